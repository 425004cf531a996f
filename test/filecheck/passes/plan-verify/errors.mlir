// RUN: sbp-opt %s --split-input-file -p plan-verify --verify-diagnostics | filecheck %s

// Every plan-verify error names the register, actor or device at fault.

sbp.placement @dp cpu ranks [0, 1] mesh [2]
plan.program @p {
  plan.device @rank0 rank 0 {
    plan.register @x : tensor<16x32xf32> bytes 2048 feed "x" of !sbp.dtensor<32x32xf32, @dp, S<0>>
  }
}
// CHECK: 'plan.device' @rank0: memory is not allocated; run plan-allocate-memory

// -----

sbp.placement @dp cpu ranks [0, 1] mesh [2]
plan.program @p {
  plan.device @rank0 rank 0 arena 4096 persistent 0 {
    plan.register @x : tensor<16x32xf32> bytes 2048 offset 0 feed "x" of !sbp.dtensor<32x32xf32, @dp, S<0>>
    plan.register @y : tensor<16x32xf32> bytes 2048 of !sbp.dtensor<32x32xf32, @dp, S<0>>
  }
}
// CHECK: 'plan.device' @rank0: register @y has no offset

// -----

sbp.placement @dp cpu ranks [0, 1] mesh [2]
plan.program @p {
  plan.device @rank0 rank 0 arena 4096 persistent 0 {
    plan.register @x : tensor<16x32xf32> bytes 2048 offset 3072 feed "x" of !sbp.dtensor<32x32xf32, @dp, S<0>>
  }
}
// CHECK: 'plan.device' @rank0: register @x needs bytes [3072, 5120) but the arena has 4096

// -----

sbp.placement @dp cpu ranks [0, 1] mesh [2]
plan.program @p {
  plan.device @rank0 rank 0 arena 0 persistent 1024 {
    plan.register @w : tensor<32x32xf32> bytes 4096 offset 0 persistent param "w" init #lg.zeros of !sbp.dtensor<32x32xf32, @dp, B>
  }
}
// CHECK: 'plan.device' @rank0: register @w needs bytes [0, 4096) but the persistent region has 1024

// -----

sbp.placement @dp cpu ranks [0, 1] mesh [2]
plan.program @p {
  plan.device @rank0 rank 0 arena 4096 persistent 0 {
    plan.register @x : tensor<16x32xf32> bytes 2048 offset 0 feed "x" of !sbp.dtensor<32x32xf32, @dp, S<0>>
    plan.register @y : tensor<16x32xf32> bytes 2048 offset 1024 of !sbp.dtensor<32x32xf32, @dp, S<0>>
    plan.compute @k "lg.relu" [@x] -> [@y]
  }
}
// CHECK: 'plan.device' @rank0: registers @x and @y are live together (positions 0..0) but overlap in the arena

// -----

sbp.placement @dp cpu ranks [0, 1] mesh [2]
plan.program @p {
  plan.device @rank0 rank 0 arena 0 persistent 4096 {
    plan.register @w : tensor<16x32xf32> bytes 2048 offset 0 persistent param "w" init #lg.zeros of !sbp.dtensor<32x32xf32, @dp, S<0>>
    plan.register @v : tensor<16x32xf32> bytes 2048 offset 1024 persistent param "v" init #lg.zeros of !sbp.dtensor<32x32xf32, @dp, S<0>>
  }
}
// CHECK: 'plan.device' @rank0: persistent registers @v and @w overlap

// -----

sbp.placement @dp cpu ranks [0, 1] mesh [2]
plan.program @p {
  plan.device @rank0 rank 0 arena 8192 persistent 0 {
    plan.register @x : tensor<16x32xf32> bytes 2048 offset 0 feed "x" of !sbp.dtensor<32x32xf32, @dp, S<0>>
    plan.register @g : tensor<32x32xf32> bytes 4096 offset 2048 of !sbp.dtensor<32x32xf32, @dp, B>
    plan.comm @c0 "all_gather" id 0 [@x] -> [@g] group [0, 1] over [0] from !sbp.dtensor<32x32xf32, @dp, S<0>> to !sbp.dtensor<32x32xf32, @dp, B>
  }
}
// CHECK: 'plan.comm' @c0 (id 0) on rank 0: group member rank 1 has no part in this collective

// -----

