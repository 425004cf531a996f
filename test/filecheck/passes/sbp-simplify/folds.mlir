// RUN: sbp-opt %s --split-input-file -p sbp-simplify | filecheck %s

sbp.placement @m cpu ranks [0, 1] mesh [2]
lg.graph @round_trips on @m {
  %x = lg.input "x" : !sbp.dtensor<8x4xf32, @m, B>
  // slice then gather back: the identity
  %s = sbp.slice %x over [0] : !sbp.dtensor<8x4xf32, @m, B> -> !sbp.dtensor<8x4xf32, @m, S<0>>
  %g = sbp.all_gather %s over [0] bytes 64 : !sbp.dtensor<8x4xf32, @m, S<0>> -> !sbp.dtensor<8x4xf32, @m, B>
  // there and back by all_to_all, through three steps
  %t = sbp.slice %g over [0] : !sbp.dtensor<8x4xf32, @m, B> -> !sbp.dtensor<8x4xf32, @m, S<1>>
  %u = sbp.all_to_all %t over [0] bytes 32 : !sbp.dtensor<8x4xf32, @m, S<1>> -> !sbp.dtensor<8x4xf32, @m, S<0>>
  %v = sbp.all_to_all %u over [0] bytes 32 : !sbp.dtensor<8x4xf32, @m, S<0>> -> !sbp.dtensor<8x4xf32, @m, S<1>>
  // make_partial then all_reduce: the identity
  %p = sbp.make_partial %x over [0] : !sbp.dtensor<8x4xf32, @m, B> -> !sbp.dtensor<8x4xf32, @m, P>
  %r = sbp.all_reduce %p over [0] bytes 128 : !sbp.dtensor<8x4xf32, @m, P> -> !sbp.dtensor<8x4xf32, @m, B>
  %y = lg.add %v, %r : (!sbp.dtensor<8x4xf32, @m, S<1>>, !sbp.dtensor<8x4xf32, @m, B>) -> !sbp.dtensor<8x4xf32, @m, S<1>>
  lg.output ["y"] %y : !sbp.dtensor<8x4xf32, @m, S<1>>
}
// CHECK:      %x = lg.input "x" : !sbp.dtensor<8x4xf32, @m, B>
// CHECK-NEXT: %t = sbp.slice %x over [0] : !sbp.dtensor<8x4xf32, @m, B> -> !sbp.dtensor<8x4xf32, @m, S<1>>
// CHECK-NEXT: %y = lg.add %t, %x
// CHECK-NEXT: lg.output

// -----

sbp.placement @m cpu ranks [0, 1] mesh [2]
lg.graph @reduce_scatter on @m {
  %x = lg.input "x" : !sbp.dtensor<8x4xf32, @m, P>
  %r = sbp.all_reduce %x over [0] bytes 128 : !sbp.dtensor<8x4xf32, @m, P> -> !sbp.dtensor<8x4xf32, @m, B>
  %s = sbp.slice %r over [0] : !sbp.dtensor<8x4xf32, @m, B> -> !sbp.dtensor<8x4xf32, @m, S<1>>
  lg.output ["s"] %s : !sbp.dtensor<8x4xf32, @m, S<1>>
}
// CHECK:      %x = lg.input "x" : !sbp.dtensor<8x4xf32, @m, P>
// CHECK-NEXT: %s = sbp.reduce_scatter %x over [0] bytes 64 : !sbp.dtensor<8x4xf32, @m, P> -> !sbp.dtensor<8x4xf32, @m, S<1>>
// CHECK-NEXT: lg.output ["s"] %s

// -----

// An all_reduce that someone else also reads is not folded away.
sbp.placement @m cpu ranks [0, 1] mesh [2]
lg.graph @shared_reduce on @m {
  %x = lg.input "x" : !sbp.dtensor<8x4xf32, @m, P>
  %r = sbp.all_reduce %x over [0] : !sbp.dtensor<8x4xf32, @m, P> -> !sbp.dtensor<8x4xf32, @m, B>
  %s = sbp.slice %r over [0] : !sbp.dtensor<8x4xf32, @m, B> -> !sbp.dtensor<8x4xf32, @m, S<1>>
  lg.output ["r", "s"] %r, %s : !sbp.dtensor<8x4xf32, @m, B>, !sbp.dtensor<8x4xf32, @m, S<1>>
}
// CHECK:      %r = sbp.all_reduce %x over [0]
// CHECK-NEXT: %s = sbp.slice %r over [0]

// -----

// Repeated boxing of one value for two consumers keeps one result; unused
// collectives go.
sbp.placement @m cpu ranks [0, 1] mesh [2]
lg.graph @shared on @m {
  %x = lg.input "x" : !sbp.dtensor<8x4xf32, @m, S<0>>
  %a = sbp.all_gather %x over [0] bytes 64 : !sbp.dtensor<8x4xf32, @m, S<0>> -> !sbp.dtensor<8x4xf32, @m, B>
  %b = sbp.all_gather %x over [0] bytes 64 : !sbp.dtensor<8x4xf32, @m, S<0>> -> !sbp.dtensor<8x4xf32, @m, B>
  %dead = sbp.all_to_all %x over [0] : !sbp.dtensor<8x4xf32, @m, S<0>> -> !sbp.dtensor<8x4xf32, @m, S<1>>
  %y = lg.mul %a, %b : (!sbp.dtensor<8x4xf32, @m, B>, !sbp.dtensor<8x4xf32, @m, B>) -> !sbp.dtensor<8x4xf32, @m, B>
  lg.output ["y"] %y : !sbp.dtensor<8x4xf32, @m, B>
}
// CHECK:      %a = sbp.all_gather %x over [0] bytes 64
// CHECK-NEXT: %y = lg.mul %a, %a
// CHECK-NOT:  sbp.all_to_all
