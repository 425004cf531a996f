// RUN: sbp-opt %s -p sbp-infer | filecheck %s

// A split over more devices than elements (3 rows on 4 devices: one piece is
// empty) is a valid hint and is kept. The cost model prices such a split by
// its fullest device (a third of the rows each, not a quarter), so the batch
// stays split through the matmul, as data parallelism on a small batch.

sbp.placement @m cpu ranks [0, 1, 2, 3] mesh [4]
lg.graph @g on @m {
  %x = lg.input "x" : !sbp.dtensor<3x4xf32, @m, S<0>>
  %w = lg.param "w" init #lg.normal<0.0, 0.1> : tensor<4x8xf32>
  %y = lg.matmul %x, %w : (!sbp.dtensor<3x4xf32, @m, S<0>>, tensor<4x8xf32>) -> tensor<3x8xf32>
  %s = lg.reduce_sum %y axes [0] : tensor<3x8xf32> -> tensor<8xf32>
  lg.output ["s"] %s : tensor<8xf32>
}
// CHECK:      %x = lg.input "x" {sbp.signature = #sbp.sig<() -> (S<0>)>} : !sbp.dtensor<3x4xf32, @m, S<0>>
// CHECK:      lg.matmul %x, %w {sbp.signature = #sbp.sig<(S<0>, B) -> (S<0>)>}
// CHECK:      lg.reduce_sum %y axes [0] {sbp.signature = #sbp.sig<(S<0>) -> (P)>}
