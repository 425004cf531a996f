// RUN: sbp-opt %s -p sbp-infer{strategy=greedy} | filecheck %s --check-prefix=GREEDY
// RUN: sbp-opt %s -p sbp-infer{strategy=auto} | filecheck %s --check-prefix=AUTO
// RUN: sbp-opt %s -p sbp-infer{strategy=ilp} | filecheck %s --check-prefix=ILP

// A value with two consumers that want it split differently. Greedy decides
// %x together with its first consumer (a row sum prefers rows, S<0>) and then
// pays an all_to_all of the whole 4 MB tensor for the column softmax (which
// needs S<1> or B). Auto sees both consumers: split columns (S<1>), let the
// row sum end partial, and move nothing. Costs are seconds under the cpu
// device model (the compute as the simulator prices it; its figures are a
// measurement, so the costs are not checked here): greedy 5.4e-4, auto
// 3.4e-4; the integer program proves
// auto's answer optimal.

sbp.placement @m cpu ranks [0, 1] mesh [2]

lg.graph @first_consumer_trap on @m {
  %x = lg.input "x" : tensor<1024x1024xf32>
  %rowsum = lg.reduce_sum %x axes [1] : tensor<1024x1024xf32> -> tensor<1024xf32>
  %colsoftmax = lg.softmax %x axis 0 : tensor<1024x1024xf32>
  lg.output ["rowsum", "colsoftmax"] %rowsum, %colsoftmax : tensor<1024xf32>, tensor<1024x1024xf32>
}

// GREEDY:      lg.graph @first_consumer_trap on @m attributes {sbp.strategy = "greedy", sbp.total_cost = {{[0-9.e+-]+}} : f64}
// GREEDY-NEXT:   %x = lg.input "x" {sbp.signature = #sbp.sig<() -> (S<0>)>}
// GREEDY-NEXT:   %0 = sbp.annotate %x : !sbp.dtensor<1024x1024xf32, @m, S<0>> -> !sbp.dtensor<1024x1024xf32, @m, S<1>>
// GREEDY-NEXT:   %rowsum = lg.reduce_sum %x axes [1] {sbp.signature = #sbp.sig<(S<0>) -> (S<0>)>}
// GREEDY-NEXT:   %colsoftmax = lg.softmax %0 axis 0 {sbp.signature = #sbp.sig<(S<1>) -> (S<1>)>}

// AUTO:      lg.graph @first_consumer_trap on @m attributes {sbp.strategy = "auto", sbp.total_cost = {{[0-9.e+-]+}} : f64}
// AUTO-NEXT:   %x = lg.input "x" {sbp.signature = #sbp.sig<() -> (S<1>)>}
// AUTO-NEXT:   %rowsum = lg.reduce_sum %x axes [1] {sbp.signature = #sbp.sig<(S<1>) -> (P)>}
// AUTO-NEXT:   %colsoftmax = lg.softmax %x axis 0 {sbp.signature = #sbp.sig<(S<1>) -> (S<1>)>}
// AUTO-NOT:    sbp.annotate

// ILP:      lg.graph @first_consumer_trap on @m attributes {sbp.strategy = "ilp", sbp.total_cost = {{[0-9.e+-]+}} : f64}
// ILP-NEXT:   %x = lg.input "x" {sbp.signature = #sbp.sig<() -> (S<1>)>}
// ILP-NEXT:   %rowsum = lg.reduce_sum %x axes [1] {sbp.signature = #sbp.sig<(S<1>) -> (P)>}
// ILP-NEXT:   %colsoftmax = lg.softmax %x axis 0 {sbp.signature = #sbp.sig<(S<1>) -> (S<1>)>}
// ILP-NOT:    sbp.annotate
