// RUN: sbp-opt %s --split-input-file -p 'compile{to_plan=false}',sbp-to-plan,plan-allocate-memory,plan-verify | filecheck %s
// RUN: sbp-opt %s --split-input-file -p 'compile{to_plan=false}',sbp-to-plan,'plan-allocate-memory{in_place=false}',plan-verify | filecheck %s --check-prefix=NOINPLACE

// A reshape's result is a view of its input's bytes even where the input
// lives on (%y is read again by the neg): %r takes %y's offset and the
// reshape has nothing to do. The group {%y, %r} is read-only until both
// are dead, so the tanh of %r may not write over it (it goes elsewhere),
// and only the neg, where %y's last read is, writes over the group; its
// own reshape %c is a view of %b in turn.
sbp.placement @one cpu ranks [0] mesh [1]
lg.graph @views on @one {
  %x = lg.input "x" : tensor<4x6xf32>
  %y = lg.exp %x : tensor<4x6xf32>
  %r = lg.reshape %y : tensor<4x6xf32> -> tensor<24xf32>
  %a = lg.tanh %r : tensor<24xf32>
  %b = lg.neg %y : tensor<4x6xf32>
  %c = lg.reshape %b : tensor<4x6xf32> -> tensor<24xf32>
  %d = lg.add %a, %c : (tensor<24xf32>, tensor<24xf32>) -> tensor<24xf32>
  lg.output ["d"] %d : tensor<24xf32>
}
// CHECK:      plan.device @rank0 rank 0 arena 256
// CHECK:      plan.register @y : tensor<4x6xf32> bytes 96 offset [[Y:[0-9]+]]
// CHECK-NEXT: plan.register @r : tensor<24xf32> bytes 96 offset [[Y]]
// CHECK-NEXT: plan.register @a : tensor<24xf32> bytes 96 offset [[A:[0-9]+]]
// CHECK-NEXT: plan.register @b : tensor<4x6xf32> bytes 96 offset [[Y]]
// CHECK-NEXT: plan.register @c : tensor<24xf32> bytes 96 offset [[Y]]
// CHECK:      plan.compute @r.reshape "lg.reshape" [@y] -> [@r] in_place
// CHECK-NEXT: plan.compute @a.tanh "lg.tanh" [@r] -> [@a]{{$}}
// CHECK-NEXT: plan.compute @b.neg "lg.neg" [@y] -> [@b] in_place
// CHECK-NEXT: plan.compute @c.reshape "lg.reshape" [@b] -> [@c] in_place
// NOINPLACE:      plan.compute @r.reshape "lg.reshape" [@y] -> [@r]{{$}}
// NOINPLACE:      plan.compute @c.reshape "lg.reshape" [@b] -> [@c]{{$}}

// -----

// A reshape of a feed is no view (the feed's bytes are written by the
// caller, not by the step): it copies, and its result starts a view group
// of its own, whose reshape does nothing.
sbp.placement @one cpu ranks [0] mesh [1]
lg.graph @fed on @one {
  %x = lg.input "x" : tensor<4x6xf32>
  %f = lg.reshape %x : tensor<4x6xf32> -> tensor<24xf32>
  %g = lg.reshape %f : tensor<24xf32> -> tensor<6x4xf32>
  %a = lg.exp %g : tensor<6x4xf32>
  %b = lg.tanh %f : tensor<24xf32>
  %c = lg.reshape %a : tensor<6x4xf32> -> tensor<24xf32>
  %d = lg.add %b, %c : (tensor<24xf32>, tensor<24xf32>) -> tensor<24xf32>
  lg.output ["d"] %d : tensor<24xf32>
}
// CHECK-LABEL: plan.program @fed
// CHECK:       plan.register @f : tensor<24xf32> bytes 96 offset [[F:[0-9]+]]
// CHECK-NEXT:  plan.register @g : tensor<6x4xf32> bytes 96 offset [[F]]
// CHECK:       plan.compute @f.reshape "lg.reshape" [@x] -> [@f]{{$}}
// CHECK-NEXT:  plan.compute @g.reshape "lg.reshape" [@f] -> [@g] in_place

// -----

// A fetched output may be a view too: its reshape (as a model's logits
// reshaped for its loss) does nothing, and the group, live to the step's
// end, is written over by no one (the exp of %r goes elsewhere).
sbp.placement @one cpu ranks [0] mesh [1]
lg.graph @fetched on @one {
  %x = lg.input "x" : tensor<4x6xf32>
  %y = lg.neg %x : tensor<4x6xf32>
  %r = lg.reshape %y : tensor<4x6xf32> -> tensor<24xf32>
  %e = lg.exp %r : tensor<24xf32>
  lg.output ["y", "e"] %y, %e : tensor<4x6xf32>, tensor<24xf32>
}
// CHECK-LABEL: plan.program @fetched
// CHECK:      plan.register @y : tensor<4x6xf32> bytes 96 offset [[Y:[0-9]+]] fetch "y"
// CHECK-NEXT: plan.register @r : tensor<24xf32> bytes 96 offset [[Y]]
// CHECK-NEXT: plan.register @e : tensor<24xf32> bytes 96 offset [[E:[0-9]+]] fetch "e"
// CHECK:      plan.compute @r.reshape "lg.reshape" [@y] -> [@r] in_place
// CHECK-NEXT: plan.compute @e.exp "lg.exp" [@r] -> [@e]{{$}}

// -----

