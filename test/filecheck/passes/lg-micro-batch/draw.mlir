// RUN: sbp-opt %s -p 'lg-micro-batch{count=2}' | filecheck %s

// A random draw whose axis 0 is the batch (drop path's per-example mask) is
// drawn once for the whole batch and cut as an input is: micro-batch k's
// rows are the batch's rows k, k+2, ..., as the draw without micro-batches.

lg.graph @step {
  %x = lg.input "x" : tensor<4x3xf32>
  %seed = lg.param "rng.seed" init #lg.zeros state : tensor<i64>
  %rstep = lg.param "rng.step" init #lg.zeros state : tensor<i64>
  %u = lg.uniform %seed, %rstep stream 1 : (tensor<i64>, tensor<i64>) -> tensor<4x1xf32>
  %m = lg.floor %u : tensor<4x1xf32>
  %y = lg.mul %x, %m : (tensor<4x3xf32>, tensor<4x1xf32>) -> tensor<4x3xf32>
  %loss = lg.reduce_mean %y axes [0, 1] : tensor<4x3xf32> -> tensor<f32>
  lg.output ["loss"] %loss : tensor<f32>
}

// CHECK:      %u = lg.uniform %seed, %rstep stream 1 : (tensor<i64>, tensor<i64>) -> tensor<4x1xf32>
// CHECK:      %x_mb1 = lg.reshape
// CHECK-NEXT: %[[UG:.*]] = lg.reshape %u : tensor<4x1xf32> -> tensor<2x2x1xf32>
// CHECK-NEXT: %[[U0:.*]] = lg.slice %[[UG]] starts [0, 0, 0] limits [2, 1, 1] strides [1, 1, 1] {lg.micro_batch = 0 : i64}
// CHECK-NEXT: %u_mb0 = lg.reshape %[[U0]] {lg.micro_batch = 0 : i64} : tensor<2x1x1xf32> -> tensor<2x1xf32>
// CHECK-NEXT: %[[U1:.*]] = lg.slice %[[UG]] starts [0, 1, 0] limits [2, 2, 1] strides [1, 1, 1] {lg.micro_batch = 1 : i64}
// CHECK-NEXT: %u_mb1 = lg.reshape %[[U1]] {lg.micro_batch = 1 : i64} : tensor<2x1x1xf32> -> tensor<2x1xf32>
// CHECK-NEXT: %m_mb0 = lg.floor %u_mb0
// CHECK-NEXT: %y_mb0 = lg.mul %x_mb0, %m_mb0
// CHECK:      %m_mb1 = lg.floor %u_mb1
