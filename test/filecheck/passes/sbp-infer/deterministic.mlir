// RUN: env PYTHONHASHSEED=1 sbp-opt %S/../../../../examples/gpt_block.mlir -p 'compile{strategy=ilp}' > %t.1
// RUN: env PYTHONHASHSEED=2 sbp-opt %S/../../../../examples/gpt_block.mlir -p 'compile{strategy=ilp}' > %t.2
// RUN: env PYTHONHASHSEED=3 sbp-opt %S/../../../../examples/gpt_block.mlir -p 'compile{strategy=auto}' > %t.3
// RUN: env PYTHONHASHSEED=4 sbp-opt %S/../../../../examples/gpt_block.mlir -p 'compile{strategy=auto}' > %t.4
// RUN: diff %t.1 %t.2
// RUN: diff %t.3 %t.4
// RUN: filecheck %s < %t.1

// The same input compiles to the same plan in every process: nothing the
// compiler chooses may follow Python's string hashing, which differs from
// one process to the next. The GPT block's integer program has many plans
// of equal cost; which one HiGHS returns followed the order of its
// columns, which came from iterating a set of SBPs.

// CHECK: plan.program
