// RUN: sbp-opt %s -p lg-autodiff,'compile{to_plan=false}' | filecheck %s
// RUN: sbp-opt %s -p lg-autodiff,'compile{to_plan=false fuse=false}' | filecheck %s --check-prefix=NOFUSE
// RUN: sbp-opt %s -p lg-autodiff,compile | filecheck %s --check-prefix=PLAN

// A layernorm trained data parallel: lg-autodiff emits its gradient as
// single ops, sbp-infer splits the rows over the batch, and compile's
// sbp-fuse-norms (with `fuse`, the default) makes the input's gradient one
// lg.layernorm_grad and the statistics the weight's gradient reads one
// lg.layernorm; the plan runs them as kernels of their own.

sbp.placement @two cpu ranks [0, 1] mesh [2]
lg.graph @dp on @two {
  %x = lg.input "x" : !sbp.dtensor<8x16xf32, @two, S<0>>
  %m = lg.param "m" init #lg.ones : tensor<16x16xf32>
  %w = lg.param "w" init #lg.ones : tensor<16xf32>
  %b = lg.param "b" init #lg.zeros : tensor<16xf32>
  %h = lg.matmul %x, %m : (!sbp.dtensor<8x16xf32, @two, S<0>>, tensor<16x16xf32>) -> tensor<8x16xf32>
  %y = lg.layernorm %h weight %w : tensor<16xf32> bias %b : tensor<16xf32> axis 1 eps 1.0e-05 : tensor<8x16xf32>
  %s = lg.mul %y, %y : (tensor<8x16xf32>, tensor<8x16xf32>) -> tensor<8x16xf32>
  %l = lg.reduce_mean %s axes [0, 1] : tensor<8x16xf32> -> tensor<f32>
  lg.output ["loss"] %l : tensor<f32>
}
// CHECK-LABEL: lg.graph @dp
// CHECK:       %y = lg.layernorm %h weight %w
// CHECK-NOT:   lg.rsqrt
// CHECK:       lg.layernorm %h axis 1 eps {{.*}} {sbp.signature = #sbp.sig<(S<0>) -> (S<0>)>}
// CHECK-NOT:   lg.rsqrt
// CHECK:       lg.layernorm_grad %h, %{{.*}} axis 1 eps {{.*}} {sbp.signature = #sbp.sig<(S<0>, S<0>) -> (S<0>)>}
// CHECK-NOT:   lg.rsqrt
// CHECK:       lg.output ["loss", "grad.m", "grad.w", "grad.b"]

// NOFUSE-LABEL: lg.graph @dp
// NOFUSE-NOT:   lg.layernorm_grad
// NOFUSE:       lg.rsqrt
// NOFUSE-NOT:   lg.layernorm_grad
// NOFUSE:       lg.output ["loss", "grad.m", "grad.w", "grad.b"]

// PLAN:      plan.device @rank0 rank 0
// PLAN:      plan.compute @{{.*}} "lg.layernorm" [@h] -> [@{{.*}}] props {axis = 1 : i64, epsilon = {{.*}}, operandSegmentSizes = array<i32: 1, 0, 0>}
// PLAN:      plan.compute @{{.*}} "lg.layernorm_grad" [@h, @{{.*}}] -> [@{{.*}}] props {axis = 1 : i64, epsilon = {{.*}}}
