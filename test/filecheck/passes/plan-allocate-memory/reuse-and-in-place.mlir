// RUN: sbp-opt %s -p 'compile{to_plan=false}',sbp-to-plan,plan-allocate-memory,plan-verify | filecheck %s
// RUN: sbp-opt %s -p 'compile{to_plan=false}',sbp-to-plan,'plan-allocate-memory{in_place=false}',plan-verify | filecheck %s --check-prefix=NOINPLACE

// One device, 1 KiB tensors (16x16xf32). The elementwise chain writes in
// place (%t and %e take %r's bytes) and so does the final add (%s takes the
// product's bytes, which die there); the feed %x stays live until that add,
// so nothing else uses its bytes. Three buffers are live at the peak (%x,
// the chain, the product): the arena is exactly the live-set bound, against
// 6 KiB without reuse. The parameter sits in the persistent region.

sbp.placement @one cpu ranks [0] mesh [1]

lg.graph @chain on @one {
  %x = lg.input "x" : tensor<16x16xf32>
  %w = lg.param "w" init #lg.ones : tensor<16x16xf32>
  %r = lg.relu %x : tensor<16x16xf32>
  %t = lg.tanh %r : tensor<16x16xf32>
  %e = lg.exp %t : tensor<16x16xf32>
  %m = lg.matmul %e, %w : (tensor<16x16xf32>, tensor<16x16xf32>) -> tensor<16x16xf32>
  %s = lg.add %x, %m : (tensor<16x16xf32>, tensor<16x16xf32>) -> tensor<16x16xf32>
  lg.output ["s"] %s : tensor<16x16xf32>
}

// CHECK:      plan.device @rank0 rank 0 arena 3072 persistent 1024 live_bound 3072 no_reuse 6144 {
// CHECK-NEXT:   plan.register @x : tensor<16x16xf32> bytes 1024 offset [[X:[0-9]+]] feed "x"
// CHECK-NEXT:   plan.register @w : tensor<16x16xf32> bytes 1024 offset 0 persistent param "w"
// CHECK-NEXT:   plan.register @r : tensor<16x16xf32> bytes 1024 offset [[CHAIN:[0-9]+]] of
// CHECK-NEXT:   plan.register @t : tensor<16x16xf32> bytes 1024 offset [[CHAIN]] of
// CHECK-NEXT:   plan.register @e : tensor<16x16xf32> bytes 1024 offset [[CHAIN]] of
// CHECK-NEXT:   plan.register @m : tensor<16x16xf32> bytes 1024 offset [[M:[0-9]+]] of
// CHECK-NEXT:   plan.register @s : tensor<16x16xf32> bytes 1024 offset [[M]] fetch "s"
// CHECK-NEXT:   plan.compute @r.relu "lg.relu" [@x] -> [@r]
// CHECK-NEXT:   plan.compute @t.tanh "lg.tanh" [@r] -> [@t] in_place
// CHECK-NEXT:   plan.compute @e.exp "lg.exp" [@t] -> [@e] in_place
// CHECK-NEXT:   plan.compute @m.matmul "lg.matmul" [@e, @w] -> [@m]
// CHECK-NEXT:   plan.compute @s.add "lg.add" [@x, @m] -> [@s] in_place

// Without in-place writes, neighbours of the chain need their own bytes
// while the next is written, but dead ones are still reused (@e takes @r's).
// NOINPLACE: plan.device @rank0 rank 0 arena 3072 persistent 1024 live_bound 3072 no_reuse 6144 {
// NOINPLACE:      plan.register @r : tensor<16x16xf32> bytes 1024 offset [[R:[0-9]+]] of
// NOINPLACE-NEXT: plan.register @t : tensor<16x16xf32> bytes 1024 offset {{[0-9]+}} of
// NOINPLACE-NEXT: plan.register @e : tensor<16x16xf32> bytes 1024 offset [[R]] of
// NOINPLACE-NOT: in_place
