sbp.placement @m cpu ranks [0, 1] mesh [2]
lg.graph @g on @m {
  %x = lg.input "x" : tensor<8xf32>
  %a = sbp.annotate %x : tensor<8xf32> -> !sbp.dtensor<8xf32, @m, S<1>>
  lg.output ["a"] %a : !sbp.dtensor<8xf32, @m, S<1>>
}
