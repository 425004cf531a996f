// RUN: sbp-opt %s --split-input-file --verify-diagnostics | filecheck %s

// Every verifier error of the lg dialect: each names the op and the mismatch.

lg.graph @g {
  %x = lg.input "x" : tensor<8x16xf32>
  %y = lg.matmul %x, %x : (tensor<8x16xf32>, tensor<8x16xf32>) -> tensor<8x16xf32>
  lg.output ["y"] %y : tensor<8x16xf32>
}
// CHECK: 'lg.matmul': contracting dimensions differ: [8, 16] @ [8, 16]

// -----

lg.graph @g {
  %x = lg.input "x" : tensor<16xf32>
  %y = lg.matmul %x, %x : (tensor<16xf32>, tensor<16xf32>) -> tensor<f32>
  lg.output ["y"] %y : tensor<f32>
}
// CHECK: 'lg.matmul': operands must have rank >= 2, got [16] and [16]

// -----

lg.graph @g {
  %a = lg.input "a" : tensor<2x4x8xf32>
  %b = lg.input "b" : tensor<3x8x4xf32>
  %y = lg.matmul %a, %b : (tensor<2x4x8xf32>, tensor<3x8x4xf32>) -> tensor<2x4x4xf32>
  lg.output ["y"] %y : tensor<2x4x4xf32>
}
// CHECK: 'lg.matmul': shapes [2], [3] do not broadcast

// -----

lg.graph @g {
  %x = lg.input "x" : tensor<8x16xf32>
  %w = lg.input "w" : tensor<16x4xf32>
  %y = lg.matmul %x, %w : (tensor<8x16xf32>, tensor<16x4xf32>) -> tensor<8x5xf32>
  lg.output ["y"] %y : tensor<8x5xf32>
}
// CHECK: 'lg.matmul': result type 8x5xf32 does not match the inferred 8x4xf32

// -----

lg.graph @g {
  %x = lg.input "x" : tensor<8x16xf32>
  %w = lg.input "w" : tensor<16x4xf64>
  %y = lg.matmul %x, %w : (tensor<8x16xf32>, tensor<16x4xf64>) -> tensor<8x4xf32>
  lg.output ["y"] %y : tensor<8x4xf32>
}
// CHECK: 'lg.matmul': operands must share one element type, got f32, f64

// -----

lg.graph @g {
  %a = lg.input "a" : tensor<8x4xf32>
  %b = lg.input "b" : tensor<3xf32>
  %y = lg.add %a, %b : (tensor<8x4xf32>, tensor<3xf32>) -> tensor<8x4xf32>
  lg.output ["y"] %y : tensor<8x4xf32>
}
// CHECK: 'lg.add': shapes [8, 4], [3] do not broadcast

// -----

lg.graph @g {
  %a = lg.input "a" : tensor<8x4xi1>
  %y = lg.mul %a, %a : (tensor<8x4xi1>, tensor<8x4xi1>) -> tensor<8x4xi1>
  lg.output ["y"] %y : tensor<8x4xi1>
}
// CHECK: 'lg.mul': operands must have a float element type, got i1

// -----

lg.graph @g {
  %a = lg.input "a" : tensor<8xi32>
  %y = lg.relu %a : tensor<8xi32>
  lg.output ["y"] %y : tensor<8xi32>
}
// CHECK: 'lg.relu': operand must have a float element type, got i32

// -----

lg.graph @g {
  %x = lg.input "x" : tensor<8x4xf32>
  %y = lg.softmax %x axis 2 : tensor<8x4xf32>
  lg.output ["y"] %y : tensor<8x4xf32>
}
// CHECK: 'lg.softmax': axis 2 is out of range for rank 2

// -----

lg.graph @g {
  %x = lg.input "x" : tensor<8x4xf32>
  %w = lg.input "w" : tensor<8x4xf32>
  %b = lg.input "b" : tensor<8x4xf32>
  %y = lg.layernorm %x weight %w : tensor<8x4xf32> bias %b : tensor<8x4xf32> axis 1 eps 1.0e-05 : tensor<8x4xf32>
  lg.output ["y"] %y : tensor<8x4xf32>
}
// CHECK: 'lg.layernorm': weight shape [8, 4] must equal the normalized shape [4]

// -----

lg.graph @g {
  %x = lg.input "x" : tensor<8x4xf32>
  %w = lg.input "w" : tensor<4xf32>
  %y = lg.layernorm %x weight %w : tensor<4xf32> axis 1 eps 1.0e-05 : tensor<8x4xf32>
  lg.output ["y"] %y : tensor<8x4xf32>
}
// CHECK: 'lg.layernorm': an affine layernorm needs both weight and bias

// -----

lg.graph @g {
  %x = lg.input "x" : tensor<8x4xf32>
  %y = lg.layernorm %x axis 1 eps 0.0 : tensor<8x4xf32>
  lg.output ["y"] %y : tensor<8x4xf32>
}
// CHECK: 'lg.layernorm': eps must be positive, got 0.0

// -----

lg.graph @g {
  %x = lg.input "x" : tensor<8x4xf32>
  %dy = lg.input "dy" : tensor<8x4xf32>
  %y = lg.layernorm_grad %x, %dy axis 1 eps 0.0 : (tensor<8x4xf32>, tensor<8x4xf32>) -> tensor<8x4xf32>
  lg.output ["y"] %y : tensor<8x4xf32>
}
// CHECK: 'lg.layernorm_grad': eps must be positive, got 0.0

// -----

lg.graph @g {
  %x = lg.input "x" : tensor<8x4xf32>
  %dy = lg.input "dy" : tensor<8x4xf32>
  %y = lg.layernorm_grad %x, %dy axis 2 eps 1.0e-05 : (tensor<8x4xf32>, tensor<8x4xf32>) -> tensor<8x4xf32>
  lg.output ["y"] %y : tensor<8x4xf32>
}
// CHECK: 'lg.layernorm_grad': axis 2 is out of range for rank 2

// -----

lg.graph @g {
  %x = lg.input "x" : tensor<8x4xi64>
  %dy = lg.input "dy" : tensor<8x4xi64>
  %y = lg.layernorm_grad %x, %dy axis 1 eps 1.0e-05 : (tensor<8x4xi64>, tensor<8x4xi64>) -> tensor<8x4xi64>
  lg.output ["y"] %y : tensor<8x4xi64>
}
// CHECK: 'lg.layernorm_grad': input must have a float element type, got i64

