// RUN: sbp-opt %s --split-input-file -p sbp-fuse-norms | filecheck %s

// Layernorm's gradient as lg-autodiff emits it (LayerNormOp.gradient), laid
// out by sbp-infer: the statistics recomputed from %h, the input's gradient
// from the normalized value's (%dy times the weight) and the weight's
// gradient (%dy times the normalized %h, summed). Rows split over the batch:
// the input's gradient becomes one lg.layernorm_grad, and the statistics,
// which the weight's gradient still reads, one lg.layernorm without affine
// part; each keeps the value's type and records its signature.

sbp.placement @two cpu ranks [0, 1] mesh [2]
lg.graph @rows on @two {
  %h = lg.input "h" : !sbp.dtensor<8x16xf32, @two, S<0>>
  %dy = lg.input "dy" : !sbp.dtensor<8x16xf32, @two, S<0>>
  %w = lg.param "w" init #lg.ones : !sbp.dtensor<16xf32, @two, B>
  %mean = lg.reduce_mean %h axes [1] keepdims : !sbp.dtensor<8x16xf32, @two, S<0>> -> !sbp.dtensor<8x1xf32, @two, S<0>>
  %xc = lg.sub %h, %mean : (!sbp.dtensor<8x16xf32, @two, S<0>>, !sbp.dtensor<8x1xf32, @two, S<0>>) -> !sbp.dtensor<8x16xf32, @two, S<0>>
  %sq = lg.mul %xc, %xc : (!sbp.dtensor<8x16xf32, @two, S<0>>, !sbp.dtensor<8x16xf32, @two, S<0>>) -> !sbp.dtensor<8x16xf32, @two, S<0>>
  %var = lg.reduce_mean %sq axes [1] keepdims : !sbp.dtensor<8x16xf32, @two, S<0>> -> !sbp.dtensor<8x1xf32, @two, S<0>>
  %eps = lg.constant dense<1.000000e-05> : tensor<f32> -> !sbp.dtensor<f32, @two, B>
  %ve = lg.add %var, %eps : (!sbp.dtensor<8x1xf32, @two, S<0>>, !sbp.dtensor<f32, @two, B>) -> !sbp.dtensor<8x1xf32, @two, S<0>>
  %r = lg.rsqrt %ve : !sbp.dtensor<8x1xf32, @two, S<0>>
  %xhat = lg.mul %xc, %r : (!sbp.dtensor<8x16xf32, @two, S<0>>, !sbp.dtensor<8x1xf32, @two, S<0>>) -> !sbp.dtensor<8x16xf32, @two, S<0>>
  %dxhat = lg.mul %dy, %w : (!sbp.dtensor<8x16xf32, @two, S<0>>, !sbp.dtensor<16xf32, @two, B>) -> !sbp.dtensor<8x16xf32, @two, S<0>>
  %gx = lg.mul %dy, %xhat : (!sbp.dtensor<8x16xf32, @two, S<0>>, !sbp.dtensor<8x16xf32, @two, S<0>>) -> !sbp.dtensor<8x16xf32, @two, S<0>>
  %gw = lg.reduce_sum %gx axes [0] : !sbp.dtensor<8x16xf32, @two, S<0>> -> !sbp.dtensor<16xf32, @two, P>
  %m1 = lg.reduce_mean %dxhat axes [1] keepdims : !sbp.dtensor<8x16xf32, @two, S<0>> -> !sbp.dtensor<8x1xf32, @two, S<0>>
  %p = lg.mul %dxhat, %xhat : (!sbp.dtensor<8x16xf32, @two, S<0>>, !sbp.dtensor<8x16xf32, @two, S<0>>) -> !sbp.dtensor<8x16xf32, @two, S<0>>
  %m2 = lg.reduce_mean %p axes [1] keepdims : !sbp.dtensor<8x16xf32, @two, S<0>> -> !sbp.dtensor<8x1xf32, @two, S<0>>
  %c = lg.sub %dxhat, %m1 : (!sbp.dtensor<8x16xf32, @two, S<0>>, !sbp.dtensor<8x1xf32, @two, S<0>>) -> !sbp.dtensor<8x16xf32, @two, S<0>>
  %q = lg.mul %xhat, %m2 : (!sbp.dtensor<8x16xf32, @two, S<0>>, !sbp.dtensor<8x1xf32, @two, S<0>>) -> !sbp.dtensor<8x16xf32, @two, S<0>>
  %d = lg.sub %c, %q : (!sbp.dtensor<8x16xf32, @two, S<0>>, !sbp.dtensor<8x16xf32, @two, S<0>>) -> !sbp.dtensor<8x16xf32, @two, S<0>>
  %dx = lg.mul %r, %d : (!sbp.dtensor<8x1xf32, @two, S<0>>, !sbp.dtensor<8x16xf32, @two, S<0>>) -> !sbp.dtensor<8x16xf32, @two, S<0>>
  lg.output ["dx", "gw"] %dx, %gw : !sbp.dtensor<8x16xf32, @two, S<0>>, !sbp.dtensor<16xf32, @two, P>
}
// CHECK-LABEL: lg.graph @rows
// CHECK:       %w = lg.param
// CHECK-NEXT:  %[[N:.*]] = lg.layernorm %h axis 1 eps 9.99999974737875{{[0-9]*}}e-06 {sbp.signature = #sbp.sig<(S<0>) -> (S<0>)>} : !sbp.dtensor<8x16xf32, @two, S<0>>
// CHECK-NEXT:  %dxhat = lg.mul %dy, %w
// CHECK-NEXT:  %gx = lg.mul %dy, %[[N]]
// CHECK-NEXT:  %gw = lg.reduce_sum %gx
// CHECK-NEXT:  %[[DX:.*]] = lg.layernorm_grad %h, %dxhat axis 1 eps 9.99999974737875{{[0-9]*}}e-06 {sbp.signature = #sbp.sig<(S<0>, S<0>) -> (S<0>)>} : (!sbp.dtensor<8x16xf32, @two, S<0>>, !sbp.dtensor<8x16xf32, @two, S<0>>) -> !sbp.dtensor<8x16xf32, @two, S<0>>
// CHECK-NEXT:  lg.output ["dx", "gw"] %[[DX]], %gw

