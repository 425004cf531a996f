// RUN: sbp-opt %s --split-input-file --verify-diagnostics | filecheck %s

// Every verifier error of the sbp dialect's ops.

sbp.placement @m cpu ranks [0, 1, 2] mesh [2, 2]
// CHECK: 'sbp.placement' @m: mesh shape [2, 2] holds 4 devices but 3 ranks are given

// -----

sbp.placement @m cpu ranks [0, 1] mesh [2, 0]
// CHECK: 'sbp.placement' @m: mesh dimensions must be positive, got [2, 0]

// -----

sbp.placement @m cpu ranks [] mesh []
// CHECK: 'sbp.placement' @m: the mesh needs at least one axis

// -----

sbp.placement @m cpu ranks [0, 0] mesh [2]
// CHECK: 'sbp.placement' @m: ranks must be distinct and non-negative, got [0, 0]

// -----

sbp.placement @m cpu ranks [-1, 0] mesh [2]
// CHECK: 'sbp.placement' @m: ranks must be distinct and non-negative, got [-1, 0]

// -----

// A dtensor split on an axis its tensor does not have.
sbp.placement @m cpu ranks [0, 1] mesh [2]
%t = "test.op"() : () -> tensor<8x16xf32>
%a = sbp.annotate %t : tensor<8x16xf32> -> !sbp.dtensor<8x16xf32, @m, S<2>>
// CHECK: 'sbp.annotate': result is split on axis 2 but has rank 2

// -----

// An nd-SBP whose width is not the mesh's.
sbp.placement @m cpu ranks [0, 1, 2, 3] mesh [2, 2]
%t = "test.op"() : () -> tensor<8x16xf32>
%a = sbp.annotate %t : tensor<8x16xf32> -> !sbp.dtensor<8x16xf32, @m, S<0>>
// CHECK: 'sbp.annotate': result has 1 SBP entries but placement @m has a 2-D mesh [2, 2]

// -----

%t = "test.op"() : () -> tensor<8x16xf32>
%a = sbp.annotate %t : tensor<8x16xf32> -> !sbp.dtensor<8x16xf32, @nowhere, S<0>>
// CHECK: 'sbp.annotate': placement @nowhere does not exist

// -----

lg.graph @notmesh {
  lg.output []
}
%t = "test.op"() : () -> tensor<8x16xf32>
%a = sbp.annotate %t : tensor<8x16xf32> -> !sbp.dtensor<8x16xf32, @notmesh, S<0>>
// CHECK: 'sbp.annotate': placement @notmesh is not a placement

// -----

sbp.placement @m cpu ranks [0, 1] mesh [2]
%t = "test.op"() : () -> tensor<8x16xf32>
%a = sbp.annotate %t : tensor<8x16xf32> -> !sbp.dtensor<8x4xf32, @m, S<0>>
// CHECK: 'sbp.annotate': result must have the operand's global shape and element type ([8, 16]xf32 vs [8, 4]xf32)

// -----

sbp.placement @m cpu ranks [0, 1] mesh [2]
%t = "test.op"() : () -> !sbp.dtensor<8xf32, @m, S<0>>
%a = sbp.annotate %t : !sbp.dtensor<8xf32, @m, S<0>> -> !sbp.dtensor<8xf16, @m, B>
// CHECK: 'sbp.annotate': result must have the operand's global shape and element type ([8]xf32 vs [8]xf16)

// -----

// Each collective checks its transition on the listed mesh axes.
sbp.placement @m cpu ranks [0, 1] mesh [2]
%t = "test.op"() : () -> !sbp.dtensor<8xf32, @m, S<0>>
%a = sbp.all_reduce %t over [0] : !sbp.dtensor<8xf32, @m, S<0>> -> !sbp.dtensor<8xf32, @m, B>
// CHECK: 'sbp.all_reduce': mesh axis 0 goes from S<0> to B, but sbp.all_reduce performs P -> B

// -----

sbp.placement @m cpu ranks [0, 1] mesh [2]
%t = "test.op"() : () -> !sbp.dtensor<8xf32, @m, P>
%a = sbp.all_gather %t over [0] : !sbp.dtensor<8xf32, @m, P> -> !sbp.dtensor<8xf32, @m, B>
// CHECK: 'sbp.all_gather': mesh axis 0 goes from P to B, but sbp.all_gather performs S<i>, G or I -> B

// -----

