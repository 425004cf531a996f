// RUN: sbp-opt %S/../../../../examples/mlp_train.mlir -p 'sbp-autoplan{explain=true}' | filecheck %s

// A graph the user hinted on a 1-D mesh of 4: the planner also tries the
// 2x2 mesh, where those hints name too few axes. Such a layout is rejected
// with the verifier's word, and a layout that keeps the hints is chosen
// (it was a ValueError with a traceback from the boxing planner).

// CHECK: sbp.autoplan = "mesh 4,
// CHECK-SAME: "mesh 2x2, replicated: rejected: 'sbp.annotate': result has 1 SBP entries but placement @dp has a 2-D mesh [2, 2]"
