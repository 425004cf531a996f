// RUN: sbp-opt %s -p 'compile{bucket=false device=h100}' | filecheck %s
// RUN: sbp-opt %s -p 'compile{bucket=false}' | filecheck %s --check-prefix=ONE-LANE

// A step on a 2x2 mesh (data x tensor) reduced to its waits: a bias
// gradient reduced over the data axis, reshaped and used by its update; an
// activation gradient reduced over the tensor axis, with the rest of the
// backward pass (four tanh, a weight gradient) behind it; a bf16 weight
// cast for its update. Both reductions are issued first. Then, on a device
// that runs each group's collectives on a stream of its own (the H100
// preset: NCCL), the tensor axis's may finish before the data axis's
// issued earlier, so of the ops that wait for a collective the one with
// the longer chain behind it goes first: the backward pass, not the bias
// update (program order would run the update first, and the thread would
// wait for the data axis in the middle of the backward); the updates then
// go in the order their reductions were issued. On one lane (the MPI
// runtime: `cpu`) collectives finish in the order they are issued, and
// program order keeps to it. On both, the weight's cast, made from a
// parameter alone, is not run first (its copy would live the whole step):
// it waits for the reduction of the gradient its update reads. (The
// partial results are hinted: tensors this small would be gathered whole
// rather than reduced, under the prices the simulator charges.)

sbp.placement @m cpu ranks [0, 1, 2, 3] mesh [2, 2]
lg.graph @step on @m {
  %lr = lg.input "lr" : tensor<f32>
  %x = lg.input "x" : !sbp.dtensor<8x4xf32, @m, [S<0>, B]>
  %d = lg.input "d" : !sbp.dtensor<8x4xf32, @m, [S<0>, S<1>]>
  %v = lg.param "v" init #lg.normal<0.0, 0.1> : !sbp.dtensor<4x4xf32, @m, [B, S<0>]>
  %b = lg.param "b" init #lg.zeros : !sbp.dtensor<4xf32, @m, [B, B]>
  %w = lg.param "w" init #lg.normal<0.0, 0.1> : !sbp.dtensor<4x4xbf16, @m, [B, B]>
  %gb = lg.reduce_sum %x axes [0] keepdims : !sbp.dtensor<8x4xf32, @m, [S<0>, B]> -> !sbp.dtensor<1x4xf32, @m, [P, B]>
  %gbr = sbp.annotate %gb : !sbp.dtensor<1x4xf32, @m, [P, B]> -> !sbp.dtensor<1x4xf32, @m, [B, B]>
  %h = lg.matmul %d, %v : (!sbp.dtensor<8x4xf32, @m, [S<0>, S<1>]>, !sbp.dtensor<4x4xf32, @m, [B, S<0>]>) -> !sbp.dtensor<8x4xf32, @m, [S<0>, P]>
  %hr = sbp.annotate %h : !sbp.dtensor<8x4xf32, @m, [S<0>, P]> -> !sbp.dtensor<8x4xf32, @m, [S<0>, B]>
  %gbv = lg.reshape %gbr : !sbp.dtensor<1x4xf32, @m, [B, B]> -> tensor<4xf32>
  %gbs = lg.mul %gbv, %lr : (tensor<4xf32>, tensor<f32>) -> tensor<4xf32>
  %b_new = lg.sub %b, %gbs : (!sbp.dtensor<4xf32, @m, [B, B]>, tensor<4xf32>) -> tensor<4xf32>
  %t1 = lg.tanh %hr : !sbp.dtensor<8x4xf32, @m, [S<0>, B]>
  %t2 = lg.tanh %t1 : !sbp.dtensor<8x4xf32, @m, [S<0>, B]>
  %t3 = lg.tanh %t2 : !sbp.dtensor<8x4xf32, @m, [S<0>, B]>
  %t4 = lg.tanh %t3 : !sbp.dtensor<8x4xf32, @m, [S<0>, B]>
  %gw = lg.matmul %x, %t4 transpose_lhs : (!sbp.dtensor<8x4xf32, @m, [S<0>, B]>, !sbp.dtensor<8x4xf32, @m, [S<0>, B]>) -> !sbp.dtensor<4x4xf32, @m, [P, B]>
  %gwr = sbp.annotate %gw : !sbp.dtensor<4x4xf32, @m, [P, B]> -> !sbp.dtensor<4x4xf32, @m, [B, B]>
  %wf = lg.cast %w : !sbp.dtensor<4x4xbf16, @m, [B, B]> -> tensor<4x4xf32>
  %gws = lg.mul %gwr, %lr : (!sbp.dtensor<4x4xf32, @m, [B, B]>, tensor<f32>) -> tensor<4x4xf32>
  %wn = lg.sub %wf, %gws : (tensor<4x4xf32>, tensor<4x4xf32>) -> tensor<4x4xf32>
  %w_new = lg.cast %wn : tensor<4x4xf32> -> tensor<4x4xbf16>
  lg.output ["new.b", "new.w"] %b_new, %w_new : tensor<4xf32>, tensor<4x4xbf16>
}

// CHECK:      plan.device @rank0
// CHECK:      plan.compute @gb.reduce_sum
// CHECK-NEXT: plan.comm @gbr.all_reduce "all_reduce" {{.*}} over [0]
// CHECK-NEXT: plan.compute @h.matmul
// CHECK-NEXT: plan.comm @hr.all_reduce "all_reduce" {{.*}} over [1]
// CHECK-NEXT: plan.compute @t4.tanh "plan.fused" [@hr]
// CHECK-NEXT: plan.compute @gw.matmul
// CHECK-NEXT: plan.comm @gwr.all_reduce "all_reduce" {{.*}} over [0]
// CHECK-NEXT: plan.compute @wf.cast "lg.cast" [@w]
// CHECK-NEXT: plan.compute @gbv.reshape "lg.reshape" [@gbr]
// CHECK-NEXT: plan.compute @b_new.sub
// CHECK-NEXT: plan.compute @wn.sub "plan.fused" [@gwr, @lr, @wf]
// CHECK-NEXT: plan.compute @w_new.cast

// ONE-LANE:      plan.device @rank0
// ONE-LANE:      plan.compute @gb.reduce_sum
// ONE-LANE-NEXT: plan.comm @gbr.all_reduce
// ONE-LANE-NEXT: plan.compute @h.matmul
// ONE-LANE-NEXT: plan.comm @hr.all_reduce
// ONE-LANE-NEXT: plan.compute @gbv.reshape "lg.reshape" [@gbr]
// ONE-LANE-NEXT: plan.compute @b_new.sub
// ONE-LANE-NEXT: plan.compute @t4.tanh
// ONE-LANE-NEXT: plan.compute @gw.matmul
// ONE-LANE-NEXT: plan.comm @gwr.all_reduce
// ONE-LANE-NEXT: plan.compute @wf.cast "lg.cast" [@w]
// ONE-LANE-NEXT: plan.compute @wn.sub