sbp.placement @m cpu ranks [0, 1] mesh [2]
%t = "test.op"() : () -> !sbp.dtensor<8xf32, @m, B>
%a = sbp.reduce_scatter %t over [0] : !sbp.dtensor<8xf32, @m, B> -> !sbp.dtensor<8xf32, @m, S<0>>
// CHECK: 'sbp.reduce_scatter': mesh axis 0 goes from B to S<0>, but sbp.reduce_scatter performs P -> S<i> or G

// -----

sbp.placement @m cpu ranks [0, 1] mesh [2]
%t = "test.op"() : () -> !sbp.dtensor<8x8xf32, @m, S<0>>
%a = sbp.all_to_all %t over [0] : !sbp.dtensor<8x8xf32, @m, S<0>> -> !sbp.dtensor<8x8xf32, @m, S<0>>
// CHECK: 'sbp.all_to_all': mesh axis 0 goes from S<0> to S<0>, but sbp.all_to_all performs S<i> -> S<j> with i != j

// -----

sbp.placement @m cpu ranks [0, 1] mesh [2]
%t = "test.op"() : () -> !sbp.dtensor<8xf32, @m, P>
%a = sbp.slice %t over [0] : !sbp.dtensor<8xf32, @m, P> -> !sbp.dtensor<8xf32, @m, S<0>>
// CHECK: 'sbp.slice': mesh axis 0 goes from P to S<0>, but sbp.slice performs B -> S<i>, G or I (local)

// -----

sbp.placement @m cpu ranks [0, 1, 2, 3] mesh [2, 2]
%t = "test.op"() : () -> !sbp.dtensor<8xf32, @m, [P, P]>
%a = sbp.all_reduce %t over [0] : !sbp.dtensor<8xf32, @m, [P, P]> -> !sbp.dtensor<8xf32, @m, [B, B]>
// CHECK: 'sbp.all_reduce': mesh axis 1 is not in mesh_axes [0] but changes from P to B

// -----

sbp.placement @m cpu ranks [0, 1] mesh [2]
%t = "test.op"() : () -> !sbp.dtensor<8xf32, @m, P>
%a = sbp.all_reduce %t over [1] : !sbp.dtensor<8xf32, @m, P> -> !sbp.dtensor<8xf32, @m, B>
// CHECK: 'sbp.all_reduce': mesh axes [1] must be distinct axes of the 1-D mesh @m

// -----

sbp.placement @m cpu ranks [0, 1] mesh [2]
%t = "test.op"() : () -> !sbp.dtensor<8xf32, @m, P>
%a = sbp.all_reduce %t over [] : !sbp.dtensor<8xf32, @m, P> -> !sbp.dtensor<8xf32, @m, B>
// CHECK: 'sbp.all_reduce': mesh axes [] must be distinct axes of the 1-D mesh @m

// -----

sbp.placement @m cpu ranks [0, 1, 2, 3] mesh [2, 2]
%t = "test.op"() : () -> !sbp.dtensor<8xf32, @m, [P, P]>
%a = sbp.all_reduce %t over [0, 0] : !sbp.dtensor<8xf32, @m, [P, P]> -> !sbp.dtensor<8xf32, @m, [B, P]>
// CHECK: 'sbp.all_reduce': mesh axes [0, 0] must be distinct axes of the 2-D mesh @m

// -----

sbp.placement @m cpu ranks [0, 1] mesh [2]
sbp.placement @n cpu ranks [2, 3] mesh [2]
%t = "test.op"() : () -> !sbp.dtensor<8xf32, @m, S<0>>
%a = sbp.all_gather %t over [0] : !sbp.dtensor<8xf32, @m, S<0>> -> !sbp.dtensor<8xf32, @n, B>
// CHECK: 'sbp.all_gather': operand and result must share a placement (@m vs @n); use sbp.transfer to move between placements

// -----

sbp.placement @m cpu ranks [0, 1] mesh [2]
%t = "test.op"() : () -> !sbp.dtensor<8xf32, @m, S<0>>
%a = sbp.all_gather %t over [0] : !sbp.dtensor<8xf32, @m, S<0>> -> !sbp.dtensor<4xf32, @m, B>
// CHECK: 'sbp.all_gather': result must have the operand's global shape and element type ([8]xf32 vs [4]xf32)

// -----

sbp.placement @m cpu ranks [0, 1] mesh [2]
sbp.placement @n cpu ranks [2, 3] mesh [2]
%t = "test.op"() : () -> !sbp.dtensor<8xf32, @m, S<0>>
%a = sbp.transfer %t : !sbp.dtensor<8xf32, @m, S<0>> -> !sbp.dtensor<8x2xf32, @n, B>
// CHECK: 'sbp.transfer': result must have the operand's global shape and element type ([8]xf32 vs [8, 2]xf32)

