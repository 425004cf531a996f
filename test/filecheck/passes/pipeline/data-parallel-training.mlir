// RUN: cat %S/../../../../examples/mlp_train.mlir %S/split.txt %S/../../../../examples/mlp_train_zero.mlir > %t.mlir
// RUN: sbp-opt %t.mlir --split-input-file -p sbp-infer,sbp-insert-boxing,sbp-simplify | filecheck %s
// The named pipeline runs the same chain (and then buckets the gradients' collectives):
// RUN: sbp-opt %t.mlir --split-input-file -p 'compile{to_plan=false bucket=false}' | filecheck %s
// RUN: sbp-opt %t.mlir --split-input-file -p 'compile{to_plan=false}',sbp-comm-summary 2>&1 >/dev/null | filecheck %s --check-prefix=BUCKETED
// BUCKETED:      // communication of @train_step on @dp, bytes a device receives:
// BUCKETED-NEXT: //   all_reduce           1         18,432
// BUCKETED:      // communication of @zero_train_step on @dp, bytes a device receives:
// BUCKETED-NEXT: //   all_gather           2          9,216
// BUCKETED-NEXT: //   reduce_scatter       1          9,216
// RUN: sbp-opt %t.mlir --split-input-file -p sbp-infer,sbp-insert-boxing,sbp-simplify,sbp-comm-summary 2>&1 >/dev/null | filecheck %s --check-prefix=SUMMARY
// SUMMARY:      // communication of @train_step on @dp, bytes a device receives:
// SUMMARY-NEXT: //   all_reduce           2         18,432
// SUMMARY-NEXT: //   total                2         18,432
// SUMMARY-NEXT: // communication of @zero_train_step on @dp, bytes a device receives:
// SUMMARY-NEXT: //   all_gather           2          9,216
// SUMMARY-NEXT: //   reduce_scatter       2          9,216
// SUMMARY-NEXT: //   slice                2              0
// SUMMARY-NEXT: //   total                6         18,432

// A data-parallel training step, backward and SGD written out by hand (the
// autodiff pass will write them): batch split S<0>, parameters replicated.
// Every weight gradient comes out P and gets exactly one all_reduce; nothing
// else communicates.


// CHECK-LABEL: lg.graph @train_step
// CHECK-NOT:   = sbp.
// CHECK:       %dw2 = lg.matmul %a, %dy transpose_lhs {sbp.signature = #sbp.sig<(S<0>, S<0>) -> (P)>}
// CHECK-NOT:   = sbp.
// CHECK:       %dw1 = lg.matmul %x0, %dh transpose_lhs {sbp.signature = #sbp.sig<(S<0>, S<0>) -> (P)>}
// CHECK-NOT:   = sbp.
// CHECK:       %s1 = lg.mul %dw1, %lr {sbp.signature = #sbp.sig<(P, B) -> (P)>}
// CHECK-NEXT:  %0 = sbp.all_reduce %s1 over [0] bytes 12288 : !sbp.dtensor<32x64xf32, @dp, P> -> !sbp.dtensor<32x64xf32, @dp, B>
// CHECK-NEXT:  %n1 = lg.sub %w1, %0
// CHECK-NEXT:  %s2 = lg.mul %dw2, %lr {sbp.signature = #sbp.sig<(P, B) -> (P)>}
// CHECK-NEXT:  %1 = sbp.all_reduce %s2 over [0] bytes 6144 : !sbp.dtensor<64x16xf32, @dp, P> -> !sbp.dtensor<64x16xf32, @dp, B>
// CHECK-NEXT:  %n2 = lg.sub %w2, %1
// CHECK-NEXT:  lg.output ["loss", "w1", "w2"] %loss, %n1, %n2

// -----

// The same step with ZeRO-style hints: the update runs on S<0> shards. Each
// gradient is reduce-scattered and each new parameter all-gathered; the only
// other boxing is the free local slice of the replicated parameter.


// CHECK-LABEL: lg.graph @zero_train_step
// CHECK-NOT:   sbp.all_reduce
// CHECK:       %0 = sbp.reduce_scatter %dw2 over [0] bytes 3072
// CHECK:       %1 = sbp.reduce_scatter %dw1 over [0] bytes 6144
// A parameter is redistributed right before its use.
// CHECK:       %2 = sbp.slice %w1 over [0] bytes 0
// CHECK-NEXT:  %n1 = lg.sub %2, %s1 {sbp.signature = #sbp.sig<(S<0>, S<0>) -> (S<0>)>}
// CHECK:       %3 = sbp.slice %w2 over [0] bytes 0
// CHECK-NEXT:  %n2 = lg.sub %3, %s2 {sbp.signature = #sbp.sig<(S<0>, S<0>) -> (S<0>)>}
// CHECK-NEXT:  %w1_new = sbp.all_gather %n1 over [0] bytes 6144
// CHECK-NEXT:  %w2_new = sbp.all_gather %n2 over [0] bytes 3072
// CHECK-NEXT:  lg.output
// CHECK-NOT:   sbp.all_reduce

// Counts over both graphs: two all_reduces (first graph), two reduce_scatters
// and two all_gathers (second graph), no all_to_all.
// RUN: sbp-opt %t.mlir --split-input-file -p sbp-infer,sbp-insert-boxing,sbp-simplify | grep -o "sbp\.[a-z_]* %" | sort | uniq -c | filecheck %s --check-prefix=COUNT
// COUNT:      {{^ *}}2 sbp.all_gather %
// COUNT-NEXT: {{^ *}}2 sbp.all_reduce %
// COUNT-NEXT: {{^ *}}2 sbp.reduce_scatter %
// COUNT-NEXT: {{^ *}}2 sbp.slice %
// Anchored: twelve all_reduces would not pass for two.
// RUN: printf "%%s\n" "      2 sbp.all_gather %%" "     12 sbp.all_reduce %%" "      2 sbp.reduce_scatter %%" "      2 sbp.slice %%" | not filecheck %s --check-prefix=COUNT
