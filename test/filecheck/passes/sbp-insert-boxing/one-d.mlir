// RUN: sbp-opt %s --split-input-file -p sbp-insert-boxing | filecheck %s
// RUN: sbp-opt %s --split-input-file -p sbp-insert-boxing,sbp-simplify | filecheck %s

// Every single-step transition on a 1-D mesh of 2 devices, on an 8x4xf32
// tensor (128 bytes): the bytes are what a device receives on average.

sbp.placement @m cpu ranks [0, 1] mesh [2]
lg.graph @t0 on @m {
  %x = lg.input "x" : !sbp.dtensor<8x4xf32, @m, P>
  %y = sbp.annotate %x : !sbp.dtensor<8x4xf32, @m, P> -> !sbp.dtensor<8x4xf32, @m, B>
  lg.output ["y"] %y : !sbp.dtensor<8x4xf32, @m, B>
}
// CHECK-LABEL: lg.graph @t0
// CHECK-NEXT:  %x = lg.input "x" : !sbp.dtensor<8x4xf32, @m, P>
// CHECK-NEXT:  %y = sbp.all_reduce %x over [0] bytes 128 : !sbp.dtensor<8x4xf32, @m, P> -> !sbp.dtensor<8x4xf32, @m, B>
// CHECK-NEXT:  lg.output ["y"] %y : !sbp.dtensor<8x4xf32, @m, B>

// -----

sbp.placement @m cpu ranks [0, 1] mesh [2]
lg.graph @t1 on @m {
  %x = lg.input "x" : !sbp.dtensor<8x4xf32, @m, P>
  %y = sbp.annotate %x : !sbp.dtensor<8x4xf32, @m, P> -> !sbp.dtensor<8x4xf32, @m, S<0>>
  lg.output ["y"] %y : !sbp.dtensor<8x4xf32, @m, S<0>>
}
// CHECK-LABEL: lg.graph @t1
// CHECK-NEXT:  %x = lg.input "x" : !sbp.dtensor<8x4xf32, @m, P>
// CHECK-NEXT:  %y = sbp.reduce_scatter %x over [0] bytes 64 : !sbp.dtensor<8x4xf32, @m, P> -> !sbp.dtensor<8x4xf32, @m, S<0>>
// CHECK-NEXT:  lg.output ["y"] %y : !sbp.dtensor<8x4xf32, @m, S<0>>

// -----

sbp.placement @m cpu ranks [0, 1] mesh [2]
lg.graph @t2 on @m {
  %x = lg.input "x" : !sbp.dtensor<8x4xf32, @m, P>
  %y = sbp.annotate %x : !sbp.dtensor<8x4xf32, @m, P> -> !sbp.dtensor<8x4xf32, @m, S<1>>
  lg.output ["y"] %y : !sbp.dtensor<8x4xf32, @m, S<1>>
}
// CHECK-LABEL: lg.graph @t2
// CHECK-NEXT:  %x = lg.input "x" : !sbp.dtensor<8x4xf32, @m, P>
// CHECK-NEXT:  %y = sbp.reduce_scatter %x over [0] bytes 64 : !sbp.dtensor<8x4xf32, @m, P> -> !sbp.dtensor<8x4xf32, @m, S<1>>
// CHECK-NEXT:  lg.output ["y"] %y : !sbp.dtensor<8x4xf32, @m, S<1>>

// -----

sbp.placement @m cpu ranks [0, 1] mesh [2]
lg.graph @t3 on @m {
  %x = lg.input "x" : !sbp.dtensor<8x4xf32, @m, S<0>>
  %y = sbp.annotate %x : !sbp.dtensor<8x4xf32, @m, S<0>> -> !sbp.dtensor<8x4xf32, @m, B>
  lg.output ["y"] %y : !sbp.dtensor<8x4xf32, @m, B>
}
// CHECK-LABEL: lg.graph @t3
// CHECK-NEXT:  %x = lg.input "x" : !sbp.dtensor<8x4xf32, @m, S<0>>
// CHECK-NEXT:  %y = sbp.all_gather %x over [0] bytes 64 : !sbp.dtensor<8x4xf32, @m, S<0>> -> !sbp.dtensor<8x4xf32, @m, B>
// CHECK-NEXT:  lg.output ["y"] %y : !sbp.dtensor<8x4xf32, @m, B>