// -----

// The normalized value's gradient partial (a row-split matmul's input
// gradient, as in Megatron's MLP), the rows whole: the input's gradient is
// linear in it, so lg.layernorm_grad takes it partial and gives a partial
// result. No weight: the gradient is the normalized value's, and once the
// input's gradient is fused nothing reads the statistics.

sbp.placement @two cpu ranks [0, 1] mesh [2]
lg.graph @partial on @two {
  %h = lg.input "h" : !sbp.dtensor<8x16xf32, @two, B>
  %dy = lg.input "dy" : !sbp.dtensor<8x16xf32, @two, P>
  %mean = lg.reduce_mean %h axes [1] keepdims : !sbp.dtensor<8x16xf32, @two, B> -> !sbp.dtensor<8x1xf32, @two, B>
  %xc = lg.sub %h, %mean : (!sbp.dtensor<8x16xf32, @two, B>, !sbp.dtensor<8x1xf32, @two, B>) -> !sbp.dtensor<8x16xf32, @two, B>
  %sq = lg.mul %xc, %xc : (!sbp.dtensor<8x16xf32, @two, B>, !sbp.dtensor<8x16xf32, @two, B>) -> !sbp.dtensor<8x16xf32, @two, B>
  %var = lg.reduce_mean %sq axes [1] keepdims : !sbp.dtensor<8x16xf32, @two, B> -> !sbp.dtensor<8x1xf32, @two, B>
  %eps = lg.constant dense<1.000000e-05> : tensor<f32> -> !sbp.dtensor<f32, @two, B>
  %ve = lg.add %var, %eps : (!sbp.dtensor<8x1xf32, @two, B>, !sbp.dtensor<f32, @two, B>) -> !sbp.dtensor<8x1xf32, @two, B>
  %r = lg.rsqrt %ve : !sbp.dtensor<8x1xf32, @two, B>
  %xhat = lg.mul %xc, %r : (!sbp.dtensor<8x16xf32, @two, B>, !sbp.dtensor<8x1xf32, @two, B>) -> !sbp.dtensor<8x16xf32, @two, B>
  %m1 = lg.reduce_mean %dy axes [1] keepdims : !sbp.dtensor<8x16xf32, @two, P> -> !sbp.dtensor<8x1xf32, @two, P>
  %p = lg.mul %dy, %xhat : (!sbp.dtensor<8x16xf32, @two, P>, !sbp.dtensor<8x16xf32, @two, B>) -> !sbp.dtensor<8x16xf32, @two, P>
  %m2 = lg.reduce_mean %p axes [1] keepdims : !sbp.dtensor<8x16xf32, @two, P> -> !sbp.dtensor<8x1xf32, @two, P>
  %c = lg.sub %dy, %m1 : (!sbp.dtensor<8x16xf32, @two, P>, !sbp.dtensor<8x1xf32, @two, P>) -> !sbp.dtensor<8x16xf32, @two, P>
  %q = lg.mul %xhat, %m2 : (!sbp.dtensor<8x16xf32, @two, B>, !sbp.dtensor<8x1xf32, @two, P>) -> !sbp.dtensor<8x16xf32, @two, P>
  %d = lg.sub %c, %q : (!sbp.dtensor<8x16xf32, @two, P>, !sbp.dtensor<8x16xf32, @two, P>) -> !sbp.dtensor<8x16xf32, @two, P>
  %dx = lg.mul %r, %d : (!sbp.dtensor<8x1xf32, @two, B>, !sbp.dtensor<8x16xf32, @two, P>) -> !sbp.dtensor<8x16xf32, @two, P>
  lg.output ["dx"] %dx : !sbp.dtensor<8x16xf32, @two, P>
}
// CHECK-LABEL: lg.graph @partial
// CHECK-NEXT:  %h = lg.input "h"
// CHECK-NEXT:  %dy = lg.input "dy"
// CHECK-NEXT:  %[[DX:.*]] = lg.layernorm_grad %h, %dy axis 1 eps {{.*}} {sbp.signature = #sbp.sig<(B, P) -> (P)>}
// CHECK-NEXT:  lg.output ["dx"] %[[DX]]

