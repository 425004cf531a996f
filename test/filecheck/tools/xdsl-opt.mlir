// Stock xdsl-opt sees sbpc's dialects and passes through the xdsl.universe
// entry point.
// RUN: xdsl-opt %s | filecheck %s
// RUN: xdsl-opt %s -p sbp-erase | filecheck %s --check-prefix=ERASED

sbp.placement @m cpu ranks [0, 1] mesh [2]
lg.graph @g on @m {
  %x = lg.input "x" : !sbp.dtensor<8x4xf32, @m, S<0>>
  %y = lg.relu %x : !sbp.dtensor<8x4xf32, @m, S<0>>
  %z = sbp.all_gather %y over [0] : !sbp.dtensor<8x4xf32, @m, S<0>> -> !sbp.dtensor<8x4xf32, @m, B>
  lg.output ["z"] %z : !sbp.dtensor<8x4xf32, @m, B>
}

// CHECK:      sbp.placement @m cpu ranks [0, 1] mesh [2]
// CHECK-NEXT: lg.graph @g on @m {
// CHECK-NEXT:   %x = lg.input "x" : !sbp.dtensor<8x4xf32, @m, S<0>>
// CHECK-NEXT:   %y = lg.relu %x : !sbp.dtensor<8x4xf32, @m, S<0>>
// CHECK-NEXT:   %z = sbp.all_gather %y over [0] : !sbp.dtensor<8x4xf32, @m, S<0>> -> !sbp.dtensor<8x4xf32, @m, B>
// CHECK-NEXT:   lg.output ["z"] %z : !sbp.dtensor<8x4xf32, @m, B>

// ERASED:      lg.graph @g on @m {
// ERASED-NEXT:   %x = lg.input "x" : tensor<8x4xf32>
// ERASED-NEXT:   %y = lg.relu %x : tensor<8x4xf32>
// ERASED-NEXT:   lg.output ["z"] %y : tensor<8x4xf32>
