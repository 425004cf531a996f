// RUN: SBP_ROUNDTRIP
// RUN: SBP_GENERIC_ROUNDTRIP
// RUN: sbp-opt %s --split-input-file --print-op-generic | filecheck %s --check-prefix=GENERIC

// Placements: 1-D, 2-D, 3-D meshes, non-contiguous ranks, both device kinds.
sbp.placement @cpu1 cpu ranks [0] mesh [1]
sbp.placement @cpu4 cpu ranks [0, 1, 2, 3] mesh [4]
sbp.placement @grid cuda ranks [0, 1, 2, 3, 4, 5] mesh [2, 3]
sbp.placement @cube cpu ranks [0, 1, 2, 3, 4, 5, 6, 7] mesh [2, 2, 2]
sbp.placement @stage1 cpu ranks [4, 6] mesh [2]

// CHECK:      sbp.placement @cpu1 cpu ranks [0] mesh [1]
// CHECK-NEXT: sbp.placement @cpu4 cpu ranks [0, 1, 2, 3] mesh [4]
// CHECK-NEXT: sbp.placement @grid cuda ranks [0, 1, 2, 3, 4, 5] mesh [2, 3]
// CHECK-NEXT: sbp.placement @cube cpu ranks [0, 1, 2, 3, 4, 5, 6, 7] mesh [2, 2, 2]
// CHECK-NEXT: sbp.placement @stage1 cpu ranks [4, 6] mesh [2]

// GENERIC: "sbp.placement"() <{sym_name = "grid", device = #sbp<device cuda>, ranks = array<i64: 0, 1, 2, 3, 4, 5>, shape = array<i64: 2, 3>}> : () -> ()

// -----

// The annotation op, and every collective on a 2-D mesh.
sbp.placement @m cpu ranks [0, 1, 2, 3] mesh [2, 2]
sbp.placement @other cpu ranks [4, 5] mesh [2]

%t = "test.op"() : () -> tensor<8x16xf32>
%a = sbp.annotate %t : tensor<8x16xf32> -> !sbp.dtensor<8x16xf32, @m, [P, S<1>]>
%b = sbp.annotate %a : !sbp.dtensor<8x16xf32, @m, [P, S<1>]> -> !sbp.dtensor<8x16xf32, @m, [B, B]>
%ar = sbp.all_reduce %a over [0] : !sbp.dtensor<8x16xf32, @m, [P, S<1>]> -> !sbp.dtensor<8x16xf32, @m, [B, S<1>]>
%ag = sbp.all_gather %ar over [1] : !sbp.dtensor<8x16xf32, @m, [B, S<1>]> -> !sbp.dtensor<8x16xf32, @m, [B, B]>
%sl = sbp.slice %ag over [0, 1] : !sbp.dtensor<8x16xf32, @m, [B, B]> -> !sbp.dtensor<8x16xf32, @m, [S<0>, S<0>]>
%a2a = sbp.all_to_all %sl over [1] : !sbp.dtensor<8x16xf32, @m, [S<0>, S<0>]> -> !sbp.dtensor<8x16xf32, @m, [S<0>, S<1>]>
%rs = sbp.reduce_scatter %a over [0] : !sbp.dtensor<8x16xf32, @m, [P, S<1>]> -> !sbp.dtensor<8x16xf32, @m, [S<0>, S<1>]>
%pm = "test.op"() : () -> !sbp.dtensor<4xf32, @m, [P<max>, P<max>]>
%arm = sbp.all_reduce %pm over [0, 1] : !sbp.dtensor<4xf32, @m, [P<max>, P<max>]> -> !sbp.dtensor<4xf32, @m, [B, B]>
%tr = sbp.transfer %rs : !sbp.dtensor<8x16xf32, @m, [S<0>, S<1>]> -> !sbp.dtensor<8x16xf32, @other, S<1>>
%mp = sbp.make_partial %ag over [1] : !sbp.dtensor<8x16xf32, @m, [B, B]> -> !sbp.dtensor<8x16xf32, @m, [B, P]>
%mps = sbp.make_partial %sl over [0, 1] : !sbp.dtensor<8x16xf32, @m, [S<0>, S<0>]> -> !sbp.dtensor<8x16xf32, @m, [P<max>, P<max>]>
%by = sbp.all_gather %ar over [1] bytes 256 : !sbp.dtensor<8x16xf32, @m, [B, S<1>]> -> !sbp.dtensor<8x16xf32, @m, [B, B]>
%tb = sbp.transfer %rs bytes 512 : !sbp.dtensor<8x16xf32, @m, [S<0>, S<1>]> -> !sbp.dtensor<8x16xf32, @other, B>

