// Inputs the fuzzer (test/fuzz/fuzz_ir.py) found crashing sbp-opt with a
// Python traceback; each now gets a diagnostic at its place.
// RUN: sbp-opt %s --split-input-file --parsing-diagnostics --verify-diagnostics 2>&1 | filecheck %s
// CHECK-NOT: Traceback

// An integer array element beyond int64 failed in struct.pack, unreported.
sbp.placement @m cpu ranks [0, 1, 2, 3] mesh [2, -9223372036854775809]
// CHECK: fuzz-findings.mlir:{{[0-9]+}}:{{[0-9]+}}
// CHECK: integer -9223372036854775809 is out of range for a 64-bit array element

// -----

// An integer property beyond its type was reported with no location.
sbp.placement @dp cpu ranks [0, 1] mesh [2]
plan.program @p {
  plan.device @rank0 rank 0 arena 4096 persistent 0 {
    plan.register @x : tensor<16x4xf32> bytes 18446744073709551616 offset 0 feed "x" of !sbp.dtensor<32x4xf32, @dp, S<0>>
  }
}
// CHECK: fuzz-findings.mlir:{{[0-9]+}}:{{[0-9]+}}
// CHECK: Integer value 18446744073709551616 is out of range for type i64

// -----

// An attribute of the wrong kind where an initializer belongs: no location.
lg.graph @g {
  %w = lg.param "w" init #sbp.B : tensor<4xf32>
  lg.output ["w"] %w : tensor<4xf32>
}
// CHECK: fuzz-findings.mlir:{{[0-9]+}}:{{[0-9]+}}
// CHECK: #sbp.B should be of attribute subclassing `InitializerAttr`

// -----

// A register split on an axis its value does not have crashed in the layout
// code with an IndexError.
sbp.placement @dp cpu ranks [0, 1] mesh [2]
plan.program @p {
  plan.device @rank0 rank 0 arena 4096 persistent 0 {
    plan.register @y : tensor<16x32xf32> bytes 2048 offset 0 fetch "y" of !sbp.dtensor<32x32xf32, @dp, S<2>>
  }
}
// CHECK: 'plan.register': its value is split on axis 2 but has rank 2

// -----

// A graph whose last op is no terminator: xDSL's message named the op but
// did not mark it.
lg.graph @g {
  %a = lg.input "a" : tensor<8xf32>
  %y = lg.relu %a : tensor<8xf32>
}
// CHECK:      %y = "lg.relu"(%a)
// CHECK-NEXT: ^^^^
// CHECK:      Operation lg.relu terminates block in single-block region but is not a terminator

// -----

// A real literal given a complex type hit an assertion in xDSL's parser.
lg.graph @g {
  %c = lg.constant dense<0.5> : tensor<complex<f32>>
  lg.output ["c"] %c : tensor<complex<f32>>
}
// CHECK: fuzz-findings.mlir:{{[0-9]+}}:{{[0-9]+}}
// CHECK: lg.constant: the literal does not match its element type

// -----

// A placement inside a graph crashed sbp-infer, which reads every op of a
// graph as one value.
lg.graph @g {
sbp.placement @m cpu ranks [0, 1] mesh [2]
  %a = lg.input "a" : tensor<8xf32>
  lg.output ["a"] %a : tensor<8xf32>
}
// CHECK: 'sbp.placement' cannot stand in graph @g: its body holds lg and sbp ops of one result each

// -----

// A tensor too large for 64-bit byte counts failed in sbp-to-plan, where
// its register's size did not fit an i64 attribute, with no op named.
sbp.placement @m cpu ranks [0, 1] mesh [2]
lg.graph @g on @m {
  %x = lg.input "x" : tensor<99999999999999x99999999999999xf32>
  lg.output ["x"] %x : tensor<99999999999999x99999999999999xf32>
}
// CHECK: 'lg.input': result #0 of shape [99999999999999, 99999999999999] has more than 2^60 elements

// -----

// A register of tensors of tensors had no byte size: AttributeError in
// element_bytes (the widened fuzzer's nested types, 2026-11-27).
sbp.placement @dp cpu ranks [0, 1] mesh [2]
plan.program @p {
  plan.device @a rank 0 {
    plan.register @x : tensor<tensor<2xf32>> bytes 100 of !sbp.dtensor<32x32xf32, @dp, S<0>>
  }
}
// CHECK: 'plan.register' @x: element type tensor<2xf32> is not a float or integer type

// -----

// A long string with no closing quote on its line made xDSL's string
// lexer backtrack exponentially: minutes for a 5000-character name.
lg.graph @g {
  %x = lg.input "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx : tensor<4xf32>
  lg.output ["x"] %x : tensor<4xf32>
}
// CHECK: fuzz-findings.mlir:{{[0-9]+}}:{{[0-9]+}}
// CHECK: End of file reached before closing string literal

// -----

// A dynamic shape reached sbp-infer, whose dtensor type refused it with no
// op named (a generated graph mutated by the fuzzer).
lg.graph @g {
  %x = lg.input "x" : tensor<?x4xf32>
  lg.output ["x"] %x : tensor<?x4xf32>
}
// CHECK: 'lg.input': result #0 has the dynamic shape tensor<?x4xf32>; sbpc plans static shapes only

// -----

// A block label inside a device split its region in two; the placement
// lookup read the region's one block and raised xDSL's ValueError.
plan.program @p {
  plan.device @rank0 rank 0 arena 8192 persistent 0 {
    plan.register @x : tensor<16x32xf32> bytes 2048 offset 0 feed "x" of !sbp.dtensor<32x32xf32, @dp, S<0>>
^bb0(%a: f32):
    plan.register @g : tensor<32x32xf32> bytes 4096 offset 2048 of !sbp.dtensor<32x32xf32, @dp, B>
  }
}
// CHECK: Region 'body' at position 0 expected a single block, but got 2 blocks

// -----

// Two lines swapped put a use above the op that makes it: the parser took
// the forward reference and sbp-autoplan's layer profiler failed an assertion.
lg.graph @g {
  %x = lg.input "x" : tensor<4xf32>
  %z = lg.add %y, %x : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>
  %y = lg.relu %x : tensor<4xf32>
  lg.output ["z"] %z : tensor<4xf32>
}
// CHECK: 'lg.add': operand #0 is used before the op that makes it (an lg graph is in program order)
