// RUN: sbp-opt %s --split-input-file -p sbp-insert-boxing | filecheck %s

// Transitions on a 2x2 mesh, one mesh axis per step: pieces nest outer axis
// first, so gathers run inner axis first and splits outer axis first.

sbp.placement @m cpu ranks [0, 1, 2, 3] mesh [2, 2]
lg.graph @t0 on @m {
  %x = lg.input "x" : !sbp.dtensor<8x4xf32, @m, [S<0>, S<0>]>
  %y = sbp.annotate %x : !sbp.dtensor<8x4xf32, @m, [S<0>, S<0>]> -> !sbp.dtensor<8x4xf32, @m, [B, B]>
  lg.output ["y"] %y : !sbp.dtensor<8x4xf32, @m, [B, B]>
}
// CHECK-LABEL: lg.graph @t0
// CHECK-NEXT:  %x = lg.input "x" : !sbp.dtensor<8x4xf32, @m, [S<0>, S<0>]>
// CHECK-NEXT:  %0 = sbp.all_gather %x over [1] bytes 32 : !sbp.dtensor<8x4xf32, @m, [S<0>, S<0>]> -> !sbp.dtensor<8x4xf32, @m, [S<0>, B]>
// CHECK-NEXT:  %y = sbp.all_gather %0 over [0] bytes 64 : !sbp.dtensor<8x4xf32, @m, [S<0>, B]> -> !sbp.dtensor<8x4xf32, @m, [B, B]>
// CHECK-NEXT:  lg.output ["y"] %y : !sbp.dtensor<8x4xf32, @m, [B, B]>

// -----

sbp.placement @m cpu ranks [0, 1, 2, 3] mesh [2, 2]
lg.graph @t1 on @m {
  %x = lg.input "x" : !sbp.dtensor<8x4xf32, @m, [B, B]>
  %y = sbp.annotate %x : !sbp.dtensor<8x4xf32, @m, [B, B]> -> !sbp.dtensor<8x4xf32, @m, [S<0>, S<0>]>
  lg.output ["y"] %y : !sbp.dtensor<8x4xf32, @m, [S<0>, S<0>]>
}
// CHECK-LABEL: lg.graph @t1
// CHECK-NEXT:  %x = lg.input "x" : !sbp.dtensor<8x4xf32, @m, [B, B]>
// CHECK-NEXT:  %0 = sbp.slice %x over [0] bytes 0 : !sbp.dtensor<8x4xf32, @m, [B, B]> -> !sbp.dtensor<8x4xf32, @m, [S<0>, B]>
// CHECK-NEXT:  %y = sbp.slice %0 over [1] bytes 0 : !sbp.dtensor<8x4xf32, @m, [S<0>, B]> -> !sbp.dtensor<8x4xf32, @m, [S<0>, S<0>]>
// CHECK-NEXT:  lg.output ["y"] %y : !sbp.dtensor<8x4xf32, @m, [S<0>, S<0>]>

// -----

sbp.placement @m cpu ranks [0, 1, 2, 3] mesh [2, 2]
lg.graph @t2 on @m {
  %x = lg.input "x" : !sbp.dtensor<8x4xf32, @m, [P, P]>
  %y = sbp.annotate %x : !sbp.dtensor<8x4xf32, @m, [P, P]> -> !sbp.dtensor<8x4xf32, @m, [B, B]>
  lg.output ["y"] %y : !sbp.dtensor<8x4xf32, @m, [B, B]>
}
// CHECK-LABEL: lg.graph @t2
// CHECK-NEXT:  %x = lg.input "x" : !sbp.dtensor<8x4xf32, @m, [P, P]>
// CHECK-NEXT:  %0 = sbp.reduce_scatter %x over [0] bytes 64 : !sbp.dtensor<8x4xf32, @m, [P, P]> -> !sbp.dtensor<8x4xf32, @m, [S<0>, P]>
// CHECK-NEXT:  %1 = sbp.all_reduce %0 over [1] bytes 64 : !sbp.dtensor<8x4xf32, @m, [S<0>, P]> -> !sbp.dtensor<8x4xf32, @m, [S<0>, B]>
// CHECK-NEXT:  %y = sbp.all_gather %1 over [0] bytes 64 : !sbp.dtensor<8x4xf32, @m, [S<0>, B]> -> !sbp.dtensor<8x4xf32, @m, [B, B]>
// CHECK-NEXT:  lg.output ["y"] %y : !sbp.dtensor<8x4xf32, @m, [B, B]>

// -----

