// RUN: sbp-opt %s -p 'lg-autodiff,lg-recompute{policy=selective}' | filecheck %s
// RUN: sbp-opt %s -p 'lg-autodiff,lg-recompute{policy=full}' | filecheck %s --check-prefix=FULL
// RUN: sbp-opt %s -p 'lg-autodiff,lg-recompute{policy=full},compile' | filecheck %s --check-prefix=PLAN
// RUN: sbp-opt %s -p 'lg-autodiff,lg-recompute{policy=none}' | filecheck %s --check-prefix=NONE
// RUN: sbp-opt %s -p 'lg-recompute' | filecheck %s --check-prefix=NONE
// RUN: not sbp-opt %s -p 'lg-autodiff,lg-recompute{policy=sometimes}' 2>&1 | filecheck %s --check-prefix=POLICY
// RUN: not sbp-opt %s -p 'lg-autodiff,lg-recompute{loss=objective}' 2>&1 | filecheck %s --check-prefix=LOSS

// A residual MLP of two blocks (h = h + gelu(h w) w') and its training
// step. `selective` repeats each GELU for the weight gradient that reads
// it, from the GEMM output that the GELU's own gradient keeps anyway, just
// before that matmul: the forward GELU is dead once the forward pass has
// used it. `full` keeps only the residual stream between blocks (h0, h1,
// h2: the values that alone cross a cut) and repeats each block's GEMM and
// GELU before the block's backward pass. The plan runs each clone after
// the backward op that makes the other operand of its use.

sbp.placement @m cpu ranks [0, 1] mesh [2]
lg.graph @mlp on @m {
  %x = lg.input "x" : tensor<8x4xf32>
  %labels = lg.input "labels" : tensor<8xi64>
  %w0 = lg.param "w0" init #lg.normal<0.0, 0.2> seed 1 : tensor<4x16xf32>
  %w1 = lg.param "w1" init #lg.normal<0.0, 0.2> seed 2 : tensor<16x16xf32>
  %w2 = lg.param "w2" init #lg.normal<0.0, 0.2> seed 3 : tensor<16x16xf32>
  %w3 = lg.param "w3" init #lg.normal<0.0, 0.2> seed 4 : tensor<16x16xf32>
  %w4 = lg.param "w4" init #lg.normal<0.0, 0.2> seed 5 : tensor<16x16xf32>
  %w5 = lg.param "w5" init #lg.normal<0.0, 0.2> seed 6 : tensor<16x4xf32>
  %h0 = lg.matmul %x, %w0 : (tensor<8x4xf32>, tensor<4x16xf32>) -> tensor<8x16xf32>
  %u1 = lg.matmul %h0, %w1 : (tensor<8x16xf32>, tensor<16x16xf32>) -> tensor<8x16xf32>
  %a1 = lg.gelu %u1 : tensor<8x16xf32>
  %d1 = lg.matmul %a1, %w2 : (tensor<8x16xf32>, tensor<16x16xf32>) -> tensor<8x16xf32>
  %h1 = lg.add %h0, %d1 : (tensor<8x16xf32>, tensor<8x16xf32>) -> tensor<8x16xf32>
  %u2 = lg.matmul %h1, %w3 : (tensor<8x16xf32>, tensor<16x16xf32>) -> tensor<8x16xf32>
  %a2 = lg.gelu %u2 : tensor<8x16xf32>
  %d2 = lg.matmul %a2, %w4 : (tensor<8x16xf32>, tensor<16x16xf32>) -> tensor<8x16xf32>
  %h2 = lg.add %h1, %d2 : (tensor<8x16xf32>, tensor<8x16xf32>) -> tensor<8x16xf32>
  %y = lg.matmul %h2, %w5 : (tensor<8x16xf32>, tensor<16x4xf32>) -> tensor<8x4xf32>
  %loss = lg.cross_entropy %y, %labels : (tensor<8x4xf32>, tensor<8xi64>) -> tensor<f32>
  lg.output ["loss"] %loss : tensor<f32>
}

// CHECK:      %a2 = lg.gelu %u2 : tensor<8x16xf32>
// CHECK:      %[[DD2:.*]] = lg.matmul %{{.*}}, %w5 transpose_rhs
// CHECK:      %a2_again = lg.gelu %u2 {lg.recompute} : tensor<8x16xf32>
// CHECK-NEXT: lg.matmul %a2_again, %[[DD2]] transpose_lhs
// CHECK:      %a1_again = lg.gelu %u1 {lg.recompute} : tensor<8x16xf32>
// CHECK-NEXT: lg.matmul %a1_again, %{{.*}} transpose_lhs
// CHECK-NOT:  lg.recompute
// CHECK:      lg.output

// FULL:      %[[DD2:.*]] = lg.matmul %{{.*}}, %w5 transpose_rhs
// FULL-NEXT: lg.matmul %h2, %{{.*}} transpose_lhs
// FULL-NEXT: lg.matmul %[[DD2]], %w4 transpose_rhs
// FULL-NEXT: %u2_again = lg.matmul %h1, %w3 {lg.recompute}
// FULL-NEXT: %a2_again = lg.gelu %u2_again {lg.recompute}
// FULL-NEXT: lg.matmul %a2_again, %[[DD2]] transpose_lhs
// FULL-NOT:  %u2,
// FULL-NOT:  %u2 :
// FULL:      %u1_again = lg.matmul %h0, %w1 {lg.recompute}
// FULL-NEXT: %a1_again = lg.gelu %u1_again {lg.recompute}
// FULL-NOT:  lg.recompute
// FULL:      lg.output

// PLAN:      plan.device @rank0
// PLAN:      plan.compute @loss.cross_entropy
// PLAN:      plan.compute @[[DX:.*]].matmul "lg.matmul" [@{{.*}}, @w4] -> [@[[DX]]] props {transpose_rhs}
// PLAN-NEXT: plan.compute @u2_again.matmul "lg.matmul" [@h1, @w3] -> [@u2_again]
// PLAN-NEXT: plan.compute @a2_again.gelu "lg.gelu" [@u2_again] -> [@a2_again]
// PLAN:      "lg.matmul" [@{{.*}}, @w2] -> {{.*}} props {transpose_rhs}
// PLAN-NEXT: plan.compute @u1_again.matmul "lg.matmul" [@h0, @w1] -> [@u1_again]

// Without a policy, or without a backward pass (nothing is saved for it), nothing changes.
// NONE-NOT: lg.recompute

// POLICY: lg-recompute: unknown policy 'sometimes' (known: none, selective, full)
// LOSS: 'lg.graph' @mlp: lg-recompute: no output named "objective" (the forward pass is what it depends on)
