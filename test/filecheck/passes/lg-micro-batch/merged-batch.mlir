// RUN: sbp-opt %s -p 'lg-micro-batch{count=2}' | filecheck %s
// RUN: not sbp-opt -p 'lg-micro-batch{count=2}' < %S/batch-moved.txt 2>&1 | filecheck %s --check-prefix=MOVED

// Hugging Face's linear layers flatten (B, T, D) to (B*T, D) and back
// (`view(-1, hidden)`): axis 0 then holds T rows per example, in example
// order, and a micro-batch of B/K examples holds (B/K)*T of them. Written
// shapes and slice limits follow.

lg.graph @step {
  %x = lg.input "x" : tensor<4x3x2xf32>
  %w = lg.param "w" init #lg.normal<0.0, 0.1> : tensor<2x2xf32>
  %f = lg.reshape %x : tensor<4x3x2xf32> -> tensor<12x2xf32>
  %y = lg.matmul %f, %w : (tensor<12x2xf32>, tensor<2x2xf32>) -> tensor<12x2xf32>
  %s = lg.slice %y starts [0, 0] limits [12, 1] strides [1, 1] : tensor<12x2xf32> -> tensor<12x1xf32>
  %b = lg.reshape %s : tensor<12x1xf32> -> tensor<4x3xf32>
  %loss = lg.reduce_mean %b axes [0, 1] : tensor<4x3xf32> -> tensor<f32>
  lg.output ["loss"] %loss : tensor<f32>
}

// CHECK:      %f_mb0 = lg.reshape %x_mb0 {lg.micro_batch = 0 : i64} : tensor<2x3x2xf32> -> tensor<6x2xf32>
// CHECK-NEXT: %y_mb0 = lg.matmul %f_mb0, %w {lg.micro_batch = 0 : i64} : (tensor<6x2xf32>, tensor<2x2xf32>) -> tensor<6x2xf32>
// CHECK-NEXT: %s_mb0 = lg.slice %y_mb0 starts [0, 0] limits [6, 1] strides [1, 1] {lg.micro_batch = 0 : i64} : tensor<6x2xf32> -> tensor<6x1xf32>
// CHECK-NEXT: %b_mb0 = lg.reshape %s_mb0 {lg.micro_batch = 0 : i64} : tensor<6x1xf32> -> tensor<2x3xf32>
// CHECK:      %f_mb1 = lg.reshape %x_mb1 {lg.micro_batch = 1 : i64} : tensor<2x3x2xf32> -> tensor<6x2xf32>

// A transpose that moves the batch off axis 0 is refused, even where the
// shape alone would pass (a 4x4 batch of 4).
// MOVED: 'lg.transpose': lg-micro-batch{count=2}: a value that depends on the batch must keep it as axis 0 (size 4, or a multiple after a reshape merges it with the axes after it) or be a scalar: a transpose that moves axis 0 gives shape [4, 4]
