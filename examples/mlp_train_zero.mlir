// The training step of examples/mlp_train.mlir with ZeRO-style hints: the
// parameter update runs on S<0> shards, so gradients are reduce-scattered
// and the new parameters all-gathered.

sbp.placement @dp cpu ranks [0, 1, 2, 3] mesh [4]
lg.graph @zero_train_step on @dp {
  %x0 = lg.input "x" : tensor<64x32xf32>
  %t0 = lg.input "t" : tensor<64x16xf32>
  %lr = lg.input "lr" : tensor<f32>
  %w1 = lg.param "w1" init #lg.normal<0.0, 0.1> : tensor<32x64xf32>
  %w2 = lg.param "w2" init #lg.normal<0.0, 0.1> : tensor<64x16xf32>
  %x = sbp.annotate %x0 : tensor<64x32xf32> -> !sbp.dtensor<64x32xf32, @dp, S<0>>
  %t = sbp.annotate %t0 : tensor<64x16xf32> -> !sbp.dtensor<64x16xf32, @dp, S<0>>
  // forward
  %h = lg.matmul %x, %w1 : (!sbp.dtensor<64x32xf32, @dp, S<0>>, tensor<32x64xf32>) -> tensor<64x64xf32>
  %a = lg.tanh %h : tensor<64x64xf32>
  %y = lg.matmul %a, %w2 : (tensor<64x64xf32>, tensor<64x16xf32>) -> tensor<64x16xf32>
  %loss = lg.mse_loss %y, %t : (tensor<64x16xf32>, !sbp.dtensor<64x16xf32, @dp, S<0>>) -> tensor<f32>
  // backward of mse: dy = 2 (y - t) / N
  %scale = lg.constant dense<0.001953125> : tensor<f32>
  %diff = lg.sub %y, %t : (tensor<64x16xf32>, !sbp.dtensor<64x16xf32, @dp, S<0>>) -> tensor<64x16xf32>
  %dy = lg.mul %diff, %scale : (tensor<64x16xf32>, tensor<f32>) -> tensor<64x16xf32>
  %dw2 = lg.matmul %a, %dy transpose_lhs : (tensor<64x64xf32>, tensor<64x16xf32>) -> tensor<64x16xf32>
  %da = lg.matmul %dy, %w2 transpose_rhs : (tensor<64x16xf32>, tensor<64x16xf32>) -> tensor<64x64xf32>
  // tanh' = 1 - a^2
  %one = lg.constant dense<1.0> : tensor<f32>
  %a2 = lg.mul %a, %a : (tensor<64x64xf32>, tensor<64x64xf32>) -> tensor<64x64xf32>
  %dtanh = lg.sub %one, %a2 : (tensor<f32>, tensor<64x64xf32>) -> tensor<64x64xf32>
  %dh = lg.mul %da, %dtanh : (tensor<64x64xf32>, tensor<64x64xf32>) -> tensor<64x64xf32>
  %dw1 = lg.matmul %x, %dh transpose_lhs : (!sbp.dtensor<64x32xf32, @dp, S<0>>, tensor<64x64xf32>) -> tensor<32x64xf32>
  // ZeRO: the update runs on shards (S<0>), then the new parameters are gathered
  %s1 = lg.mul %dw1, %lr : (tensor<32x64xf32>, tensor<f32>) -> tensor<32x64xf32>
  %n1 = lg.sub %w1, %s1 : (tensor<32x64xf32>, tensor<32x64xf32>) -> !sbp.dtensor<32x64xf32, @dp, S<0>>
  %s2 = lg.mul %dw2, %lr : (tensor<64x16xf32>, tensor<f32>) -> tensor<64x16xf32>
  %n2 = lg.sub %w2, %s2 : (tensor<64x16xf32>, tensor<64x16xf32>) -> !sbp.dtensor<64x16xf32, @dp, S<0>>
  %w1_new = sbp.annotate %n1 : !sbp.dtensor<32x64xf32, @dp, S<0>> -> !sbp.dtensor<32x64xf32, @dp, B>
  %w2_new = sbp.annotate %n2 : !sbp.dtensor<64x16xf32, @dp, S<0>> -> !sbp.dtensor<64x16xf32, @dp, B>
  lg.output ["loss", "w1", "w2"] %loss, %w1_new, %w2_new : tensor<f32>, !sbp.dtensor<32x64xf32, @dp, B>, !sbp.dtensor<64x16xf32, @dp, B>
}
