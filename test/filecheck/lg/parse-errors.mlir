// RUN: sbp-opt %s --split-input-file --parsing-diagnostics --verify-diagnostics | filecheck %s

// Initializer errors point at the initializer.

lg.graph @g {
  %w = lg.param "w" init #lg.normal<0.0, -1.0> : tensor<4xf32>
  lg.output []
}
// CHECK: #lg.normal needs std >= 0, got -1.0

// -----

lg.graph @g {
  %w = lg.param "w" init #lg.uniform<1.0, 1.0> : tensor<4xf32>
  lg.output []
}
// CHECK: #lg.uniform needs low < high, got 1.0 and 1.0

// -----

lg.graph @g {
  %w = lg.param "w" init #lg.normal<0.0> : tensor<4xf32>
  lg.output []
}
// CHECK: #lg.normal takes 2 number(s), got 1

// -----

lg.graph @g {
  %w = lg.param "w" init #sbp.B : tensor<4xf32>
  lg.output []
}
// CHECK: #sbp.B should be of attribute subclassing `InitializerAttr`

// -----

lg.graph @g {
  %w = lg.frobnicate "w" : tensor<4xf32>
  lg.output []
}
// CHECK: Operation lg.frobnicate is not registered

// -----

lg.graph @g {
  %x = lg.input "x" : tensor<4xf32>
  %y = lg.add %x, %x : tensor<4xf32>
  lg.output []
}
// CHECK: Expected '('
