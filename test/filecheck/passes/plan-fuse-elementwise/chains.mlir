// RUN: sbp-opt %s -p 'compile{to_plan=false}',sbp-to-plan,plan-fuse-elementwise | filecheck %s
// RUN: sbp-opt %s -p 'compile{to_plan=false}',sbp-to-plan,plan-fuse-elementwise,plan-allocate-memory,plan-verify | sbp-opt | filecheck %s --check-prefix=ALLOC
// RUN: sbp-opt %s -p 'compile{fuse=false}' | filecheck %s --check-prefix=NOFUSE
// RUN: sbp-opt %s -p compile,plan-codegen{all=true} | filecheck %s --check-prefix=CUDA
// RUN: not sbp-opt %s -p compile,plan-fuse-elementwise 2>&1 | filecheck %s --check-prefix=LATE

// relu -> tanh -> exp -> add(v) -> mul(t) folds into one actor: %t has two
// readers (exp and mul), but both end up inside the chain. The matmul is no
// elementwise op, and the final add reads the feed %x, which stays a
// register: it is a feed (and read twice). The fused registers vanish, so
// the arena holds only %x, %v, %b, %m and %s.

sbp.placement @two cpu ranks [0, 1] mesh [2]

lg.graph @chain on @two {
  %x = lg.input "x" : !sbp.dtensor<16x16xf32, @two, S<0>>
  %v = lg.input "v" : tensor<16xf32>
  %w = lg.param "w" init #lg.ones : tensor<16x16xf32>
  %r = lg.relu %x : !sbp.dtensor<16x16xf32, @two, S<0>>
  %t = lg.tanh %r : !sbp.dtensor<16x16xf32, @two, S<0>>
  %e = lg.exp %t : !sbp.dtensor<16x16xf32, @two, S<0>>
  %a = lg.add %e, %v : (!sbp.dtensor<16x16xf32, @two, S<0>>, tensor<16xf32>) -> tensor<16x16xf32>
  %b = lg.mul %a, %t : (tensor<16x16xf32>, !sbp.dtensor<16x16xf32, @two, S<0>>) -> tensor<16x16xf32>
  %m = lg.matmul %b, %w : (tensor<16x16xf32>, tensor<16x16xf32>) -> tensor<16x16xf32>
  %s = lg.add %x, %m : (!sbp.dtensor<16x16xf32, @two, S<0>>, tensor<16x16xf32>) -> tensor<16x16xf32>
  lg.output ["s"] %s : tensor<16x16xf32>
}

// CHECK:      plan.device @rank0 rank 0 {
// CHECK-NEXT:   plan.register @x : tensor<8x16xf32> bytes 512 feed "x"
// CHECK-NEXT:   plan.register @v : tensor<16xf32> bytes 64 feed "v"
// CHECK-NEXT:   plan.register @w : tensor<16x16xf32> bytes 1024 persistent param "w"
// CHECK-NEXT:   plan.register @b : tensor<8x16xf32> bytes 512 of
// CHECK-NEXT:   plan.register @m : tensor<8x16xf32> bytes 512 of
// CHECK-NEXT:   plan.register @s : tensor<8x16xf32> bytes 512 fetch "s"
// CHECK-NEXT:   plan.compute @b.mul "plan.fused" [@x, @v] -> [@b] props {steps = [
// CHECK-SAME:     {kernel = "lg.relu", args = array<i64: 0>, type = tensor<8x16xf32>},
// CHECK-SAME:     {kernel = "lg.tanh", args = array<i64: 2>, type = tensor<8x16xf32>},
// CHECK-SAME:     {kernel = "lg.exp", args = array<i64: 3>, type = tensor<8x16xf32>},
// CHECK-SAME:     {kernel = "lg.add", args = array<i64: 4, 1>, type = tensor<8x16xf32>},
// CHECK-SAME:     {kernel = "lg.mul", args = array<i64: 5, 3>, type = tensor<8x16xf32>}]}
// CHECK-NEXT:   plan.compute @m.matmul "lg.matmul" [@b, @w] -> [@m]
// CHECK-NEXT:   plan.compute @s.add "lg.add" [@x, @m] -> [@s]
// CHECK-NEXT: }

// ALLOC:      plan.device @rank0 rank 0 arena 1536 persistent 1024 live_bound 1536 no_reuse 2112 {
// ALLOC:        plan.compute @b.mul "plan.fused" [@x, @v] -> [@b] props

// NOFUSE:     plan.register @r : tensor<8x16xf32>
// NOFUSE:     plan.compute @r.relu "lg.relu" [@x] -> [@r]
// NOFUSE:     plan.compute @b.mul "lg.mul" [@a, @t] -> [@b]

// One kernel for the chain: the broadcast %v is read at the output's column,
// the intermediates are values in registers.
// CUDA:       plan.compute @b.mul "plan.fused" [@x, @v] -> [@b]
// CUDA-SAME:  void k_b_mul(const T* a0, const T* a1, T* out)
// CUDA-SAME:  long o1 = 0;
// CUDA-SAME:  T v0 = a0[i];
// CUDA-SAME:  T v1 = a1[o1];
// CUDA-SAME:  T v2 = v0 > (T)0 ? v0 : (T)0;
// CUDA-SAME:  T v3 = tanh(v2);
// CUDA-SAME:  T v4 = exp(v3);
// CUDA-SAME:  T v5 = v4 + v1;
// CUDA-SAME:  T v6 = v5 * v3;
// CUDA-SAME:  out[i] = v6;

// LATE: the plan is already allocated; run plan-fuse-elementwise before plan-allocate-memory