// A slice that keeps one run of its input's bytes is a view of that run
// (a gradient bucket's members after its collective): %a, rows 2..3 of
// %y, lies 64 bytes into %y's buffer and its slice does nothing; %b, the
// last row, starts 160 bytes in (not a multiple of 64: a register starts
// aligned) and %c keeps columns (no one run): both copy. The group {%y,
// %a} is read-only until both are dead: the exp of %a goes elsewhere.
sbp.placement @one cpu ranks [0] mesh [1]
lg.graph @slices on @one {
  %x = lg.input "x" : tensor<6x8xf32>
  %y = lg.tanh %x : tensor<6x8xf32>
  %a = lg.slice %y starts [2, 0] limits [4, 8] strides [1, 1] : tensor<6x8xf32> -> tensor<2x8xf32>
  %b = lg.slice %y starts [5, 0] limits [6, 8] strides [1, 1] : tensor<6x8xf32> -> tensor<1x8xf32>
  %c = lg.slice %y starts [0, 0] limits [6, 4] strides [1, 1] : tensor<6x8xf32> -> tensor<6x4xf32>
  %e = lg.exp %a : tensor<2x8xf32>
  %s = lg.reduce_sum %y axes [0, 1] : tensor<6x8xf32> -> tensor<f32>
  lg.output ["e", "b", "c", "s"] %e, %b, %c, %s : tensor<2x8xf32>, tensor<1x8xf32>, tensor<6x4xf32>, tensor<f32>
}
// CHECK-LABEL: plan.program @slices
// CHECK:       plan.register @y : tensor<6x8xf32> bytes 192 offset 0 of
// CHECK-NEXT:  plan.register @a : tensor<2x8xf32> bytes 64 offset 64 of
// CHECK:       plan.compute @a.slice "lg.slice" [@y] -> [@a] props {{.*}} in_place
// CHECK-NEXT:  plan.compute @b.slice "lg.slice" [@y] -> [@b] props {{.*}}>}{{$}}
// CHECK-NEXT:  plan.compute @c.slice "lg.slice" [@y] -> [@c] props {{.*}}>}{{$}}
// CHECK-NEXT:  plan.compute @e.exp "lg.exp" [@a] -> [@e]{{$}}
// NOINPLACE-LABEL: plan.program @slices
// NOINPLACE:       plan.compute @a.slice "lg.slice" [@y] -> [@a] props {{.*}}>}{{$}}

// -----

// A concatenation whose every input is one run of its output, each at a
// multiple of 64 bytes, has nothing to do: its inputs are views of their
// runs (a gradient bucket before its collective), written there by the
// kernels that compute them, which still run (not in place: they write no
// input's bytes). %r's group, %y with it, lies at the output's start and
// %t 128 bytes in.
sbp.placement @one cpu ranks [0] mesh [1]
lg.graph @joined on @one {
  %x = lg.input "x" : tensor<4x8xf32>
  %z = lg.input "z" : tensor<16xf32>
  %y = lg.exp %x : tensor<4x8xf32>
  %r = lg.reshape %y : tensor<4x8xf32> -> tensor<32xf32>
  %t = lg.tanh %z : tensor<16xf32>
  %c = lg.concat %r, %t axis 0 : (tensor<32xf32>, tensor<16xf32>) -> tensor<48xf32>
  %n = lg.neg %c : tensor<48xf32>
  lg.output ["n"] %n : tensor<48xf32>
}
// CHECK-LABEL: plan.program @joined
// CHECK:       plan.register @y : tensor<4x8xf32> bytes 128 offset 0 of
// CHECK-NEXT:  plan.register @r : tensor<32xf32> bytes 128 offset 0 of
// CHECK-NEXT:  plan.register @t : tensor<16xf32> bytes 64 offset 128 of
// CHECK-NEXT:  plan.register @c : tensor<48xf32> bytes 192 offset 0 of
// CHECK:       plan.compute @y.exp "lg.exp" [@x] -> [@y]{{$}}
// CHECK-NEXT:  plan.compute @r.reshape "lg.reshape" [@y] -> [@r] in_place
// CHECK-NEXT:  plan.compute @t.tanh "lg.tanh" [@z] -> [@t]{{$}}
// CHECK-NEXT:  plan.compute @c.concat "lg.concat" [@r, @t] -> [@c] props {axis = 0 : i64} in_place
// NOINPLACE-LABEL: plan.program @joined
// NOINPLACE:       plan.compute @c.concat "lg.concat" [@r, @t] -> [@c] props {axis = 0 : i64}{{$}}

// -----

// All or nothing: %t's 8 floats (32 bytes) put %r at 32 bytes into the
// output, not a multiple of 64, so every input keeps its own register and
// the concatenation copies.
sbp.placement @one cpu ranks [0] mesh [1]
lg.graph @unaligned on @one {
  %x = lg.input "x" : tensor<4x8xf32>
  %z = lg.input "z" : tensor<8xf32>
  %y = lg.exp %x : tensor<4x8xf32>
  %r = lg.reshape %y : tensor<4x8xf32> -> tensor<32xf32>
  %t = lg.tanh %z : tensor<8xf32>
  %c = lg.concat %t, %r axis 0 : (tensor<8xf32>, tensor<32xf32>) -> tensor<40xf32>
  %n = lg.neg %c : tensor<40xf32>
  lg.output ["n"] %n : tensor<40xf32>
}
// CHECK-LABEL: plan.program @unaligned
// CHECK:       plan.compute @c.concat "lg.concat" [@t, @r] -> [@c] props {axis = 0 : i64}{{$}}
