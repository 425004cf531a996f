// RUN: sbp-opt %s --split-input-file -p 'compile{to_plan=false bucket=false},sbp-bucket-collectives' | filecheck %s
// RUN: sbp-opt %s --split-input-file -p 'compile{to_plan=false bucket=false},sbp-bucket-collectives{bucket_bytes=100}' | filecheck %s --check-prefix=FIXED
// RUN: sbp-opt %s --split-input-file -p 'compile{to_plan=false}' | filecheck %s --check-prefix=COMPILE

// Three gradients ready together: one all_reduce over their concatenation,
// each gradient sliced back out (and reshaped to its shape). Ordered by when
// each is ready; `sbp.bucket` names the members.
sbp.placement @dp cpu ranks [0, 1] mesh [2]
lg.graph @step on @dp {
  %x = lg.input "x" : !sbp.dtensor<8x4xf32, @dp, S<0>>
  %d = lg.input "d" : !sbp.dtensor<8x6xf32, @dp, S<0>>
  %gw = lg.matmul %x, %d transpose_lhs : (!sbp.dtensor<8x4xf32, @dp, S<0>>, !sbp.dtensor<8x6xf32, @dp, S<0>>) -> tensor<4x6xf32>
  %gb = lg.reduce_sum %d axes [0] : !sbp.dtensor<8x6xf32, @dp, S<0>> -> tensor<6xf32>
  %gc = lg.reduce_sum %x axes [0] : !sbp.dtensor<8x4xf32, @dp, S<0>> -> tensor<4xf32>
  %rw = sbp.annotate %gw : tensor<4x6xf32> -> !sbp.dtensor<4x6xf32, @dp, B>
  %rb = sbp.annotate %gb : tensor<6xf32> -> !sbp.dtensor<6xf32, @dp, B>
  %rc = sbp.annotate %gc : tensor<4xf32> -> !sbp.dtensor<4xf32, @dp, B>
  lg.output ["w", "b", "c"] %rw, %rb, %rc : !sbp.dtensor<4x6xf32, @dp, B>, !sbp.dtensor<6xf32, @dp, B>, !sbp.dtensor<4xf32, @dp, B>
}
// CHECK-LABEL: lg.graph @step
// CHECK:      %gw.flat = lg.reshape %gw {sbp.signature = #sbp.sig<(P) -> (P)>} : !sbp.dtensor<4x6xf32, @dp, P> -> !sbp.dtensor<24xf32, @dp, P>
// CHECK-NEXT: %bucket.0.in = lg.concat %gc, %gw.flat, %gb axis 0 {sbp.signature = #sbp.sig<(P, P, P) -> (P)>} : (!sbp.dtensor<4xf32, @dp, P>, !sbp.dtensor<24xf32, @dp, P>, !sbp.dtensor<6xf32, @dp, P>) -> !sbp.dtensor<34xf32, @dp, P>
// CHECK-NEXT: %bucket.0 = sbp.all_reduce %bucket.0.in over [0] bytes 136 {sbp.bucket = ["gc", "gw", "gb"]} : !sbp.dtensor<34xf32, @dp, P> -> !sbp.dtensor<34xf32, @dp, B>
// CHECK-NEXT: %rc = lg.slice %bucket.0 starts [0] limits [4] strides [1] {sbp.signature = #sbp.sig<(B) -> (B)>} : !sbp.dtensor<34xf32, @dp, B> -> !sbp.dtensor<4xf32, @dp, B>
// CHECK-NEXT: %bucket.0.1 = lg.slice %bucket.0 starts [4] limits [28] strides [1]
// CHECK-NEXT: %rw = lg.reshape %bucket.0.1 {sbp.signature = #sbp.sig<(B) -> (B)>} : !sbp.dtensor<24xf32, @dp, B> -> !sbp.dtensor<4x6xf32, @dp, B>
// CHECK-NEXT: %rb = lg.slice %bucket.0 starts [28] limits [34] strides [1]
// CHECK-NEXT: lg.output ["w", "b", "c"] %rw, %rb, %rc
// CHECK-NOT:  sbp.all_reduce
// A fixed size (DDP's rule): a bucket closes once it holds 100 bytes
// FIXED-LABEL: lg.graph @step
// FIXED:       %rb = sbp.all_reduce %gb over [0] bytes 24
// FIXED:       %bucket.0 = sbp.all_reduce %bucket.0.in over [0] bytes 112 {sbp.bucket = ["gc", "gw"]}
// compile buckets by default
// COMPILE-LABEL: lg.graph @step
// COMPILE:       %bucket.0 = sbp.all_reduce
// COMPILE-NOT:   sbp.all_reduce

// -----

