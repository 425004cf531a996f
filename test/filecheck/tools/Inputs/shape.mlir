lg.graph @g {
  %x = lg.input "x" : tensor<8x16xf32>
  %y = lg.matmul %x, %x : (tensor<8x16xf32>, tensor<8x16xf32>) -> tensor<8x16xf32>
  lg.output ["y"] %y : tensor<8x16xf32>
}
