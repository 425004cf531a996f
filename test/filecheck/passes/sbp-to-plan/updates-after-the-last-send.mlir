// RUN: sbp-opt %s -p 'lg-micro-batch{count=4 schedule=1f1b},lg-autodiff,lg-optimizer{algorithm=sgd},compile' | filecheck %s

// Two pipeline stages, each data parallel on 2 ranks, four micro-batches.
// The last stage's weight gradient is summed over the micro-batches and
// reduced over its data axis; its update reads the reduced gradient. The
// stage before waits for the last micro-batch's input gradient, so the
// last stage sends it before any update runs: the updates wait for the
// stage's last backward (sbp-to-plan's slots), where run as soon as the
// reduction was ready they held the send back by the whole optimizer. The
// reduction itself is issued as soon as the summed gradient is ready.

sbp.placement @stage0 cpu ranks [0, 1] mesh [2]
sbp.placement @stage1 cpu ranks [2, 3] mesh [2]

lg.graph @two_stages on @stage0 {
  %x = lg.input "x" : !sbp.dtensor<16x4xf32, @stage0, S<0>>
  %t = lg.input "t" {sbp.placement = @stage1} : !sbp.dtensor<16x4xf32, @stage1, S<0>>
  %w1 = lg.param "w1" init #lg.normal<0.0, 0.5> seed 1 : tensor<4x4xf32>
  %h = lg.matmul %x, %w1 : (!sbp.dtensor<16x4xf32, @stage0, S<0>>, tensor<4x4xf32>) -> tensor<16x4xf32>
  %a = lg.tanh %h : tensor<16x4xf32>
  %w2 = lg.param "w2" init #lg.normal<0.0, 0.5> seed 2 {sbp.placement = @stage1} : !sbp.dtensor<4x4xf32, @stage1, B>
  %b = lg.matmul %a, %w2 {sbp.placement = @stage1} : (tensor<16x4xf32>, !sbp.dtensor<4x4xf32, @stage1, B>) -> !sbp.dtensor<16x4xf32, @stage1, S<0>>
  %y = lg.tanh %b {sbp.placement = @stage1} : !sbp.dtensor<16x4xf32, @stage1, S<0>>
  %loss = lg.mse_loss %y, %t {sbp.placement = @stage1} : (!sbp.dtensor<16x4xf32, @stage1, S<0>>, !sbp.dtensor<16x4xf32, @stage1, S<0>>) -> tensor<f32>
  lg.output ["loss"] %loss : tensor<f32>
}

// CHECK:      plan.device @rank2 rank 2
// CHECK:        plan.compute @b_mb3.matmul
// CHECK:        plan.comm @{{.*}}.transfer "transfer" id {{[0-9]+}} [@{{.*}}] -> [] group [2, 3, 0, 1]
// CHECK-NOT:    "transfer"
// CHECK:        plan.compute @w2_new.sub {{.*}} -> [@w2_new]
// CHECK:      plan.device @rank3 rank 3
