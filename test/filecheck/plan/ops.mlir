// RUN: SBP_ROUNDTRIP
// RUN: SBP_GENERIC_ROUNDTRIP
// RUN: sbp-opt %s --print-op-generic | filecheck %s --check-prefix=GENERIC

// Every plan op with every optional field; @rank1 runs @rank0's body as rank 1.

sbp.placement @dp cpu ranks [0, 1] mesh [2]
sbp.placement @next cpu ranks [2, 3] mesh [2]
plan.program @step {
  plan.device @rank0 rank 0 arena 4096 persistent 1088 live_bound 3584 no_reuse 5632 {
    plan.register @x : tensor<16x32xf32> bytes 2048 offset 0 feed "x" of !sbp.dtensor<32x32xf32, @dp, S<0>>
    plan.register @w : tensor<32x8xf32> bytes 1024 offset 0 persistent param "w" init #lg.normal<0.0, 0.1> seed 3 of !sbp.dtensor<32x8xf32, @dp, B>
    plan.register @c : tensor<8xf32> bytes 32 offset 1024 persistent constant dense<1.0> : tensor<8xf32> of !sbp.dtensor<8xf32, @dp, B>
    plan.register @w_new : tensor<32x8xf32> bytes 1024 offset 0 persistent fetch "new.w" alias @w of !sbp.dtensor<32x8xf32, @dp, B>
    plan.register @y : tensor<16x8xf32> bytes 512 offset 2048 of !sbp.dtensor<32x8xf32, @dp, S<0>>
    plan.register @r : tensor<16x8xf32> bytes 512 offset 2048 of !sbp.dtensor<32x8xf32, @dp, S<0>>
    plan.register @z : tensor<32x8xf32> bytes 1024 slots 2 offset 2560 fetch "z" of !sbp.dtensor<32x8xf32, @dp, B>
    plan.compute @y.matmul "lg.matmul" [@x, @w] -> [@y] props {transpose_rhs}
    plan.compute @r.relu "lg.relu" [@y] -> [@r] in_place
    plan.comm @z.all_gather "all_gather" id 0 [@r] -> [@z] group [0, 1] over [0] bytes 512 from !sbp.dtensor<32x8xf32, @dp, S<0>> to !sbp.dtensor<32x8xf32, @dp, B>
    plan.comm @z.transfer "transfer" id 1 [@z] -> [] group [0, 1, 2, 3] bytes 1024 from !sbp.dtensor<32x8xf32, @dp, B> to !sbp.dtensor<32x8xf32, @next, B>
  }
  plan.device @rank1 rank 1 like @rank0 arena 4096 persistent 1088 live_bound 3584 no_reuse 5632 attributes {note = "rank 0's body"} {
  }
  plan.device @rank2 rank 2 {
    plan.register @z2 : tensor<32x8xf32> bytes 1024 fetch "z2" of !sbp.dtensor<32x8xf32, @next, B>
    plan.comm @z.transfer "transfer" id 1 [] -> [@z2] group [0, 1, 2, 3] from !sbp.dtensor<32x8xf32, @dp, B> to !sbp.dtensor<32x8xf32, @next, B>
  }
}

