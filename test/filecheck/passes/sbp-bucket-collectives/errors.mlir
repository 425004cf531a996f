// RUN: not sbp-opt %s -p 'compile{to_plan=false bucket=false},sbp-bucket-collectives{device=nosuch}' 2>&1 | filecheck %s

// An unknown cluster is named, with the presets to choose from.
sbp.placement @dp cpu ranks [0, 1] mesh [2]
lg.graph @step on @dp {
  %x = lg.input "x" : !sbp.dtensor<8x4xf32, @dp, S<0>>
  %a = lg.reduce_sum %x axes [0] : !sbp.dtensor<8x4xf32, @dp, S<0>> -> tensor<4xf32>
  %b = lg.reduce_mean %x axes [0] : !sbp.dtensor<8x4xf32, @dp, S<0>> -> tensor<4xf32>
  %ra = sbp.annotate %a : tensor<4xf32> -> !sbp.dtensor<4xf32, @dp, B>
  %rb = sbp.annotate %b : tensor<4xf32> -> !sbp.dtensor<4xf32, @dp, B>
  lg.output ["a", "b"] %ra, %rb : !sbp.dtensor<4xf32, @dp, B>, !sbp.dtensor<4xf32, @dp, B>
}
// CHECK: sbp-bucket-collectives: cluster 'nosuch' is neither a preset (cpu, h100-node
