// RUN: sbp-opt %s -p lg-autodiff | filecheck %s

// A reduction's gradient is spread back over its reduced axes; where an
// elementwise op of two operands reads the spread and its other operand
// has the whole shape, the op broadcasts the reduced value itself (no
// lg.broadcast_to). A spread read otherwise (here: output as a gradient)
// stays.

lg.graph @centered {
  %x = lg.param "x" init #lg.normal<0.0, 1.0> : tensor<4x3xf32>
  %m = lg.reduce_mean %x axes [0] keepdims : tensor<4x3xf32> -> tensor<1x3xf32>
  %c = lg.sub %x, %m : (tensor<4x3xf32>, tensor<1x3xf32>) -> tensor<4x3xf32>
  %s = lg.mul %c, %c : (tensor<4x3xf32>, tensor<4x3xf32>) -> tensor<4x3xf32>
  %loss = lg.reduce_sum %s axes [0, 1] : tensor<4x3xf32> -> tensor<f32>
  lg.output ["loss"] %loss : tensor<f32>
}

// CHECK-LABEL: lg.graph @centered
// CHECK-NOT:   lg.broadcast_to
// CHECK:       %[[SEED:.*]] = lg.reshape %{{.*}} : tensor<f32> -> tensor<1x1xf32>
// CHECK-NEXT:  %[[A:.*]] = lg.mul %[[SEED]], %c : (tensor<1x1xf32>, tensor<4x3xf32>) -> tensor<4x3xf32>
// CHECK-NOT:   lg.broadcast_to
// CHECK:       %[[SUM:.*]] = lg.reduce_sum %{{.*}} axes [0] keepdims : tensor<4x3xf32> -> tensor<1x3xf32>
// CHECK-NEXT:  %[[SCALE:.*]] = lg.constant dense<2.500000e-01> : tensor<f32>
// CHECK-NEXT:  %[[MEAN:.*]] = lg.mul %[[SUM]], %[[SCALE]] : (tensor<1x3xf32>, tensor<f32>) -> tensor<1x3xf32>
// CHECK-NEXT:  %[[G:.*]] = lg.add %{{.*}}, %[[MEAN]] : (tensor<4x3xf32>, tensor<1x3xf32>) -> tensor<4x3xf32>
// CHECK-NEXT:  lg.output ["loss", "grad.x"] %loss, %[[G]]

lg.graph @summed {
  %x = lg.param "x" init #lg.normal<0.0, 1.0> : tensor<4x3xf32>
  %loss = lg.reduce_sum %x axes [0, 1] : tensor<4x3xf32> -> tensor<f32>
  lg.output ["loss"] %loss : tensor<f32>
}

// CHECK-LABEL: lg.graph @summed
// CHECK:       %[[SPREAD:.*]] = lg.broadcast_to %{{.*}} : tensor<1x1xf32> -> tensor<4x3xf32>
// CHECK-NEXT:  lg.output ["loss", "grad.x"] %loss, %[[SPREAD]]

lg.graph @scaled {
  %x = lg.param "x" init #lg.normal<0.0, 1.0> : tensor<4x3xf32>
  %b = lg.param "b" init #lg.normal<0.0, 1.0> : tensor<1x3xf32>
  %y = lg.mul %x, %b : (tensor<4x3xf32>, tensor<1x3xf32>) -> tensor<4x3xf32>
  %loss = lg.reduce_sum %y axes [0, 1] : tensor<4x3xf32> -> tensor<f32>
  lg.output ["loss"] %loss : tensor<f32>
}

// Beside an operand of another shape the spread stays: the product
// must have the whole shape.
// CHECK-LABEL: lg.graph @scaled
// CHECK:       %[[SPREAD:.*]] = lg.broadcast_to %{{.*}} : tensor<1x1xf32> -> tensor<4x3xf32>
// CHECK-NEXT:  %{{.*}} = lg.mul %[[SPREAD]], %b : (tensor<4x3xf32>, tensor<1x3xf32>) -> tensor<4x3xf32>

lg.graph @product {
  %x = lg.param "x" init #lg.normal<0.0, 1.0> : tensor<3x3xf32>
  %w = lg.param "w" init #lg.normal<0.0, 1.0> : tensor<3x3xf32>
  %y = lg.matmul %x, %w : (tensor<3x3xf32>, tensor<3x3xf32>) -> tensor<3x3xf32>
  %loss = lg.reduce_sum %y axes [0, 1] : tensor<3x3xf32> -> tensor<f32>
  lg.output ["loss"] %loss : tensor<f32>
}

// Read by an op that does not broadcast (a matmul), the spread stays.
// CHECK-LABEL: lg.graph @product
// CHECK:       %[[SPREAD:.*]] = lg.broadcast_to %{{.*}} : tensor<1x1xf32> -> tensor<3x3xf32>
// CHECK-NEXT:  %{{.*}} = lg.matmul %[[SPREAD]], %w transpose_rhs
