// RUN: sbp-opt %s --split-input-file --verify-diagnostics | filecheck %s

// Every verifier error of the plan dialect's ops.

sbp.placement @dp cpu ranks [0, 1] mesh [2]
plan.program @p {
  plan.device @a rank 0 {
    plan.register @x : tensor<16x32xf32> bytes 2048 feed "x" of !sbp.dtensor<32x32xf32, @dp, S<0>>
  }
  plan.device @b rank 0 {
    plan.register @x : tensor<16x32xf32> bytes 2048 feed "x" of !sbp.dtensor<32x32xf32, @dp, S<0>>
  }
}
// CHECK: 'plan.program' @p: two devices share a rank ([0, 0])

// -----

sbp.placement @dp cpu ranks [0, 1] mesh [2]
plan.program @p {
  plan.device @a rank 0 {
    plan.register @x : tensor<16x32xf32> bytes 2048 feed "x" of !sbp.dtensor<32x32xf32, @dp, S<0>>
    plan.compute @k "lg.relu" [@x] -> [@x]
    plan.register @late : tensor<16x32xf32> bytes 2048 of !sbp.dtensor<32x32xf32, @dp, S<0>>
  }
}
// CHECK: 'plan.device' @a: register @late comes after an actor; registers come first, then the actors in schedule order

// -----

sbp.placement @dp cpu ranks [0, 1] mesh [2]
plan.program @p {
  plan.device @a rank 0 arena -1 {
    plan.register @x : tensor<16x32xf32> bytes 2048 feed "x" of !sbp.dtensor<32x32xf32, @dp, S<0>>
  }
}
// CHECK: 'plan.device' @a: arena size must be non-negative

// -----

sbp.placement @dp cpu ranks [0, 1] mesh [2]
plan.program @p {
  plan.device @a rank 0 {
    plan.register @x : tensor<16x32xf32> bytes 100 of !sbp.dtensor<32x32xf32, @dp, S<0>>
  }
}
// CHECK: 'plan.register' @x: tensor<16x32xf32> takes 2048 bytes, not 100

// -----

sbp.placement @dp cpu ranks [0, 1] mesh [2]
plan.program @p {
  plan.device @a rank 0 {
    plan.register @x : tensor<16x32xf32> bytes 2048 slots 0 of !sbp.dtensor<32x32xf32, @dp, S<0>>
  }
}
// CHECK: 'plan.register' @x: needs at least one slot

// -----

sbp.placement @dp cpu ranks [0, 1] mesh [2]
plan.program @p {
  plan.device @a rank 0 {
    plan.register @x : tensor<16x32xf32> bytes 2048 offset -64 of !sbp.dtensor<32x32xf32, @dp, S<0>>
  }
}
// CHECK: 'plan.register' @x: negative offset

// -----

sbp.placement @dp cpu ranks [0, 1] mesh [2]
plan.program @p {
  plan.device @a rank 0 {
    plan.register @w : tensor<16x32xf32> bytes 2048 persistent param "w" of !sbp.dtensor<32x32xf32, @dp, S<0>>
  }
}
// CHECK: 'plan.register' @w: a parameter needs its initializer, and only a parameter has one

// -----

sbp.placement @dp cpu ranks [0, 1] mesh [2]
plan.program @p {
  plan.device @a rank 0 {
    plan.register @w : tensor<16x32xf32> bytes 2048 param "w" init #lg.zeros of !sbp.dtensor<32x32xf32, @dp, S<0>>
  }
}
// CHECK: 'plan.register' @w: parameters and constants live in the persistent region

// -----

sbp.placement @dp cpu ranks [0, 1] mesh [2]
plan.program @p {
  plan.device @a rank 0 {
    plan.register @x : tensor<16x32xf16> bytes 1024 of !sbp.dtensor<32x32xf32, @dp, S<0>>
  }
}
// CHECK: 'plan.register' @x: element type f16 is not the value's f32

// -----

