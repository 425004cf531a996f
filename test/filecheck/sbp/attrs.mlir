// RUN: SBP_ROUNDTRIP
// RUN: SBP_GENERIC_ROUNDTRIP

// Every sbp attribute and the dtensor type, standalone and nested.

"test.op"() {
  split = #sbp.S<0>,
  split3 = #sbp.S<3>,
  broadcast = #sbp.B,
  partial = #sbp.P,
  partial_sum = #sbp.P<sum>,
  partial_max = #sbp.P<max>,
  grouped = #sbp.G,
  nd_grouped = #sbp.nd<[G, S<1>]>,
  indexed = #sbp.I<16>,
  nd1 = #sbp.nd<S<1>>,
  nd1_bracketed = #sbp.nd<[B]>,
  nd2 = #sbp.nd<[S<0>, P<max>]>,
  nd3 = #sbp.nd<[B, P, S<2>]>,
  sig1 = #sbp.sig<(S<0>, B) -> (S<0>)>,
  sig2 = #sbp.sig<([S<0>, B], [B, S<1>]) -> ([S<0>, S<1>])>,
  sig_no_inputs = #sbp.sig<() -> (B)>,
  device = #sbp<device cuda>
} : () -> ()

// CHECK:      "test.op"() {split = #sbp.S<0>, split3 = #sbp.S<3>, broadcast = #sbp.B, partial = #sbp.P, partial_sum = #sbp.P,
// CHECK-SAME:   partial_max = #sbp.P<max>, grouped = #sbp.G, nd_grouped = #sbp.nd<[G, S<1>]>, indexed = #sbp.I<16>, nd1 = #sbp.nd<S<1>>, nd1_bracketed = #sbp.nd<B>, nd2 = #sbp.nd<[S<0>, P<max>]>,
// CHECK-SAME:   nd3 = #sbp.nd<[B, P, S<2>]>, sig1 = #sbp.sig<(S<0>, B) -> (S<0>)>,
// CHECK-SAME:   sig2 = #sbp.sig<([S<0>, B], [B, S<1>]) -> ([S<0>, S<1>])>, sig_no_inputs = #sbp.sig<() -> (B)>,
// CHECK-SAME:   device = #sbp<device cuda>} : () -> ()

// -----

sbp.placement @m cpu ranks [0, 1, 2, 3] mesh [2, 2]
"test.op"() : () -> (!sbp.dtensor<8x16xf32, @m, [S<0>, B]>, !sbp.dtensor<f32, @m, [P, P<max>]>, !sbp.dtensor<4xi64, @m, [B, B]>)

// CHECK: "test.op"() : () -> (!sbp.dtensor<8x16xf32, @m, [S<0>, B]>, !sbp.dtensor<f32, @m, [P, P<max>]>, !sbp.dtensor<4xi64, @m, [B, B]>)

// -----

sbp.placement @line cpu ranks [0, 1] mesh [2]
"test.op"() : () -> !sbp.dtensor<3x5xf16, @line, S<1>>
"test.op"() : () -> !sbp.dtensor<3x5xf16, @line, [P]>

// CHECK:      "test.op"() : () -> !sbp.dtensor<3x5xf16, @line, S<1>>
// CHECK-NEXT: "test.op"() : () -> !sbp.dtensor<3x5xf16, @line, P>