sbp.placement @dp cpu ranks [0, 1] mesh [2]
plan.program @p {
  plan.device @rank0 rank 0 arena 8192 persistent 0 {
    plan.register @x : tensor<16x32xf32> bytes 2048 offset 0 feed "x" of !sbp.dtensor<32x32xf32, @dp, S<0>>
    plan.register @g : tensor<32x32xf32> bytes 4096 offset 2048 of !sbp.dtensor<32x32xf32, @dp, B>
    plan.comm @c0 "all_gather" id 0 [@x] -> [@g] group [0, 1] over [0] from !sbp.dtensor<32x32xf32, @dp, S<0>> to !sbp.dtensor<32x32xf32, @dp, B>
  }
  plan.device @rank1 rank 1 arena 8192 persistent 0 {
    plan.register @x : tensor<16x32xf32> bytes 2048 offset 0 feed "x" of !sbp.dtensor<32x32xf32, @dp, S<0>>
    plan.register @g : tensor<32x32xf32> bytes 4096 offset 2048 of !sbp.dtensor<32x32xf32, @dp, B>
    plan.comm @c0 "all_gather" id 0 [@x] -> [@g] group [1, 0] over [0] from !sbp.dtensor<32x32xf32, @dp, S<0>> to !sbp.dtensor<32x32xf32, @dp, B>
  }
}
// CHECK: 'plan.comm' @c0 (id 0): rank 0 sees all_gather over [0, 1] but rank 1 sees all_gather over [1, 0]

// -----

sbp.placement @dp cpu ranks [0, 1] mesh [2]
plan.program @p {
  plan.device @rank0 rank 0 arena 12288 persistent 0 {
    plan.register @x : tensor<16x32xf32> bytes 2048 offset 0 feed "x" of !sbp.dtensor<32x32xf32, @dp, S<0>>
    plan.register @g : tensor<32x32xf32> bytes 4096 offset 2048 of !sbp.dtensor<32x32xf32, @dp, B>
    plan.register @h : tensor<32x32xf32> bytes 4096 offset 6144 of !sbp.dtensor<32x32xf32, @dp, B>
    plan.comm @c0 "all_gather" id 0 [@x] -> [@g] group [0, 1] over [0] from !sbp.dtensor<32x32xf32, @dp, S<0>> to !sbp.dtensor<32x32xf32, @dp, B>
    plan.comm @c1 "all_gather" id 1 [@x] -> [@h] group [0, 1] over [0] from !sbp.dtensor<32x32xf32, @dp, S<0>> to !sbp.dtensor<32x32xf32, @dp, B>
  }
  plan.device @rank1 rank 1 arena 12288 persistent 0 {
    plan.register @x : tensor<16x32xf32> bytes 2048 offset 0 feed "x" of !sbp.dtensor<32x32xf32, @dp, S<0>>
    plan.register @g : tensor<32x32xf32> bytes 4096 offset 2048 of !sbp.dtensor<32x32xf32, @dp, B>
    plan.register @h : tensor<32x32xf32> bytes 4096 offset 6144 of !sbp.dtensor<32x32xf32, @dp, B>
    plan.comm @c1 "all_gather" id 1 [@x] -> [@h] group [0, 1] over [0] from !sbp.dtensor<32x32xf32, @dp, S<0>> to !sbp.dtensor<32x32xf32, @dp, B>
    plan.comm @c0 "all_gather" id 0 [@x] -> [@g] group [0, 1] over [0] from !sbp.dtensor<32x32xf32, @dp, S<0>> to !sbp.dtensor<32x32xf32, @dp, B>
  }
}
// CHECK: 'plan.program' @p: ranks 0 and 1 issue their shared collectives in different orders (rank 0: id 0, rank 1: id 1 at position 0); this would deadlock

// -----

// An in-place update (alias) must take exactly its parameter's bytes...
sbp.placement @one cpu ranks [0] mesh [1]
plan.program @p {
  plan.device @rank0 rank 0 arena 0 persistent 2048 {
    plan.register @w : tensor<16x16xf32> bytes 1024 offset 0 persistent param "w" init #lg.zeros of !sbp.dtensor<16x16xf32, @one, B>
    plan.register @w_new : tensor<16x16xf32> bytes 1024 offset 1024 persistent fetch "new.w" alias @w of !sbp.dtensor<16x16xf32, @one, B>
    plan.compute @k "lg.relu" [@w] -> [@w_new] in_place
  }
}
// CHECK: 'plan.device' @rank0: register @w_new aliases @w but does not take exactly its bytes (same type, slots, region and offset)

// -----

