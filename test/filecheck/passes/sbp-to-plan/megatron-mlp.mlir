// RUN: sbp-opt %S/../sbp-infer/megatron-mlp.mlir -p 'compile{to_plan=false}',sbp-to-plan | filecheck %s

// Megatron's MLP on 2 ranks: each rank holds a column block of w1 and a row
// block of w2, computes a partial output, and one all_reduce actor per rank,
// with the same id and group on both, makes it whole. Both blocks have the
// same local shapes, so rank 1 runs rank 0's body as its own rank, which
// picks its blocks (`like`).

// CHECK:      plan.device @rank0 rank 0 {
// CHECK-NEXT:   plan.register @x : tensor<16x64xf32> bytes 4096 feed "x" of !sbp.dtensor<16x64xf32, @tp, B>
// CHECK-NEXT:   plan.register @w1 : tensor<64x128xf32> bytes 32768 persistent param "w1" {{.*}} of !sbp.dtensor<64x256xf32, @tp, S<1>>
// CHECK-NEXT:   plan.register @w2 : tensor<128x64xf32> bytes 32768 persistent param "w2" {{.*}} of !sbp.dtensor<256x64xf32, @tp, S<0>>
// CHECK-NEXT:   plan.register @h : tensor<16x128xf32> bytes 8192 of !sbp.dtensor<16x256xf32, @tp, S<1>>
// CHECK-NEXT:   plan.register @a : tensor<16x128xf32> bytes 8192 of !sbp.dtensor<16x256xf32, @tp, S<1>>
// CHECK-NEXT:   plan.register @y : tensor<16x64xf32> bytes 4096 of !sbp.dtensor<16x64xf32, @tp, P>
// CHECK-NEXT:   plan.register @yb : tensor<16x64xf32> bytes 4096 fetch "y" of !sbp.dtensor<16x64xf32, @tp, B>
// CHECK-NEXT:   plan.compute @h.matmul "lg.matmul" [@x, @w1] -> [@h]
// CHECK-NEXT:   plan.compute @a.gelu "lg.gelu" [@h] -> [@a]
// CHECK-NEXT:   plan.compute @y.matmul "lg.matmul" [@a, @w2] -> [@y]
// CHECK-NEXT:   plan.comm @yb.all_reduce "all_reduce" id 0 [@y] -> [@yb] group [0, 1] over [0] bytes 4096 from !sbp.dtensor<16x64xf32, @tp, P> to !sbp.dtensor<16x64xf32, @tp, B>
// CHECK-NEXT: }
// CHECK-NEXT: plan.device @rank1 rank 1 like @rank0 {
// CHECK-NEXT: }