// -----

sbp.placement @m cpu ranks [0, 1] mesh [2]
lg.graph @t4 on @m {
  %x = lg.input "x" : !sbp.dtensor<8x4xf32, @m, S<0>>
  %y = sbp.annotate %x : !sbp.dtensor<8x4xf32, @m, S<0>> -> !sbp.dtensor<8x4xf32, @m, S<1>>
  lg.output ["y"] %y : !sbp.dtensor<8x4xf32, @m, S<1>>
}
// CHECK-LABEL: lg.graph @t4
// CHECK-NEXT:  %x = lg.input "x" : !sbp.dtensor<8x4xf32, @m, S<0>>
// CHECK-NEXT:  %y = sbp.all_to_all %x over [0] bytes 32 : !sbp.dtensor<8x4xf32, @m, S<0>> -> !sbp.dtensor<8x4xf32, @m, S<1>>
// CHECK-NEXT:  lg.output ["y"] %y : !sbp.dtensor<8x4xf32, @m, S<1>>

// -----

sbp.placement @m cpu ranks [0, 1] mesh [2]
lg.graph @t5 on @m {
  %x = lg.input "x" : !sbp.dtensor<8x4xf32, @m, B>
  %y = sbp.annotate %x : !sbp.dtensor<8x4xf32, @m, B> -> !sbp.dtensor<8x4xf32, @m, S<0>>
  lg.output ["y"] %y : !sbp.dtensor<8x4xf32, @m, S<0>>
}
// CHECK-LABEL: lg.graph @t5
// CHECK-NEXT:  %x = lg.input "x" : !sbp.dtensor<8x4xf32, @m, B>
// CHECK-NEXT:  %y = sbp.slice %x over [0] bytes 0 : !sbp.dtensor<8x4xf32, @m, B> -> !sbp.dtensor<8x4xf32, @m, S<0>>
// CHECK-NEXT:  lg.output ["y"] %y : !sbp.dtensor<8x4xf32, @m, S<0>>

// -----

sbp.placement @m cpu ranks [0, 1] mesh [2]
lg.graph @t6 on @m {
  %x = lg.input "x" : !sbp.dtensor<8x4xf32, @m, B>
  %y = sbp.annotate %x : !sbp.dtensor<8x4xf32, @m, B> -> !sbp.dtensor<8x4xf32, @m, P>
  lg.output ["y"] %y : !sbp.dtensor<8x4xf32, @m, P>
}
// CHECK-LABEL: lg.graph @t6
// CHECK-NEXT:  %x = lg.input "x" : !sbp.dtensor<8x4xf32, @m, B>
// CHECK-NEXT:  %y = sbp.make_partial %x over [0] bytes 0 : !sbp.dtensor<8x4xf32, @m, B> -> !sbp.dtensor<8x4xf32, @m, P>
// CHECK-NEXT:  lg.output ["y"] %y : !sbp.dtensor<8x4xf32, @m, P>

// -----

sbp.placement @m cpu ranks [0, 1] mesh [2]
lg.graph @t7 on @m {
  %x = lg.input "x" : !sbp.dtensor<8x4xf32, @m, S<1>>
  %y = sbp.annotate %x : !sbp.dtensor<8x4xf32, @m, S<1>> -> !sbp.dtensor<8x4xf32, @m, P>
  lg.output ["y"] %y : !sbp.dtensor<8x4xf32, @m, P>
}
// CHECK-LABEL: lg.graph @t7
// CHECK-NEXT:  %x = lg.input "x" : !sbp.dtensor<8x4xf32, @m, S<1>>
// CHECK-NEXT:  %y = sbp.make_partial %x over [0] bytes 0 : !sbp.dtensor<8x4xf32, @m, S<1>> -> !sbp.dtensor<8x4xf32, @m, P>
// CHECK-NEXT:  lg.output ["y"] %y : !sbp.dtensor<8x4xf32, @m, P>

