// RUN: sbp-opt %s -p compile | filecheck %s

// Two pipeline stages on disjoint ranks: the value crossing from stage 0 to
// stage 1 gets two slots on both sides (the first stage may run one step
// ahead), and the transfer is one communication actor per rank: stage-0
// ranks only send, stage-1 ranks only receive, all with the same id and
// group.

sbp.placement @stage0 cpu ranks [0, 1] mesh [2]
sbp.placement @stage1 cpu ranks [2, 3] mesh [2]

lg.graph @two_stages on @stage0 {
  %x = lg.input "x" : tensor<8x4xf32>
  %a = lg.relu %x : tensor<8x4xf32>
  %b = sbp.annotate %a : tensor<8x4xf32> -> !sbp.dtensor<8x4xf32, @stage1, S<0>>
  %c = lg.tanh %b : !sbp.dtensor<8x4xf32, @stage1, S<0>>
  lg.output ["c"] %c : !sbp.dtensor<8x4xf32, @stage1, S<0>>
}

// CHECK:      plan.device @rank0 rank 0
// CHECK:        plan.register @a : tensor<4x4xf32> bytes 64 slots 2 offset {{[0-9]+}} of !sbp.dtensor<8x4xf32, @stage0, S<0>>
// CHECK:        plan.compute @a.relu "lg.relu" [@x] -> [@a]
// CHECK-NEXT:   plan.comm @b.transfer "transfer" id 0 [@a] -> [] group [0, 1, 2, 3] bytes 64
// CHECK:      plan.device @rank2 rank 2
// CHECK-NEXT:   plan.register @b : tensor<4x4xf32> bytes 64 slots 2 offset {{[0-9]+}} of !sbp.dtensor<8x4xf32, @stage1, S<0>>
// CHECK-NEXT:   plan.register @c : tensor<4x4xf32> bytes 64 offset {{[0-9]+}} fetch "c" of !sbp.dtensor<8x4xf32, @stage1, S<0>>
// CHECK-NEXT:   plan.comm @b.transfer "transfer" id 0 [] -> [@b] group [0, 1, 2, 3] bytes 64
// CHECK-NEXT:   plan.compute @c.tanh "lg.tanh" [@b] -> [@c]