// CHECK:      %a = sbp.annotate %t : tensor<8x16xf32> -> !sbp.dtensor<8x16xf32, @m, [P, S<1>]>
// CHECK-NEXT: %b = sbp.annotate %a : !sbp.dtensor<8x16xf32, @m, [P, S<1>]> -> !sbp.dtensor<8x16xf32, @m, [B, B]>
// CHECK-NEXT: %ar = sbp.all_reduce %a over [0] : !sbp.dtensor<8x16xf32, @m, [P, S<1>]> -> !sbp.dtensor<8x16xf32, @m, [B, S<1>]>
// CHECK-NEXT: %ag = sbp.all_gather %ar over [1] : !sbp.dtensor<8x16xf32, @m, [B, S<1>]> -> !sbp.dtensor<8x16xf32, @m, [B, B]>
// CHECK-NEXT: %sl = sbp.slice %ag over [0, 1] : !sbp.dtensor<8x16xf32, @m, [B, B]> -> !sbp.dtensor<8x16xf32, @m, [S<0>, S<0>]>
// CHECK-NEXT: %a2a = sbp.all_to_all %sl over [1] : !sbp.dtensor<8x16xf32, @m, [S<0>, S<0>]> -> !sbp.dtensor<8x16xf32, @m, [S<0>, S<1>]>
// CHECK-NEXT: %rs = sbp.reduce_scatter %a over [0] : !sbp.dtensor<8x16xf32, @m, [P, S<1>]> -> !sbp.dtensor<8x16xf32, @m, [S<0>, S<1>]>
// CHECK-NEXT: %pm = "test.op"() : () -> !sbp.dtensor<4xf32, @m, [P<max>, P<max>]>
// CHECK-NEXT: %arm = sbp.all_reduce %pm over [0, 1] : !sbp.dtensor<4xf32, @m, [P<max>, P<max>]> -> !sbp.dtensor<4xf32, @m, [B, B]>
// CHECK-NEXT: %tr = sbp.transfer %rs : !sbp.dtensor<8x16xf32, @m, [S<0>, S<1>]> -> !sbp.dtensor<8x16xf32, @other, S<1>>
// CHECK-NEXT: %mp = sbp.make_partial %ag over [1] : !sbp.dtensor<8x16xf32, @m, [B, B]> -> !sbp.dtensor<8x16xf32, @m, [B, P]>
// CHECK-NEXT: %mps = sbp.make_partial %sl over [0, 1] : !sbp.dtensor<8x16xf32, @m, [S<0>, S<0>]> -> !sbp.dtensor<8x16xf32, @m, [P<max>, P<max>]>
// CHECK-NEXT: %by = sbp.all_gather %ar over [1] bytes 256 : !sbp.dtensor<8x16xf32, @m, [B, S<1>]> -> !sbp.dtensor<8x16xf32, @m, [B, B]>
// CHECK-NEXT: %tb = sbp.transfer %rs bytes 512 : !sbp.dtensor<8x16xf32, @m, [S<0>, S<1>]> -> !sbp.dtensor<8x16xf32, @other, B>

// GENERIC:      %a = "sbp.annotate"(%t) : (tensor<8x16xf32>) -> !sbp.dtensor<8x16xf32, @m, [P, S<1>]>
// GENERIC:      %ar = "sbp.all_reduce"(%a) <{mesh_axes = array<i64: 0>, operandSegmentSizes = array<i32: 1, 0, 0>}> : (!sbp.dtensor<8x16xf32, @m, [P, S<1>]>) -> !sbp.dtensor<8x16xf32, @m, [B, S<1>]>
// GENERIC-NEXT: %ag = "sbp.all_gather"(%ar) <{mesh_axes = array<i64: 1>, operandSegmentSizes = array<i32: 1, 0, 0>}>
// GENERIC-NEXT: %sl = "sbp.slice"(%ag) <{mesh_axes = array<i64: 0, 1>, operandSegmentSizes = array<i32: 1, 0, 0>}>
// GENERIC-NEXT: %a2a = "sbp.all_to_all"(%sl) <{mesh_axes = array<i64: 1>, operandSegmentSizes = array<i32: 1, 0, 0>}>
// GENERIC-NEXT: %rs = "sbp.reduce_scatter"(%a) <{mesh_axes = array<i64: 0>, operandSegmentSizes = array<i32: 1, 0, 0>}>
// GENERIC:      %tr = "sbp.transfer"(%rs) : (!sbp.dtensor<8x16xf32, @m, [S<0>, S<1>]>) -> !sbp.dtensor<8x16xf32, @other, S<1>>
// GENERIC-NEXT: %mp = "sbp.make_partial"(%ag) <{mesh_axes = array<i64: 1>, operandSegmentSizes = array<i32: 1, 0, 0>}>
// GENERIC-NEXT: %mps = "sbp.make_partial"(%sl) <{mesh_axes = array<i64: 0, 1>, operandSegmentSizes = array<i32: 1, 0, 0>}>
// GENERIC-NEXT: %by = "sbp.all_gather"(%ar) <{mesh_axes = array<i64: 1>, bytes = 256 : i64, operandSegmentSizes = array<i32: 1, 0, 0>}>
// GENERIC-NEXT: %tb = "sbp.transfer"(%rs) <{bytes = 512 : i64}>