// -----

lg.graph @g {
  %x = lg.input "x" : tensor<8x4xf32>
  %dy = lg.input "dy" : tensor<8x3xf32>
  %y = lg.layernorm_grad %x, %dy axis 1 eps 1.0e-05 : (tensor<8x4xf32>, tensor<8x3xf32>) -> tensor<8x4xf32>
  lg.output ["y"] %y : tensor<8x4xf32>
}
// CHECK: 'lg.layernorm_grad': grad shape [8, 3] must equal the input's [8, 4]

// -----

lg.graph @g {
  %x = lg.input "x" : tensor<8x4xf32>
  %y = lg.reduce_sum %x axes [1, 0] : tensor<8x4xf32> -> tensor<f32>
  lg.output ["y"] %y : tensor<f32>
}
// CHECK: 'lg.reduce_sum': axes [1, 0] must be sorted and distinct

// -----

lg.graph @g {
  %x = lg.input "x" : tensor<8x4xf32>
  %y = lg.reduce_max %x axes [2] : tensor<8x4xf32> -> tensor<8x4xf32>
  lg.output ["y"] %y : tensor<8x4xf32>
}
// CHECK: 'lg.reduce_max': axis 2 is out of range for rank 2

// -----

lg.graph @g {
  %x = lg.input "x" : tensor<8x4xf32>
  %y = lg.reduce_mean %x axes [1] : tensor<8x4xf32> -> tensor<8x1xf32>
  lg.output ["y"] %y : tensor<8x1xf32>
}
// CHECK: 'lg.reduce_mean': result type 8x1xf32 does not match the inferred 8xf32

// -----

lg.graph @g {
  %x = lg.input "x" : tensor<8x4xf32>
  %y = lg.reshape %x : tensor<8x4xf32> -> tensor<5x6xf32>
  lg.output ["y"] %y : tensor<5x6xf32>
}
// CHECK: 'lg.reshape': cannot reshape [8, 4] (32 elements) to [5, 6] (30 elements)

// -----

lg.graph @g {
  %x = lg.input "x" : tensor<8x4xf32>
  %y = lg.reshape %x : tensor<8x4xf32> -> tensor<32xf16>
  lg.output ["y"] %y : tensor<32xf16>
}
// CHECK: 'lg.reshape': result type 32xf16 does not match the inferred 32xf32

// -----

lg.graph @g {
  %x = lg.input "x" : tensor<8x4xf32>
  %y = lg.broadcast_to %x : tensor<8x4xf32> -> tensor<8x8xf32>
  lg.output ["y"] %y : tensor<8x8xf32>
}
// CHECK: 'lg.broadcast_to': shapes [8, 4], [8, 8] do not broadcast

// -----

lg.graph @g {
  %x = lg.input "x" : tensor<1x4xf32>
  %y = lg.broadcast_to %x : tensor<1x4xf32> -> tensor<4xf32>
  lg.output ["y"] %y : tensor<4xf32>
}
// CHECK: 'lg.broadcast_to': cannot broadcast [1, 4] to [4]

// -----

lg.graph @g {
  %x = lg.input "x" : tensor<8x4xf32>
  %y = lg.transpose %x perm [0, 0] : tensor<8x4xf32> -> tensor<8x8xf32>
  lg.output ["y"] %y : tensor<8x8xf32>
}
// CHECK: 'lg.transpose': perm [0, 0] is not a permutation of the 2 axes

// -----

lg.graph @g {
  %a = lg.input "a" : tensor<8x4xf32>
  %b = lg.input "b" : tensor<7x4xf32>
  %y = lg.concat %a, %b axis 1 : (tensor<8x4xf32>, tensor<7x4xf32>) -> tensor<8x8xf32>
  lg.output ["y"] %y : tensor<8x8xf32>
}
// CHECK: 'lg.concat': shapes [[8, 4], [7, 4]] differ outside axis 1

// -----

lg.graph @g {
  %a = lg.input "a" : tensor<8x4xf32>
  %b = lg.input "b" : tensor<8x4xf16>
  %y = lg.concat %a, %b axis 0 : (tensor<8x4xf32>, tensor<8x4xf16>) -> tensor<16x4xf32>
  lg.output ["y"] %y : tensor<16x4xf32>
}
// CHECK: 'lg.concat': operands must share one element type, got f32, f16

// -----

lg.graph @g {
  %x = lg.input "x" : tensor<8x4xf32>
  %y = lg.slice %x starts [0, 2] limits [8, 5] strides [1, 1] : tensor<8x4xf32> -> tensor<8x3xf32>
  lg.output ["y"] %y : tensor<8x3xf32>
}
// CHECK: 'lg.slice': axis 1: need 0 <= start <= limit <= 4 and stride >= 1, got 2:5:1

// -----

lg.graph @g {
  %x = lg.input "x" : tensor<8x4xf32>
  %y = lg.slice %x starts [0] limits [8] strides [1] : tensor<8x4xf32> -> tensor<8xf32>
  lg.output ["y"] %y : tensor<8xf32>
}
// CHECK: 'lg.slice': starts, limits and strides need one entry per axis (2)

// -----

lg.graph @g {
  %t = lg.input "t" : tensor<10x4xf32>
  %i = lg.input "i" : tensor<3xf32>
  %y = lg.embedding %t, %i : (tensor<10x4xf32>, tensor<3xf32>) -> tensor<3x4xf32>
  lg.output ["y"] %y : tensor<3x4xf32>
}
// CHECK: 'lg.embedding': indices must be i32 or i64, got f32

// -----

lg.graph @g {
  %t = lg.input "t" : tensor<10xf32>
  %i = lg.input "i" : tensor<3xi64>
  %y = lg.embedding %t, %i : (tensor<10xf32>, tensor<3xi64>) -> tensor<3xf32>
  lg.output ["y"] %y : tensor<3xf32>
}
// CHECK: 'lg.embedding': table must have rank 2, got [10]

// -----