// -----

sbp.placement @m cpu ranks [0, 1] mesh [2]
sbp.placement @n cpu ranks [2, 3, 4, 5] mesh [2, 2]
%t = "test.op"() : () -> !sbp.dtensor<8xf32, @m, S<0>>
%a = sbp.transfer %t : !sbp.dtensor<8xf32, @m, S<0>> -> !sbp.dtensor<8xf32, @n, [B, S<1>]>
// CHECK: 'sbp.transfer': result is split on axis 1 but has rank 1

// -----

// The collectives take dtensors only.
%t = "test.op"() : () -> tensor<8xf32>
%a = "sbp.all_gather"(%t) <{mesh_axes = array<i64: 0>, operandSegmentSizes = array<i32: 1, 0, 0>}> : (tensor<8xf32>) -> tensor<8xf32>
// CHECK: Operation does not verify: operand 'input' at position 0 does not verify:
// CHECK-NEXT: tensor<8xf32> should be of base attribute sbp.dtensor

// -----

sbp.placement @m cpu ranks [0, 1] mesh [2]
%t = "test.op"() : () -> !sbp.dtensor<8xf32, @m, P>
%a = sbp.make_partial %t over [0] : !sbp.dtensor<8xf32, @m, P> -> !sbp.dtensor<8xf32, @m, P<max>>
// CHECK: 'sbp.make_partial': mesh axis 0 goes from P to P<max>, but sbp.make_partial performs B, S<i>, G or I -> P (local)

// -----

// Pieces nest outer mesh axis first: gathering the outer axis while the
// inner one still splits the same tensor axis is not one all_gather.
sbp.placement @m cpu ranks [0, 1, 2, 3] mesh [2, 2]
%t = "test.op"() : () -> !sbp.dtensor<8xf32, @m, [S<0>, S<0>]>
%a = sbp.all_gather %t over [0] : !sbp.dtensor<8xf32, @m, [S<0>, S<0>]> -> !sbp.dtensor<8xf32, @m, [B, S<0>]>
// CHECK: 'sbp.all_gather': mesh axis 0 changes the split of tensor axis 0, which inner mesh axis 1 still splits; pieces are nested outer axis first, so change mesh axis 1 first

// -----

// An op placed (sbp.placement) on one placement with a value on another.
sbp.placement @s0 cpu ranks [0] mesh [1]
sbp.placement @s1 cpu ranks [1] mesh [1]
lg.graph @g on @s0 {
  %x = lg.input "x" : !sbp.dtensor<4xf32, @s0, B>
  %y = lg.relu %x {sbp.placement = @s1} : !sbp.dtensor<4xf32, @s0, B>
  lg.output ["y"] %y : !sbp.dtensor<4xf32, @s0, B>
}
// CHECK: 'lg.relu': operand #0 is on @s0 but the op is placed on @s1

// -----

sbp.placement @s0 cpu ranks [0] mesh [1]
lg.graph @g on @s0 {
  %x = lg.input "x" {sbp.placement = @nowhere} : tensor<4xf32>
  lg.output ["x"] %x : tensor<4xf32>
}
// CHECK: 'lg.input': placement @nowhere does not exist

// -----

sbp.placement @s0 cpu ranks [0] mesh [1]
lg.graph @g on @s0 {
  %x = lg.input "x" {sbp.placement = "s0"} : tensor<4xf32>
  lg.output ["x"] %x : tensor<4xf32>
}
// CHECK: 'lg.input': attribute 'sbp.placement' must be a placement symbol (@name)

// -----

sbp.placement @m cpu ranks [0, 1] mesh [2]
%x = "test.op"() : () -> !sbp.dtensor<8x4xf32, @m, G>
%y = sbp.all_gather %x over [0] : !sbp.dtensor<8x4xf32, @m, G> -> !sbp.dtensor<8x4xf32, @m, B>
// CHECK: 'sbp.all_gather': mesh axis 0 goes into or out of rows grouped by expert (G): it needs the group ends (`grouped by %ends`)

// -----

sbp.placement @m cpu ranks [0, 1] mesh [2]
%e = "test.op"() : () -> !sbp.dtensor<4xi32, @m, S<0>>
%x = "test.op"() : () -> !sbp.dtensor<8x4xf32, @m, P>
%y = sbp.reduce_scatter %x grouped by %e : !sbp.dtensor<4xi32, @m, S<0>> over [0] : !sbp.dtensor<8x4xf32, @m, P> -> !sbp.dtensor<8x4xf32, @m, G>
// CHECK: 'sbp.reduce_scatter': the group ends must be whole (B) on every device of @m, got S<0> on @m