// -----

// The normalized axis split (a tensor-parallel activation): each row's
// sums are partial, and all_reduce makes them whole between the ops. No
// fused kernel sees a whole row there: nothing is fused.

sbp.placement @two cpu ranks [0, 1] mesh [2]
lg.graph @split_rows on @two {
  %h = lg.input "h" : !sbp.dtensor<8x16xf32, @two, S<1>>
  %dy = lg.input "dy" : !sbp.dtensor<8x16xf32, @two, S<1>>
  %mp = lg.reduce_mean %h axes [1] keepdims : !sbp.dtensor<8x16xf32, @two, S<1>> -> !sbp.dtensor<8x1xf32, @two, P>
  %mean = sbp.all_reduce %mp over [0] bytes 32 : !sbp.dtensor<8x1xf32, @two, P> -> !sbp.dtensor<8x1xf32, @two, B>
  %xc = lg.sub %h, %mean : (!sbp.dtensor<8x16xf32, @two, S<1>>, !sbp.dtensor<8x1xf32, @two, B>) -> !sbp.dtensor<8x16xf32, @two, S<1>>
  %sq = lg.mul %xc, %xc : (!sbp.dtensor<8x16xf32, @two, S<1>>, !sbp.dtensor<8x16xf32, @two, S<1>>) -> !sbp.dtensor<8x16xf32, @two, S<1>>
  %vp = lg.reduce_mean %sq axes [1] keepdims : !sbp.dtensor<8x16xf32, @two, S<1>> -> !sbp.dtensor<8x1xf32, @two, P>
  %var = sbp.all_reduce %vp over [0] bytes 32 : !sbp.dtensor<8x1xf32, @two, P> -> !sbp.dtensor<8x1xf32, @two, B>
  %eps = lg.constant dense<1.000000e-05> : tensor<f32> -> !sbp.dtensor<f32, @two, B>
  %ve = lg.add %var, %eps : (!sbp.dtensor<8x1xf32, @two, B>, !sbp.dtensor<f32, @two, B>) -> !sbp.dtensor<8x1xf32, @two, B>
  %r = lg.rsqrt %ve : !sbp.dtensor<8x1xf32, @two, B>
  %xhat = lg.mul %xc, %r : (!sbp.dtensor<8x16xf32, @two, S<1>>, !sbp.dtensor<8x1xf32, @two, B>) -> !sbp.dtensor<8x16xf32, @two, S<1>>
  %m1p = lg.reduce_mean %dy axes [1] keepdims : !sbp.dtensor<8x16xf32, @two, S<1>> -> !sbp.dtensor<8x1xf32, @two, P>
  %m1 = sbp.all_reduce %m1p over [0] bytes 32 : !sbp.dtensor<8x1xf32, @two, P> -> !sbp.dtensor<8x1xf32, @two, B>
  %p = lg.mul %dy, %xhat : (!sbp.dtensor<8x16xf32, @two, S<1>>, !sbp.dtensor<8x16xf32, @two, S<1>>) -> !sbp.dtensor<8x16xf32, @two, S<1>>
  %m2p = lg.reduce_mean %p axes [1] keepdims : !sbp.dtensor<8x16xf32, @two, S<1>> -> !sbp.dtensor<8x1xf32, @two, P>
  %m2 = sbp.all_reduce %m2p over [0] bytes 32 : !sbp.dtensor<8x1xf32, @two, P> -> !sbp.dtensor<8x1xf32, @two, B>
  %c = lg.sub %dy, %m1 : (!sbp.dtensor<8x16xf32, @two, S<1>>, !sbp.dtensor<8x1xf32, @two, B>) -> !sbp.dtensor<8x16xf32, @two, S<1>>
  %q = lg.mul %xhat, %m2 : (!sbp.dtensor<8x16xf32, @two, S<1>>, !sbp.dtensor<8x1xf32, @two, B>) -> !sbp.dtensor<8x16xf32, @two, S<1>>
  %d = lg.sub %c, %q : (!sbp.dtensor<8x16xf32, @two, S<1>>, !sbp.dtensor<8x16xf32, @two, S<1>>) -> !sbp.dtensor<8x16xf32, @two, S<1>>
  %dx = lg.mul %r, %d : (!sbp.dtensor<8x1xf32, @two, B>, !sbp.dtensor<8x16xf32, @two, S<1>>) -> !sbp.dtensor<8x16xf32, @two, S<1>>
  lg.output ["dx"] %dx : !sbp.dtensor<8x16xf32, @two, S<1>>
}
// CHECK-LABEL: lg.graph @split_rows
// CHECK-NOT:   lg.layernorm
// CHECK:       %r = lg.rsqrt %ve
// CHECK-NOT:   lg.layernorm
// CHECK:       %dx = lg.mul %r, %d
// CHECK-NOT:   lg.layernorm
// CHECK:       lg.output ["dx"] %dx

