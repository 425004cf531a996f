// RUN: sbp-opt %s -p 'lg-micro-batch{count=2}' | filecheck %s
// RUN: sbp-opt %s -p 'lg-micro-batch{count=2}',lg-autodiff | filecheck %s --check-prefix=GRAD
// RUN: sbp-opt %s -p 'lg-micro-batch{count=1}' | filecheck %s --check-prefix=ONE
// RUN: not sbp-opt %s -p 'lg-micro-batch{count=3}' 2>&1 | filecheck %s --check-prefix=ODD
// RUN: sbp-opt %s -p 'lg-micro-batch{count=2}' --print-op-generic | sbp-opt -p 'lg-micro-batch{count=1}' | filecheck %s

// Two micro-batches: every input of rank >= 1 is cut into strided halves
// (rows 0, 2 and rows 1, 3), the batch-dependent ops repeat per micro-batch,
// micro-batch 0's ops first, and the loss is the mean of the two.

lg.graph @step {
  %x = lg.input "x" : tensor<4x3xf32>
  %t = lg.input "t" : tensor<4x2xf32>
  %w = lg.param "w" init #lg.normal<0.0, 0.1> : tensor<3x2xf32>
  %y = lg.matmul %x, %w : (tensor<4x3xf32>, tensor<3x2xf32>) -> tensor<4x2xf32>
  %r = lg.reshape %y : tensor<4x2xf32> -> tensor<4x1x2xf32>
  %s = lg.reshape %r : tensor<4x1x2xf32> -> tensor<4x2xf32>
  %loss = lg.mse_loss %s, %t : (tensor<4x2xf32>, tensor<4x2xf32>) -> tensor<f32>
  lg.output ["loss"] %loss : tensor<f32>
}

// CHECK-LABEL: lg.graph @step attributes {lg.pipeline_schedule = "gpipe"}
// CHECK:      %w = lg.param "w"
// CHECK:      %[[XG:.*]] = lg.reshape %x : tensor<4x3xf32> -> tensor<2x2x3xf32>
// CHECK-NEXT: %[[X0:.*]] = lg.slice %[[XG]] starts [0, 0, 0] limits [2, 1, 3] strides [1, 1, 1] {lg.micro_batch = 0 : i64} : tensor<2x2x3xf32> -> tensor<2x1x3xf32>
// CHECK-NEXT: %x_mb0 = lg.reshape %[[X0]] {lg.micro_batch = 0 : i64} : tensor<2x1x3xf32> -> tensor<2x3xf32>
// CHECK-NEXT: %[[X1:.*]] = lg.slice %[[XG]] starts [0, 1, 0] limits [2, 2, 3]
// CHECK-NEXT: %x_mb1 = lg.reshape %[[X1]] {lg.micro_batch = 1 : i64} : tensor<2x1x3xf32> -> tensor<2x3xf32>
// CHECK:      %t_mb1 = lg.reshape
// CHECK-NEXT: %y_mb0 = lg.matmul %x_mb0, %w {lg.micro_batch = 0 : i64} : (tensor<2x3xf32>, tensor<3x2xf32>) -> tensor<2x2xf32>
// CHECK-NEXT: %r_mb0 = lg.reshape %y_mb0 {lg.micro_batch = 0 : i64} : tensor<2x2xf32> -> tensor<2x1x2xf32>
// CHECK-NEXT: %s_mb0 = lg.reshape %r_mb0 {lg.micro_batch = 0 : i64} : tensor<2x1x2xf32> -> tensor<2x2xf32>
// CHECK-NEXT: %loss_mb0 = lg.mse_loss %s_mb0, %t_mb0
// CHECK-NEXT: %y_mb1 = lg.matmul %x_mb1, %w
// CHECK:      %loss_mb1 = lg.mse_loss %s_mb1, %t_mb1
// CHECK-NEXT: %[[SUM:.*]] = lg.add %loss_mb0, %loss_mb1
// CHECK-NEXT: %[[HALF:.*]] = lg.constant dense<5.000000e-01> : tensor<f32>
// CHECK-NEXT: %loss = lg.mul %[[SUM]], %[[HALF]]
// CHECK-NEXT: lg.output ["loss"] %loss : tensor<f32>

// The weight's gradient is the sum of the two micro-batches' contributions.
// GRAD: %[[G1:.*]] = lg.matmul %x_mb1, %{{.*}} transpose_lhs
// GRAD: %[[G0:.*]] = lg.matmul %x_mb0, %{{.*}} transpose_lhs
// GRAD: %[[G:.*]] = lg.add %[[G1]], %[[G0]]
// GRAD: lg.output ["loss", "grad.w"] %loss, %[[G]]

// ONE: %y = lg.matmul %x, %w

// ODD: 'lg.input': lg-micro-batch{count=3}: the batch of 4 does not divide into 3 micro-batches

// A batch-dependent output that is not a scalar cannot be averaged.
// RUN: not sbp-opt -p 'lg-micro-batch{count=2}' < %S/not-scalar.txt 2>&1 | filecheck %s --check-prefix=VEC
// VEC: 'lg.output': lg-micro-batch{count=2}: output "y" depends on the batch but is not a scalar
