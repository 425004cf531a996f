// RUN: sbp-opt %s -p sbp-to-plan | filecheck %s

// A parameter's gather is issued one op ahead of its use, gated on what its
// users' other operands need. Here the gathered %g is read by %c1 and again
// by %c2, whose other operand comes from %c1: %c1 needs %g, so it cannot
// gate the gather (that would be a cycle, and the schedule would lose ops).

sbp.placement @dp cpu ranks [0, 1] mesh [2]
lg.graph @g on @dp {
  %x = lg.input "x" {sbp.signature = #sbp.sig<() -> (B)>} : !sbp.dtensor<4x2xf32, @dp, B>
  %w = lg.param "w" init #lg.normal<0.0, 0.1> {sbp.signature = #sbp.sig<() -> (S<0>)>} : !sbp.dtensor<4x2xf32, @dp, S<0>>
  %g = sbp.all_gather %w over [0] : !sbp.dtensor<4x2xf32, @dp, S<0>> -> !sbp.dtensor<4x2xf32, @dp, B>
  %c1 = lg.mul %x, %g {sbp.signature = #sbp.sig<(B, B) -> (B)>} : (!sbp.dtensor<4x2xf32, @dp, B>, !sbp.dtensor<4x2xf32, @dp, B>) -> !sbp.dtensor<4x2xf32, @dp, B>
  %r = lg.relu %c1 {sbp.signature = #sbp.sig<(B) -> (B)>} : !sbp.dtensor<4x2xf32, @dp, B>
  %c2 = lg.mul %r, %g {sbp.signature = #sbp.sig<(B, B) -> (B)>} : (!sbp.dtensor<4x2xf32, @dp, B>, !sbp.dtensor<4x2xf32, @dp, B>) -> !sbp.dtensor<4x2xf32, @dp, B>
  lg.output ["y"] %c2 : !sbp.dtensor<4x2xf32, @dp, B>
}

// CHECK:      plan.device @rank0 rank 0 {
// CHECK:        plan.comm @g.all_gather "all_gather" id 0 [@w] -> [@g]
// CHECK-NEXT:   plan.compute @c1.mul "lg.mul" [@x, @g] -> [@c1]
// CHECK-NEXT:   plan.compute @r.relu "lg.relu" [@c1] -> [@r]
// CHECK-NEXT:   plan.compute @c2.mul "lg.mul" [@r, @g] -> [@c2]
// CHECK-NEXT: }