// ...name a register of its device...
sbp.placement @one cpu ranks [0] mesh [1]
plan.program @p {
  plan.device @rank0 rank 0 arena 0 persistent 1024 {
    plan.register @w_new : tensor<16x16xf32> bytes 1024 offset 0 persistent fetch "new.w" alias @w of !sbp.dtensor<16x16xf32, @one, B>
  }
}
// CHECK: 'plan.device' @rank0: register @w_new aliases @w, which is not a register of this device

// -----

// ...and be written only once the old value has no reader left: here the
// matmul still reads @w after the update overwrote it.
sbp.placement @one cpu ranks [0] mesh [1]
plan.program @p {
  plan.device @rank0 rank 0 arena 1024 persistent 1024 {
    plan.register @w : tensor<16x16xf32> bytes 1024 offset 0 persistent param "w" init #lg.zeros of !sbp.dtensor<16x16xf32, @one, B>
    plan.register @w_new : tensor<16x16xf32> bytes 1024 offset 0 persistent fetch "new.w" alias @w of !sbp.dtensor<16x16xf32, @one, B>
    plan.register @y : tensor<16x16xf32> bytes 1024 offset 0 fetch "y" of !sbp.dtensor<16x16xf32, @one, B>
    plan.compute @update "lg.relu" [@w] -> [@w_new] in_place
    plan.compute @use "lg.matmul" [@w, @w] -> [@y]
  }
}
// CHECK: 'plan.device' @rank0: register @w_new aliases @w but @update writes it at position 0 while @w is still read (until position 1)

// -----

// `in_place` lets an output share bytes with an input only for a kernel
// that can run in place: a matmul's output may not overwrite its operand.
sbp.placement @one cpu ranks [0] mesh [1]
plan.program @p {
  plan.device @rank0 rank 0 arena 1024 persistent 0 {
    plan.register @x : tensor<16x16xf32> bytes 1024 offset 0 feed "x" of !sbp.dtensor<16x16xf32, @one, B>
    plan.register @y : tensor<16x16xf32> bytes 1024 offset 0 fetch "y" of !sbp.dtensor<16x16xf32, @one, B>
    plan.compute @k "lg.matmul" [@x, @x] -> [@y] in_place
  }
}
// CHECK: 'plan.device' @rank0: registers @x and @y are live together (positions 0..0) but overlap in the arena

// -----

// An in-place actor writes over its input only where the input dies: the
// tanh may not write over @y while the neg still reads it.
sbp.placement @one cpu ranks [0] mesh [1]
plan.program @p {
  plan.device @rank0 rank 0 arena 384 persistent 0 {
    plan.register @x : tensor<4x6xf32> bytes 96 offset 128 feed "x" of !sbp.dtensor<4x6xf32, @one, B>
    plan.register @y : tensor<4x6xf32> bytes 96 offset 0 of !sbp.dtensor<4x6xf32, @one, B>
    plan.register @a : tensor<4x6xf32> bytes 96 offset 0 fetch "a" of !sbp.dtensor<4x6xf32, @one, B>
    plan.register @b : tensor<4x6xf32> bytes 96 offset 256 fetch "b" of !sbp.dtensor<4x6xf32, @one, B>
    plan.compute @y.exp "lg.exp" [@x] -> [@y]
    plan.compute @a.tanh "lg.tanh" [@y] -> [@a] in_place
    plan.compute @b.neg "lg.neg" [@y] -> [@b]
  }
}
// CHECK: 'plan.device' @rank0: registers @a and @y are live together (positions 1..2) but overlap in the arena

// -----

// A reshape in place makes its result a view of its input's bytes (@r of
// @y): the two are one group, read-only while either lives. Writing over
// @r in place (the tanh) while @y is still read (the neg) is refused.
sbp.placement @one cpu ranks [0] mesh [1]
plan.program @p {
  plan.device @rank0 rank 0 arena 384 persistent 0 {
    plan.register @x : tensor<4x6xf32> bytes 96 offset 128 feed "x" of !sbp.dtensor<4x6xf32, @one, B>
    plan.register @y : tensor<4x6xf32> bytes 96 offset 0 of !sbp.dtensor<4x6xf32, @one, B>
    plan.register @r : tensor<24xf32> bytes 96 offset 0 of !sbp.dtensor<24xf32, @one, B>
    plan.register @a : tensor<24xf32> bytes 96 offset 0 of !sbp.dtensor<24xf32, @one, B>
    plan.register @b : tensor<4x6xf32> bytes 96 offset 128 fetch "b" of !sbp.dtensor<4x6xf32, @one, B>
    plan.register @z : tensor<24xf32> bytes 96 offset 256 fetch "z" of !sbp.dtensor<24xf32, @one, B>
    plan.compute @y.exp "lg.exp" [@x] -> [@y]
    plan.compute @r.reshape "lg.reshape" [@y] -> [@r] in_place
    plan.compute @a.tanh "lg.tanh" [@r] -> [@a] in_place
    plan.compute @b.neg "lg.neg" [@y] -> [@b]
    plan.compute @z.tanh "lg.tanh" [@a] -> [@z]
  }
}
// CHECK: 'plan.device' @rank0: registers @a and @y are live together (positions 2..3) but overlap in the arena