// -----

sbp.placement @m cpu ranks [0, 1] mesh [2]
lg.graph @t8 on @m {
  %x = lg.input "x" : !sbp.dtensor<8x4xf32, @m, P<max>>
  %y = sbp.annotate %x : !sbp.dtensor<8x4xf32, @m, P<max>> -> !sbp.dtensor<8x4xf32, @m, B>
  lg.output ["y"] %y : !sbp.dtensor<8x4xf32, @m, B>
}
// CHECK-LABEL: lg.graph @t8
// CHECK-NEXT:  %x = lg.input "x" : !sbp.dtensor<8x4xf32, @m, P<max>>
// CHECK-NEXT:  %y = sbp.all_reduce %x over [0] bytes 128 : !sbp.dtensor<8x4xf32, @m, P<max>> -> !sbp.dtensor<8x4xf32, @m, B>
// CHECK-NEXT:  lg.output ["y"] %y : !sbp.dtensor<8x4xf32, @m, B>

// -----

sbp.placement @m cpu ranks [0, 1] mesh [2]
lg.graph @t9 on @m {
  %x = lg.input "x" : !sbp.dtensor<8x4xf32, @m, P<max>>
  %y = sbp.annotate %x : !sbp.dtensor<8x4xf32, @m, P<max>> -> !sbp.dtensor<8x4xf32, @m, S<0>>
  lg.output ["y"] %y : !sbp.dtensor<8x4xf32, @m, S<0>>
}
// CHECK-LABEL: lg.graph @t9
// CHECK-NEXT:  %x = lg.input "x" : !sbp.dtensor<8x4xf32, @m, P<max>>
// CHECK-NEXT:  %y = sbp.reduce_scatter %x over [0] bytes 64 : !sbp.dtensor<8x4xf32, @m, P<max>> -> !sbp.dtensor<8x4xf32, @m, S<0>>
// CHECK-NEXT:  lg.output ["y"] %y : !sbp.dtensor<8x4xf32, @m, S<0>>

// -----

sbp.placement @m cpu ranks [0, 1] mesh [2]
lg.graph @t10 on @m {
  %x = lg.input "x" : !sbp.dtensor<8x4xf32, @m, S<1>>
  %y = sbp.annotate %x : !sbp.dtensor<8x4xf32, @m, S<1>> -> !sbp.dtensor<8x4xf32, @m, S<1>>
  lg.output ["y"] %y : !sbp.dtensor<8x4xf32, @m, S<1>>
}
// CHECK-LABEL: lg.graph @t10
// CHECK-NEXT:  %x = lg.input "x" : !sbp.dtensor<8x4xf32, @m, S<1>>
// CHECK-NEXT:  lg.output ["y"] %x : !sbp.dtensor<8x4xf32, @m, S<1>>

// -----

sbp.placement @m cpu ranks [0, 1] mesh [2]
lg.graph @t11 on @m {
  %x = lg.input "x" : !sbp.dtensor<8x4xf32, @m, P>
  %y = sbp.annotate %x : !sbp.dtensor<8x4xf32, @m, P> -> !sbp.dtensor<8x4xf32, @m, P<max>>
  lg.output ["y"] %y : !sbp.dtensor<8x4xf32, @m, P<max>>
}
// CHECK-LABEL: lg.graph @t11
// CHECK-NEXT:  %x = lg.input "x" : !sbp.dtensor<8x4xf32, @m, P>
// CHECK-NEXT:  %0 = sbp.reduce_scatter %x over [0] bytes 64 : !sbp.dtensor<8x4xf32, @m, P> -> !sbp.dtensor<8x4xf32, @m, S<0>>
// CHECK-NEXT:  %y = sbp.make_partial %0 over [0] bytes 0 : !sbp.dtensor<8x4xf32, @m, S<0>> -> !sbp.dtensor<8x4xf32, @m, P<max>>
// CHECK-NEXT:  lg.output ["y"] %y : !sbp.dtensor<8x4xf32, @m, P<max>>
