// RUN: sbp-opt %s -p 'lg-micro-batch{count=2}' | filecheck %s
// RUN: sbp-opt %s -p 'lg-micro-batch{count=2}',lg-autodiff | filecheck %s --check-prefix=GRAD
// RUN: not sbp-opt %s -p 'lg-micro-batch{count=2 schedule=1f1b}' 2>&1 | filecheck %s --check-prefix=ONE-F-ONE-B

// Ops that mix the examples run once, on the whole batch joined from the
// micro-batches (row i*K + k of the batch is row i of micro-batch k), once
// per value (a join's whole-batch result and the inputs serve as they are): a
// running count over the batch axis (a mixture of experts' capacity) is cut
// into micro-batches again; a mean over the batch axis that keeps other axes
// (its load-balancing share) and a matmul that contracts the batch axis (its
// dispatch into the experts' buffers) are whole-batch values that the
// micro-batches share, and what is computed from them alone runs once too.

lg.graph @step {
  %x = lg.input "x" : tensor<4x3xf32>
  %w = lg.param "w" init #lg.normal<0.0, 0.1> : tensor<3x2xf32>
  %y = lg.matmul %x, %w : (tensor<4x3xf32>, tensor<3x2xf32>) -> tensor<4x2xf32>
  %c = lg.cumsum %y axis 0 : tensor<4x2xf32> -> tensor<4x2xf32>
  %share = lg.reduce_mean %y axes [0] : tensor<4x2xf32> -> tensor<2xf32>
  %buffers = lg.matmul %c, %x transpose_lhs : (tensor<4x2xf32>, tensor<4x3xf32>) -> tensor<2x3xf32>
  %e = lg.reduce_sum %buffers axes [0, 1] : tensor<2x3xf32> -> tensor<f32>
  %balance = lg.reduce_sum %share axes [0] : tensor<2xf32> -> tensor<f32>
  %h = lg.matmul %c, %buffers : (tensor<4x2xf32>, tensor<2x3xf32>) -> tensor<4x3xf32>
  %l = lg.reduce_mean %h axes [0, 1] : tensor<4x3xf32> -> tensor<f32>
  %loss = lg.add %l, %balance : (tensor<f32>, tensor<f32>) -> tensor<f32>
  lg.output ["loss", "e"] %loss, %e : tensor<f32>, tensor<f32>
}

// CHECK-LABEL: lg.graph @step
// CHECK:      %y_mb0 = lg.matmul %x_mb0, %w {lg.micro_batch = 0 : i64}
// CHECK-NEXT: %y_mb1 = lg.matmul %x_mb1, %w {lg.micro_batch = 1 : i64}
// CHECK-NEXT: %[[Y0:.*]] = lg.reshape %y_mb0 : tensor<2x2xf32> -> tensor<2x1x1x2xf32>
// CHECK-NEXT: %[[Y1:.*]] = lg.reshape %y_mb1 : tensor<2x2xf32> -> tensor<2x1x1x2xf32>
// CHECK-NEXT: %[[YJ:.*]] = lg.concat %[[Y0]], %[[Y1]] axis 1 : (tensor<2x1x1x2xf32>, tensor<2x1x1x2xf32>) -> tensor<2x2x1x2xf32>
// CHECK-NEXT: %[[Y:.*]] = lg.reshape %[[YJ]] : tensor<2x2x1x2xf32> -> tensor<4x2xf32>
// CHECK-NEXT: %c = lg.cumsum %[[Y]] axis 0 : tensor<4x2xf32> -> tensor<4x2xf32>
// CHECK-NEXT: %[[CG:.*]] = lg.reshape %c : tensor<4x2xf32> -> tensor<2x2x2xf32>
// CHECK-NEXT: %[[C0:.*]] = lg.slice %[[CG]] starts [0, 0, 0] limits [2, 1, 2] strides [1, 1, 1] {lg.micro_batch = 0 : i64}
// CHECK-NEXT: %c_mb0 = lg.reshape %[[C0]] {lg.micro_batch = 0 : i64} : tensor<2x1x2xf32> -> tensor<2x2xf32>
// CHECK-NEXT: %[[C1:.*]] = lg.slice %[[CG]] starts [0, 1, 0] limits [2, 2, 2] strides [1, 1, 1] {lg.micro_batch = 1 : i64}
// CHECK-NEXT: %c_mb1 = lg.reshape %[[C1]] {lg.micro_batch = 1 : i64} : tensor<2x1x2xf32> -> tensor<2x2xf32>
// CHECK-NEXT: %share = lg.reduce_mean %[[Y]] axes [0] : tensor<4x2xf32> -> tensor<2xf32>
// CHECK-NEXT: %buffers = lg.matmul %c, %x transpose_lhs : (tensor<4x2xf32>, tensor<4x3xf32>) -> tensor<2x3xf32>
// CHECK-NEXT: %e = lg.reduce_sum %buffers axes [0, 1]
// CHECK-NEXT: %balance = lg.reduce_sum %share axes [0]
// CHECK-NEXT: %h_mb0 = lg.matmul %c_mb0, %buffers {lg.micro_batch = 0 : i64} : (tensor<2x2xf32>, tensor<2x3xf32>) -> tensor<2x3xf32>
// CHECK-NEXT: %l_mb0 = lg.reduce_mean %h_mb0
// CHECK-NEXT: %loss_mb0 = lg.add %l_mb0, %balance {lg.micro_batch = 0 : i64}
// CHECK-NEXT: %h_mb1 = lg.matmul %c_mb1, %buffers {lg.micro_batch = 1 : i64}
// CHECK:      %loss_mb1 = lg.add %l_mb1, %balance {lg.micro_batch = 1 : i64}
// CHECK-NEXT: %[[SUM:.*]] = lg.add %loss_mb0, %loss_mb1
// CHECK-NEXT: %[[HALF:.*]] = lg.constant dense<5.000000e-01> : tensor<f32>
// CHECK-NEXT: %loss = lg.mul %[[SUM]], %[[HALF]]
// CHECK-NEXT: lg.output ["loss", "e"] %loss, %e : tensor<f32>, tensor<f32>

// The weight's gradient reaches each micro-batch's matmul through the joins.
// GRAD: %[[G0:.*]] = lg.matmul %x_mb0, %{{.*}} transpose_lhs
// GRAD: lg.output ["loss", "e", "grad.w"]

// ONE-F-ONE-B: 'lg.cumsum': lg-micro-batch{count=2}: it mixes the examples of the batch, so it runs once on the whole batch after every micro-batch's forward up to it, which the 1f1b schedule (a backward before the last forward) cannot order; use gpipe
