// RUN: sbp-opt %s -p lg-autodiff | filecheck %s
// RUN: sbp-opt %s -p lg-autodiff,sbp-infer | filecheck %s --check-prefix=DP

// The backward of a linear layer with a relu and an MSE loss: the loss's
// seed 1.0, mse's 2/N (a - b), relu's step mask (of its output), then the matmul's two
// products. %w is used twice (matmul and a penalty), so its gradient adds
// the two contributions. Under a batch split, sbp-infer makes the weight
// gradient a partial sum, as data parallelism needs.

sbp.placement @dp cpu ranks [0, 1] mesh [2]
lg.graph @linear on @dp {
  %x0 = lg.input "x" : tensor<8x4xf32>
  %x = sbp.annotate %x0 : tensor<8x4xf32> -> !sbp.dtensor<8x4xf32, @dp, S<0>>
  %t = lg.input "t" : tensor<8x2xf32>
  %w = lg.param "w" init #lg.normal<0.0, 0.1> : tensor<4x2xf32>
  %y = lg.matmul %x, %w : (!sbp.dtensor<8x4xf32, @dp, S<0>>, tensor<4x2xf32>) -> tensor<8x2xf32>
  %r = lg.relu %y : tensor<8x2xf32>
  %l = lg.mse_loss %r, %t : (tensor<8x2xf32>, tensor<8x2xf32>) -> tensor<f32>
  %p = lg.mse_loss %w, %w : (tensor<4x2xf32>, tensor<4x2xf32>) -> tensor<f32>
  %loss = lg.add %l, %p : (tensor<f32>, tensor<f32>) -> tensor<f32>
  lg.output ["loss"] %loss : tensor<f32>
}

// CHECK:      %[[ONE:.*]] = lg.constant dense<1.000000e+00> : tensor<f32>
// CHECK:      %[[SCALE:.*]] = lg.constant dense<1.250000e-01> : tensor<f32>
// CHECK:      %[[STEP:.*]] = lg.step %r : tensor<8x2xf32>
// CHECK-NEXT: %[[DY:.*]] = lg.mul %{{.*}}, %[[STEP]] : (tensor<8x2xf32>, tensor<8x2xf32>) -> tensor<8x2xf32>
// CHECK-NEXT: %{{.*}} = lg.matmul %[[DY]], %w transpose_rhs : (tensor<8x2xf32>, tensor<4x2xf32>) -> tensor<8x4xf32>
// CHECK-NEXT: %[[DW:.*]] = lg.matmul %x, %[[DY]] transpose_lhs : (!sbp.dtensor<8x4xf32, @dp, S<0>>, tensor<8x2xf32>) -> tensor<4x2xf32>
// CHECK-NEXT: %[[ACC:.*]] = lg.add %{{.*}}, %[[DW]] : (tensor<4x2xf32>, tensor<4x2xf32>) -> tensor<4x2xf32>
// CHECK-NEXT: lg.output ["loss", "grad.w"] %loss, %[[ACC]] : tensor<f32>, tensor<4x2xf32>

// DP: lg.matmul %x, %{{.*}} transpose_lhs {sbp.signature = #sbp.sig<(S<0>, S<0>) -> (P)>}
