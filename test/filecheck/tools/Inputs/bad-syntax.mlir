lg.graph @g {
  %x = lg.input "x" tensor<8xf32>
  lg.output []
}