lg.graph @g {
  %t = lg.input "t" : tensor<10x4xf32>
  %i = lg.input "i" : tensor<3xi64>
  %y = lg.embedding %t, %i padding 10 : (tensor<10x4xf32>, tensor<3xi64>) -> tensor<3x4xf32>
  lg.output ["y"] %y : tensor<3x4xf32>
}
// CHECK: 'lg.embedding': padding 10 is not a row of the 10-row table

// -----

lg.graph @g {
  %g = lg.input "g" : tensor<3x4xf32>
  %i = lg.input "i" : tensor<3xi64>
  %y = lg.embedding_grad %g, %i rows 5 padding -1 : (tensor<3x4xf32>, tensor<3xi64>) -> tensor<5x4xf32>
  lg.output ["y"] %y : tensor<5x4xf32>
}
// CHECK: 'lg.embedding_grad': padding -1 is not a row of the 5-row table

// -----

lg.graph @g {
  %l = lg.input "l" : tensor<8x10xf32>
  %t = lg.input "t" : tensor<4xi64>
  %y = lg.cross_entropy %l, %t : (tensor<8x10xf32>, tensor<4xi64>) -> tensor<f32>
  lg.output ["y"] %y : tensor<f32>
}
// CHECK: 'lg.cross_entropy': labels shape [4] must be the logits shape without its class axis [8]

// -----

lg.graph @g {
  %l = lg.input "l" : tensor<8x10xf32>
  %t = lg.input "t" : tensor<8xf32>
  %y = lg.cross_entropy %l, %t : (tensor<8x10xf32>, tensor<8xf32>) -> tensor<f32>
  lg.output ["y"] %y : tensor<f32>
}
// CHECK: 'lg.cross_entropy': labels must be i32 or i64, got f32

// -----

lg.graph @g {
  %a = lg.input "a" : tensor<8xf32>
  %b = lg.input "b" : tensor<4xf32>
  %y = lg.mse_loss %a, %b : (tensor<8xf32>, tensor<4xf32>) -> tensor<f32>
  lg.output ["y"] %y : tensor<f32>
}
// CHECK: 'lg.mse_loss': operands must have one shape, got [8] and [4]

// -----

lg.graph @g {
  %w = lg.param "w" init #lg.zeros : tensor<4xi32>
  lg.output ["w"] %w : tensor<4xi32>
}
// CHECK: 'lg.param': a parameter must have a float element type, got i32

// -----

lg.graph @g {
  %x = lg.input "x" : tensor<4xi8>
  lg.output ["x"] %x : tensor<4xi8>
}
// CHECK: 'lg.input': element type i8 is not supported (float, i32, i64 or i1)

// -----

lg.graph @g {
  %x = lg.input "x" : tensor<4xf32>
  %y = lg.cast %x : tensor<4xf32> -> tensor<4xi8>
  lg.output ["y"] %y : tensor<4xi8>
}
// CHECK: 'lg.cast': result must be a float, i32, i64 or i1 tensor, got i8

// -----

lg.graph @g {
  %x = lg.input "x" : tensor<4xf32>
  %y = lg.cast %x : tensor<4xf32> -> tensor<3xi1>
  lg.output ["y"] %y : tensor<3xi1>
}
// CHECK: 'lg.cast': result type 3xi1 does not match the inferred 4xi1

// -----

lg.graph @g {
  %a = lg.input "a" : tensor<4xi1>
  %b = lg.input "b" : tensor<4xf32>
  %y = lg.logical "and" %a, %b : (tensor<4xi1>, tensor<4xf32>) -> tensor<4xi1>
  lg.output ["y"] %y : tensor<4xi1>
}
// CHECK: 'lg.logical': operands must be i1, got f32

// -----

lg.graph @g {
  %a = lg.input "a" : tensor<4xi1>
  %y = lg.logical "nand" %a, %a : (tensor<4xi1>, tensor<4xi1>) -> tensor<4xi1>
  lg.output ["y"] %y : tensor<4xi1>
}
// CHECK: 'lg.logical': kind must be one of and, or, xor, got 'nand'

// -----

