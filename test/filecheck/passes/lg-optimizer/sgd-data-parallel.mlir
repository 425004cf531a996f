// RUN: sbp-opt %s -p lg-autodiff,lg-optimizer | filecheck %s
// RUN: sbp-opt %s -p 'lg-autodiff,lg-optimizer{algorithm=momentum}' | filecheck %s --check-prefix=MOMENTUM
// RUN: sbp-opt %s -p lg-autodiff,lg-optimizer,'compile{to_plan=false}' | filecheck %s --check-prefix=DP
// RUN: sbp-opt %s -p lg-autodiff,lg-optimizer,'compile{to_plan=false}' | grep "= sbp\." | filecheck %s --check-prefix=ONLY
// RUN: sbp-opt %s -p lg-autodiff,lg-optimizer,'compile{to_plan=false}' | grep -c "= sbp\." | filecheck %s --check-prefix=ONE
// RUN: not sbp-opt %s -p lg-optimizer 2>&1 | filecheck %s --check-prefix=NOGRAD

// A training step from a forward graph: lg-autodiff adds the gradient,
// lg-optimizer the update with the learning rate as an input. Compiled data
// parallel, the updated weight is tied to the weight's distribution (B), so
// the step has exactly one collective: an all_reduce of the gradient.

sbp.placement @dp cpu ranks [0, 1] mesh [2]
lg.graph @step on @dp {
  %x0 = lg.input "x" : tensor<64x32xf32>
  %x = sbp.annotate %x0 : tensor<64x32xf32> -> !sbp.dtensor<64x32xf32, @dp, S<0>>
  %t = lg.input "t" : tensor<64x16xf32>
  %w = lg.param "w" init #lg.normal<0.0, 0.1> : tensor<32x16xf32>
  %y = lg.matmul %x, %w : (!sbp.dtensor<64x32xf32, @dp, S<0>>, tensor<32x16xf32>) -> tensor<64x16xf32>
  %loss = lg.mse_loss %y, %t : (tensor<64x16xf32>, tensor<64x16xf32>) -> tensor<f32>
  lg.output ["loss"] %loss : tensor<f32>
}

// CHECK:      %lr = lg.input "lr" : tensor<f32>
// CHECK:      %[[G:.*]] = lg.matmul %x, %{{.*}} transpose_lhs
// CHECK-NEXT: %[[STEP:.*]] = lg.mul %[[G]], %lr : (tensor<32x16xf32>, tensor<f32>) -> tensor<32x16xf32>
// CHECK-NEXT: %w_new = lg.sub %w, %[[STEP]] : (tensor<32x16xf32>, tensor<32x16xf32>) -> tensor<32x16xf32>
// CHECK-NEXT: lg.output ["loss", "new.w"] %loss, %w_new : tensor<f32>, tensor<32x16xf32>

// MOMENTUM:      %momentum_w = lg.param "momentum.w" init #lg.zeros : tensor<32x16xf32>
// MOMENTUM:      lg.output ["loss", "new.momentum.w", "new.w"]

// DP:     %w = lg.param "w" {{.*}} : !sbp.dtensor<32x16xf32, @dp, B>
// DP:     lg.output ["loss", "new.w"] %loss, %{{.*}} : {{.*}}, !sbp.dtensor<32x16xf32, @dp, B>
// ONLY:   = sbp.all_reduce %{{[0-9a-z_]+}} over [0] bytes 2048
// ONE:    {{^1$}}

// NOGRAD: 'lg.graph' @step: no grad.<param> outputs: run lg-autodiff first, on a loss computed from a trained parameter
