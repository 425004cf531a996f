// RUN: sbp-opt %s -p compile,plan-codegen | filecheck %s
// RUN: sbp-opt %s -p compile,plan-codegen | sbp-opt | filecheck %s

// CUDA devices get one generated kernel per compute actor, for its local
// shapes: here the batch is split over 2 GPUs, so each matmul sees 4 rows,
// and the mean over the split axis divides by the global count (8 x 3).

sbp.placement @gpus cuda ranks [0, 1] mesh [2]

lg.graph @k on @gpus {
  %x = lg.input "x" : !sbp.dtensor<8x16xf32, @gpus, S<0>>
  %w = lg.param "w" init #lg.normal<0.0, 0.1> : tensor<16x3xf32>
  %y = lg.matmul %x, %w : (!sbp.dtensor<8x16xf32, @gpus, S<0>>, tensor<16x3xf32>) -> tensor<8x3xf32>
  %r = lg.relu %y : tensor<8x3xf32>
  %m = lg.reduce_mean %r axes [0, 1] : tensor<8x3xf32> -> tensor<f32>
  lg.output ["m"] %m : tensor<f32>
}

// CHECK:      plan.compute @y.matmul "lg.matmul" [@x, @w] -> [@y] {
// CHECK-SAME:   cuda.source = "typedef float T;\0Aextern \22C\22 __global__ void k_y_matmul(const T* __restrict__ A, const T* __restrict__ B, T* __restrict__ C) {
// CHECK-SAME:   if (row < 4 && col < 3)
// CHECK-SAME:   cuda.entry = "k_y_matmul", cuda.launch = array<i64: 1, 1, 1, 16, 16, 1>}
// CHECK:      plan.compute @r.relu "lg.relu" [@y] -> [@r] in_place {
// CHECK-SAME:   T v1 = v0 > (T)0 ? v0 : (T)0;
// CHECK:      plan.compute @m.reduce_mean "lg.reduce_mean" [@r] -> [@m] props {axes = array<i64: 0, 1>} {
// CHECK-SAME:   acc = acc / (T)24;