lg.graph @g {
  %c = lg.input "c" : tensor<4xf32>
  %a = lg.input "a" : tensor<4xf32>
  %y = lg.select %c, %a, %a : (tensor<4xf32>, tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>
  lg.output ["y"] %y : tensor<4xf32>
}
// CHECK: 'lg.select': condition must be i1, got f32

// -----

lg.graph @g {
  %c = lg.input "c" : tensor<4xi1>
  %a = lg.input "a" : tensor<4xf32>
  %b = lg.input "b" : tensor<4xi64>
  %y = lg.select %c, %a, %b : (tensor<4xi1>, tensor<4xf32>, tensor<4xi64>) -> tensor<4xf32>
  lg.output ["y"] %y : tensor<4xf32>
}
// CHECK: 'lg.select': values must share one element type, got f32, i64

// -----

lg.graph @g {
  %c = "lg.constant"() <{value = dense<1.0> : tensor<4xf32>}> : () -> tensor<5xf32>
  lg.output ["c"] %c : tensor<5xf32>
}
// CHECK: 'lg.constant': result type does not match the literal's type tensor<4xf32>

// -----

lg.graph @g {
  %x = lg.input "x" : tensor<4xf32>
  %w = lg.param "x" init #lg.zeros : tensor<4xf32>
  lg.output []
}
// CHECK: 'lg.param': name "x" is already used by an lg.input of graph @g

// -----

lg.graph @g {
  %x = lg.input "x" : tensor<4xf32>
  lg.output ["a", "b"] %x : tensor<4xf32>
}
// CHECK: 'lg.output': 2 names for 1 values

// -----

lg.graph @g {
  %x = lg.input "x" : tensor<4xf32>
  lg.output ["a", "a"] %x, %x : tensor<4xf32>, tensor<4xf32>
}
// CHECK: 'lg.output': output names must be distinct, got 'a' more than once

// -----

lg.graph @g on @nowhere {
  lg.output []
}
// CHECK: 'lg.graph': placement @nowhere does not exist

// -----

"lg.graph"() <{sym_name = "g"}> ({
  %x = "lg.input"() <{key = "x"}> : () -> tensor<4xf32>
}) : () -> ()
// CHECK: Operation lg.input terminates block in single-block region but is not a terminator

// -----

"lg.output"() <{names = []}> : () -> ()
// CHECK: 'lg.output' expects parent op 'lg.graph'

// -----

// Distributed operands: the placement, the mesh width, and one placement per op.
sbp.placement @m cpu ranks [0, 1] mesh [2]
sbp.placement @n cpu ranks [2, 3] mesh [2]
lg.graph @g {
  %a = lg.input "a" : !sbp.dtensor<8xf32, @m, S<0>>
  %b = lg.input "b" : !sbp.dtensor<8xf32, @n, S<0>>
  %y = lg.add %a, %b : (!sbp.dtensor<8xf32, @m, S<0>>, !sbp.dtensor<8xf32, @n, S<0>>) -> !sbp.dtensor<8xf32, @m, S<0>>
  lg.output ["y"] %y : !sbp.dtensor<8xf32, @m, S<0>>
}
// CHECK: 'lg.add': all operands and results must share one placement, got @m, @n

// -----

sbp.placement @m cpu ranks [0, 1] mesh [2]
lg.graph @g {
  %a = lg.input "a" : !sbp.dtensor<8x4xf32, @m, S<2>>
  lg.output ["a"] %a : !sbp.dtensor<8x4xf32, @m, S<2>>
}
// CHECK: 'lg.input': result #0 is split on axis 2 but has rank 2

// -----

sbp.placement @m cpu ranks [0, 1, 2, 3] mesh [4]
lg.graph @g {
  %a = lg.input "a" : !sbp.dtensor<8x4xf32, @m, [S<0>, B]>
  lg.output ["a"] %a : !sbp.dtensor<8x4xf32, @m, [S<0>, B]>
}
// CHECK: 'lg.input': result #0 has 2 SBP entries but placement @m has a 1-D mesh [4]

// -----

// A recorded signature must match the operands and results.
sbp.placement @m cpu ranks [0, 1] mesh [2]
lg.graph @g {
  %a = lg.input "a" : !sbp.dtensor<8xf32, @m, S<0>>
  %y = lg.relu %a {sbp.signature = #sbp.sig<(B) -> (B)>} : !sbp.dtensor<8xf32, @m, S<0>>
  lg.output ["y"] %y : !sbp.dtensor<8xf32, @m, S<0>>
}
// CHECK: 'lg.relu': operand #0 is S<0> but the signature requires B

// -----

sbp.placement @m cpu ranks [0, 1] mesh [2]
lg.graph @g {
  %a = lg.input "a" : !sbp.dtensor<8xf32, @m, S<0>>
  %y = lg.relu %a {sbp.signature = #sbp.sig<(S<0>, B) -> (S<0>)>} : !sbp.dtensor<8xf32, @m, S<0>>
  lg.output ["y"] %y : !sbp.dtensor<8xf32, @m, S<0>>
}
// CHECK: 'lg.relu': signature has 2 operands but the op has 1

// -----

sbp.placement @m cpu ranks [0, 1] mesh [2]
lg.graph @g {
  %a = lg.input "a" : tensor<8xf32>
  %y = lg.relu %a {sbp.signature = #sbp.sig<(S<0>) -> (S<0>)>} : tensor<8xf32>
  lg.output ["y"] %y : tensor<8xf32>
}
// CHECK: 'lg.relu': operand #0 has no distribution but the op has a signature

// -----

lg.graph @g {
  %a = lg.input "a" : tensor<8xf32>
  %y = lg.relu %a {sbp.signature = 3 : i64} : tensor<8xf32>
  lg.output ["y"] %y : tensor<8xf32>
}
// CHECK: 'lg.relu': attribute 'sbp.signature' must be an #sbp.sig

// -----

lg.graph @g {
  %t = lg.input "t" : tensor<10x4xi32>
  %i = lg.input "i" : tensor<3xi64>
  %y = lg.embedding %t, %i : (tensor<10x4xi32>, tensor<3xi64>) -> tensor<3x4xi32>
  lg.output ["y"] %y : tensor<3x4xi32>
}
// CHECK: 'lg.embedding': table must have a float element type, got i32

// -----

lg.graph @g {
  %l = lg.input "l" : tensor<f32>
  %t = lg.input "t" : tensor<i64>
  %y = lg.cross_entropy %l, %t : (tensor<f32>, tensor<i64>) -> tensor<f32>
  lg.output ["y"] %y : tensor<f32>
}
// CHECK: 'lg.cross_entropy': logits must have a class axis

// -----

lg.graph @g {
  %l = lg.input "l" : tensor<8x10xi64>
  %t = lg.input "t" : tensor<8xi64>
  %y = lg.cross_entropy %l, %t : (tensor<8x10xi64>, tensor<8xi64>) -> tensor<i64>
  lg.output ["y"] %y : tensor<i64>
}
// CHECK: 'lg.cross_entropy': logits must have a float element type, got i64

// -----

lg.graph @g {
  %x = lg.input "x" : tensor<8x4xi64>
  %y = lg.reduce_mean %x axes [0] : tensor<8x4xi64> -> tensor<4xi64>
  lg.output ["y"] %y : tensor<4xi64>
}
// CHECK: 'lg.reduce_mean': operand must have a float element type, got i64

// -----

lg.graph @g {
  %y = "lg.concat"() <{axis = 0 : i64}> : () -> tensor<4xf32>
  lg.output ["y"] %y : tensor<4xf32>
}
// CHECK: 'lg.concat': needs at least one operand

// -----

lg.graph @g {
  %c = "lg.constant"() <{value = dense<1.0> : vector<4xf32>}> : () -> tensor<4xf32>
  lg.output ["c"] %c : tensor<4xf32>
}
// CHECK: 'lg.constant': the literal must be a tensor

// -----

lg.graph @g {
  %x = lg.input "x" : tensor<8xf32>
  %y = "lg.relu"(%x) : (tensor<8xf32>) -> tensor<4xf32>
  lg.output ["y"] %y : tensor<4xf32>
}
// CHECK: result 'result' at position 0 does not verify

// -----

sbp.placement @m cpu ranks [0, 1] mesh [2]
lg.graph @g {
  %a = lg.input "a" : !sbp.dtensor<8xf32, @m, S<0>>
  %y = lg.relu %a {sbp.signature = #sbp.sig<(S<0>) -> ()>} : !sbp.dtensor<8xf32, @m, S<0>>
  lg.output ["y"] %y : !sbp.dtensor<8xf32, @m, S<0>>
}
// CHECK: 'lg.relu': signature has 0 results but the op has 1

// -----

sbp.placement @m cpu ranks [0, 1] mesh [2]
lg.graph @g {
  %a = lg.input "a" : tensor<8xf32>
  %b = lg.input "b" : tensor<8xf32>
  %y = lg.add %a, %b : (tensor<8xf32>, tensor<8xf32>) -> !sbp.dtensor<8xf32, @m, P>
  %z = lg.add %a, %b {sbp.signature = #sbp.sig<(B, B) -> (P)>} : (tensor<8xf32>, tensor<8xf32>) -> !sbp.dtensor<8xf32, @m, P>
  lg.output ["y"] %y : !sbp.dtensor<8xf32, @m, P>
}
// CHECK: 'lg.add': operand #0 has no distribution but the op has a signature

// -----

lg.graph @g {
  %l = lg.input "l" : tensor<8xf32>
  %y = lg.one_hot %l classes 4 : tensor<8xf32> -> tensor<8x4xf32>
  lg.output ["y"] %y : tensor<8x4xf32>
}
// CHECK: 'lg.one_hot': labels must be i32 or i64, got f32

// -----

lg.graph @g {
  %l = lg.input "l" : tensor<8xi64>
  %y = lg.one_hot %l classes 4 : tensor<8xi64> -> tensor<8x5xf32>
  lg.output ["y"] %y : tensor<8x5xf32>
}
// CHECK: 'lg.one_hot': result type 8x5xf32 does not match the inferred 8x4xf32

// -----

lg.graph @g {
  %l = lg.input "l" : tensor<8xi64>
  %y = lg.one_hot %l classes 0 : tensor<8xi64> -> tensor<8x0xf32>
  lg.output ["y"] %y : tensor<8x0xf32>
}
// CHECK: 'lg.one_hot': classes must be positive, got 0

// -----

lg.graph @g {
  %l = lg.input "l" : tensor<8xi64>
  %y = lg.one_hot %l classes 4 : tensor<8xi64> -> tensor<8x4xi64>
  lg.output ["y"] %y : tensor<8x4xi64>
}
// CHECK: 'lg.one_hot': result must have a float element type, got i64

// -----

lg.graph @g {
  %g = lg.input "g" : tensor<3x4xf32>
  %i = lg.input "i" : tensor<2xi64>
  %y = lg.embedding_grad %g, %i rows 5 : (tensor<3x4xf32>, tensor<2xi64>) -> tensor<5x4xf32>
  lg.output ["y"] %y : tensor<5x4xf32>
}
// CHECK: 'lg.embedding_grad': grad shape [3, 4] must be the indices shape [2] plus one axis

// -----

lg.graph @g {
  %g = lg.input "g" : tensor<3x4xf32>
  %i = lg.input "i" : tensor<3xf32>
  %y = lg.embedding_grad %g, %i rows 5 : (tensor<3x4xf32>, tensor<3xf32>) -> tensor<5x4xf32>
  lg.output ["y"] %y : tensor<5x4xf32>
}
// CHECK: 'lg.embedding_grad': indices must be i32 or i64, got f32

// -----

lg.graph @g {
  %g = lg.input "g" : tensor<3x4xi64>
  %i = lg.input "i" : tensor<3xi64>
  %y = lg.embedding_grad %g, %i rows 5 : (tensor<3x4xi64>, tensor<3xi64>) -> tensor<5x4xi64>
  lg.output ["y"] %y : tensor<5x4xi64>
}
// CHECK: 'lg.embedding_grad': grad must have a float element type, got i64

// -----

lg.graph @g {
  %a = lg.input "a" : tensor<4xi64>
  %b = lg.input "b" : tensor<4xf32>
  %y = lg.compare "lt" %a, %b : (tensor<4xi64>, tensor<4xf32>) -> tensor<4xi1>
  lg.output ["y"] %y : tensor<4xi1>
}
// CHECK: 'lg.compare': operands must share one element type, got i64, f32

// -----

lg.graph @g {
  %a = lg.input "a" : tensor<4xf32>
  %y = lg.compare "less" %a, %a : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xi1>
  lg.output ["y"] %y : tensor<4xi1>
}
// CHECK: 'lg.compare': kind must be one of eq, ne, lt, le, gt, ge, got 'less'

// -----

lg.graph @g {
  %a = lg.input "a" : tensor<4xf32>
  %y = lg.compare "eq" %a, %a : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>
  lg.output ["y"] %y : tensor<4xf32>
}
// CHECK: 'lg.compare': result type 4xf32 does not match the inferred 4xi1

// -----

lg.graph @g {
  %x = lg.input "x" : tensor<8x4xf32>
  %m = lg.input "m" : tensor<4xf32>
  %s = lg.sum_exp %x, %m : (tensor<8x4xf32>, tensor<4xf32>) -> tensor<8xf32>
  lg.output ["s"] %s : tensor<8xf32>
}
// CHECK: 'lg.sum_exp': shift shape [4] must be the logits shape without its class axis [8]

// -----

lg.graph @g {
  %x = lg.input "x" : tensor<8x4xf32>
  %m = lg.input "m" : tensor<8xf64>
  %s = lg.sum_exp %x, %m : (tensor<8x4xf32>, tensor<8xf64>) -> tensor<8xf32>
  lg.output ["s"] %s : tensor<8xf32>
}
// CHECK: 'lg.sum_exp': shift must be f32 as the logits are, got f64

// -----

lg.graph @g {
  %x = lg.input "x" : tensor<8x4xf32>
  %labels = lg.input "labels" : tensor<8xf32>
  %m = lg.input "m" : tensor<8xf32>
  %y = lg.token_cross_entropy %x, %labels, %m, %m : (tensor<8x4xf32>, tensor<8xf32>, tensor<8xf32>, tensor<8xf32>) -> tensor<8xf32>
  lg.output ["y"] %y : tensor<8xf32>
}
// CHECK: 'lg.token_cross_entropy': labels must be i32 or i64, got f32

// -----

lg.graph @g {
  %x = lg.input "x" : tensor<8x4xf32>
  %labels = lg.input "labels" : tensor<8xi64>
  %m = lg.input "m" : tensor<8xf32>
  %s = lg.input "s" : tensor<4xf32>
  %y = lg.token_cross_entropy %x, %labels, %m, %s : (tensor<8x4xf32>, tensor<8xi64>, tensor<8xf32>, tensor<4xf32>) -> tensor<8xf32>
  lg.output ["y"] %y : tensor<8xf32>
}
// CHECK: 'lg.token_cross_entropy': sum_exp shape [4] must be the logits shape without its class axis [8]

// -----

lg.graph @g {
  %x = lg.input "x" : tensor<8x4xf32>
  %labels = lg.input "labels" : tensor<8xi64>
  %m = lg.input "m" : tensor<8xf32>
  %g = lg.input "g" : tensor<8x4xf32>
  %y = lg.token_cross_entropy_grad %x, %labels, %m, %m, %g : (tensor<8x4xf32>, tensor<8xi64>, tensor<8xf32>, tensor<8xf32>, tensor<8x4xf32>) -> tensor<8x4xf32>
  lg.output ["y"] %y : tensor<8x4xf32>
}
// CHECK: 'lg.token_cross_entropy_grad': grad shape [8, 4] must be the logits shape without its class axis [8]

// -----

lg.graph @g {
  %x = lg.input "x" : tensor<8x4xf32>
  %y = lg.pad %x low [0, -1] high [0, 0] value 0.000000e+00 : tensor<8x4xf32> -> tensor<8x3xf32>
  lg.output ["y"] %y : tensor<8x3xf32>
}
// CHECK: 'lg.pad': padding widths must be at least 0, got low [0, -1] high [0, 0]

// -----

lg.graph @g {
  %x = lg.input "x" : tensor<8xi64>
  %y = lg.pad %x low [1] high [0] value 5.000000e-01 : tensor<8xi64> -> tensor<9xi64>
  lg.output ["y"] %y : tensor<9xi64>
}
// CHECK: 'lg.pad': a i64 tensor cannot be padded with 0.5

// -----

lg.graph @g {
  %x = lg.input "x" : tensor<8x4xf32>
  %y = lg.pad %x low [1] high [0] value 0.000000e+00 : tensor<8x4xf32> -> tensor<9x4xf32>
  lg.output ["y"] %y : tensor<9x4xf32>
}
// CHECK: 'lg.pad': low and high need one entry per axis (2)

// -----

lg.graph @g {
  %x = lg.input "x" : tensor<8xi1>
  %y = lg.cumsum %x axis 0 : tensor<8xi1> -> tensor<8xi1>
  lg.output ["y"] %y : tensor<8xi1>
}
// CHECK: 'lg.cumsum': operand must be a float, i32 or i64 tensor, got i1

// -----

lg.graph @g {
  %x = lg.input "x" : tensor<8xf32>
  %y = lg.cumsum %x axis 1 : tensor<8xf32> -> tensor<8xf32>
  lg.output ["y"] %y : tensor<8xf32>
}
// CHECK: 'lg.cumsum': axis 1 is out of range for rank 1

// -----

lg.graph @g {
  %a = lg.input "a" : tensor<4xi64>
  %b = lg.input "b" : tensor<4xi32>
  %y = lg.add %a, %b : (tensor<4xi64>, tensor<4xi32>) -> tensor<4xi64>
  lg.output ["y"] %y : tensor<4xi64>
}
// CHECK: 'lg.add': operands must share one element type, got i64, i32

// -----

lg.graph @g {
  %a = lg.input "a" : tensor<4xi64>
  %y = lg.div %a, %a : (tensor<4xi64>, tensor<4xi64>) -> tensor<4xi64>
  lg.output ["y"] %y : tensor<4xi64>
}
// CHECK: 'lg.div': operands must have a float element type, got i64

// -----

lg.graph @g {
  %x = lg.input "x" : tensor<8x4xf32>
  %i = lg.input "i" : tensor<4x2xi64>
  %y = lg.gather %x, %i axis 1 : (tensor<8x4xf32>, tensor<4x2xi64>) -> tensor<4x2xf32>
  lg.output ["y"] %y : tensor<4x2xf32>
}
// CHECK: 'lg.gather': indices shape [4, 2] must be the input shape [8, 4] but on axis 1

// -----

lg.graph @g {
  %x = lg.input "x" : tensor<8x4xf32>
  %i = lg.input "i" : tensor<8x2xf32>
  %y = lg.gather %x, %i axis 1 : (tensor<8x4xf32>, tensor<8x2xf32>) -> tensor<8x2xf32>
  lg.output ["y"] %y : tensor<8x2xf32>
}
// CHECK: 'lg.gather': indices must be i32 or i64, got f32

// -----

lg.graph @g {
  %u = lg.input "u" : tensor<8x2xf32>
  %i = lg.input "i" : tensor<8x2xi64>
  %y = lg.scatter_add %u, %i axis 2 size 4 : (tensor<8x2xf32>, tensor<8x2xi64>) -> tensor<8x4xf32>
  lg.output ["y"] %y : tensor<8x4xf32>
}
// CHECK: 'lg.scatter_add': axis 2 is out of range for rank 2

// -----

lg.graph @g {
  %x = lg.input "x" : tensor<2x3x4x4xf32>
  %w = lg.input "w" : tensor<4x2x2x2xf32>
  %y = lg.conv2d %x, %w stride [1, 1] padding [0, 0] dilation [1, 1] groups 1 : (tensor<2x3x4x4xf32>, tensor<4x2x2x2xf32>) -> tensor<2x4x3x3xf32>
  lg.output ["y"] %y : tensor<2x4x3x3xf32>
}
// CHECK: 'lg.conv2d': 3 input channels and 4 output channels do not fit weights [4, 2, 2, 2] in 1 groups

// -----

lg.graph @g {
  %x = lg.input "x" : tensor<2x2x4x4xf32>
  %w = lg.input "w" : tensor<4x2x6x2xf32>
  %y = lg.conv2d %x, %w stride [1, 1] padding [0, 0] dilation [1, 1] groups 1 : (tensor<2x2x4x4xf32>, tensor<4x2x6x2xf32>) -> tensor<2x4x1x3xf32>
  lg.output ["y"] %y : tensor<2x4x1x3xf32>
}
// CHECK: 'lg.conv2d': the kernel [6, 2] (dilation [1, 1]) does not fit the padded image [4, 4]

// -----

lg.graph @g {
  %x = lg.input "x" : tensor<2x2x4x4xf32>
  %w = lg.input "w" : tensor<4x2x2x2xf32>
  %y = lg.conv2d %x, %w stride [0, 1] padding [0, 0] dilation [1, 1] groups 1 : (tensor<2x2x4x4xf32>, tensor<4x2x2x2xf32>) -> tensor<2x4x3x3xf32>
  lg.output ["y"] %y : tensor<2x4x3x3xf32>
}
// CHECK: 'lg.conv2d': need stride >= 1, dilation >= 1, padding >= 0 and groups >= 1, got stride [0, 1], padding [0, 0], dilation [1, 1], groups 1

// -----

lg.graph @g {
  %g = lg.input "g" : tensor<2x4x3x3xf32>
  %w = lg.input "w" : tensor<4x2x2x2xf32>
  %y = lg.conv2d_grad_input %g, %w size [5, 4] stride [1, 1] padding [0, 0] dilation [1, 1] groups 1 : (tensor<2x4x3x3xf32>, tensor<4x2x2x2xf32>) -> tensor<2x2x5x4xf32>
  lg.output ["y"] %y : tensor<2x2x5x4xf32>
}
// CHECK: 'lg.conv2d_grad_input': grad shape [2, 4, 3, 3] is not the convolution's output for images of size [5, 4] and weights [4, 2, 2, 2]

// -----

lg.graph @g {
  %x = lg.input "x" : tensor<2x2x4x4xf32>
  %g = lg.input "g" : tensor<2x4x3x3xf32>
  %y = lg.conv2d_grad_weight %x, %g kernel [3, 2] stride [1, 1] padding [0, 0] dilation [1, 1] groups 1 : (tensor<2x2x4x4xf32>, tensor<2x4x3x3xf32>) -> tensor<4x2x3x2xf32>
  lg.output ["y"] %y : tensor<4x2x3x2xf32>
}
// CHECK: 'lg.conv2d_grad_weight': grad shape [2, 4, 3, 3] is not the convolution's output for input [2, 2, 4, 4] and a kernel [3, 2]

// -----

lg.graph @g {
  %x = lg.input "x" : tensor<2x2x4x4xf32>
  %y = lg.max_pool2d %x kernel [2, 2] stride [2, 2] padding [2, 0] : tensor<2x2x4x4xf32> -> tensor<2x2x4x2xf32>
  lg.output ["y"] %y : tensor<2x2x4x2xf32>
}
// CHECK: 'lg.max_pool2d': need kernel >= 1, stride >= 1 and 0 <= padding <= kernel / 2, got kernel [2, 2], stride [2, 2], padding [2, 0]

// -----

lg.graph @g {
  %x = lg.input "x" : tensor<2x2x4x4xf32>
  %g = lg.input "g" : tensor<2x2x3x3xf32>
  %y = lg.max_pool2d_grad %x, %g kernel [2, 2] stride [2, 2] padding [0, 0] : (tensor<2x2x4x4xf32>, tensor<2x2x3x3xf32>) -> tensor<2x2x4x4xf32>
  lg.output ["y"] %y : tensor<2x2x4x4xf32>
}
// CHECK: 'lg.max_pool2d_grad': grad shape [2, 2, 3, 3] is not the pooling's output for images [2, 2, 4, 4]

// -----

lg.graph @g {
  %x = lg.input "x" : tensor<8xi64>
  %s = lg.param "rng.seed" init #lg.zeros state : tensor<i64>
  %y = lg.dropout %x, %s, %s rate 1.000000e-01 stream 1 : (tensor<8xi64>, tensor<i64>, tensor<i64>) -> tensor<8xi64>
  lg.output ["y"] %y : tensor<8xi64>
}
// CHECK: 'lg.dropout': input must be a float tensor, got i64

// -----

lg.graph @g {
  %x = lg.input "x" : tensor<8xf32>
  %s = lg.param "rng.seed" init #lg.zeros state : tensor<i64>
  %t = lg.param "rng.step" init #lg.zeros state : tensor<2xi64>
  %y = lg.dropout %x, %s, %t rate 1.000000e-01 stream 1 : (tensor<8xf32>, tensor<i64>, tensor<2xi64>) -> tensor<8xf32>
  lg.output ["y"] %y : tensor<8xf32>
}
// CHECK: 'lg.dropout': step must be an i64 scalar, got 2xi64

// -----

lg.graph @g {
  %x = lg.input "x" : tensor<8xf32>
  %s = lg.param "rng.seed" init #lg.zeros state : tensor<i64>
  %y = lg.dropout %x, %s, %s rate 1.000000e+00 stream 1 : (tensor<8xf32>, tensor<i64>, tensor<i64>) -> tensor<8xf32>
  lg.output ["y"] %y : tensor<8xf32>
}
// CHECK: 'lg.dropout': rate must be in [0, 1), got 1.0

// -----

lg.graph @g {
  %x = lg.input "x" : tensor<8xf32>
  %s = lg.param "rng.seed" init #lg.zeros state : tensor<i64>
  %y = lg.dropout %x, %s, %s rate 1.000000e-01 stream -1 : (tensor<8xf32>, tensor<i64>, tensor<i64>) -> tensor<8xf32>
  lg.output ["y"] %y : tensor<8xf32>
}
// CHECK: 'lg.dropout': stream must be in [0, 2^32), got -1

// -----

lg.graph @g {
  %x = lg.input "x" : tensor<8xf32>
  %s = lg.param "rng.seed" init #lg.zeros state : tensor<i64>
  %y = lg.dropout %x, %s, %s rate 1.000000e-01 stream 1 micro_batch [2, 2, 1] : (tensor<8xf32>, tensor<i64>, tensor<i64>) -> tensor<8xf32>
  lg.output ["y"] %y : tensor<8xf32>
}
// CHECK: 'lg.dropout': micro_batch (count, index, rows per example) = [2, 2, 1] is not a micro-batch of a batch along axis 0

// -----

lg.graph @g {
  %s = lg.param "rng.seed" init #lg.zeros state : tensor<i64>
  %y = lg.uniform %s, %s stream 1 : (tensor<i64>, tensor<i64>) -> tensor<8xf16>
  lg.output ["y"] %y : tensor<8xf16>
}
// CHECK: 'lg.uniform': the draws must be f32 or f64, got f16

// -----

lg.graph @g {
  %s = lg.param "rng.seed" init #lg.zeros state : tensor<i64>
  %t = lg.param "t" init #lg.zeros state : tensor<2xi64>
  %y = lg.uniform %s, %t stream 1 : (tensor<i64>, tensor<2xi64>) -> tensor<8xf32>
  lg.output ["y"] %y : tensor<8xf32>
}
// CHECK: 'lg.uniform': step must be an i64 scalar, got 2xi64

// -----

lg.graph @g {
  %x = lg.input "x" : tensor<8x0xf32>
  %y = lg.argmax %x axis 1 : tensor<8x0xf32> -> tensor<8xi64>
  lg.output ["y"] %y : tensor<8xi64>
}
// CHECK: 'lg.argmax': axis 1 is empty: no element to pick

// -----

lg.graph @g {
  %x = lg.input "x" : tensor<8x4xf32>
  %y = lg.argmax %x axis 1 : tensor<8x4xf32> -> tensor<8xi32>
  lg.output ["y"] %y : tensor<8xi32>
}
// CHECK: 'lg.argmax': result type 8xi32 does not match the inferred 8xi64

// -----

lg.graph @g {
  %x = lg.input "x" : tensor<8x4xf32>
  %y = lg.topk %x k 5 axis 1 : tensor<8x4xf32> -> tensor<8x5xi64>
  lg.output ["y"] %y : tensor<8x5xi64>
}
// CHECK: 'lg.topk': k 5 is not between 0 and the size 4 of axis 1

// -----

lg.graph @g {
  %x = lg.input "x" : tensor<8x4xf32>
  %y = lg.topk %x k 2 axis 2 : tensor<8x4xf32> -> tensor<8x2xi64>
  lg.output ["y"] %y : tensor<8x2xi64>
}
// CHECK: 'lg.topk': axis 2 is out of range for rank 2

// -----

lg.graph @g {
  %x = lg.input "x" : tensor<8x4xf32>
  %y = lg.topk %x k 2 axis 1 : tensor<8x4xf32> -> tensor<8x2xf32>
  lg.output ["y"] %y : tensor<8x2xf32>
}
// CHECK: 'lg.topk': result type 8x2xf32 does not match the inferred 8x2xi64

// -----

lg.graph @g {
  %x = lg.input "x" : tensor<8x4xf32>
  %w = lg.input "w" : tensor<3x5x2xf32>
  %e = lg.input "e" : tensor<3xi64>
  %y = lg.grouped_matmul %x, %w, %e : (tensor<8x4xf32>, tensor<3x5x2xf32>, tensor<3xi64>) -> tensor<8x2xf32>
  lg.output ["y"] %y : tensor<8x2xf32>
}
// CHECK: 'lg.grouped_matmul': contracting dimensions differ: [8, 4] @ [3, 5, 2]

// -----

lg.graph @g {
  %x = lg.input "x" : tensor<8x4xf32>
  %w = lg.input "w" : tensor<3x4x2xf32>
  %e = lg.input "e" : tensor<2xi64>
  %y = lg.grouped_matmul %x, %w, %e : (tensor<8x4xf32>, tensor<3x4x2xf32>, tensor<2xi64>) -> tensor<8x2xf32>
  lg.output ["y"] %y : tensor<8x2xf32>
}
// CHECK: 'lg.grouped_matmul': the group ends must be a vector of 3 (one per expert), got [2]

// -----

lg.graph @g {
  %x = lg.input "x" : tensor<8x4xf32>
  %w = lg.input "w" : tensor<3x4x2xf32>
  %e = lg.input "e" : tensor<3xf32>
  %y = lg.grouped_matmul %x, %w, %e : (tensor<8x4xf32>, tensor<3x4x2xf32>, tensor<3xf32>) -> tensor<8x2xf32>
  lg.output ["y"] %y : tensor<8x2xf32>
}
// CHECK: 'lg.grouped_matmul': the group ends must be i32 or i64, got f32

// -----

lg.graph @g {
  %x = lg.input "x" : tensor<8x4xf32>
  %d = lg.input "d" : tensor<6x2xf32>
  %e = lg.input "e" : tensor<3xi64>
  %y = lg.grouped_matmul_grad_weight %x, %d, %e : (tensor<8x4xf32>, tensor<6x2xf32>, tensor<3xi64>) -> tensor<3x4x2xf32>
  lg.output ["y"] %y : tensor<3x4x2xf32>
}
// CHECK: 'lg.grouped_matmul_grad_weight': operands must be rows [S, K] and [S, N], got [8, 4] and [6, 2]

// -----

lg.graph @g {
  %x = lg.input "x" : tensor<4x3xf32>
  %i = lg.input "i" : tensor<2x3xi64>
  %u = lg.input "u" : tensor<2x3xi64>
  %y = lg.scatter %x, %i, %u axis 0 : (tensor<4x3xf32>, tensor<2x3xi64>, tensor<2x3xi64>) -> tensor<4x3xf32>
  lg.output ["y"] %y : tensor<4x3xf32>
}
// CHECK: 'lg.scatter': updates must have the input's element type f32, got i64

// -----

lg.graph @g {
  %x = lg.input "x" : tensor<4x3xf32>
  %i = lg.input "i" : tensor<2x3xi64>
  %u = lg.input "u" : tensor<2x2xf32>
  %y = lg.scatter %x, %i, %u axis 0 : (tensor<4x3xf32>, tensor<2x3xi64>, tensor<2x2xf32>) -> tensor<4x3xf32>
  lg.output ["y"] %y : tensor<4x3xf32>
}
// CHECK: 'lg.scatter': updates shape [2, 2] must be the indices shape [2, 3]