// -----

// A view lives as long as its group: @y is dead after the reshape, but
// its bytes are @r's until @r's last read, so @q may not take them before.
sbp.placement @one cpu ranks [0] mesh [1]
plan.program @p {
  plan.device @rank0 rank 0 arena 384 persistent 0 {
    plan.register @x : tensor<4x6xf32> bytes 96 offset 128 feed "x" of !sbp.dtensor<4x6xf32, @one, B>
    plan.register @y : tensor<4x6xf32> bytes 96 offset 0 of !sbp.dtensor<4x6xf32, @one, B>
    plan.register @r : tensor<24xf32> bytes 96 offset 0 of !sbp.dtensor<24xf32, @one, B>
    plan.register @q : tensor<4x6xf32> bytes 96 offset 0 fetch "q" of !sbp.dtensor<4x6xf32, @one, B>
    plan.register @z : tensor<24xf32> bytes 96 offset 256 fetch "z" of !sbp.dtensor<24xf32, @one, B>
    plan.compute @y.exp "lg.exp" [@x] -> [@y]
    plan.compute @r.reshape "lg.reshape" [@y] -> [@r] in_place
    plan.compute @q.tanh "lg.tanh" [@x] -> [@q]
    plan.compute @z.tanh "lg.tanh" [@r] -> [@z]
  }
}
// CHECK: 'plan.device' @rank0: registers @q and @y are live together (positions 2..3) but overlap in the arena

// -----

// A reshape in place runs nothing, so its result must lie on its input's
// bytes: here @r has an offset of its own (and the input two slots).
sbp.placement @one cpu ranks [0] mesh [1]
plan.program @p {
  plan.device @rank0 rank 0 arena 384 persistent 0 {
    plan.register @x : tensor<4x6xf32> bytes 96 slots 2 offset 0 feed "x" of !sbp.dtensor<4x6xf32, @one, B>
    plan.register @r : tensor<24xf32> bytes 96 offset 256 fetch "r" of !sbp.dtensor<24xf32, @one, B>
    plan.compute @r.reshape "lg.reshape" [@x] -> [@r] in_place
  }
}
// CHECK: 'plan.device' @rank0: 'plan.compute' @r.reshape runs nothing in place, but @r does not lie on @x's bytes (offset, size, slots and region alike)

// -----

// A correct plan passes unchanged.
sbp.placement @dp cpu ranks [0, 1] mesh [2]
plan.program @p {
  plan.device @rank0 rank 0 arena 4096 persistent 0 {
    plan.register @x : tensor<16x32xf32> bytes 2048 offset 0 feed "x" of !sbp.dtensor<32x32xf32, @dp, S<0>>
    plan.register @y : tensor<16x32xf32> bytes 2048 offset 2048 fetch "y" of !sbp.dtensor<32x32xf32, @dp, S<0>>
    plan.compute @k "lg.relu" [@x] -> [@y]
  }
}
// CHECK:      plan.compute @k "lg.relu" [@x] -> [@y]

// -----

// A slice in place runs nothing, so its result must lie on the run of its
// input's bytes it keeps: rows 2..3 of @y start 64 bytes into it, not 32.
sbp.placement @one cpu ranks [0] mesh [1]
plan.program @p {
  plan.device @rank0 rank 0 arena 512 persistent 0 {
    plan.register @x : tensor<6x8xf32> bytes 192 offset 256 feed "x" of !sbp.dtensor<6x8xf32, @one, B>
    plan.register @y : tensor<6x8xf32> bytes 192 offset 0 of !sbp.dtensor<6x8xf32, @one, B>
    plan.register @a : tensor<2x8xf32> bytes 64 offset 32 fetch "a" of !sbp.dtensor<2x8xf32, @one, B>
    plan.compute @y.tanh "lg.tanh" [@x] -> [@y]
    plan.compute @a.slice "lg.slice" [@y] -> [@a] props {starts = array<i64: 2, 0>, limits = array<i64: 4, 8>, strides = array<i64: 1, 1>} in_place
  }
}
// CHECK: 'plan.device' @rank0: 'plan.compute' @a.slice runs nothing in place, but @a does not lie on @y's bytes (offset, size, slots and region alike)