sbp.placement @dp cpu ranks [0, 1] mesh [2]
plan.program @p {
  plan.device @a rank 5 {
    plan.register @x : tensor<16x32xf32> bytes 2048 feed "x" of !sbp.dtensor<32x32xf32, @dp, S<0>>
  }
}
// CHECK: 'plan.register' @x: rank 5 is not in placement @dp

// -----

sbp.placement @dp cpu ranks [0, 1] mesh [2]
plan.program @p {
  plan.device @a rank 1 {
    plan.register @x : tensor<32x32xf32> bytes 4096 of !sbp.dtensor<32x32xf32, @dp, S<0>>
  }
}
// CHECK: 'plan.register' @x: local shape [32, 32] is not the piece [16, 32] that rank 1 holds of [32, 32] under S<0>

// -----

sbp.placement @dp cpu ranks [0, 1] mesh [2]
plan.program @p {
  plan.device @a rank 0 {
    plan.register @x : tensor<16x32xf32> bytes 2048 feed "x" of !sbp.dtensor<32x32xf32, @dp, S<0>>
    plan.compute @k "lg.relu" [@x] -> [@x, @x]
  }
}
// CHECK: 'plan.compute' @k: a compute actor writes one register

// -----

sbp.placement @dp cpu ranks [0, 1] mesh [2]
plan.program @p {
  plan.device @a rank 0 {
    plan.register @x : tensor<16x32xf32> bytes 2048 feed "x" of !sbp.dtensor<32x32xf32, @dp, S<0>>
    plan.compute @k "lg.relu" [@nothing] -> [@x]
  }
}
// CHECK: 'plan.compute' @k: input register @nothing does not exist on @a

// -----

sbp.placement @dp cpu ranks [0, 1] mesh [2]
plan.program @p {
  plan.device @a rank 0 {
    plan.register @x : tensor<16x32xf32> bytes 2048 feed "x" of !sbp.dtensor<32x32xf32, @dp, S<0>>
    plan.comm @c "broadcast" id 0 [@x] -> [@x] group [0, 1] from !sbp.dtensor<32x32xf32, @dp, S<0>> to !sbp.dtensor<32x32xf32, @dp, B>
  }
}
// CHECK: 'plan.comm' @c: unknown collective 'broadcast'

// -----

sbp.placement @dp cpu ranks [0, 1] mesh [2]
plan.program @p {
  plan.device @a rank 0 {
    plan.register @x : tensor<16x32xf32> bytes 2048 feed "x" of !sbp.dtensor<32x32xf32, @dp, S<0>>
    plan.comm @c "all_gather" id 0 [@x] -> [@x] group [0, 0] from !sbp.dtensor<32x32xf32, @dp, S<0>> to !sbp.dtensor<32x32xf32, @dp, B>
  }
}
// CHECK: 'plan.comm' @c: the rank group must be non-empty and distinct, got [0, 0]

// -----

sbp.placement @dp cpu ranks [0, 1] mesh [2]
plan.program @p {
  plan.device @a rank 0 {
    plan.register @x : tensor<16x32xf32> bytes 2048 feed "x" of !sbp.dtensor<32x32xf32, @dp, S<0>>
    plan.comm @c "all_gather" id 0 [@x] -> [@x] group [1, 2] from !sbp.dtensor<32x32xf32, @dp, S<0>> to !sbp.dtensor<32x32xf32, @dp, B>
  }
}
// CHECK: 'plan.comm' @c: rank 0 is not in its own group [1, 2]

// -----

sbp.placement @dp cpu ranks [0, 1] mesh [2]
plan.program @p {
  plan.device @a rank 0 {
    plan.register @x : tensor<16x32xf32> bytes 2048 feed "x" of !sbp.dtensor<32x32xf32, @dp, S<0>>
    plan.comm @c "all_gather" id 0 [@x] -> [] group [0, 1] from !sbp.dtensor<32x32xf32, @dp, S<0>> to !sbp.dtensor<32x32xf32, @dp, B>
  }
}
// CHECK: 'plan.comm' @c: a all_gather reads one register and writes one

