// RUN: sbp-opt %s --split-input-file -p sbp-infer | filecheck %s
// RUN: sbp-opt %s --split-input-file -p sbp-infer,sbp-insert-boxing | filecheck %s --check-prefix=BOXED

// Two experts' layers of a mixture of experts: rows sorted by expert, the
// group ends computed at run time (a cumulative count), the experts'
// weights split by expert (hinted S(0): expert parallelism). Each device
// computes its own experts' rows only, and only those rows flow between its
// layers: the rows are grouped by the ends (G), not gathered whole between
// the layers or summed as partial values.

sbp.placement @m cpu ranks [0, 1] mesh [2]
lg.graph @experts on @m {
  %x = lg.input "x" : tensor<16x8xf32>
  %counts = lg.input "counts" : tensor<4xi32>
  %ends = lg.cumsum %counts axis 0 : tensor<4xi32> -> tensor<4xi32>
  %w1 = lg.param "w1" init #lg.normal<0.0, 0.1> : !sbp.dtensor<4x8x32xf32, @m, S<0>>
  %w2 = lg.param "w2" init #lg.normal<0.0, 0.1> : !sbp.dtensor<4x32x8xf32, @m, S<0>>
  %h = lg.grouped_matmul %x, %w1, %ends : (tensor<16x8xf32>, !sbp.dtensor<4x8x32xf32, @m, S<0>>, tensor<4xi32>) -> tensor<16x32xf32>
  %a = lg.gelu %h : tensor<16x32xf32>
  %y = lg.grouped_matmul %a, %w2, %ends : (tensor<16x32xf32>, !sbp.dtensor<4x32x8xf32, @m, S<0>>, tensor<4xi32>) -> tensor<16x8xf32>
  %z = lg.mul %y, %y : (tensor<16x8xf32>, tensor<16x8xf32>) -> tensor<16x8xf32>
  lg.output ["z"] %z : tensor<16x8xf32>
}

// CHECK:      %h = lg.grouped_matmul %{{.*}}, %w1, %ends {sbp.signature = #sbp.sig<(G, S<0>, B) -> (G)>}
// CHECK:      %a = lg.gelu %h {sbp.signature = #sbp.sig<(G) -> (G)>}
// CHECK:      %y = lg.grouped_matmul %a, %w2, %ends {sbp.signature = #sbp.sig<(G, S<0>, B) -> (G)>}

// The output is fetched whole, with no ends beside it: never grouped.
// CHECK:      %z = lg.mul %{{.*}}, %{{.*}} {sbp.signature = #sbp.sig<({{B|S<0>}}, {{B|S<0>}}) -> ({{B|S<0>}})>}

// BOXED:      sbp.slice %x over [0] bytes 0 : !sbp.dtensor<16x8xf32, @m, B> -> !sbp.dtensor<16x8xf32, @m, G>
// BOXED:      %h = lg.grouped_matmul
// BOXED-NOT:  sbp.all_reduce
// BOXED:      %y = lg.grouped_matmul
// BOXED-NEXT: sbp.{{all_gather|all_to_all}} %y grouped by %ends : !sbp.dtensor<4xi32, @m, B> over [0]

// -----

// Rows the ends do not group (no grouped matmul reads them), and rows that
// two routings' ends would group: never G.

