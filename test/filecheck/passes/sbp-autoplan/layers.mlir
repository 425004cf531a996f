// RUN: sbp-opt %s -p 'sbp-autoplan{search=layers explain=true training="lg-autodiff,lg-optimizer{algorithm=adam}"}' | filecheck %s
// RUN: sbp-opt %s -p 'sbp-autoplan{search=layers memory_budget=60000 training="lg-autodiff,lg-optimizer{algorithm=adam}"},compile' | filecheck %s --check-prefix=PLAN
// RUN: not sbp-opt %s -p 'sbp-autoplan{search=layers}' 2>&1 | filecheck %s --check-prefix=NOTRAIN

// A residual MLP of four equal blocks, no hints, planned by layers for 4
// devices: the forward graph is cut where only the residual crosses, the
// blocks share one profile, and the chosen layout is written as hints and
// placements followed by the training passes (the output still carries the
// optimizer's updates, and compile lowers it to a plan).

sbp.placement @m cpu ranks [0, 1, 2, 3] mesh [4]
lg.graph @res on @m {
  %x = lg.input "x" : tensor<32x16xf32>
  %labels = lg.input "labels" : tensor<32xi64>
  %w0 = lg.param "w0" init #lg.normal<0.0, 0.2> seed 1 : tensor<16x32xf32>
  %h0 = lg.matmul %x, %w0 : (tensor<32x16xf32>, tensor<16x32xf32>) -> tensor<32x32xf32>
  %w1 = lg.param "w1" init #lg.normal<0.0, 0.2> seed 2 : tensor<32x32xf32>
  %m1 = lg.matmul %h0, %w1 : (tensor<32x32xf32>, tensor<32x32xf32>) -> tensor<32x32xf32>
  %t1 = lg.tanh %m1 : tensor<32x32xf32>
  %h1 = lg.add %h0, %t1 : (tensor<32x32xf32>, tensor<32x32xf32>) -> tensor<32x32xf32>
  %w2 = lg.param "w2" init #lg.normal<0.0, 0.2> seed 3 : tensor<32x32xf32>
  %m2 = lg.matmul %h1, %w2 : (tensor<32x32xf32>, tensor<32x32xf32>) -> tensor<32x32xf32>
  %t2 = lg.tanh %m2 : tensor<32x32xf32>
  %h2 = lg.add %h1, %t2 : (tensor<32x32xf32>, tensor<32x32xf32>) -> tensor<32x32xf32>
  %w3 = lg.param "w3" init #lg.normal<0.0, 0.2> seed 4 : tensor<32x32xf32>
  %m3 = lg.matmul %h2, %w3 : (tensor<32x32xf32>, tensor<32x32xf32>) -> tensor<32x32xf32>
  %t3 = lg.tanh %m3 : tensor<32x32xf32>
  %h3 = lg.add %h2, %t3 : (tensor<32x32xf32>, tensor<32x32xf32>) -> tensor<32x32xf32>
  %w4 = lg.param "w4" init #lg.normal<0.0, 0.2> seed 6 : tensor<32x32xf32>
  %m4 = lg.matmul %h3, %w4 : (tensor<32x32xf32>, tensor<32x32xf32>) -> tensor<32x32xf32>
  %t4 = lg.tanh %m4 : tensor<32x32xf32>
  %h4 = lg.add %h3, %t4 : (tensor<32x32xf32>, tensor<32x32xf32>) -> tensor<32x32xf32>
  %wo = lg.param "wo" init #lg.normal<0.0, 0.2> seed 5 : tensor<32x8xf32>
  %y = lg.matmul %h4, %wo : (tensor<32x32xf32>, tensor<32x8xf32>) -> tensor<32x8xf32>
  %loss = lg.cross_entropy %y, %labels : (tensor<32x8xf32>, tensor<32xi64>) -> tensor<f32>
  lg.output ["loss"] %loss : tensor<f32>
}

// CHECK:      sbp.placement @m cpu ranks [0, 1, 2, 3] mesh [{{[0-9, ]+}}]
// CHECK:      lg.graph @res on @m attributes {
// CHECK-SAME:   sbp.autoplan = "{{.*}}: predicted {{[0-9.]+}} ms/step, {{[0-9.]+}} MiB per device on cpu/4 (by layers: 4 layers of 3 kinds, {{[0-9]+}} layer plans simulated, {{[0-9]+}} layouts composed)"
// CHECK-SAME:   sbp.autoplan.alternatives = ["
// CHECK-SAME:   "2 stages of
// CHECK:        %x = lg.input "x" {sbp.placement = @m} : !sbp.dtensor<32x16xf32, @m,
// CHECK:        %h0 = lg.matmul
// CHECK-NEXT:   sbp.annotate %h0 {sbp.placement = @m, sbp.autoplan.request} : tensor<32x32xf32> -> !sbp.dtensor<32x32xf32, @m,
// CHECK:        lg.output ["loss", {{.*}}"new.w1"

// Within 60000 bytes per device, lowered to a plan. On the cpu preset (2
// cores, so 4 ranks share them), four stages of one device: their transfers
// go between ranks on different cores, while a collective among ranks that
// share a core pays the sync the preset measured (about 140 us).
// PLAN:       sbp.placement @stage0 cpu ranks [0] mesh [1]
// PLAN-NEXT:  sbp.placement @stage1 cpu ranks [1] mesh [1]
// PLAN-NEXT:  sbp.placement @stage2 cpu ranks [2] mesh [1]
// PLAN-NEXT:  sbp.placement @stage3 cpu ranks [3] mesh [1]
// PLAN-NEXT:  plan.program @res

// NOTRAIN: sbp-autoplan: search=layers plans a forward graph with a batch: give `training` with lg-autodiff