// CHECK:      plan.program @step {
// CHECK-NEXT:   plan.device @rank0 rank 0 arena 4096 persistent 1088 live_bound 3584 no_reuse 5632 {
// CHECK-NEXT:     plan.register @x : tensor<16x32xf32> bytes 2048 offset 0 feed "x" of !sbp.dtensor<32x32xf32, @dp, S<0>>
// CHECK-NEXT:     plan.register @w : tensor<32x8xf32> bytes 1024 offset 0 persistent param "w" init #lg.normal<0.0, 0.1> seed 3 of !sbp.dtensor<32x8xf32, @dp, B>
// CHECK-NEXT:     plan.register @c : tensor<8xf32> bytes 32 offset 1024 persistent constant dense<1.000000e+00> : tensor<8xf32> of !sbp.dtensor<8xf32, @dp, B>
// CHECK-NEXT:     plan.register @w_new : tensor<32x8xf32> bytes 1024 offset 0 persistent fetch "new.w" alias @w of !sbp.dtensor<32x8xf32, @dp, B>
// CHECK-NEXT:     plan.register @y : tensor<16x8xf32> bytes 512 offset 2048 of !sbp.dtensor<32x8xf32, @dp, S<0>>
// CHECK-NEXT:     plan.register @r : tensor<16x8xf32> bytes 512 offset 2048 of !sbp.dtensor<32x8xf32, @dp, S<0>>
// CHECK-NEXT:     plan.register @z : tensor<32x8xf32> bytes 1024 slots 2 offset 2560 fetch "z" of !sbp.dtensor<32x8xf32, @dp, B>
// CHECK-NEXT:     plan.compute @y.matmul "lg.matmul" [@x, @w] -> [@y] props {transpose_rhs}
// CHECK-NEXT:     plan.compute @r.relu "lg.relu" [@y] -> [@r] in_place
// CHECK-NEXT:     plan.comm @z.all_gather "all_gather" id 0 [@r] -> [@z] group [0, 1] over [0] bytes 512 from !sbp.dtensor<32x8xf32, @dp, S<0>> to !sbp.dtensor<32x8xf32, @dp, B>
// CHECK-NEXT:     plan.comm @z.transfer "transfer" id 1 [@z] -> [] group [0, 1, 2, 3] bytes 1024 from !sbp.dtensor<32x8xf32, @dp, B> to !sbp.dtensor<32x8xf32, @next, B>
// CHECK-NEXT:   }
// CHECK-NEXT:   plan.device @rank1 rank 1 like @rank0 arena 4096 persistent 1088 live_bound 3584 no_reuse 5632 attributes {note = "rank 0's body"} {
// CHECK-NEXT:   }
// CHECK-NEXT:   plan.device @rank2 rank 2 {
// CHECK-NEXT:     plan.register @z2 : tensor<32x8xf32> bytes 1024 fetch "z2" of !sbp.dtensor<32x8xf32, @next, B>
// CHECK-NEXT:     plan.comm @z.transfer "transfer" id 1 [] -> [@z2] group [0, 1, 2, 3] from !sbp.dtensor<32x8xf32, @dp, B> to !sbp.dtensor<32x8xf32, @next, B>
// CHECK-NEXT:   }
// CHECK-NEXT: }

// GENERIC:      "plan.program"() <{sym_name = "step"}> ({
// GENERIC-NEXT:   "plan.device"() <{sym_name = "rank0", rank = 0 : i64, arena = 4096 : i64, persistent = 1088 : i64, live_bound = 3584 : i64, no_reuse = 5632 : i64}> ({
// GENERIC-NEXT:     "plan.register"() <{sym_name = "x", type = tensor<16x32xf32>, bytes = 2048 : i64, offset = 0 : i64, feed = "x", value = !sbp.dtensor<32x32xf32, @dp, S<0>>, slots = 1 : i64}> : () -> ()
// GENERIC:          "plan.register"() <{sym_name = "w_new", type = tensor<32x8xf32>, bytes = 1024 : i64, offset = 0 : i64, persistent, fetch = "new.w", alias = @w, value = !sbp.dtensor<32x8xf32, @dp, B>, slots = 1 : i64}> : () -> ()
// GENERIC:          "plan.compute"() <{sym_name = "y.matmul", kernel = "lg.matmul", ins = [@x, @w], outs = [@y], props = {transpose_rhs}}> : () -> ()
// GENERIC-NEXT:     "plan.compute"() <{sym_name = "r.relu", kernel = "lg.relu", ins = [@y], outs = [@r], in_place, props = {}}> : () -> ()
// GENERIC-NEXT:     "plan.comm"() <{sym_name = "z.all_gather", kind = "all_gather", id = 0 : i64, ins = [@r], outs = [@z], group = array<i64: 0, 1>, mesh_axes = array<i64: 0>, bytes = 512 : i64, from = !sbp.dtensor<32x8xf32, @dp, S<0>>, to = !sbp.dtensor<32x8xf32, @dp, B>}> : () -> ()
// GENERIC:        "plan.device"() <{sym_name = "rank1", rank = 1 : i64, like = @rank0, arena = 4096 : i64, persistent = 1088 : i64, live_bound = 3584 : i64, no_reuse = 5632 : i64}> ({
// GENERIC-NEXT:   ^bb0:
// GENERIC-NEXT:   }) {note = "rank 0's body"} : () -> ()