sbp.placement @m cpu ranks [0, 1] mesh [2]
lg.graph @two_routings on @m {
  %x = lg.input "x" : tensor<16x8xf32>
  %c1 = lg.input "c1" : tensor<2xi32>
  %c2 = lg.input "c2" : tensor<2xi32>
  %e1 = lg.cumsum %c1 axis 0 : tensor<2xi32> -> tensor<2xi32>
  %e2 = lg.cumsum %c2 axis 0 : tensor<2xi32> -> tensor<2xi32>
  %w = lg.param "w" init #lg.normal<0.0, 0.1> : !sbp.dtensor<2x8x8xf32, @m, S<0>>
  %y1 = lg.grouped_matmul %x, %w, %e1 : (tensor<16x8xf32>, !sbp.dtensor<2x8x8xf32, @m, S<0>>, tensor<2xi32>) -> tensor<16x8xf32>
  %y2 = lg.grouped_matmul %x, %w, %e2 : (tensor<16x8xf32>, !sbp.dtensor<2x8x8xf32, @m, S<0>>, tensor<2xi32>) -> tensor<16x8xf32>
  %s = lg.add %y1, %y2 : (tensor<16x8xf32>, tensor<16x8xf32>) -> tensor<16x8xf32>
  %t = lg.tanh %s : tensor<16x8xf32>
  lg.output ["t"] %t : tensor<16x8xf32>
}

// CHECK-LABEL: lg.graph @two_routings
// CHECK-NOT:   G>
// CHECK:       lg.output


// -----

// Tokens split over the devices (S(0)): each routed copy is gathered where
// its token lies, owned there by rows (I<256>: gathered from 256 rows split
// evenly), and goes to its expert's device by an all_to_all that reads the
// index and the group ends at run time, not by gathering every token. The
// experts are 4x as wide as the tokens, as in a transformer's MLP: with
// experts of 16 columns, gathering all tokens and experts to every device
// is cheaper, and sbp-infer takes it.

sbp.placement @m cpu ranks [0, 1, 2, 3] mesh [4]
lg.graph @dispatch on @m {
  %tokens = lg.input "tokens" : !sbp.dtensor<256x64xf32, @m, S<0>>
  %ids = lg.input "ids" : tensor<512xi32>
  %counts = lg.input "counts" : tensor<4xi32>
  %ends = lg.cumsum %counts axis 0 : tensor<4xi32> -> tensor<4xi32>
  %w1 = lg.param "w1" init #lg.normal<0.0, 0.1> : !sbp.dtensor<4x64x256xf32, @m, S<0>>
  %w2 = lg.param "w2" init #lg.normal<0.0, 0.1> : !sbp.dtensor<4x256x64xf32, @m, S<0>>
  %rows = lg.embedding %tokens, %ids : (!sbp.dtensor<256x64xf32, @m, S<0>>, tensor<512xi32>) -> tensor<512x64xf32>
  %h = lg.grouped_matmul %rows, %w1, %ends : (tensor<512x64xf32>, !sbp.dtensor<4x64x256xf32, @m, S<0>>, tensor<4xi32>) -> tensor<512x256xf32>
  %a = lg.gelu %h : tensor<512x256xf32>
  %y = lg.grouped_matmul %a, %w2, %ends : (tensor<512x256xf32>, !sbp.dtensor<4x256x64xf32, @m, S<0>>, tensor<4xi32>) -> tensor<512x64xf32>
  %z = lg.mul %y, %y : (tensor<512x64xf32>, tensor<512x64xf32>) -> tensor<512x64xf32>
  lg.output ["z"] %z : tensor<512x64xf32>
}

// CHECK-LABEL: lg.graph @dispatch
// CHECK:       %rows = lg.embedding %tokens, %ids {sbp.signature = #sbp.sig<(S<0>, B) -> (I<256>)>}
// CHECK:       %h = lg.grouped_matmul %{{.*}}, %w1, %ends {sbp.signature = #sbp.sig<(G, S<0>, B) -> (G)>}

// BOXED-LABEL: lg.graph @dispatch
// BOXED:       %rows = lg.embedding %tokens, %ids
// BOXED:       sbp.all_to_all %rows grouped by %ends : !sbp.dtensor<4xi32, @m, B> indexed by %ids : !sbp.dtensor<512xi32, @m, B> over [0]
// BOXED-SAME:  !sbp.dtensor<512x64xf32, @m, I<256>> -> !sbp.dtensor<512x64xf32, @m, G>
// BOXED-NEXT:  %h = lg.grouped_matmul