sbp.placement @m cpu ranks [0, 1, 2, 3] mesh [2, 2]
lg.graph @t3 on @m {
  %x = lg.input "x" : !sbp.dtensor<8x4xf32, @m, [P, P]>
  %y = sbp.annotate %x : !sbp.dtensor<8x4xf32, @m, [P, P]> -> !sbp.dtensor<8x4xf32, @m, [S<0>, S<1>]>
  lg.output ["y"] %y : !sbp.dtensor<8x4xf32, @m, [S<0>, S<1>]>
}
// CHECK-LABEL: lg.graph @t3
// CHECK-NEXT:  %x = lg.input "x" : !sbp.dtensor<8x4xf32, @m, [P, P]>
// CHECK-NEXT:  %0 = sbp.reduce_scatter %x over [0] bytes 64 : !sbp.dtensor<8x4xf32, @m, [P, P]> -> !sbp.dtensor<8x4xf32, @m, [S<0>, P]>
// CHECK-NEXT:  %y = sbp.reduce_scatter %0 over [1] bytes 32 : !sbp.dtensor<8x4xf32, @m, [S<0>, P]> -> !sbp.dtensor<8x4xf32, @m, [S<0>, S<1>]>
// CHECK-NEXT:  lg.output ["y"] %y : !sbp.dtensor<8x4xf32, @m, [S<0>, S<1>]>

// -----

sbp.placement @m cpu ranks [0, 1, 2, 3] mesh [2, 2]
lg.graph @t4 on @m {
  %x = lg.input "x" : !sbp.dtensor<8x4xf32, @m, [S<0>, S<1>]>
  %y = sbp.annotate %x : !sbp.dtensor<8x4xf32, @m, [S<0>, S<1>]> -> !sbp.dtensor<8x4xf32, @m, [S<1>, S<0>]>
  lg.output ["y"] %y : !sbp.dtensor<8x4xf32, @m, [S<1>, S<0>]>
}
// CHECK-LABEL: lg.graph @t4
// CHECK-NEXT:  %x = lg.input "x" : !sbp.dtensor<8x4xf32, @m, [S<0>, S<1>]>
// CHECK-NEXT:  %0 = sbp.make_partial %x over [0] bytes 0 : !sbp.dtensor<8x4xf32, @m, [S<0>, S<1>]> -> !sbp.dtensor<8x4xf32, @m, [P, S<1>]>
// CHECK-NEXT:  %1 = sbp.all_to_all %0 over [1] bytes 32 : !sbp.dtensor<8x4xf32, @m, [P, S<1>]> -> !sbp.dtensor<8x4xf32, @m, [P, S<0>]>
// CHECK-NEXT:  %y = sbp.reduce_scatter %1 over [0] bytes 32 : !sbp.dtensor<8x4xf32, @m, [P, S<0>]> -> !sbp.dtensor<8x4xf32, @m, [S<1>, S<0>]>
// CHECK-NEXT:  lg.output ["y"] %y : !sbp.dtensor<8x4xf32, @m, [S<1>, S<0>]>

// -----

sbp.placement @m cpu ranks [0, 1, 2, 3] mesh [2, 2]
lg.graph @t5 on @m {
  %x = lg.input "x" : !sbp.dtensor<8x4xf32, @m, [S<0>, B]>
  %y = sbp.annotate %x : !sbp.dtensor<8x4xf32, @m, [S<0>, B]> -> !sbp.dtensor<8x4xf32, @m, [B, S<0>]>
  lg.output ["y"] %y : !sbp.dtensor<8x4xf32, @m, [B, S<0>]>
}
// CHECK-LABEL: lg.graph @t5
// CHECK-NEXT:  %x = lg.input "x" : !sbp.dtensor<8x4xf32, @m, [S<0>, B]>
// CHECK-NEXT:  %0 = sbp.slice %x over [1] bytes 0 : !sbp.dtensor<8x4xf32, @m, [S<0>, B]> -> !sbp.dtensor<8x4xf32, @m, [S<0>, S<1>]>
// CHECK-NEXT:  %1 = sbp.all_gather %0 over [0] bytes 32 : !sbp.dtensor<8x4xf32, @m, [S<0>, S<1>]> -> !sbp.dtensor<8x4xf32, @m, [B, S<1>]>
// CHECK-NEXT:  %y = sbp.all_to_all %1 over [1] bytes 32 : !sbp.dtensor<8x4xf32, @m, [B, S<1>]> -> !sbp.dtensor<8x4xf32, @m, [B, S<0>]>
// CHECK-NEXT:  lg.output ["y"] %y : !sbp.dtensor<8x4xf32, @m, [B, S<0>]>

// -----