// A large gradient ready long before the others (two large matmuls run
// between): its collective goes out alone, hidden under them, rather than
// wait to be packed with the late ones, which share a bucket. (The
// gradient is hinted partial: unhinted, sbp-infer gathers its rows
// instead, a collective bucketing leaves alone.)
sbp.placement @dp cpu ranks [0, 1] mesh [2]
lg.graph @early on @dp {
  %x = lg.input "x" : !sbp.dtensor<512x512xf32, @dp, S<0>>
  %w = lg.input "w" : !sbp.dtensor<512x512xf32, @dp, B>
  %early = lg.matmul %x, %x transpose_lhs : (!sbp.dtensor<512x512xf32, @dp, S<0>>, !sbp.dtensor<512x512xf32, @dp, S<0>>) -> !sbp.dtensor<512x512xf32, @dp, P>
  %h = lg.matmul %x, %w : (!sbp.dtensor<512x512xf32, @dp, S<0>>, !sbp.dtensor<512x512xf32, @dp, B>) -> tensor<512x512xf32>
  %k = lg.matmul %h, %w : (tensor<512x512xf32>, !sbp.dtensor<512x512xf32, @dp, B>) -> tensor<512x512xf32>
  %late1 = lg.reduce_sum %k axes [0] : tensor<512x512xf32> -> tensor<512xf32>
  %late2 = lg.reduce_mean %k axes [0] : tensor<512x512xf32> -> tensor<512xf32>
  %a = sbp.annotate %early : !sbp.dtensor<512x512xf32, @dp, P> -> !sbp.dtensor<512x512xf32, @dp, B>
  %b = sbp.annotate %late1 : tensor<512xf32> -> !sbp.dtensor<512xf32, @dp, B>
  %c = sbp.annotate %late2 : tensor<512xf32> -> !sbp.dtensor<512xf32, @dp, B>
  lg.output ["a", "b", "c"] %a, %b, %c : !sbp.dtensor<512x512xf32, @dp, B>, !sbp.dtensor<512xf32, @dp, B>, !sbp.dtensor<512xf32, @dp, B>
}
// CHECK-LABEL: lg.graph @early
// CHECK:       %a = sbp.all_reduce %early over [0]
// CHECK:       %bucket.0 = sbp.all_reduce %bucket.0.in over [0] bytes 4096 {sbp.bucket = ["late1", "late2"]}
// COMPILE-LABEL: lg.graph @early

// -----

// A collective whose result feeds more communication (a tensor-parallel
// forward) is on the critical path: never bucketed. Nor is a gradient
// split on another mesh axis (its piece is not the flat whole). (Partial
// results hinted: tensors this small would be gathered whole otherwise.)
sbp.placement @m cpu ranks [0, 1, 2, 3] mesh [2, 2]
lg.graph @mixed on @m {
  %x = lg.input "x" : !sbp.dtensor<8x8xf32, @m, [S<0>, B]>
  %w = lg.param "w" init #lg.normal<0.0, 0.1> : !sbp.dtensor<8x8xf32, @m, [B, S<0>]>
  %v = lg.param "v" init #lg.normal<0.0, 0.1> : !sbp.dtensor<8x8xf32, @m, [B, S<1>]>
  %h = lg.matmul %x, %w : (!sbp.dtensor<8x8xf32, @m, [S<0>, B]>, !sbp.dtensor<8x8xf32, @m, [B, S<0>]>) -> !sbp.dtensor<8x8xf32, @m, [S<0>, P]>
  %hb = sbp.annotate %h : !sbp.dtensor<8x8xf32, @m, [S<0>, P]> -> !sbp.dtensor<8x8xf32, @m, [S<0>, B]>
  %y = lg.matmul %hb, %v : (!sbp.dtensor<8x8xf32, @m, [S<0>, B]>, !sbp.dtensor<8x8xf32, @m, [B, S<1>]>) -> tensor<8x8xf32>
  %gv = lg.matmul %hb, %y transpose_lhs : (!sbp.dtensor<8x8xf32, @m, [S<0>, B]>, tensor<8x8xf32>) -> !sbp.dtensor<8x8xf32, @m, [P, S<1>]>
  %gvb = sbp.annotate %gv : !sbp.dtensor<8x8xf32, @m, [P, S<1>]> -> !sbp.dtensor<8x8xf32, @m, [B, S<1>]>
  %s1 = lg.reduce_sum %hb axes [0] : !sbp.dtensor<8x8xf32, @m, [S<0>, B]> -> !sbp.dtensor<8xf32, @m, [P, B]>
  %s2 = lg.reduce_sum %x axes [0] : !sbp.dtensor<8x8xf32, @m, [S<0>, B]> -> !sbp.dtensor<8xf32, @m, [P, B]>
  %s1b = sbp.annotate %s1 : !sbp.dtensor<8xf32, @m, [P, B]> -> !sbp.dtensor<8xf32, @m, [B, B]>
  %s2b = sbp.annotate %s2 : !sbp.dtensor<8xf32, @m, [P, B]> -> !sbp.dtensor<8xf32, @m, [B, B]>
  lg.output ["gv", "s1", "s2"] %gvb, %s1b, %s2b : !sbp.dtensor<8x8xf32, @m, [B, S<1>]>, !sbp.dtensor<8xf32, @m, [B, B]>, !sbp.dtensor<8xf32, @m, [B, B]>
}
// CHECK-LABEL: lg.graph @mixed
// CHECK:       %hb = sbp.all_reduce %h over [1]
// CHECK:       sbp.all_reduce {{.*}} over [0] {{.*}} : !sbp.dtensor<8x8xf32, @m, [P, S<1>]> -> !sbp.dtensor<8x8xf32, @m, [B, S<1>]>
// CHECK:       %bucket.0 = sbp.all_reduce %bucket.0.in over [0] {{.*}} {sbp.bucket = ["s2", "s1"]} : !sbp.dtensor<16xf32, @m, [P, B]> -> !sbp.dtensor<16xf32, @m, [B, B]>