// -----

// Each row whole, but a statistic of the gradient read outside it (%m1 is
// an output too): fusing would compute it twice. Nothing is fused: the
// normalization keeps its readers.

sbp.placement @two cpu ranks [0, 1] mesh [2]
lg.graph @read_outside on @two {
  %h = lg.input "h" : tensor<8x16xf32>
  %dy = lg.input "dy" : tensor<8x16xf32>
  %mean = lg.reduce_mean %h axes [1] keepdims : tensor<8x16xf32> -> tensor<8x1xf32>
  %xc = lg.sub %h, %mean : (tensor<8x16xf32>, tensor<8x1xf32>) -> tensor<8x16xf32>
  %sq = lg.mul %xc, %xc : (tensor<8x16xf32>, tensor<8x16xf32>) -> tensor<8x16xf32>
  %var = lg.reduce_mean %sq axes [1] keepdims : tensor<8x16xf32> -> tensor<8x1xf32>
  %eps = lg.constant dense<1.000000e-05> : tensor<f32>
  %ve = lg.add %var, %eps : (tensor<8x1xf32>, tensor<f32>) -> tensor<8x1xf32>
  %r = lg.rsqrt %ve : tensor<8x1xf32>
  %xhat = lg.mul %xc, %r : (tensor<8x16xf32>, tensor<8x1xf32>) -> tensor<8x16xf32>
  %m1 = lg.reduce_mean %dy axes [1] keepdims : tensor<8x16xf32> -> tensor<8x1xf32>
  %p = lg.mul %dy, %xhat : (tensor<8x16xf32>, tensor<8x16xf32>) -> tensor<8x16xf32>
  %m2 = lg.reduce_mean %p axes [1] keepdims : tensor<8x16xf32> -> tensor<8x1xf32>
  %c = lg.sub %dy, %m1 : (tensor<8x16xf32>, tensor<8x1xf32>) -> tensor<8x16xf32>
  %q = lg.mul %xhat, %m2 : (tensor<8x16xf32>, tensor<8x1xf32>) -> tensor<8x16xf32>
  %d = lg.sub %c, %q : (tensor<8x16xf32>, tensor<8x16xf32>) -> tensor<8x16xf32>
  %dx = lg.mul %r, %d : (tensor<8x1xf32>, tensor<8x16xf32>) -> tensor<8x16xf32>
  lg.output ["dx", "m1"] %dx, %m1 : tensor<8x16xf32>, tensor<8x1xf32>
}
// CHECK-LABEL: lg.graph @read_outside
// CHECK-NOT:   lg.layernorm
// CHECK:       %dx = lg.mul %r, %d
// CHECK-NEXT:  lg.output ["dx", "m1"] %dx, %m1