// -----

sbp.placement @dp cpu ranks [0, 1] mesh [2]
plan.program @p {
  plan.device @a rank 0 {
    plan.register @x : tensor<16x32xf32> bytes 2048 feed "x" of !sbp.dtensor<32x32xf32, @dp, S<0>>
    plan.comm @c "transfer" id 0 [] -> [] group [0, 1] from !sbp.dtensor<32x32xf32, @dp, S<0>> to !sbp.dtensor<32x32xf32, @dp, B>
  }
}
// CHECK: 'plan.comm' @c: a transfer actor sends, receives, or both

// -----

sbp.placement @dp cpu ranks [0, 1] mesh [2]
plan.program @p {
  plan.device @a rank 0 {
    plan.register @x : tensor<16x32xf32> bytes 2048 feed "x" of !sbp.dtensor<32x32xf32, @dp, S<0>>
    plan.comm @c "all_gather" id 0 [@x] -> [@y] group [0, 1] from !sbp.dtensor<32x32xf32, @dp, S<0>> to !sbp.dtensor<32x32xf32, @dp, B>
  }
}
// CHECK: 'plan.comm' @c: output register @y does not exist on @a

// -----

sbp.placement @dp cpu ranks [0, 1] mesh [2]
plan.program @p {
  plan.device @a rank 0 {
    plan.register @x : tensor<16x32xf32> bytes 2048 feed "x" of !sbp.dtensor<32x32xf32, @dp, S<0>>
    plan.register @y : tensor<16x32xf32> bytes 2048 of !sbp.dtensor<32x32xf32, @dp, S<0>>
    plan.compute @k "plan.fused" [@x] -> [@y] props {steps = [{kernel = "lg.relu", args = array<i64: 0>, type = tensor<16x32xf32>}, {kernel = "lg.exp", args = array<i64: 2>, type = tensor<16x32xf32>}]}
  }
}
// CHECK: 'plan.compute' @k: step 1 (lg.exp) reads [2]; it may read inputs 0..0 and the results of earlier steps (1..1)

// -----

sbp.placement @dp cpu ranks [0, 1] mesh [2]
plan.program @p {
  plan.device @a rank 0 {
    plan.register @x : tensor<16x32xf32> bytes 2048 feed "x" of !sbp.dtensor<32x32xf32, @dp, S<0>>
    plan.register @y : tensor<16x32xf32> bytes 2048 of !sbp.dtensor<32x32xf32, @dp, S<0>>
    plan.compute @k "plan.fused" [@x] -> [@y] props {steps = [{kernel = "lg.relu", args = array<i64: 0>, type = tensor<16xf32>}]}
  }
}
// CHECK: 'plan.compute' @k: the last step gives tensor<16xf32>, the output register is tensor<16x32xf32>

// -----

sbp.placement @dp cpu ranks [0, 1] mesh [2]
plan.program @p {
  plan.device @a rank 0 {
    plan.register @x : tensor<16x32xf32> bytes 2048 feed "x" of !sbp.dtensor<32x32xf32, @dp, S<0>>
    plan.register @y : tensor<16x32xf32> bytes 2048 of !sbp.dtensor<32x32xf32, @dp, S<0>>
    plan.compute @k "plan.fused" [@x] -> [@y]
  }
}
// CHECK: 'plan.compute' @k: a plan.fused actor needs props {steps = [...]}

// -----

sbp.placement @dp cpu ranks [0, 1] mesh [2]
plan.program @p {
  plan.device @a rank 0 {
    plan.register @x : tensor<16x32xf32> bytes 2048 feed "x" of !sbp.dtensor<32x32xf32, @dp, S<0>>
    plan.register @y : tensor<16x32xf32> bytes 2048 of !sbp.dtensor<32x32xf32, @dp, S<0>>
    plan.compute @k "plan.fused" [@x] -> [@y] props {steps = [{kernel = "lg.softmax", args = array<i64: 0>, type = tensor<16x32xf32>}]}
  }
}
// CHECK: 'plan.compute' @k: step 0 runs lg.softmax, which is not an elementwise kernel

