// RUN: sbp-opt %s -p 'lg-micro-batch{count=2}' | filecheck %s

// A loss that is a ratio of two sums over the batch (a cross-entropy's
// total over the count of labels not ignored) is combined as the batch's
// ratio: the micro-batches' totals summed over their counts summed, not
// the mean of their ratios. Their own ratios go.

lg.graph @step {
  %x = lg.input "x" : tensor<4x3xf32>
  %m = lg.input "m" : tensor<4x3xf32>
  %l = lg.mul %x, %m : (tensor<4x3xf32>, tensor<4x3xf32>) -> tensor<4x3xf32>
  %total = lg.reduce_sum %l axes [0, 1] : tensor<4x3xf32> -> tensor<f32>
  %count = lg.reduce_sum %m axes [0, 1] : tensor<4x3xf32> -> tensor<f32>
  %loss = lg.div %total, %count : (tensor<f32>, tensor<f32>) -> tensor<f32>
  lg.output ["loss"] %loss : tensor<f32>
}

// CHECK:      %total_mb0 = lg.reduce_sum %l_mb0
// CHECK-NEXT: %count_mb0 = lg.reduce_sum %m_mb0
// CHECK-NOT:  lg.div %total_mb0
// CHECK:      %total_mb1 = lg.reduce_sum %l_mb1
// CHECK-NEXT: %count_mb1 = lg.reduce_sum %m_mb1
// CHECK-NEXT: %[[T:.*]] = lg.add %total_mb0, %total_mb1
// CHECK-NEXT: %[[C:.*]] = lg.add %count_mb0, %count_mb1
// CHECK-NEXT: %loss = lg.div %[[T]], %[[C]]
// CHECK-NEXT: lg.output ["loss"] %loss : tensor<f32>
