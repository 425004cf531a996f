// RUN: sbp-opt %s -p 'lg-autodiff,lg-optimizer{algorithm=adam},sbp-autoplan{strategy=auto explain=true}' | filecheck %s
// RUN: sbp-opt %s -p 'lg-autodiff,lg-optimizer{algorithm=adam},sbp-autoplan{strategy=auto memory_budget=70000},compile,plan-verify{memory_budget=70000}' > %t
// RUN: filecheck %s --check-prefix=TIGHT < %t
// RUN: not sbp-opt %t -p 'plan-verify{memory_budget=1000}' -f mlir 2>&1 | filecheck %s --check-prefix=OVER
// RUN: not sbp-opt %s -p 'lg-autodiff,lg-optimizer{algorithm=adam},sbp-autoplan{strategy=auto memory_budget=1000}' 2>&1 | filecheck %s --check-prefix=NOFIT
// RUN: not sbp-opt %s -p 'sbp-autoplan{cluster=tpu-pod}' 2>&1 | filecheck %s --check-prefix=CLUSTER

// An MLP with no hints on 4 devices. Every mesh shape (4, 2x2), start of the
// inputs (free, split, replicated) and memory mode (replicated, ZeRO, FSDP)
// is inferred, lowered and simulated on the cpu cluster; the fastest is
// kept, every value typed with its distribution, and the alternatives are
// listed fastest first.

sbp.placement @m cpu ranks [0, 1, 2, 3] mesh [4]
lg.graph @mlp on @m {
  %x = lg.input "x" : tensor<64x32xf32>
  %labels = lg.input "labels" : tensor<64xi64>
  %w1 = lg.param "w1" init #lg.normal<0.0, 0.2> seed 1 : tensor<32x64xf32>
  %h = lg.matmul %x, %w1 : (tensor<64x32xf32>, tensor<32x64xf32>) -> tensor<64x64xf32>
  %a = lg.gelu %h : tensor<64x64xf32>
  %w2 = lg.param "w2" init #lg.normal<0.0, 0.2> seed 2 : tensor<64x8xf32>
  %y = lg.matmul %a, %w2 : (tensor<64x64xf32>, tensor<64x8xf32>) -> tensor<64x8xf32>
  %loss = lg.cross_entropy %y, %labels : (tensor<64x8xf32>, tensor<64xi64>) -> tensor<f32>
  lg.output ["loss"] %loss : tensor<f32>
}

// CHECK:      sbp.placement @m cpu ranks [0, 1, 2, 3] mesh [{{4|2, 2}}]
// CHECK:      lg.graph @mlp on @m attributes {
// CHECK-SAME:   sbp.autoplan = "mesh {{[0-9x]+}}, {{.*}}{{replicated|zero|fsdp}}: predicted {{[0-9.]+}} ms/step, {{[0-9.]+}} MiB per device on cpu/4"
// CHECK-SAME:   sbp.autoplan.alternatives = ["mesh
// CHECK-COUNT-17: , "mesh
// CHECK:        %x = lg.input "x" {{.*}}: !sbp.dtensor<64x32xf32, @m,
// CHECK:        %w1 = lg.param "w1" {{.*}}: !sbp.dtensor<32x64xf32, @m,

// Under 70,000 bytes per device only a sharded layout fits; it compiles,
// and the compiled arena and persistent region fit too (plan-verify checks
// the plan itself, not the planner's estimate of it: the same plan, read
// back, is over a smaller budget).
// TIGHT:      plan.program
// TIGHT-NOT:  lg.graph

// OVER: 'plan.device' @rank0: arena and persistent region take {{[0-9]+}} bytes ({{[0-9]+}} + {{[0-9]+}}), over memory_budget=1000

// NOFIT: sbp-autoplan: no plan fits 0.000954 MiB per device; the smallest needs {{[0-9.]+}} MiB (mesh {{.*}})

// CLUSTER: sbp-autoplan: cluster 'tpu-pod' is neither a preset
