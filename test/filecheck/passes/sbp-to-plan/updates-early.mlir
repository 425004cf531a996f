// RUN: sbp-opt %s -p compile | filecheck %s

// The data-parallel MLP of bench/train_throughput.py (1024 -> 4096 -> 4096
// -> 1024, batch 256 on 2 ranks, SGD) after lg-autodiff and lg-optimizer.
// The last layer's weight is hinted replicated and its gradient split over
// rows, so its update is computed on the rank's rows and its result
// all-gathered. (Left alone, sbp-infer keeps that weight split and moves
// activations instead, which has no update to gather.) The schedule runs
// an update as soon as its gradient is ready (it reads a local slice of its
// weight, no collective's result): the last layer's update and the
// all-gather of its result come right after its gradient, before the first
// layers' gradients, so the gather overlaps the rest of the backward pass.
// The old weight's last read comes before, so each gathered weight is
// written over it (alias): no copy back after the step.

sbp.placement @cpu2_0_1 cpu ranks [0, 1] mesh [2]
lg.graph @mlp on @cpu2_0_1 {
  %lr = lg.input "lr" : tensor<f32>
  %0 = lg.input "x" : !sbp.dtensor<256x1024xf32, @cpu2_0_1, S<0>>
  %1 = lg.input "y" : !sbp.dtensor<256x1024xf32, @cpu2_0_1, S<0>>
  %2 = lg.param "w0" init #lg.normal<0.0, 0.03125> seed 1 : tensor<1024x4096xf32>
  %3 = lg.matmul %0, %2 : (!sbp.dtensor<256x1024xf32, @cpu2_0_1, S<0>>, tensor<1024x4096xf32>) -> tensor<256x4096xf32>
  %4 = lg.param "b0" init #lg.zeros : tensor<4096xf32>
  %5 = lg.add %3, %4 : (tensor<256x4096xf32>, tensor<4096xf32>) -> tensor<256x4096xf32>
  %6 = lg.relu %5 : tensor<256x4096xf32>
  %7 = lg.param "w1" init #lg.normal<0.0, 0.015625> seed 2 : tensor<4096x4096xf32>
  %8 = lg.matmul %6, %7 : (tensor<256x4096xf32>, tensor<4096x4096xf32>) -> tensor<256x4096xf32>
  %9 = lg.param "b1" init #lg.zeros : tensor<4096xf32>
  %10 = lg.add %8, %9 : (tensor<256x4096xf32>, tensor<4096xf32>) -> tensor<256x4096xf32>
  %11 = lg.relu %10 : tensor<256x4096xf32>
  %12 = lg.param "w2" init #lg.normal<0.0, 0.015625> seed 3 : !sbp.dtensor<4096x1024xf32, @cpu2_0_1, B>
  %13 = lg.matmul %11, %12 : (tensor<256x4096xf32>, !sbp.dtensor<4096x1024xf32, @cpu2_0_1, B>) -> tensor<256x1024xf32>
  %14 = lg.param "b2" init #lg.zeros : tensor<1024xf32>
  %15 = lg.add %13, %14 : (tensor<256x1024xf32>, tensor<1024xf32>) -> tensor<256x1024xf32>
  %16 = lg.mse_loss %15, %1 : (tensor<256x1024xf32>, !sbp.dtensor<256x1024xf32, @cpu2_0_1, S<0>>) -> tensor<f32>
  %17 = lg.constant dense<1.000000e+00> : tensor<f32>
  %18 = lg.sub %15, %1 : (tensor<256x1024xf32>, !sbp.dtensor<256x1024xf32, @cpu2_0_1, S<0>>) -> tensor<256x1024xf32>
  %19 = lg.constant dense<7.62939453e-06> : tensor<f32>
  %20 = lg.mul %17, %19 : (tensor<f32>, tensor<f32>) -> tensor<f32>
  %21 = lg.mul %18, %20 : (tensor<256x1024xf32>, tensor<f32>) -> tensor<256x1024xf32>
  %22 = lg.neg %21 : tensor<256x1024xf32>
  %23 = lg.reduce_sum %21 axes [0] keepdims : tensor<256x1024xf32> -> tensor<1x1024xf32>
  %24 = lg.reshape %23 : tensor<1x1024xf32> -> tensor<1024xf32>
  %25 = lg.matmul %21, %12 transpose_rhs : (tensor<256x1024xf32>, !sbp.dtensor<4096x1024xf32, @cpu2_0_1, B>) -> tensor<256x4096xf32>
  %26 = lg.matmul %11, %21 transpose_lhs : (tensor<256x4096xf32>, tensor<256x1024xf32>) -> !sbp.dtensor<4096x1024xf32, @cpu2_0_1, S<0>>
  %27 = lg.step %10 : tensor<256x4096xf32>
  %28 = lg.mul %25, %27 : (tensor<256x4096xf32>, tensor<256x4096xf32>) -> tensor<256x4096xf32>
  %29 = lg.reduce_sum %28 axes [0] keepdims : tensor<256x4096xf32> -> tensor<1x4096xf32>
  %30 = lg.reshape %29 : tensor<1x4096xf32> -> tensor<4096xf32>
  %31 = lg.matmul %28, %7 transpose_rhs : (tensor<256x4096xf32>, tensor<4096x4096xf32>) -> tensor<256x4096xf32>
  %32 = lg.matmul %6, %28 transpose_lhs : (tensor<256x4096xf32>, tensor<256x4096xf32>) -> tensor<4096x4096xf32>
  %33 = lg.step %5 : tensor<256x4096xf32>
  %34 = lg.mul %31, %33 : (tensor<256x4096xf32>, tensor<256x4096xf32>) -> tensor<256x4096xf32>
  %35 = lg.reduce_sum %34 axes [0] keepdims : tensor<256x4096xf32> -> tensor<1x4096xf32>
  %36 = lg.reshape %35 : tensor<1x4096xf32> -> tensor<4096xf32>
  %37 = lg.matmul %34, %2 transpose_rhs : (tensor<256x4096xf32>, tensor<1024x4096xf32>) -> tensor<256x1024xf32>
  %38 = lg.matmul %0, %34 transpose_lhs : (!sbp.dtensor<256x1024xf32, @cpu2_0_1, S<0>>, tensor<256x4096xf32>) -> tensor<1024x4096xf32>
  %39 = lg.mul %38, %lr : (tensor<1024x4096xf32>, tensor<f32>) -> tensor<1024x4096xf32>
  %w0_new = lg.sub %2, %39 : (tensor<1024x4096xf32>, tensor<1024x4096xf32>) -> tensor<1024x4096xf32>
  %40 = lg.mul %36, %lr : (tensor<4096xf32>, tensor<f32>) -> tensor<4096xf32>
  %b0_new = lg.sub %4, %40 : (tensor<4096xf32>, tensor<4096xf32>) -> tensor<4096xf32>
  %41 = lg.mul %32, %lr : (tensor<4096x4096xf32>, tensor<f32>) -> tensor<4096x4096xf32>
  %w1_new = lg.sub %7, %41 : (tensor<4096x4096xf32>, tensor<4096x4096xf32>) -> tensor<4096x4096xf32>
  %42 = lg.mul %30, %lr : (tensor<4096xf32>, tensor<f32>) -> tensor<4096xf32>
  %b1_new = lg.sub %9, %42 : (tensor<4096xf32>, tensor<4096xf32>) -> tensor<4096xf32>
  %43 = lg.mul %26, %lr : (!sbp.dtensor<4096x1024xf32, @cpu2_0_1, S<0>>, tensor<f32>) -> tensor<4096x1024xf32>
  %w2_new = lg.sub %12, %43 : (!sbp.dtensor<4096x1024xf32, @cpu2_0_1, B>, tensor<4096x1024xf32>) -> tensor<4096x1024xf32>
  %44 = lg.mul %24, %lr : (tensor<1024xf32>, tensor<f32>) -> tensor<1024xf32>
  %b2_new = lg.sub %14, %44 : (tensor<1024xf32>, tensor<1024xf32>) -> tensor<1024xf32>
  lg.output ["loss", "new.w0", "new.b0", "new.w1", "new.b1", "new.w2", "new.b2"] %16, %w0_new, %b0_new, %w1_new, %b1_new, %w2_new, %b2_new : tensor<f32>, tensor<1024x4096xf32>, tensor<4096xf32>, tensor<4096x4096xf32>, tensor<4096xf32>, tensor<4096x1024xf32>, tensor<1024xf32>
}

// CHECK:      plan.device @rank0
// CHECK:      plan.register @[[W2NEW:v[0-9]+]] : tensor<4096x1024xf32> {{.*}} persistent fetch "new.w2" alias @[[W2:v[0-9]+]] of
// CHECK:      plan.compute @[[DW2:v[0-9]+]].matmul "lg.matmul" [@{{v[0-9]+}}, @{{v[0-9]+}}] -> [@[[DW2]]] props {transpose_lhs}
// CHECK-NEXT: plan.comm @[[SLICE:v[0-9]+]].slice "slice" {{.*}} [@[[W2]]] -> [@[[SLICE]]]
// CHECK-NEXT: plan.compute @w2_new.sub "plan.fused" [@[[DW2]], @lr, @[[SLICE]]] -> [@w2_new]
// CHECK-NEXT: plan.comm @[[W2NEW]].all_gather "all_gather" {{.*}} [@w2_new] -> [@[[W2NEW]]]
// CHECK-NEXT: plan.compute @{{v[0-9]+}}.matmul "lg.matmul"
// CHECK:      plan.compute @w1_new.sub
// CHECK:      plan.compute @w0_new.sub