// -----

sbp.placement @m cpu ranks [0, 1] mesh [2]
%e = "test.op"() : () -> !sbp.dtensor<4xi32, @m, B>
%x = "test.op"() : () -> !sbp.dtensor<8x4xf32, @m, B>
%y = sbp.slice %x grouped by %e : !sbp.dtensor<4xi32, @m, B> over [0] : !sbp.dtensor<8x4xf32, @m, B> -> !sbp.dtensor<8x4xf32, @m, S<0>>
// CHECK: 'sbp.slice': group ends are given but no mesh axis goes into or out of rows grouped by expert (G)

// -----

sbp.placement @m cpu ranks [0, 1] mesh [2]
%e = "test.op"() : () -> !sbp.dtensor<4xi32, @m, B>
%x = "test.op"() : () -> !sbp.dtensor<8x4xf32, @m, S<1>>
%y = sbp.all_to_all %x grouped by %e : !sbp.dtensor<4xi32, @m, B> over [0] : !sbp.dtensor<8x4xf32, @m, S<1>> -> !sbp.dtensor<8x4xf32, @m, G>
// CHECK: 'sbp.all_to_all': mesh axis 0 goes from S<1> to G, but sbp.all_to_all performs S<i> -> S<j> with i != j, S<0> or I -> G, G -> S<0> or I

// -----

sbp.placement @m cpu ranks [0, 1] mesh [2]
%x = "test.op"() : () -> !sbp.dtensor<8x4xf32, @m, I<4>>
%y = sbp.all_gather %x over [0] : !sbp.dtensor<8x4xf32, @m, I<4>> -> !sbp.dtensor<8x4xf32, @m, B>
// CHECK: 'sbp.all_gather': mesh axis 0 goes into or out of rows gathered by an index (I): it needs the index (`indexed by %index`)

// -----

sbp.placement @m cpu ranks [0, 1] mesh [2]
%i = "test.op"() : () -> !sbp.dtensor<6xi32, @m, B>
%x = "test.op"() : () -> !sbp.dtensor<8x4xf32, @m, I<4>>
%y = sbp.all_gather %x indexed by %i : !sbp.dtensor<6xi32, @m, B> over [0] : !sbp.dtensor<8x4xf32, @m, I<4>> -> !sbp.dtensor<8x4xf32, @m, B>
// CHECK: 'sbp.all_gather': the index must be a vector of integers, one per row (8), got [6]xi32

// -----

sbp.placement @m cpu ranks [0, 1] mesh [2]
%i = "test.op"() : () -> !sbp.dtensor<8xi32, @m, S<0>>
%x = "test.op"() : () -> !sbp.dtensor<8x4xf32, @m, I<4>>
%y = sbp.all_gather %x indexed by %i : !sbp.dtensor<8xi32, @m, S<0>> over [0] : !sbp.dtensor<8x4xf32, @m, I<4>> -> !sbp.dtensor<8x4xf32, @m, B>
// CHECK: 'sbp.all_gather': the index must be whole (B) on every device of @m, got S<0> on @m

// -----

sbp.placement @m cpu ranks [0, 1] mesh [2]
%i = "test.op"() : () -> !sbp.dtensor<8xi32, @m, B>
%x = "test.op"() : () -> !sbp.dtensor<8x4xf32, @m, B>
%y = sbp.slice %x indexed by %i : !sbp.dtensor<8xi32, @m, B> over [0] : !sbp.dtensor<8x4xf32, @m, B> -> !sbp.dtensor<8x4xf32, @m, S<0>>
// CHECK: 'sbp.slice': an index is given but no mesh axis goes into or out of rows gathered by an index (I)

// -----

sbp.placement @m cpu ranks [0, 1] mesh [2]
%x = "test.op"() : () -> !sbp.dtensor<8x4xf32, @m, I<4>>
%y = sbp.all_to_all %x over [0] : !sbp.dtensor<8x4xf32, @m, I<4>> -> !sbp.dtensor<8x4xf32, @m, S<0>>
// CHECK: 'sbp.all_to_all': mesh axis 0 goes from I<4> to S<0>, but sbp.all_to_all performs S<i> -> S<j> with i != j, S<0> or I -> G, G -> S<0> or I
