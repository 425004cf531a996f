// RUN: sbp-opt %s -p 'lg-micro-batch{count=4 schedule=1f1b},lg-autodiff,lg-optimizer{algorithm=sgd},compile' | filecheck %s
// RUN: sbp-opt %s -p 'lg-micro-batch{count=4},lg-autodiff,lg-optimizer{algorithm=sgd},compile' | filecheck %s --check-prefix=GPIPE
// RUN: not sbp-opt %s -p 'lg-micro-batch{count=4 schedule=zigzag}' 2>&1 | filecheck %s --check-prefix=BAD

// Two pipeline stages, four micro-batches. In 1F1B order stage 0 of 2 runs
// one forward ahead (a_mb0, a_mb1 sent), then alternates: the gradient of
// micro-batch 0 comes back (received) before a_mb2 goes out. Stage 1 runs
// each micro-batch's backward right after its forward, so it sends the
// gradient of micro-batch 0 before it receives a_mb1. The two stages post
// their transfers in different orders; transfers match by id, and
// plan-verify accepts that (collectives it still holds to one order).
// GPipe sends every forward before any gradient comes back, and its last
// stage keeps all four micro-batches' activations: a larger arena.

sbp.placement @stage0 cpu ranks [0] mesh [1]
sbp.placement @stage1 cpu ranks [1] mesh [1]

lg.graph @two_stages on @stage0 {
  %x = lg.input "x" : tensor<8x4xf32>
  %t = lg.input "t" {sbp.placement = @stage1} : tensor<8x4xf32>
  %w1 = lg.param "w1" init #lg.normal<0.0, 0.5> seed 1 : tensor<4x4xf32>
  %h = lg.matmul %x, %w1 : (tensor<8x4xf32>, tensor<4x4xf32>) -> tensor<8x4xf32>
  %a = lg.tanh %h : tensor<8x4xf32>
  %w2 = lg.param "w2" init #lg.normal<0.0, 0.5> seed 2 {sbp.placement = @stage1} : tensor<4x4xf32>
  %y = lg.matmul %a, %w2 {sbp.placement = @stage1} : (tensor<8x4xf32>, tensor<4x4xf32>) -> tensor<8x4xf32>
  %loss = lg.mse_loss %y, %t {sbp.placement = @stage1} : (tensor<8x4xf32>, tensor<8x4xf32>) -> tensor<f32>
  lg.output ["loss"] %loss : tensor<f32>
}

// CHECK:      plan.device @rank0 rank 0 arena 960
// CHECK:      "transfer" id {{[0-9]+}} [@a_mb0] -> []
// CHECK-NOT:  group [1, 0]
// CHECK:      "transfer" id {{[0-9]+}} [@a_mb1] -> []
// CHECK-NOT:  [@a_mb2]
// CHECK:      "transfer" id [[G0:[0-9]+]] [] -> [@{{.*}}] group [1, 0]
// CHECK:      "transfer" id {{[0-9]+}} [@a_mb2] -> []
// CHECK:      plan.device @rank1 rank 1 arena 1024
// CHECK:      "transfer" id {{[0-9]+}} [] -> [@v26] group [0, 1]
// CHECK:      "transfer" id [[G0]] [@{{.*}}] -> [] group [1, 0]
// CHECK:      "transfer" id {{[0-9]+}} [] -> [@v31] group [0, 1]

// GPIPE:      plan.device @rank0 rank 0
// GPIPE:      "transfer" id {{[0-9]+}} [@a_mb0] -> []
// GPIPE-NOT:  group [1, 0]
// GPIPE:      "transfer" id {{[0-9]+}} [@a_mb3] -> []
// GPIPE:      plan.device @rank1 rank 1 arena 1408

// BAD: lg-micro-batch: unknown schedule 'zigzag' (known: gpipe, 1f1b)
