// RUN: sbp-opt %s -p 'lg-micro-batch{count=2}' | filecheck %s
// RUN: sbp-opt %s -p 'lg-micro-batch{count=2}',lg-autodiff | filecheck %s --check-prefix=GRAD
// RUN: not sbp-opt -p 'lg-micro-batch{count=2}' < %S/dropout-cut.txt 2>&1 | filecheck %s --check-prefix=TWICE

// A dropout's copy in micro-batch k of K records (K, k, rows per example),
// so that it draws the rows the whole batch's dropout draws for those
// examples: 1 row per example on the input, 3 after the reshape merges the
// batch with the next axis. The seed and step are shared, not cut.

lg.graph @step {
  %x = lg.input "x" : tensor<4x3x2xf32>
  %seed = lg.param "rng.seed" init #lg.zeros state : tensor<i64>
  %step = lg.param "rng.step" init #lg.zeros state : tensor<i64>
  %d = lg.dropout %x, %seed, %step rate 1.000000e-01 stream 1 : (tensor<4x3x2xf32>, tensor<i64>, tensor<i64>) -> tensor<4x3x2xf32>
  %f = lg.reshape %d : tensor<4x3x2xf32> -> tensor<12x2xf32>
  %e = lg.dropout %f, %seed, %step rate 5.000000e-01 stream 2 : (tensor<12x2xf32>, tensor<i64>, tensor<i64>) -> tensor<12x2xf32>
  %loss = lg.reduce_mean %e axes [0, 1] : tensor<12x2xf32> -> tensor<f32>
  %one = lg.constant dense<1> : tensor<i64>
  %next = lg.add %step, %one : (tensor<i64>, tensor<i64>) -> tensor<i64>
  lg.output ["loss", "new.rng.step"] %loss, %next : tensor<f32>, tensor<i64>
}

// CHECK:      %d_mb0 = lg.dropout %x_mb0, %seed, %step rate 1.000000e-01 stream 1 micro_batch [2, 0, 1] {lg.micro_batch = 0 : i64} : (tensor<2x3x2xf32>, tensor<i64>, tensor<i64>) -> tensor<2x3x2xf32>
// CHECK-NEXT: %f_mb0 = lg.reshape %d_mb0
// CHECK-NEXT: %e_mb0 = lg.dropout %f_mb0, %seed, %step rate 5.000000e-01 stream 2 micro_batch [2, 0, 3] {lg.micro_batch = 0 : i64} : (tensor<6x2xf32>, tensor<i64>, tensor<i64>) -> tensor<6x2xf32>
// CHECK:      %d_mb1 = lg.dropout %x_mb1, %seed, %step rate 1.000000e-01 stream 1 micro_batch [2, 1, 1]
// CHECK:      %e_mb1 = lg.dropout %f_mb1, %seed, %step rate 5.000000e-01 stream 2 micro_batch [2, 1, 3]
// CHECK:      lg.output ["loss", "new.rng.step"] %loss, %next

// The gradient draws the forward's mask again: the same op on the incoming gradient.
// GRAD: lg.dropout %{{.*}}, %seed, %step rate 5.000000e-01 stream 2 micro_batch [2, 1, 3] {lg.micro_batch = 1 : i64}

// A dropout that already draws for a micro-batch is not cut again.
// TWICE: 'lg.dropout': lg-micro-batch{count=2}: a dropout of a value already cut into micro-batches
