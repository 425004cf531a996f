// RUN: sbp-opt %s -p compile | filecheck %s
// RUN: sbp-opt %s -p 'compile{to_plan=false}',sbp-to-plan,'plan-allocate-memory{in_place=false}',plan-verify | filecheck %s --check-prefix=NOINPLACE

// An updated parameter (`new.<key>`, as lg-optimizer names it) takes its
// parameter's persistent bytes when nothing reads the old value after the
// update is written: @w2 aliases @w, and the subtraction writes over @w in
// place, so a step needs no copy back and no buffer for the new value. @v
// is still read by the relu after its update, so @v2 gets its own bytes.

sbp.placement @one cpu ranks [0] mesh [1]

lg.graph @step on @one {
  %x = lg.input "x" : tensor<16x16xf32>
  %lr = lg.input "lr" : tensor<f32>
  %w = lg.param "w" init #lg.ones : tensor<16x16xf32>
  %v = lg.param "v" init #lg.ones : tensor<16x16xf32>
  %g = lg.matmul %x, %w : (tensor<16x16xf32>, tensor<16x16xf32>) -> tensor<16x16xf32>
  %s = lg.mul %g, %lr : (tensor<16x16xf32>, tensor<f32>) -> tensor<16x16xf32>
  %w2 = lg.sub %w, %s : (tensor<16x16xf32>, tensor<16x16xf32>) -> tensor<16x16xf32>
  %v2 = lg.sub %v, %s : (tensor<16x16xf32>, tensor<16x16xf32>) -> tensor<16x16xf32>
  %y = lg.relu %v : tensor<16x16xf32>
  lg.output ["new.w", "new.v", "y"] %w2, %v2, %y : tensor<16x16xf32>, tensor<16x16xf32>, tensor<16x16xf32>
}

// CHECK:      plan.register @w : tensor<16x16xf32> bytes 1024 offset [[W:[0-9]+]] persistent param "w"
// CHECK:      plan.register @w2 : tensor<16x16xf32> bytes 1024 offset [[W]] persistent fetch "new.w" alias @w of
// CHECK-NEXT: plan.register @v2 : tensor<16x16xf32> bytes 1024 offset {{[0-9]+}} fetch "new.v" of
// CHECK:      plan.compute @w2.sub "lg.sub" [@w, @s] -> [@w2] in_place
// CHECK-NEXT: plan.compute @v2.sub "lg.sub" [@v, @s] -> [@v2] in_place
// CHECK-NEXT: plan.compute @y.relu "lg.relu" [@v] -> [@y]

// Without in-place writes, every update has its own buffer (the runtime
// copies it back after the step).
// NOINPLACE-NOT: alias
