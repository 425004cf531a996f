// A two-layer MLP classifier with a mean cross-entropy loss, to be trained
// data-parallel on two CPU ranks: the only hint is that the batch is split
// (S<0>) over the mesh; SBP inference distributes everything else.
//
//   sbp-opt examples/mlp.mlir                 parse, verify, print
//   sbp-opt examples/mlp.mlir -p sbp-erase    the purely logical graph

sbp.placement @dp cpu ranks [0, 1] mesh [2]

lg.graph @mlp on @dp {
  %x = lg.input "x" : tensor<32x64xf32>
  %labels = lg.input "labels" : tensor<32xi64>
  %w1 = lg.param "w1" init #lg.normal<0.0, 0.125> seed 1 : tensor<64x128xf32>
  %b1 = lg.param "b1" init #lg.zeros : tensor<128xf32>
  %w2 = lg.param "w2" init #lg.normal<0.0, 0.0884> seed 2 : tensor<128x10xf32>
  %b2 = lg.param "b2" init #lg.zeros : tensor<10xf32>

  %xs = sbp.annotate %x : tensor<32x64xf32> -> !sbp.dtensor<32x64xf32, @dp, S<0>>
  %h = lg.matmul %xs, %w1 : (!sbp.dtensor<32x64xf32, @dp, S<0>>, tensor<64x128xf32>) -> tensor<32x128xf32>
  %hb = lg.add %h, %b1 : (tensor<32x128xf32>, tensor<128xf32>) -> tensor<32x128xf32>
  %a = lg.gelu %hb : tensor<32x128xf32>
  %o = lg.matmul %a, %w2 : (tensor<32x128xf32>, tensor<128x10xf32>) -> tensor<32x10xf32>
  %logits = lg.add %o, %b2 : (tensor<32x10xf32>, tensor<10xf32>) -> tensor<32x10xf32>
  %loss = lg.cross_entropy %logits, %labels : (tensor<32x10xf32>, tensor<32xi64>) -> tensor<f32>
  lg.output ["loss", "logits"] %loss, %logits : tensor<f32>, tensor<32x10xf32>
}