// -----

// A device like another has no ops of its own.
sbp.placement @dp cpu ranks [0, 1] mesh [2]
plan.program @p {
  plan.device @a rank 0 {
    plan.register @x : tensor<16x32xf32> bytes 2048 feed "x" of !sbp.dtensor<32x32xf32, @dp, S<0>>
  }
  plan.device @b rank 1 like @a {
    plan.register @x : tensor<16x32xf32> bytes 2048 feed "x" of !sbp.dtensor<32x32xf32, @dp, S<0>>
  }
}
// CHECK: 'plan.device' @b: a device like @a has no ops of its own

// -----

sbp.placement @dp cpu ranks [0, 1] mesh [2]
plan.program @p {
  plan.device @a rank 0 {
    plan.register @x : tensor<16x32xf32> bytes 2048 feed "x" of !sbp.dtensor<32x32xf32, @dp, S<0>>
  }
  plan.device @b rank 1 like @c {
  }
}
// CHECK: 'plan.device' @b: like @c, which is not a device with a body in its program

// -----

// Like a device that is itself like another: name the one with the body.
sbp.placement @dp cpu ranks [0, 1, 2] mesh [3]
plan.program @p {
  plan.device @a rank 0 {
    plan.register @x : tensor<16x32xf32> bytes 2048 feed "x" of !sbp.dtensor<48x32xf32, @dp, S<0>>
  }
  plan.device @b rank 1 like @a {
  }
  plan.device @c rank 2 like @b {
  }
}
// CHECK: 'plan.device' @c: like @b, which is not a device with a body in its program

// -----

// Rank 1 holds 1 of the 3 rows, not the 2 of rank 0's register.
sbp.placement @dp cpu ranks [0, 1] mesh [2]
plan.program @p {
  plan.device @a rank 0 {
    plan.register @x : tensor<2x32xf32> bytes 256 feed "x" of !sbp.dtensor<3x32xf32, @dp, S<0>>
  }
  plan.device @b rank 1 like @a {
  }
}
// CHECK: 'plan.device' @b (like @a): 'plan.register' @x: local shape [2, 32] is not the piece [1, 32] that rank 1 holds of [3, 32] under S<0>

// -----

// On a 2x2 mesh the reduction over the second axis is among ranks 0 and 1
// for rank 0, among ranks 2 and 3 for rank 2.
sbp.placement @m cpu ranks [0, 1, 2, 3] mesh [2, 2]
plan.program @p {
  plan.device @a rank 0 {
    plan.register @x : tensor<4x4xf32> bytes 64 of !sbp.dtensor<4x4xf32, @m, [B, P]>
    plan.register @y : tensor<4x4xf32> bytes 64 of !sbp.dtensor<4x4xf32, @m, [B, B]>
    plan.comm @y.all_reduce "all_reduce" id 0 [@x] -> [@y] group [0, 1] over [1] from !sbp.dtensor<4x4xf32, @m, [B, P]> to !sbp.dtensor<4x4xf32, @m, [B, B]>
  }
  plan.device @c rank 2 like @a {
  }
}
// CHECK: 'plan.device' @c (like @a): 'plan.comm' @y.all_reduce: rank 2 is not in its group [0, 1]

// -----

sbp.placement @dp cpu ranks [0, 1] mesh [2]
plan.program @p {
  plan.device @a rank 0 arena 2048 persistent 0 {
    plan.register @x : tensor<16x32xf32> bytes 2048 offset 0 feed "x" of !sbp.dtensor<32x32xf32, @dp, S<0>>
  }
  plan.device @b rank 1 like @a arena 4096 persistent 0 {
  }
}
// CHECK: 'plan.device' @b: its arena differs from @a's, whose body it runs
