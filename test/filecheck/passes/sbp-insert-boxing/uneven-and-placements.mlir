// RUN: sbp-opt %s --split-input-file -p sbp-insert-boxing | filecheck %s

// Uneven splits: 5 rows over 2 devices are pieces of 3 and 2, over 3 devices
// pieces of 2, 2 and 1; the bytes are still the average per device.
sbp.placement @m cpu ranks [0, 1] mesh [2]
lg.graph @uneven_gather on @m {
  %x = lg.input "x" : !sbp.dtensor<5x3xf32, @m, S<0>>
  %y = sbp.annotate %x : !sbp.dtensor<5x3xf32, @m, S<0>> -> !sbp.dtensor<5x3xf32, @m, B>
  lg.output ["y"] %y : !sbp.dtensor<5x3xf32, @m, B>
}
// CHECK-LABEL: lg.graph @uneven_gather
// CHECK-NEXT:  %x = lg.input "x" : !sbp.dtensor<5x3xf32, @m, S<0>>
// CHECK-NEXT:  %y = sbp.all_gather %x over [0] bytes 30 : !sbp.dtensor<5x3xf32, @m, S<0>> -> !sbp.dtensor<5x3xf32, @m, B>
// CHECK-NEXT:  lg.output ["y"] %y : !sbp.dtensor<5x3xf32, @m, B>

// -----

sbp.placement @m3 cpu ranks [0, 1, 2] mesh [3]
lg.graph @uneven_all_to_all on @m3 {
  %x = lg.input "x" : !sbp.dtensor<5x7xf32, @m3, S<0>>
  %y = sbp.annotate %x : !sbp.dtensor<5x7xf32, @m3, S<0>> -> !sbp.dtensor<5x7xf32, @m3, S<1>>
  lg.output ["y"] %y : !sbp.dtensor<5x7xf32, @m3, S<1>>
}
// CHECK-LABEL: lg.graph @uneven_all_to_all
// CHECK-NEXT:  %x = lg.input "x" : !sbp.dtensor<5x7xf32, @m3, S<0>>
// CHECK-NEXT:  %y = sbp.all_to_all %x over [0] bytes 31 : !sbp.dtensor<5x7xf32, @m3, S<0>> -> !sbp.dtensor<5x7xf32, @m3, S<1>>
// CHECK-NEXT:  lg.output ["y"] %y : !sbp.dtensor<5x7xf32, @m3, S<1>>

// -----

sbp.placement @m3 cpu ranks [0, 1, 2] mesh [3]
lg.graph @uneven_reduce_scatter on @m3 {
  %x = lg.input "x" : !sbp.dtensor<5x7xf32, @m3, P>
  %y = sbp.annotate %x : !sbp.dtensor<5x7xf32, @m3, P> -> !sbp.dtensor<5x7xf32, @m3, S<0>>
  lg.output ["y"] %y : !sbp.dtensor<5x7xf32, @m3, S<0>>
}
// CHECK-LABEL: lg.graph @uneven_reduce_scatter
// CHECK-NEXT:  %x = lg.input "x" : !sbp.dtensor<5x7xf32, @m3, P>
// CHECK-NEXT:  %y = sbp.reduce_scatter %x over [0] bytes 93 : !sbp.dtensor<5x7xf32, @m3, P> -> !sbp.dtensor<5x7xf32, @m3, S<0>>
// CHECK-NEXT:  lg.output ["y"] %y : !sbp.dtensor<5x7xf32, @m3, S<0>>

// -----

// 4 ranks -> 2 ranks, overlapping: ranks 0 and 1 keep what they already hold.
sbp.placement @four cpu ranks [0, 1, 2, 3] mesh [4]
sbp.placement @two cpu ranks [0, 1] mesh [2]
lg.graph @shrink on @four {
  %x = lg.input "x" : !sbp.dtensor<8x4xf32, @four, S<0>>
  %y = sbp.annotate %x : !sbp.dtensor<8x4xf32, @four, S<0>> -> !sbp.dtensor<8x4xf32, @two, S<0>>
  lg.output ["y"] %y : !sbp.dtensor<8x4xf32, @two, S<0>>
}
// CHECK-LABEL: lg.graph @shrink
// CHECK-NEXT:  %x = lg.input "x" : !sbp.dtensor<8x4xf32, @four, S<0>>
// CHECK-NEXT:  %y = sbp.transfer %x bytes 48 : !sbp.dtensor<8x4xf32, @four, S<0>> -> !sbp.dtensor<8x4xf32, @two, S<0>>
// CHECK-NEXT:  lg.output ["y"] %y : !sbp.dtensor<8x4xf32, @two, S<0>>

// -----

// Disjoint pipeline stages: a partial source is reduced on its own stage
// first (reduce_scatter, the cheapest way to stop being partial), then moved.
sbp.placement @stage0 cpu ranks [0, 1] mesh [2]
sbp.placement @stage1 cpu ranks [2, 3] mesh [2]
lg.graph @stages on @stage0 {
  %x = lg.input "x" : !sbp.dtensor<8x4xf32, @stage0, P>
  %y = sbp.annotate %x : !sbp.dtensor<8x4xf32, @stage0, P> -> !sbp.dtensor<8x4xf32, @stage1, B>
  lg.output ["y"] %y : !sbp.dtensor<8x4xf32, @stage1, B>
}
// CHECK-LABEL: lg.graph @stages
// CHECK-NEXT:  %x = lg.input "x" : !sbp.dtensor<8x4xf32, @stage0, P>
// CHECK-NEXT:  %0 = sbp.reduce_scatter %x over [0] bytes 64 : !sbp.dtensor<8x4xf32, @stage0, P> -> !sbp.dtensor<8x4xf32, @stage0, S<0>>
// CHECK-NEXT:  %y = sbp.transfer %0 bytes 128 : !sbp.dtensor<8x4xf32, @stage0, S<0>> -> !sbp.dtensor<8x4xf32, @stage1, B>
// CHECK-NEXT:  lg.output ["y"] %y : !sbp.dtensor<8x4xf32, @stage1, B>

// -----

// A partial destination is rebuilt locally after the move, from a split
// (half the bytes of a whole copy); 2-D to 1-D.
sbp.placement @grid cpu ranks [0, 1, 2, 3] mesh [2, 2]
sbp.placement @line cpu ranks [4, 5] mesh [2]
lg.graph @to_partial on @grid {
  %x = lg.input "x" : !sbp.dtensor<8x4xf32, @grid, [S<0>, S<1>]>
  %y = sbp.annotate %x : !sbp.dtensor<8x4xf32, @grid, [S<0>, S<1>]> -> !sbp.dtensor<8x4xf32, @line, P>
  lg.output ["y"] %y : !sbp.dtensor<8x4xf32, @line, P>
}
// CHECK-LABEL: lg.graph @to_partial
// CHECK-NEXT:  %x = lg.input "x" : !sbp.dtensor<8x4xf32, @grid, [S<0>, S<1>]>
// CHECK-NEXT:  %0 = sbp.transfer %x bytes 64 : !sbp.dtensor<8x4xf32, @grid, [S<0>, S<1>]> -> !sbp.dtensor<8x4xf32, @line, S<0>>
// CHECK-NEXT:  %y = sbp.make_partial %0 over [0] bytes 0 : !sbp.dtensor<8x4xf32, @line, S<0>> -> !sbp.dtensor<8x4xf32, @line, P>
// CHECK-NEXT:  lg.output ["y"] %y : !sbp.dtensor<8x4xf32, @line, P>
