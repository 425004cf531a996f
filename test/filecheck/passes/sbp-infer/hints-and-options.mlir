// RUN: sbp-opt %s --split-input-file -p sbp-infer --verify-diagnostics | filecheck %s
// RUN: sbp-opt %s --split-input-file -p 'sbp-infer{explain=true}' --verify-diagnostics | filecheck %s --check-prefix=EXPLAIN
// RUN: sbp-opt %s --split-input-file -p 'sbp-infer{device=cuda}' --verify-diagnostics | filecheck %s --check-prefix=CUDA
// RUN: sbp-opt %s --split-input-file -p 'sbp-infer{device="%S/Inputs/slow-link.json"}' --verify-diagnostics | filecheck %s --check-prefix=FILE
// RUN: not sbp-opt %s --split-input-file -p 'sbp-infer{device="%S/nonexistent.json"}' 2>&1 | filecheck %s --check-prefix=NODEV
// RUN: not sbp-opt %s --split-input-file -p 'sbp-infer{strategy=exhaustive}' 2>&1 | filecheck %s --check-prefix=STRATEGY

// A hinted result keeps its distribution even when another is cheaper.
sbp.placement @m cpu ranks [0, 1] mesh [2]
lg.graph @kept on @m {
  %x = lg.input "x" : !sbp.dtensor<8x4xf32, @m, B>
  %y = lg.mul %x, %x : (!sbp.dtensor<8x4xf32, @m, B>, !sbp.dtensor<8x4xf32, @m, B>) -> tensor<8x4xf32>
  lg.output ["y"] %y : tensor<8x4xf32>
}
// CHECK:      %x = lg.input "x" {sbp.signature = #sbp.sig<() -> (B)>} : !sbp.dtensor<8x4xf32, @m, B>

// The explanation lists every candidate with its costs and marks the choice.
// A slice of B is a copy and an actor, priced as the simulator prices them,
// so a product this small stays whole: splitting it would save nanoseconds
// of compute (its share of the bytes, from cache) for microseconds of slices.
// EXPLAIN:      %x = lg.input "x" {sbp.signature = #sbp.sig<() -> (B)>, sbp.explain = ["* () -> (B): compute 0 boxing 0 memory {{.*}}"]}
// EXPLAIN-NEXT: %y = lg.mul %x, %x {sbp.signature = #sbp.sig<(B, B) -> (B)>, sbp.explain = [
// EXPLAIN-SAME:   "(S<0>, S<0>) -> (S<0>): compute [[HALF:[0-9.e+-]+]] boxing [[SLICES:[0-9.e+-]+]] memory [[PIECE:[0-9.e+-]+]] total {{[0-9.e+-]+}}",
// EXPLAIN-SAME:   "(S<1>, S<1>) -> (S<1>): compute [[HALF]] boxing [[SLICES]] memory [[PIECE]] total {{[0-9.e+-]+}}",
// EXPLAIN-SAME:   "* (B, B) -> (B): compute [[WHOLE:[0-9.e+-]+]] boxing 0 memory [[ALL:[0-9.e+-]+]] total {{[0-9.e+-]+}}",
// EXPLAIN-SAME:   "(P, B) -> (P): compute [[WHOLE]] boxing [[ZEROS:[0-9.e+-]+]] memory [[ALL]] total {{[0-9.e+-]+}}",
// EXPLAIN-SAME:   "(B, P) -> (P): compute [[WHOLE]] boxing [[ZEROS]] memory [[ALL]] total {{[0-9.e+-]+}}"]}
// (On the cpu preset of 2026-11-29: compute about 1.4e-09 a half, 2.8e-09 the whole, 2.9e-06 the two slices.)

// CUDA: sbp.strategy = "auto", sbp.total_cost = {{[0-9.e-]+}} : f64
// FILE: sbp.strategy = "auto", sbp.total_cost = {{[0-9.e-]+}} : f64
// NODEV: sbp-infer: cluster '{{.*}}nonexistent.json' is neither a preset ({{.*}}) nor a readable file
// STRATEGY: sbp-infer: unknown strategy 'exhaustive' (choose greedy, auto or ilp)

