// RUN: sbp-opt %s -p sbp-infer | filecheck %s
// RUN: sbp-opt %s -p sbp-infer{strategy=greedy} | filecheck %s

// Pure data parallelism from one hint: the batch is split, so every
// activation is S<0>, every parameter B, and the loss a partial sum of the
// per-device means. No redistribution is needed.

sbp.placement @dp cpu ranks [0, 1, 2, 3] mesh [4]

lg.graph @mlp on @dp {
  %x = lg.input "x" : tensor<64x128xf32>
  %labels = lg.input "labels" : tensor<64xi64>
  %w1 = lg.param "w1" init #lg.normal<0.0, 0.1> : tensor<128x256xf32>
  %b1 = lg.param "b1" init #lg.zeros : tensor<256xf32>
  %w2 = lg.param "w2" init #lg.normal<0.0, 0.1> : tensor<256x10xf32>
  %xs = sbp.annotate %x : tensor<64x128xf32> -> !sbp.dtensor<64x128xf32, @dp, S<0>>
  %h = lg.matmul %xs, %w1 : (!sbp.dtensor<64x128xf32, @dp, S<0>>, tensor<128x256xf32>) -> tensor<64x256xf32>
  %hb = lg.add %h, %b1 : (tensor<64x256xf32>, tensor<256xf32>) -> tensor<64x256xf32>
  %a = lg.relu %hb : tensor<64x256xf32>
  %logits = lg.matmul %a, %w2 : (tensor<64x256xf32>, tensor<256x10xf32>) -> tensor<64x10xf32>
  %loss = lg.cross_entropy %logits, %labels : (tensor<64x10xf32>, tensor<64xi64>) -> tensor<f32>
  lg.output ["loss"] %loss : tensor<f32>
}

// CHECK:      %x = lg.input "x" {sbp.signature = #sbp.sig<() -> (S<0>)>} : !sbp.dtensor<64x128xf32, @dp, S<0>>
// CHECK-NEXT: %labels = lg.input "labels" {sbp.signature = #sbp.sig<() -> (S<0>)>} : !sbp.dtensor<64xi64, @dp, S<0>>
// CHECK-NEXT: %w1 = lg.param "w1" {{.*}} {sbp.signature = #sbp.sig<() -> (B)>} : !sbp.dtensor<128x256xf32, @dp, B>
// CHECK-NEXT: %b1 = lg.param "b1" {{.*}} {sbp.signature = #sbp.sig<() -> (B)>} : !sbp.dtensor<256xf32, @dp, B>
// CHECK-NEXT: %w2 = lg.param "w2" {{.*}} {sbp.signature = #sbp.sig<() -> (B)>} : !sbp.dtensor<256x10xf32, @dp, B>
// CHECK-NEXT: %xs = sbp.annotate %x : !sbp.dtensor<64x128xf32, @dp, S<0>> -> !sbp.dtensor<64x128xf32, @dp, S<0>>
// CHECK-NEXT: %h = lg.matmul %xs, %w1 {sbp.signature = #sbp.sig<(S<0>, B) -> (S<0>)>}
// CHECK-NEXT: %hb = lg.add %h, %b1 {sbp.signature = #sbp.sig<(S<0>, B) -> (S<0>)>}
// CHECK-NEXT: %a = lg.relu %hb {sbp.signature = #sbp.sig<(S<0>) -> (S<0>)>}
// CHECK-NEXT: %logits = lg.matmul %a, %w2 {sbp.signature = #sbp.sig<(S<0>, B) -> (S<0>)>}
// CHECK-NEXT: %loss = lg.cross_entropy %logits, %labels {sbp.signature = #sbp.sig<(S<0>, S<0>) -> (P)>} : {{.*}} -> !sbp.dtensor<f32, @dp, P>
// CHECK-NEXT: lg.output ["loss"] %loss : !sbp.dtensor<f32, @dp, P>
