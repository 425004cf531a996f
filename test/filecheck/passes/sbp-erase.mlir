// RUN: sbp-opt %s --split-input-file -p sbp-erase | filecheck %s
// RUN: sbp-opt %s --split-input-file -p sbp-erase,sbp-erase --print-between-passes | filecheck %s --check-prefix=BETWEEN

// Distributions, annotations, collectives and signatures disappear; the
// logical computation stays.

sbp.placement @m cpu ranks [0, 1, 2, 3] mesh [2, 2]
sbp.placement @n cpu ranks [4, 5] mesh [2]
lg.graph @g on @m {
  %x = lg.input "x" : tensor<8x16xf32>
  %xs = sbp.annotate %x : tensor<8x16xf32> -> !sbp.dtensor<8x16xf32, @m, [S<0>, B]>
  %w = lg.param "w" init #lg.normal<0.0, 1.0> : !sbp.dtensor<16x4xf32, @m, [B, S<1>]>
  %y = lg.matmul %xs, %w {sbp.signature = #sbp.sig<([S<0>, B], [B, S<1>]) -> ([S<0>, S<1>])>, note = "kept"} : (!sbp.dtensor<8x16xf32, @m, [S<0>, B]>, !sbp.dtensor<16x4xf32, @m, [B, S<1>]>) -> !sbp.dtensor<8x4xf32, @m, [S<0>, S<1>]>
  %g = sbp.all_gather %y over [0, 1] : !sbp.dtensor<8x4xf32, @m, [S<0>, S<1>]> -> !sbp.dtensor<8x4xf32, @m, [B, B]>
  %t = sbp.transfer %g : !sbp.dtensor<8x4xf32, @m, [B, B]> -> !sbp.dtensor<8x4xf32, @n, S<0>>
  %c = lg.constant dense<1.0> : tensor<4xf32> -> !sbp.dtensor<4xf32, @n, B>
  %s = lg.add %t, %c : (!sbp.dtensor<8x4xf32, @n, S<0>>, !sbp.dtensor<4xf32, @n, B>) -> !sbp.dtensor<8x4xf32, @n, S<0>>
  lg.output ["s", "y"] %s, %y : !sbp.dtensor<8x4xf32, @n, S<0>>, !sbp.dtensor<8x4xf32, @m, [S<0>, S<1>]>
}

// CHECK:      sbp.placement @m cpu ranks [0, 1, 2, 3] mesh [2, 2]
// CHECK-NEXT: sbp.placement @n cpu ranks [4, 5] mesh [2]
// CHECK-NEXT: lg.graph @g on @m {
// CHECK-NEXT:   %x = lg.input "x" : tensor<8x16xf32>
// CHECK-NEXT:   %w = lg.param "w" init #lg.normal<0.0, 1.0> : tensor<16x4xf32>
// CHECK-NEXT:   %y = lg.matmul %x, %w {note = "kept"} : (tensor<8x16xf32>, tensor<16x4xf32>) -> tensor<8x4xf32>
// CHECK-NEXT:   %c = lg.constant dense<1.000000e+00> : tensor<4xf32>
// CHECK-NEXT:   %s = lg.add %y, %c : (tensor<8x4xf32>, tensor<4xf32>) -> tensor<8x4xf32>
// CHECK-NEXT:   lg.output ["s", "y"] %s, %y : tensor<8x4xf32>, tensor<8x4xf32>
// CHECK-NEXT: }

// BETWEEN:      IR after sbp-erase:
// BETWEEN:        %y = lg.matmul %x, %w {note = "kept"} : (tensor<8x16xf32>, tensor<16x4xf32>) -> tensor<8x4xf32>

// -----

// A graph that is already logical is left as it is.
lg.graph @plain {
  %x = lg.input "x" : tensor<4xf32>
  %y = lg.exp %x : tensor<4xf32>
  lg.output ["y"] %y : tensor<4xf32>
}

// CHECK:      lg.graph @plain {
// CHECK-NEXT:   %x = lg.input "x" : tensor<4xf32>
// CHECK-NEXT:   %y = lg.exp %x : tensor<4xf32>
// CHECK-NEXT:   lg.output ["y"] %y : tensor<4xf32>
// CHECK-NEXT: }