// -----

// Columns of a row-major tensor are no one run of its bytes: a slice of
// them cannot run nothing.
sbp.placement @one cpu ranks [0] mesh [1]
plan.program @p {
  plan.device @rank0 rank 0 arena 512 persistent 0 {
    plan.register @x : tensor<6x8xf32> bytes 192 offset 256 feed "x" of !sbp.dtensor<6x8xf32, @one, B>
    plan.register @y : tensor<6x8xf32> bytes 192 offset 0 of !sbp.dtensor<6x8xf32, @one, B>
    plan.register @c : tensor<6x4xf32> bytes 96 offset 0 fetch "c" of !sbp.dtensor<6x4xf32, @one, B>
    plan.compute @y.tanh "lg.tanh" [@x] -> [@y]
    plan.compute @c.slice "lg.slice" [@y] -> [@c] props {starts = array<i64: 0, 0>, limits = array<i64: 6, 4>, strides = array<i64: 1, 1>} in_place
  }
}
// CHECK: 'plan.device' @rank0: 'plan.compute' @c.slice runs nothing in place, but its slice of @y is not one run of its bytes

// -----

// A slice's view lives as long as its group: @y is dead after the slice,
// but rows 2..3 of its bytes are @a's until @a's last read, so @q may not
// take @y's bytes before.
sbp.placement @one cpu ranks [0] mesh [1]
plan.program @p {
  plan.device @rank0 rank 0 arena 512 persistent 0 {
    plan.register @x : tensor<6x8xf32> bytes 192 offset 256 feed "x" of !sbp.dtensor<6x8xf32, @one, B>
    plan.register @y : tensor<6x8xf32> bytes 192 offset 0 of !sbp.dtensor<6x8xf32, @one, B>
    plan.register @a : tensor<2x8xf32> bytes 64 offset 64 of !sbp.dtensor<2x8xf32, @one, B>
    plan.register @q : tensor<6x8xf32> bytes 192 offset 0 fetch "q" of !sbp.dtensor<6x8xf32, @one, B>
    plan.register @e : tensor<2x8xf32> bytes 64 offset 448 fetch "e" of !sbp.dtensor<2x8xf32, @one, B>
    plan.compute @y.tanh "lg.tanh" [@x] -> [@y]
    plan.compute @a.slice "lg.slice" [@y] -> [@a] props {starts = array<i64: 2, 0>, limits = array<i64: 4, 8>, strides = array<i64: 1, 1>} in_place
    plan.compute @q.exp "lg.exp" [@x] -> [@q]
    plan.compute @e.neg "lg.neg" [@a] -> [@e]
  }
}
// CHECK: 'plan.device' @rank0: registers @q and @y are live together (positions 2..3) but overlap in the arena

// -----

// A concatenation in place runs nothing, so each input must lie on its run
// of the output's bytes: @t belongs 128 bytes in, not at 192.
sbp.placement @one cpu ranks [0] mesh [1]
plan.program @p {
  plan.device @rank0 rank 0 arena 512 persistent 0 {
    plan.register @x : tensor<32xf32> bytes 128 offset 256 feed "x" of !sbp.dtensor<32xf32, @one, B>
    plan.register @z : tensor<16xf32> bytes 64 offset 384 feed "z" of !sbp.dtensor<16xf32, @one, B>
    plan.register @y : tensor<32xf32> bytes 128 offset 0 of !sbp.dtensor<32xf32, @one, B>
    plan.register @t : tensor<16xf32> bytes 64 offset 192 of !sbp.dtensor<16xf32, @one, B>
    plan.register @c : tensor<48xf32> bytes 192 offset 0 fetch "c" of !sbp.dtensor<48xf32, @one, B>
    plan.compute @y.exp "lg.exp" [@x] -> [@y]
    plan.compute @t.tanh "lg.tanh" [@z] -> [@t]
    plan.compute @c.concat "lg.concat" [@y, @t] -> [@c] props {axis = 0 : i64} in_place
  }
}
// CHECK: 'plan.device' @rank0: 'plan.compute' @c.concat runs nothing in place, but @t does not lie on its run of @c's bytes (offset, one slot, and the arena)