// -----

// Rows grouped by expert (G): the collectives into and out of them read the
// group ends; B -> G keeps the whole and reads nothing.
sbp.placement @m cpu ranks [0, 1, 2, 3] mesh [4]
sbp.placement @g cpu ranks [0, 1, 2, 3] mesh [2, 2]

%ends = "test.op"() : () -> !sbp.dtensor<8xi32, @m, B>
%rows = "test.op"() : () -> !sbp.dtensor<16x4xf32, @m, B>
%sum = "test.op"() : () -> !sbp.dtensor<16x4xf32, @m, P>
%even = "test.op"() : () -> !sbp.dtensor<16x4xf32, @m, S<0>>
%g = sbp.slice %rows over [0] : !sbp.dtensor<16x4xf32, @m, B> -> !sbp.dtensor<16x4xf32, @m, G>
%whole = sbp.all_gather %g grouped by %ends : !sbp.dtensor<8xi32, @m, B> over [0] : !sbp.dtensor<16x4xf32, @m, G> -> !sbp.dtensor<16x4xf32, @m, B>
%rs = sbp.reduce_scatter %sum grouped by %ends : !sbp.dtensor<8xi32, @m, B> over [0] : !sbp.dtensor<16x4xf32, @m, P> -> !sbp.dtensor<16x4xf32, @m, G>
%to = sbp.all_to_all %even grouped by %ends : !sbp.dtensor<8xi32, @m, B> over [0] : !sbp.dtensor<16x4xf32, @m, S<0>> -> !sbp.dtensor<16x4xf32, @m, G>
%back = sbp.all_to_all %to grouped by %ends : !sbp.dtensor<8xi32, @m, B> over [0] bytes 64 : !sbp.dtensor<16x4xf32, @m, G> -> !sbp.dtensor<16x4xf32, @m, S<0>>
%zeros = sbp.make_partial %g grouped by %ends : !sbp.dtensor<8xi32, @m, B> over [0] : !sbp.dtensor<16x4xf32, @m, G> -> !sbp.dtensor<16x4xf32, @m, P>
%ends2 = "test.op"() : () -> !sbp.dtensor<8xi32, @g, [B, B]>
%cols = "test.op"() : () -> !sbp.dtensor<16x4xf32, @g, [G, S<1>]>
%cg = sbp.all_gather %cols grouped by %ends2 : !sbp.dtensor<8xi32, @g, [B, B]> over [0] : !sbp.dtensor<16x4xf32, @g, [G, S<1>]> -> !sbp.dtensor<16x4xf32, @g, [B, S<1>]>

// CHECK:      %g = sbp.slice %rows over [0] : !sbp.dtensor<16x4xf32, @m, B> -> !sbp.dtensor<16x4xf32, @m, G>
// CHECK-NEXT: %whole = sbp.all_gather %g grouped by %ends : !sbp.dtensor<8xi32, @m, B> over [0] : !sbp.dtensor<16x4xf32, @m, G> -> !sbp.dtensor<16x4xf32, @m, B>
// CHECK-NEXT: %rs = sbp.reduce_scatter %sum grouped by %ends : !sbp.dtensor<8xi32, @m, B> over [0] : !sbp.dtensor<16x4xf32, @m, P> -> !sbp.dtensor<16x4xf32, @m, G>
// CHECK-NEXT: %to = sbp.all_to_all %even grouped by %ends : !sbp.dtensor<8xi32, @m, B> over [0] : !sbp.dtensor<16x4xf32, @m, S<0>> -> !sbp.dtensor<16x4xf32, @m, G>
// CHECK-NEXT: %back = sbp.all_to_all %to grouped by %ends : !sbp.dtensor<8xi32, @m, B> over [0] bytes 64 : !sbp.dtensor<16x4xf32, @m, G> -> !sbp.dtensor<16x4xf32, @m, S<0>>
// CHECK-NEXT: %zeros = sbp.make_partial %g grouped by %ends : !sbp.dtensor<8xi32, @m, B> over [0] : !sbp.dtensor<16x4xf32, @m, G> -> !sbp.dtensor<16x4xf32, @m, P>
// CHECK:      %cg = sbp.all_gather %cols grouped by %ends2 : !sbp.dtensor<8xi32, @g, [B, B]> over [0] : !sbp.dtensor<16x4xf32, @g, [G, S<1>]> -> !sbp.dtensor<16x4xf32, @g, [B, S<1>]>