// -----

// ZeRO and FSDP: gradients reduce-scattered to S(0). Each is folded into
// p rows (its S(0) piece is one row), the rows concatenated: one
// reduce_scatter leaves every device its row of each. A gradient whose
// first axis does not divide by p stays alone.
sbp.placement @dp cpu ranks [0, 1] mesh [2]
lg.graph @zero on @dp {
  %x = lg.input "x" : !sbp.dtensor<8x4xf32, @dp, S<0>>
  %d = lg.input "d" : !sbp.dtensor<8x6xf32, @dp, S<0>>
  %gw = lg.matmul %x, %d transpose_lhs : (!sbp.dtensor<8x4xf32, @dp, S<0>>, !sbp.dtensor<8x6xf32, @dp, S<0>>) -> tensor<4x6xf32>
  %gb = lg.reduce_sum %d axes [0] : !sbp.dtensor<8x6xf32, @dp, S<0>> -> tensor<6xf32>
  %go = lg.reduce_sum %d axes [1] : !sbp.dtensor<8x6xf32, @dp, S<0>> -> tensor<8xf32>
  %odd = lg.slice %go starts [0] limits [7] strides [1] : tensor<8xf32> -> tensor<7xf32>
  %rw = sbp.annotate %gw : tensor<4x6xf32> -> !sbp.dtensor<4x6xf32, @dp, S<0>>
  %rb = sbp.annotate %gb : tensor<6xf32> -> !sbp.dtensor<6xf32, @dp, S<0>>
  %ro = sbp.annotate %odd : tensor<7xf32> -> !sbp.dtensor<7xf32, @dp, S<0>>
  lg.output ["w", "b", "o"] %rw, %rb, %ro : !sbp.dtensor<4x6xf32, @dp, S<0>>, !sbp.dtensor<6xf32, @dp, S<0>>, !sbp.dtensor<7xf32, @dp, S<0>>
}
// CHECK-LABEL: lg.graph @zero
// CHECK-DAG:   %gw.flat = lg.reshape %gw {sbp.signature = #sbp.sig<(P) -> (P)>} : !sbp.dtensor<4x6xf32, @dp, P> -> !sbp.dtensor<2x12xf32, @dp, P>
// CHECK-DAG:   %gb.flat = lg.reshape %gb {sbp.signature = #sbp.sig<(P) -> (P)>} : !sbp.dtensor<6xf32, @dp, P> -> !sbp.dtensor<2x3xf32, @dp, P>
// CHECK:       lg.concat {{.*}} axis 1 {{.*}} -> !sbp.dtensor<2x15xf32, @dp, P>
// CHECK-NEXT:  %bucket.0 = sbp.reduce_scatter %bucket.0.in over [0] {{.*}} : !sbp.dtensor<2x15xf32, @dp, P> -> !sbp.dtensor<2x15xf32, @dp, S<0>>
// CHECK:       lg.slice %bucket.0 starts [0, {{[0-9]+}}] limits [2, {{[0-9]+}}] strides [1, 1] {sbp.signature = #sbp.sig<(S<0>) -> (S<0>)>}
// CHECK:       %rw = lg.reshape %{{.*}} : !sbp.dtensor<2x12xf32, @dp, S<0>> -> !sbp.dtensor<4x6xf32, @dp, S<0>>
// CHECK:       %ro = sbp.reduce_scatter %odd over [0]