// -----

// In bfloat16 each op rounds its result to 16 bits; a fused kernel would
// keep a row's sums in float32 and compute something else. Nothing is fused.

sbp.placement @two cpu ranks [0, 1] mesh [2]
lg.graph @half on @two {
  %h = lg.input "h" : tensor<8x16xbf16>
  %dy = lg.input "dy" : tensor<8x16xbf16>
  %mean = lg.reduce_mean %h axes [1] keepdims : tensor<8x16xbf16> -> tensor<8x1xbf16>
  %xc = lg.sub %h, %mean : (tensor<8x16xbf16>, tensor<8x1xbf16>) -> tensor<8x16xbf16>
  %sq = lg.mul %xc, %xc : (tensor<8x16xbf16>, tensor<8x16xbf16>) -> tensor<8x16xbf16>
  %var = lg.reduce_mean %sq axes [1] keepdims : tensor<8x16xbf16> -> tensor<8x1xbf16>
  %eps = lg.constant dense<1.000000e-05> : tensor<bf16>
  %ve = lg.add %var, %eps : (tensor<8x1xbf16>, tensor<bf16>) -> tensor<8x1xbf16>
  %r = lg.rsqrt %ve : tensor<8x1xbf16>
  %xhat = lg.mul %xc, %r : (tensor<8x16xbf16>, tensor<8x1xbf16>) -> tensor<8x16xbf16>
  %m1 = lg.reduce_mean %dy axes [1] keepdims : tensor<8x16xbf16> -> tensor<8x1xbf16>
  %p = lg.mul %dy, %xhat : (tensor<8x16xbf16>, tensor<8x16xbf16>) -> tensor<8x16xbf16>
  %m2 = lg.reduce_mean %p axes [1] keepdims : tensor<8x16xbf16> -> tensor<8x1xbf16>
  %c = lg.sub %dy, %m1 : (tensor<8x16xbf16>, tensor<8x1xbf16>) -> tensor<8x16xbf16>
  %q = lg.mul %xhat, %m2 : (tensor<8x16xbf16>, tensor<8x1xbf16>) -> tensor<8x16xbf16>
  %d = lg.sub %c, %q : (tensor<8x16xbf16>, tensor<8x16xbf16>) -> tensor<8x16xbf16>
  %dx = lg.mul %r, %d : (tensor<8x1xbf16>, tensor<8x16xbf16>) -> tensor<8x16xbf16>
  lg.output ["dx"] %dx : tensor<8x16xbf16>
}
// CHECK-LABEL: lg.graph @half
// CHECK-NOT:   lg.layernorm
// CHECK:       %dx = lg.mul %r, %d
// CHECK-NEXT:  lg.output ["dx"] %dx
