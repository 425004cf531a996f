// RUN: sbp-opt %s -p sbp-infer | filecheck %s
// Inference is idempotent: its output, inferred again, does not change.
// RUN: sbp-opt %s -p sbp-infer > %t.mlir
// RUN: sbp-opt %t.mlir -p sbp-infer | diff %t.mlir -
// After boxing, the forward has exactly one collective, an all_reduce:
// RUN: sbp-opt %s -p sbp-infer,sbp-insert-boxing,sbp-simplify | grep "= sbp\." | filecheck %s --check-prefix=BOXED
// RUN: sbp-opt %s -p sbp-infer,sbp-insert-boxing,sbp-simplify | grep -c "= sbp\." | filecheck %s --check-prefix=ONE
// BOXED: %yb = sbp.all_reduce %y over [0] bytes 4096 : !sbp.dtensor<16x64xf32, @tp, P> -> !sbp.dtensor<16x64xf32, @tp, B>
// ONE: {{^1$}}

// Megatron's MLP from two weight hints: the first weight column-split
// (S<1>), the second row-split (S<0>). The hidden activation stays split,
// the second matmul gives a partial sum, and the one redistribution is
// P -> B on the output: exactly one all_reduce after boxing.

sbp.placement @tp cpu ranks [0, 1] mesh [2]

lg.graph @megatron_mlp on @tp {
  %x = lg.input "x" : tensor<16x64xf32>
  %w1 = lg.param "w1" init #lg.normal<0.0, 0.02> : !sbp.dtensor<64x256xf32, @tp, S<1>>
  %w2 = lg.param "w2" init #lg.normal<0.0, 0.02> : !sbp.dtensor<256x64xf32, @tp, S<0>>
  %xb = sbp.annotate %x : tensor<16x64xf32> -> !sbp.dtensor<16x64xf32, @tp, B>
  %h = lg.matmul %xb, %w1 : (!sbp.dtensor<16x64xf32, @tp, B>, !sbp.dtensor<64x256xf32, @tp, S<1>>) -> tensor<16x256xf32>
  %a = lg.gelu %h : tensor<16x256xf32>
  %y = lg.matmul %a, %w2 : (tensor<16x256xf32>, !sbp.dtensor<256x64xf32, @tp, S<0>>) -> tensor<16x64xf32>
  %yb = sbp.annotate %y : tensor<16x64xf32> -> !sbp.dtensor<16x64xf32, @tp, B>
  lg.output ["y"] %yb : !sbp.dtensor<16x64xf32, @tp, B>
}

// CHECK:      %h = lg.matmul %xb, %w1 {sbp.signature = #sbp.sig<(B, S<1>) -> (S<1>)>}
// CHECK-SAME:   -> !sbp.dtensor<16x256xf32, @tp, S<1>>
// CHECK-NEXT: %a = lg.gelu %h {sbp.signature = #sbp.sig<(S<1>) -> (S<1>)>} : !sbp.dtensor<16x256xf32, @tp, S<1>>
// CHECK-NEXT: %y = lg.matmul %a, %w2 {sbp.signature = #sbp.sig<(S<1>, S<0>) -> (P)>}
// CHECK-SAME:   -> !sbp.dtensor<16x64xf32, @tp, P>
// CHECK-NEXT: %yb = sbp.annotate %y : !sbp.dtensor<16x64xf32, @tp, P> -> !sbp.dtensor<16x64xf32, @tp, B>
// CHECK-NEXT: lg.output
// CHECK-NOT:  sbp.annotate
