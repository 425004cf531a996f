// RUN: sbp-opt %s -p 'compile{to_plan=false}',sbp-to-plan | filecheck %s

// A 2x2 (data x model) mesh: rank r sits at (r / 2, r % 2). A collective on
// the model axis (mesh axis 1) groups the ranks that share a data
// coordinate: {0, 1} and {2, 3}; one on the data axis groups {0, 2} and
// {1, 3}. Every rank issues the collectives in one order (ids 0, 1, 2), and
// communication comes as early as its input allows: the weight gradient's
// all_reduce goes out before the unrelated relu runs.

sbp.placement @mesh cpu ranks [0, 1, 2, 3] mesh [2, 2]

lg.graph @hybrid on @mesh {
  %x0 = lg.input "x" : tensor<8x16xf32>
  %x = sbp.annotate %x0 : tensor<8x16xf32> -> !sbp.dtensor<8x16xf32, @mesh, [S<0>, B]>
  %w = lg.param "w" init #lg.normal<0.0, 0.1> : !sbp.dtensor<16x8xf32, @mesh, [B, S<1>]>
  %y = lg.matmul %x, %w : (!sbp.dtensor<8x16xf32, @mesh, [S<0>, B]>, !sbp.dtensor<16x8xf32, @mesh, [B, S<1>]>) -> !sbp.dtensor<8x8xf32, @mesh, [S<0>, S<1>]>
  %g = lg.matmul %x, %y transpose_lhs : (!sbp.dtensor<8x16xf32, @mesh, [S<0>, B]>, !sbp.dtensor<8x8xf32, @mesh, [S<0>, S<1>]>) -> tensor<16x8xf32>
  %gb = sbp.annotate %g : tensor<16x8xf32> -> !sbp.dtensor<16x8xf32, @mesh, [B, S<1>]>
  %r = lg.relu %y : !sbp.dtensor<8x8xf32, @mesh, [S<0>, S<1>]>
  %rb = sbp.annotate %r : !sbp.dtensor<8x8xf32, @mesh, [S<0>, S<1>]> -> !sbp.dtensor<8x8xf32, @mesh, [B, B]>
  lg.output ["g", "r"] %gb, %rb : !sbp.dtensor<16x8xf32, @mesh, [B, S<1>]>, !sbp.dtensor<8x8xf32, @mesh, [B, B]>
}

// CHECK-LABEL: plan.device @rank0 rank 0 {
// CHECK:         plan.register @x0 : tensor<4x16xf32> bytes 256 feed "x" of !sbp.dtensor<8x16xf32, @mesh, [S<0>, B]>
// CHECK:         plan.register @w : tensor<16x4xf32> bytes 256 persistent
// CHECK:         plan.register @y : tensor<4x4xf32> bytes 64 of !sbp.dtensor<8x8xf32, @mesh, [S<0>, S<1>]>
// CHECK:         plan.compute @y.matmul "lg.matmul" [@x0, @w] -> [@y]
// CHECK-NEXT:    plan.compute @g.matmul "lg.matmul" [@x0, @y] -> [@g] props {transpose_lhs}
// CHECK-NEXT:    plan.comm @gb.all_reduce "all_reduce" id 0 [@g] -> [@gb] group [0, 2] over [0]
// CHECK-NEXT:    plan.compute @r.relu "lg.relu" [@y] -> [@r]
// CHECK-NEXT:    plan.comm @{{.*}}.all_gather "all_gather" id 1 [@r] -> [@{{.*}}] group [0, 2] over [0]
// CHECK-NEXT:    plan.comm @rb.all_gather "all_gather" id 2 [@{{.*}}] -> [@rb] group [0, 1] over [1]
// CHECK-LABEL: plan.device @rank3 rank 3 {
// CHECK:         plan.comm @gb.all_reduce "all_reduce" id 0 [@g] -> [@gb] group [1, 3] over [0]
// CHECK:         plan.comm @{{.*}}.all_gather "all_gather" id 1 [@r] -> [@{{.*}}] group [1, 3] over [0]
// CHECK:         plan.comm @rb.all_gather "all_gather" id 2 [@{{.*}}] -> [@rb] group [2, 3] over [1]
