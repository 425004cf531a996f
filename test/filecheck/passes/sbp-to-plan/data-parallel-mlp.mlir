// RUN: sbp-opt %s -p 'compile{to_plan=false}',sbp-to-plan | filecheck %s
// RUN: sbp-opt %s -p 'compile{to_plan=false}',sbp-to-plan{share_bodies=false} | filecheck %s --check-prefix=EACH

// A data-parallel MLP on 2 ranks: each rank holds half the batch and whole
// parameters (persistent, with their initializers), runs the same compute
// actors on its piece, and the loss is fetched as a partial sum. The two
// ranks' registers and actors are equal, so rank 1 runs rank 0's body as
// its own rank (`like`); with share_bodies=false it gets a copy.

sbp.placement @dp cpu ranks [0, 1] mesh [2]

lg.graph @mlp on @dp {
  %x = lg.input "x" : tensor<8x16xf32>
  %labels = lg.input "labels" : tensor<8xi64>
  %w = lg.param "w" init #lg.normal<0.0, 0.1> seed 1 : tensor<16x4xf32>
  %b = lg.param "b" init #lg.zeros : tensor<4xf32>
  %xs = sbp.annotate %x : tensor<8x16xf32> -> !sbp.dtensor<8x16xf32, @dp, S<0>>
  %h = lg.matmul %xs, %w : (!sbp.dtensor<8x16xf32, @dp, S<0>>, tensor<16x4xf32>) -> tensor<8x4xf32>
  %logits = lg.add %h, %b : (tensor<8x4xf32>, tensor<4xf32>) -> tensor<8x4xf32>
  %loss = lg.cross_entropy %logits, %labels : (tensor<8x4xf32>, tensor<8xi64>) -> tensor<f32>
  lg.output ["loss"] %loss : tensor<f32>
}

// CHECK:      plan.program @mlp {
// CHECK-NEXT:   plan.device @rank0 rank 0 {
// CHECK-NEXT:     plan.register @x : tensor<4x16xf32> bytes 256 feed "x" of !sbp.dtensor<8x16xf32, @dp, S<0>>
// CHECK-NEXT:     plan.register @labels : tensor<4xi64> bytes 32 feed "labels" of !sbp.dtensor<8xi64, @dp, S<0>>
// CHECK-NEXT:     plan.register @w : tensor<16x4xf32> bytes 256 persistent param "w" init #lg.normal<0.0, 0.1> seed 1 of !sbp.dtensor<16x4xf32, @dp, B>
// CHECK-NEXT:     plan.register @b : tensor<4xf32> bytes 16 persistent param "b" init #lg.zeros seed 0 of !sbp.dtensor<4xf32, @dp, B>
// CHECK-NEXT:     plan.register @h : tensor<4x4xf32> bytes 64 of !sbp.dtensor<8x4xf32, @dp, S<0>>
// CHECK-NEXT:     plan.register @logits : tensor<4x4xf32> bytes 64 of !sbp.dtensor<8x4xf32, @dp, S<0>>
// CHECK-NEXT:     plan.register @loss : tensor<f32> bytes 4 fetch "loss" of !sbp.dtensor<f32, @dp, P>
// CHECK-NEXT:     plan.compute @h.matmul "lg.matmul" [@x, @w] -> [@h]
// CHECK-NEXT:     plan.compute @logits.add "lg.add" [@h, @b] -> [@logits]
// CHECK-NEXT:     plan.compute @loss.cross_entropy "lg.cross_entropy" [@logits, @labels] -> [@loss]
// CHECK-NEXT:   }
// CHECK-NEXT:   plan.device @rank1 rank 1 like @rank0 {
// CHECK-NEXT:   }
// CHECK-NEXT: }

// EACH:      plan.device @rank0 rank 0 {
// EACH:        plan.compute @loss.cross_entropy "lg.cross_entropy" [@logits, @labels] -> [@loss]
// EACH-NEXT:   }
// EACH-NEXT:   plan.device @rank1 rank 1 {
// EACH-NEXT:     plan.register @x : tensor<4x16xf32> bytes 256 feed "x" of !sbp.dtensor<8x16xf32, @dp, S<0>>
// EACH:          plan.compute @loss.cross_entropy "lg.cross_entropy" [@logits, @labels] -> [@loss]
// EACH-NEXT:   }
// EACH-NEXT: }