// -----

// The inputs of a concatenation in place are views of its output, one
// register from the first one's write to the last read: @q may not take
// @y's bytes (the start of @c's) meanwhile.
sbp.placement @one cpu ranks [0] mesh [1]
plan.program @p {
  plan.device @rank0 rank 0 arena 512 persistent 0 {
    plan.register @x : tensor<32xf32> bytes 128 offset 256 feed "x" of !sbp.dtensor<32xf32, @one, B>
    plan.register @z : tensor<16xf32> bytes 64 offset 384 feed "z" of !sbp.dtensor<16xf32, @one, B>
    plan.register @y : tensor<32xf32> bytes 128 offset 0 of !sbp.dtensor<32xf32, @one, B>
    plan.register @q : tensor<16xf32> bytes 64 offset 0 fetch "q" of !sbp.dtensor<16xf32, @one, B>
    plan.register @t : tensor<16xf32> bytes 64 offset 128 of !sbp.dtensor<16xf32, @one, B>
    plan.register @c : tensor<48xf32> bytes 192 offset 0 fetch "c" of !sbp.dtensor<48xf32, @one, B>
    plan.compute @y.exp "lg.exp" [@x] -> [@y]
    plan.compute @q.neg "lg.neg" [@z] -> [@q]
    plan.compute @t.tanh "lg.tanh" [@z] -> [@t]
    plan.compute @c.concat "lg.concat" [@y, @t] -> [@c] props {axis = 0 : i64} in_place
  }
}
// CHECK: 'plan.device' @rank0: registers @c and @q are live together (positions 1..4) but overlap in the arena

// -----

// Joined along their columns, two 2 x 4 pieces are no runs of their 2 x 8
// result (each row takes four floats of each): a concatenation of them
// cannot run nothing, wherever they lie.
sbp.placement @one cpu ranks [0] mesh [1]
plan.program @p {
  plan.device @rank0 rank 0 arena 512 persistent 0 {
    plan.register @x : tensor<2x4xf32> bytes 32 offset 256 feed "x" of !sbp.dtensor<2x4xf32, @one, B>
    plan.register @y : tensor<2x4xf32> bytes 32 offset 0 of !sbp.dtensor<2x4xf32, @one, B>
    plan.register @t : tensor<2x4xf32> bytes 32 offset 32 of !sbp.dtensor<2x4xf32, @one, B>
    plan.register @c : tensor<2x8xf32> bytes 64 offset 0 fetch "c" of !sbp.dtensor<2x8xf32, @one, B>
    plan.compute @y.exp "lg.exp" [@x] -> [@y]
    plan.compute @t.tanh "lg.tanh" [@x] -> [@t]
    plan.compute @c.concat "lg.concat" [@y, @t] -> [@c] props {axis = 1 : i64} in_place
  }
}
// CHECK: 'plan.device' @rank0: 'plan.compute' @c.concat runs nothing in place, but its inputs are no runs of @c's bytes (joined along axis 1)

// -----

// The inputs of a concatenation in place fill its output: 32 and 8 floats
// leave 8 of the 48 unwritten.
sbp.placement @one cpu ranks [0] mesh [1]
plan.program @p {
  plan.device @rank0 rank 0 arena 512 persistent 0 {
    plan.register @x : tensor<32xf32> bytes 128 offset 256 feed "x" of !sbp.dtensor<32xf32, @one, B>
    plan.register @z : tensor<8xf32> bytes 32 offset 384 feed "z" of !sbp.dtensor<8xf32, @one, B>
    plan.register @y : tensor<32xf32> bytes 128 offset 0 of !sbp.dtensor<32xf32, @one, B>
    plan.register @t : tensor<8xf32> bytes 32 offset 128 of !sbp.dtensor<8xf32, @one, B>
    plan.register @c : tensor<48xf32> bytes 192 offset 0 fetch "c" of !sbp.dtensor<48xf32, @one, B>
    plan.compute @y.exp "lg.exp" [@x] -> [@y]
    plan.compute @t.tanh "lg.tanh" [@z] -> [@t]
    plan.compute @c.concat "lg.concat" [@y, @t] -> [@c] props {axis = 0 : i64} in_place
  }
}
// CHECK: 'plan.device' @rank0: 'plan.compute' @c.concat runs nothing in place, but its inputs do not fill @c's bytes
