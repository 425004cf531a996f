// RUN: sbp-opt %s --split-input-file --parsing-diagnostics | filecheck %s

// Attribute and type errors are reported where they stand in the source.

"test.op"() {a = #sbp.S<-1>} : () -> ()
// CHECK: split axis must be non-negative, got -1

// -----

"test.op"() {a = #sbp.P<min>} : () -> ()
// CHECK: Expected `sum`, or `max`.

// -----

"test.op"() {a = #sbp.nd<[S<0>, Q]>} : () -> ()
// CHECK: Expected one of {{.*}} for an SBP (S<axis>, B, P, G or I<rows>)

// -----

"test.op"() {a = #sbp.sig<(S<0>, [B, B]) -> (S<0>)>} : () -> ()
// CHECK: all nd-SBPs of a signature must have one entry per mesh axis, got widths [1, 2]

// -----

sbp.placement @m cpu ranks [0, 1] mesh [2]
"test.op"() : () -> !sbp.dtensor<?x4xf32, @m, S<0>>
// CHECK: a dtensor's global shape must be static, got ?x4

// -----

sbp.placement @m tpu ranks [0, 1] mesh [2]
// CHECK: Expected `cpu`, or `cuda`.

// -----

"test.op"() {a = #sbp.nd<[G, S<0>]>} : () -> ()
// CHECK: rows grouped by expert (G) or gathered by an index (I) are on one mesh axis and not split (S<0>) by another: got [G, S<0>]
