// RUN: sbp-opt %s -p sbp-bucket-collectives | filecheck %s

// A mesh of one device: its collectives move nothing (each is a copy), so
// they stay apart; a bucket would only add a concatenation and slices.
sbp.placement @one cpu ranks [0] mesh [1]
lg.graph @single on @one {
  %x = lg.input "x" : !sbp.dtensor<8x4xf32, @one, S<0>>
  %d = lg.input "d" : !sbp.dtensor<8x6xf32, @one, S<0>>
  %gw = lg.matmul %x, %d transpose_lhs {sbp.signature = #sbp.sig<(S<0>, S<0>) -> (P)>} : (!sbp.dtensor<8x4xf32, @one, S<0>>, !sbp.dtensor<8x6xf32, @one, S<0>>) -> !sbp.dtensor<4x6xf32, @one, P>
  %gb = lg.reduce_sum %d axes [0] {sbp.signature = #sbp.sig<(S<0>) -> (P)>} : !sbp.dtensor<8x6xf32, @one, S<0>> -> !sbp.dtensor<6xf32, @one, P>
  %gc = lg.reduce_sum %x axes [0] {sbp.signature = #sbp.sig<(S<0>) -> (P)>} : !sbp.dtensor<8x4xf32, @one, S<0>> -> !sbp.dtensor<4xf32, @one, P>
  %rw = sbp.all_reduce %gw over [0] : !sbp.dtensor<4x6xf32, @one, P> -> !sbp.dtensor<4x6xf32, @one, B>
  %rb = sbp.all_reduce %gb over [0] : !sbp.dtensor<6xf32, @one, P> -> !sbp.dtensor<6xf32, @one, B>
  %rc = sbp.all_reduce %gc over [0] : !sbp.dtensor<4xf32, @one, P> -> !sbp.dtensor<4xf32, @one, B>
  lg.output ["w", "b", "c"] %rw, %rb, %rc : !sbp.dtensor<4x6xf32, @one, B>, !sbp.dtensor<6xf32, @one, B>, !sbp.dtensor<4xf32, @one, B>
}
// CHECK-LABEL: lg.graph @single
// CHECK:       %rw = sbp.all_reduce %gw over [0]
// CHECK:       %rb = sbp.all_reduce %gb over [0]
// CHECK:       %rc = sbp.all_reduce %gc over [0]
// CHECK-NOT:   lg.concat
// CHECK-NOT:   sbp.bucket