sbp.placement @m cpu ranks [0, 1, 2, 3] mesh [2, 2]
lg.graph @t6 on @m {
  %x = lg.input "x" : !sbp.dtensor<8x4xf32, @m, [P, S<0>]>
  %y = sbp.annotate %x : !sbp.dtensor<8x4xf32, @m, [P, S<0>]> -> !sbp.dtensor<8x4xf32, @m, [S<0>, B]>
  lg.output ["y"] %y : !sbp.dtensor<8x4xf32, @m, [S<0>, B]>
}
// CHECK-LABEL: lg.graph @t6
// CHECK-NEXT:  %x = lg.input "x" : !sbp.dtensor<8x4xf32, @m, [P, S<0>]>
// CHECK-NEXT:  %0 = sbp.reduce_scatter %x over [0] bytes 32 : !sbp.dtensor<8x4xf32, @m, [P, S<0>]> -> !sbp.dtensor<8x4xf32, @m, [S<1>, S<0>]>
// CHECK-NEXT:  %1 = sbp.all_gather %0 over [1] bytes 32 : !sbp.dtensor<8x4xf32, @m, [S<1>, S<0>]> -> !sbp.dtensor<8x4xf32, @m, [S<1>, B]>
// CHECK-NEXT:  %y = sbp.all_to_all %1 over [0] bytes 32 : !sbp.dtensor<8x4xf32, @m, [S<1>, B]> -> !sbp.dtensor<8x4xf32, @m, [S<0>, B]>
// CHECK-NEXT:  lg.output ["y"] %y : !sbp.dtensor<8x4xf32, @m, [S<0>, B]>

// -----

sbp.placement @m cpu ranks [0, 1, 2, 3] mesh [2, 2]
lg.graph @t7 on @m {
  %x = lg.input "x" : !sbp.dtensor<8x4xf32, @m, [B, S<1>]>
  %y = sbp.annotate %x : !sbp.dtensor<8x4xf32, @m, [B, S<1>]> -> !sbp.dtensor<8x4xf32, @m, [P, B]>
  lg.output ["y"] %y : !sbp.dtensor<8x4xf32, @m, [P, B]>
}
// CHECK-LABEL: lg.graph @t7
// CHECK-NEXT:  %x = lg.input "x" : !sbp.dtensor<8x4xf32, @m, [B, S<1>]>
// CHECK-NEXT:  %0 = sbp.slice %x over [0] bytes 0 : !sbp.dtensor<8x4xf32, @m, [B, S<1>]> -> !sbp.dtensor<8x4xf32, @m, [S<0>, S<1>]>
// CHECK-NEXT:  %1 = sbp.all_gather %0 over [1] bytes 32 : !sbp.dtensor<8x4xf32, @m, [S<0>, S<1>]> -> !sbp.dtensor<8x4xf32, @m, [S<0>, B]>
// CHECK-NEXT:  %y = sbp.make_partial %1 over [0] bytes 0 : !sbp.dtensor<8x4xf32, @m, [S<0>, B]> -> !sbp.dtensor<8x4xf32, @m, [P, B]>
// CHECK-NEXT:  lg.output ["y"] %y : !sbp.dtensor<8x4xf32, @m, [P, B]>

// -----

sbp.placement @m cpu ranks [0, 1, 2, 3] mesh [2, 2]
lg.graph @t8 on @m {
  %x = lg.input "x" : !sbp.dtensor<8x4xf32, @m, [S<1>, S<1>]>
  %y = sbp.annotate %x : !sbp.dtensor<8x4xf32, @m, [S<1>, S<1>]> -> !sbp.dtensor<8x4xf32, @m, [S<1>, B]>
  lg.output ["y"] %y : !sbp.dtensor<8x4xf32, @m, [S<1>, B]>
}
// CHECK-LABEL: lg.graph @t8
// CHECK-NEXT:  %x = lg.input "x" : !sbp.dtensor<8x4xf32, @m, [S<1>, S<1>]>
// CHECK-NEXT:  %y = sbp.all_gather %x over [1] bytes 32 : !sbp.dtensor<8x4xf32, @m, [S<1>, S<1>]> -> !sbp.dtensor<8x4xf32, @m, [S<1>, B]>
// CHECK-NEXT:  lg.output ["y"] %y : !sbp.dtensor<8x4xf32, @m, [S<1>, B]>

// -----

sbp.placement @m cpu ranks [0, 1, 2, 3] mesh [2, 2]
lg.graph @t9 on @m {
  %x = lg.input "x" : !sbp.dtensor<8x4xf32, @m, [B, P]>
  %y = sbp.annotate %x : !sbp.dtensor<8x4xf32, @m, [B, P]> -> !sbp.dtensor<8x4xf32, @m, [B, S<1>]>
  lg.output ["y"] %y : !sbp.dtensor<8x4xf32, @m, [B, S<1>]>
}
// CHECK-LABEL: lg.graph @t9
// CHECK-NEXT:  %x = lg.input "x" : !sbp.dtensor<8x4xf32, @m, [B, P]>
// CHECK-NEXT:  %y = sbp.reduce_scatter %x over [1] bytes 64 : !sbp.dtensor<8x4xf32, @m, [B, P]> -> !sbp.dtensor<8x4xf32, @m, [B, S<1>]>
// CHECK-NEXT:  lg.output ["y"] %y : !sbp.dtensor<8x4xf32, @m, [B, S<1>]>
