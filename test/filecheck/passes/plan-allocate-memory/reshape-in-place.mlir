// RUN: sbp-opt %s -p compile | filecheck %s

// A reshape keeps its input's bytes in their order, so it is planned in
// place over an input that dies there (@r takes @m's bytes; the kernel then
// has nothing to copy). A feed keeps its own bytes (@k copies @x).

sbp.placement @one cpu ranks [0] mesh [1]

lg.graph @g on @one {
  %x = lg.input "x" : tensor<4x16xf32>
  %w = lg.param "w" init #lg.ones : tensor<16x16xf32>
  %m = lg.matmul %x, %w : (tensor<4x16xf32>, tensor<16x16xf32>) -> tensor<4x16xf32>
  %r = lg.reshape %m : tensor<4x16xf32> -> tensor<2x32xf32>
  %k = lg.reshape %x : tensor<4x16xf32> -> tensor<64xf32>
  lg.output ["r", "k"] %r, %k : tensor<2x32xf32>, tensor<64xf32>
}

// CHECK:      plan.register @m : tensor<4x16xf32> bytes 256 offset [[M:[0-9]+]] of
// CHECK-NEXT: plan.register @r : tensor<2x32xf32> bytes 256 offset [[M]] fetch "r" of
// CHECK:      plan.compute @r.reshape "lg.reshape" [@m] -> [@r] in_place
// CHECK-NEXT: plan.compute @k.reshape "lg.reshape" [@x] -> [@k]{{$}}
