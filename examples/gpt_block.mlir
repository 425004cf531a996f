// One GPT block (pre-LN multi-head attention and MLP, 4 heads of 8) on a
// 2x2 (data x model) mesh: the batch split over the data axis, Megatron's
// weight splits over the model axis; SBP inference does the rest.
//
//   sbp-opt examples/gpt_block.mlir -p compile{to_plan=false},sbp-comm-summary
//   sbp-opt examples/gpt_block.mlir -p compile -t memory-svg > memory.svg

sbp.placement @mesh cpu ranks [0, 1, 2, 3] mesh [2, 2]
lg.graph @gpt_block on @mesh {
  %x0 = lg.input "x" : tensor<4x8x32xf32>
  %x = sbp.annotate %x0 : tensor<4x8x32xf32> -> !sbp.dtensor<4x8x32xf32, @mesh, [S<0>, B]>
  %g1 = lg.param "ln1.g" init #lg.ones : tensor<32xf32>
  %b1 = lg.param "ln1.b" init #lg.zeros : tensor<32xf32>
  %wq = lg.param "wq" init #lg.normal<0.0, 0.02> : !sbp.dtensor<32x32xf32, @mesh, [B, S<1>]>
  %wk = lg.param "wk" init #lg.normal<0.0, 0.02> : !sbp.dtensor<32x32xf32, @mesh, [B, S<1>]>
  %wv = lg.param "wv" init #lg.normal<0.0, 0.02> : !sbp.dtensor<32x32xf32, @mesh, [B, S<1>]>
  %wo = lg.param "wo" init #lg.normal<0.0, 0.02> : !sbp.dtensor<32x32xf32, @mesh, [B, S<0>]>
  %g2 = lg.param "ln2.g" init #lg.ones : tensor<32xf32>
  %b2 = lg.param "ln2.b" init #lg.zeros : tensor<32xf32>
  %w1 = lg.param "w1" init #lg.normal<0.0, 0.02> : !sbp.dtensor<32x128xf32, @mesh, [B, S<1>]>
  %w2 = lg.param "w2" init #lg.normal<0.0, 0.02> : !sbp.dtensor<128x32xf32, @mesh, [B, S<0>]>
  %scale = lg.constant dense<0.35355339> : tensor<f32>

  %ln1 = lg.layernorm %x weight %g1 : tensor<32xf32> bias %b1 : tensor<32xf32> axis 2 eps 1.0e-05 : !sbp.dtensor<4x8x32xf32, @mesh, [S<0>, B]>
  %q = lg.matmul %ln1, %wq : (!sbp.dtensor<4x8x32xf32, @mesh, [S<0>, B]>, !sbp.dtensor<32x32xf32, @mesh, [B, S<1>]>) -> tensor<4x8x32xf32>
  %k = lg.matmul %ln1, %wk : (!sbp.dtensor<4x8x32xf32, @mesh, [S<0>, B]>, !sbp.dtensor<32x32xf32, @mesh, [B, S<1>]>) -> tensor<4x8x32xf32>
  %v = lg.matmul %ln1, %wv : (!sbp.dtensor<4x8x32xf32, @mesh, [S<0>, B]>, !sbp.dtensor<32x32xf32, @mesh, [B, S<1>]>) -> tensor<4x8x32xf32>
  %q4 = lg.reshape %q : tensor<4x8x32xf32> -> tensor<4x8x4x8xf32>
  %k4 = lg.reshape %k : tensor<4x8x32xf32> -> tensor<4x8x4x8xf32>
  %v4 = lg.reshape %v : tensor<4x8x32xf32> -> tensor<4x8x4x8xf32>
  %qh = lg.transpose %q4 perm [0, 2, 1, 3] : tensor<4x8x4x8xf32> -> tensor<4x4x8x8xf32>
  %kh = lg.transpose %k4 perm [0, 2, 1, 3] : tensor<4x8x4x8xf32> -> tensor<4x4x8x8xf32>
  %vh = lg.transpose %v4 perm [0, 2, 1, 3] : tensor<4x8x4x8xf32> -> tensor<4x4x8x8xf32>
  %s = lg.matmul %qh, %kh transpose_rhs : (tensor<4x4x8x8xf32>, tensor<4x4x8x8xf32>) -> tensor<4x4x8x8xf32>
  %ss = lg.mul %s, %scale : (tensor<4x4x8x8xf32>, tensor<f32>) -> tensor<4x4x8x8xf32>
  %p = lg.softmax %ss axis 3 : tensor<4x4x8x8xf32>
  %o = lg.matmul %p, %vh : (tensor<4x4x8x8xf32>, tensor<4x4x8x8xf32>) -> tensor<4x4x8x8xf32>
  %ot = lg.transpose %o perm [0, 2, 1, 3] : tensor<4x4x8x8xf32> -> tensor<4x8x4x8xf32>
  %o3 = lg.reshape %ot : tensor<4x8x4x8xf32> -> tensor<4x8x32xf32>
  %attn = lg.matmul %o3, %wo : (tensor<4x8x32xf32>, !sbp.dtensor<32x32xf32, @mesh, [B, S<0>]>) -> tensor<4x8x32xf32>
  %r1 = lg.add %x, %attn : (!sbp.dtensor<4x8x32xf32, @mesh, [S<0>, B]>, tensor<4x8x32xf32>) -> tensor<4x8x32xf32>
  %ln2 = lg.layernorm %r1 weight %g2 : tensor<32xf32> bias %b2 : tensor<32xf32> axis 2 eps 1.0e-05 : tensor<4x8x32xf32>
  %h = lg.matmul %ln2, %w1 : (tensor<4x8x32xf32>, !sbp.dtensor<32x128xf32, @mesh, [B, S<1>]>) -> tensor<4x8x128xf32>
  %a = lg.gelu %h : tensor<4x8x128xf32>
  %m = lg.matmul %a, %w2 : (tensor<4x8x128xf32>, !sbp.dtensor<128x32xf32, @mesh, [B, S<0>]>) -> tensor<4x8x32xf32>
  %r2 = lg.add %r1, %m : (tensor<4x8x32xf32>, tensor<4x8x32xf32>) -> tensor<4x8x32xf32>
  %y = sbp.annotate %r2 : tensor<4x8x32xf32> -> !sbp.dtensor<4x8x32xf32, @mesh, [S<0>, B]>
  lg.output ["y"] %y : !sbp.dtensor<4x8x32xf32, @mesh, [S<0>, B]>
}
