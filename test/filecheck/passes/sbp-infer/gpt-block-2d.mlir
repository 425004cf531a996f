// RUN: sbp-opt %S/../../../../examples/gpt_block.mlir -p sbp-infer | filecheck %s

// A GPT block (pre-LN attention + MLP) on a 2x2 (data x model) mesh. Hints:
// the batch split over the data axis, and Megatron's weight splits over the
// model axis (q/k/v and the first MLP weight by columns, the output
// projections by rows). Inference splits heads through reshape and
// transpose, keeps attention head-parallel, and needs exactly two P -> B
// redistributions on the model axis (two all_reduces after boxing), each on
// a sublayer's output before its residual add, as Megatron places them; the
// data axis stays S<0> throughout.


// CHECK:      %q = lg.matmul %ln1, %wq {sbp.signature = #sbp.sig<([S<0>, B], [B, S<1>]) -> ([S<0>, S<2>])>}
// CHECK:      %q4 = lg.reshape %q {sbp.signature = #sbp.sig<([S<0>, S<2>]) -> ([S<0>, S<2>])>}
// CHECK:      %qh = lg.transpose %q4 perm [0, 2, 1, 3] {sbp.signature = #sbp.sig<([S<0>, S<2>]) -> ([S<0>, S<1>])>}
// CHECK:      %s = lg.matmul %qh, %kh transpose_rhs {sbp.signature = #sbp.sig<([S<0>, S<1>], [S<0>, S<1>]) -> ([S<0>, S<1>])>}
// CHECK:      %p = lg.softmax %ss axis 3 {sbp.signature = #sbp.sig<([S<0>, S<1>]) -> ([S<0>, S<1>])>}
// CHECK:      %o = lg.matmul %p, %vh {sbp.signature = #sbp.sig<([S<0>, S<1>], [S<0>, S<1>]) -> ([S<0>, S<1>])>}
// CHECK:      %o3 = lg.reshape %ot {sbp.signature = #sbp.sig<([S<0>, S<2>]) -> ([S<0>, S<2>])>}
// CHECK:      %attn = lg.matmul %o3, %wo {sbp.signature = #sbp.sig<([S<0>, S<2>], [B, S<0>]) -> ([S<0>, P])>}
// CHECK:      %0 = sbp.annotate %attn : !sbp.dtensor<4x8x32xf32, @mesh, [S<0>, P]> -> !sbp.dtensor<4x8x32xf32, @mesh, [S<0>, B]>
// CHECK-NEXT: %r1 = lg.add %x, %0 {sbp.signature = #sbp.sig<([S<0>, B], [S<0>, B]) -> ([S<0>, B])>}
// CHECK:      %h = lg.matmul %ln2, %w1 {sbp.signature = #sbp.sig<([S<0>, B], [B, S<1>]) -> ([S<0>, S<2>])>}
// CHECK:      %m = lg.matmul %a, %w2 {sbp.signature = #sbp.sig<([S<0>, S<2>], [B, S<0>]) -> ([S<0>, P])>}
// CHECK:      %1 = sbp.annotate %m : !sbp.dtensor<4x8x32xf32, @mesh, [S<0>, P]> -> !sbp.dtensor<4x8x32xf32, @mesh, [S<0>, B]>
// CHECK-NEXT: %r2 = lg.add %r1, %1 {sbp.signature = #sbp.sig<([S<0>, B], [S<0>, B]) -> ([S<0>, B])>}

// Exactly two P -> B requests in the whole block:
// RUN: sbp-opt %S/../../../../examples/gpt_block.mlir -p sbp-infer | grep -c "\[S<0>, P\]> -> !sbp.dtensor<4x8x32xf32, @mesh, \[S<0>, B\]>" | filecheck %s --check-prefix=COUNT
// COUNT: {{^}}2{{$}}
// The count is anchored: 12 or 20 annotations would not pass for 2.
// RUN: echo 12 | not filecheck %s --check-prefix=COUNT
// RUN: echo 20 | not filecheck %s --check-prefix=COUNT