// -----

// A hint no signature can give is a diagnostic naming the op.
sbp.placement @m cpu ranks [0, 1] mesh [2]
lg.graph @impossible on @m {
  %x = lg.input "x" : tensor<8x4xf32>
  %w = lg.param "w" init #lg.zeros : tensor<4x8xf32>
  %y = lg.matmul %x, %w : (tensor<8x4xf32>, tensor<4x8xf32>) -> !sbp.dtensor<8x8xf32, @m, P<max>>
  lg.output ["y"] %y : !sbp.dtensor<8x8xf32, @m, P<max>>
}
// CHECK: 'lg.matmul': the hint P<max> on its result cannot be met: no SBP signature gives it (it can give B, P, S<0>, S<1>)

// -----

// cross_entropy cannot run on class-split logits: they are redistributed
// first (here to the batch split), and a hint that would need the class
// split names the reason.
sbp.placement @m cpu ranks [0, 1] mesh [2]
lg.graph @vocab on @m {
  %l = lg.input "l" : tensor<8x10xf32>
  %t = lg.input "t" : tensor<8xi64>
  %ls = sbp.annotate %l : tensor<8x10xf32> -> !sbp.dtensor<8x10xf32, @m, S<1>>
  %y = lg.cross_entropy %ls, %t : (!sbp.dtensor<8x10xf32, @m, S<1>>, tensor<8xi64>) -> tensor<f32>
  lg.output ["y"] %y : tensor<f32>
}
// CHECK:      %0 = sbp.annotate %ls : !sbp.dtensor<8x10xf32, @m, S<1>> -> !sbp.dtensor<8x10xf32, @m, {{S<0>|B}}>
// CHECK-NEXT: %y = lg.cross_entropy %0, %t

// -----

sbp.placement @m cpu ranks [0, 1] mesh [2]
lg.graph @vocab_hint on @m {
  %l = lg.input "l" : tensor<8x10xf32>
  %t = lg.input "t" : tensor<8xi64>
  %y = lg.cross_entropy %l, %t : (tensor<8x10xf32>, tensor<8xi64>) -> !sbp.dtensor<f32, @m, P<max>>
  lg.output ["y"] %y : !sbp.dtensor<f32, @m, P<max>>
}
// CHECK: 'lg.cross_entropy': the hint P<max> on its result cannot be met: no SBP signature gives it (it can give B, P); class-split logits (S on the class axis) are not supported: they need a distributed max and sum-exp reduction; split the batch instead

// -----

// Without a default placement and without hints, nothing says where to run.
lg.graph @nowhere {
  %x = lg.input "x" : tensor<8xf32>
  lg.output ["x"] %x : tensor<8xf32>
}
// CHECK: 'lg.input': no placement: give graph @nowhere a default (`on @mesh`) or hint the value

// -----

// Pipeline-style placement: the annotation moves the value to a second
// stage, and what consumes it runs there.
sbp.placement @stage0 cpu ranks [0, 1] mesh [2]
sbp.placement @stage1 cpu ranks [2, 3] mesh [2]
lg.graph @two_stages on @stage0 {
  %x = lg.input "x" : tensor<8x4xf32>
  %a = lg.relu %x : tensor<8x4xf32>
  %b = sbp.annotate %a : tensor<8x4xf32> -> !sbp.dtensor<8x4xf32, @stage1, S<0>>
  %c = lg.tanh %b : !sbp.dtensor<8x4xf32, @stage1, S<0>>
  lg.output ["c"] %c : !sbp.dtensor<8x4xf32, @stage1, S<0>>
}
// CHECK:      %a = lg.relu %x {{.*}} : !sbp.dtensor<8x4xf32, @stage0, S<{{[01]}}>>
// CHECK-NEXT: %b = sbp.annotate %a : !sbp.dtensor<8x4xf32, @stage0, S<{{[01]}}>> -> !sbp.dtensor<8x4xf32, @stage1, S<0>>
// CHECK-NEXT: %c = lg.tanh %b {sbp.signature = #sbp.sig<(S<0>) -> (S<0>)>} : !sbp.dtensor<8x4xf32, @stage1, S<0>>
