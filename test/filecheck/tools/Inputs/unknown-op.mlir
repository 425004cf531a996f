lg.graph @g {
  %x = lg.input "x" : tensor<8xf32>
  %y = lg.softplus %x : tensor<8xf32>
  lg.output ["y"] %y : tensor<8xf32>
}