// GENERIC: %whole = "sbp.all_gather"(%g, %ends) <{mesh_axes = array<i64: 0>, operandSegmentSizes = array<i32: 1, 1, 0>}> : (!sbp.dtensor<16x4xf32, @m, G>, !sbp.dtensor<8xi32, @m, B>) -> !sbp.dtensor<16x4xf32, @m, B>

// -----

// Rows gathered by an index (I<n>: from a table of n rows split evenly):
// the collectives into and out of them read the index, and those to or
// from rows grouped by expert the group ends too.
sbp.placement @m cpu ranks [0, 1] mesh [2]

%ends = "test.op"() : () -> !sbp.dtensor<4xi32, @m, B>
%ids = "test.op"() : () -> !sbp.dtensor<16xi32, @m, B>
%rows = "test.op"() : () -> !sbp.dtensor<16x4xf32, @m, I<8>>
%g = sbp.all_to_all %rows grouped by %ends : !sbp.dtensor<4xi32, @m, B> indexed by %ids : !sbp.dtensor<16xi32, @m, B> over [0] : !sbp.dtensor<16x4xf32, @m, I<8>> -> !sbp.dtensor<16x4xf32, @m, G>
%back = sbp.all_to_all %g grouped by %ends : !sbp.dtensor<4xi32, @m, B> indexed by %ids : !sbp.dtensor<16xi32, @m, B> over [0] : !sbp.dtensor<16x4xf32, @m, G> -> !sbp.dtensor<16x4xf32, @m, I<8>>
%whole = sbp.all_gather %rows indexed by %ids : !sbp.dtensor<16xi32, @m, B> over [0] : !sbp.dtensor<16x4xf32, @m, I<8>> -> !sbp.dtensor<16x4xf32, @m, B>
%kept = sbp.slice %whole over [0] : !sbp.dtensor<16x4xf32, @m, B> -> !sbp.dtensor<16x4xf32, @m, I<8>>
%sum = sbp.make_partial %rows indexed by %ids : !sbp.dtensor<16xi32, @m, B> over [0] : !sbp.dtensor<16x4xf32, @m, I<8>> -> !sbp.dtensor<16x4xf32, @m, P>

// CHECK:      %g = sbp.all_to_all %rows grouped by %ends : !sbp.dtensor<4xi32, @m, B> indexed by %ids : !sbp.dtensor<16xi32, @m, B> over [0] : !sbp.dtensor<16x4xf32, @m, I<8>> -> !sbp.dtensor<16x4xf32, @m, G>
// CHECK-NEXT: %back = sbp.all_to_all %g grouped by %ends : !sbp.dtensor<4xi32, @m, B> indexed by %ids : !sbp.dtensor<16xi32, @m, B> over [0] : !sbp.dtensor<16x4xf32, @m, G> -> !sbp.dtensor<16x4xf32, @m, I<8>>
// CHECK-NEXT: %whole = sbp.all_gather %rows indexed by %ids : !sbp.dtensor<16xi32, @m, B> over [0] : !sbp.dtensor<16x4xf32, @m, I<8>> -> !sbp.dtensor<16x4xf32, @m, B>
// CHECK-NEXT: %kept = sbp.slice %whole over [0] : !sbp.dtensor<16x4xf32, @m, B> -> !sbp.dtensor<16x4xf32, @m, I<8>>
// CHECK-NEXT: %sum = sbp.make_partial %rows indexed by %ids : !sbp.dtensor<16xi32, @m, B> over [0] : !sbp.dtensor<16x4xf32, @m, I<8>> -> !sbp.dtensor<16x4xf32, @m, P>

// GENERIC: %g = "sbp.all_to_all"(%rows, %ends, %ids) <{mesh_axes = array<i64: 0>, operandSegmentSizes = array<i32: 1, 1, 1>}>
