// Malformed input gives a diagnostic naming the op, exit code 1, and never a
// Python traceback.
// RUN: not sbp-opt %S/Inputs/shape.mlir 2>&1 | filecheck %s --check-prefix=SHAPE
// RUN: not sbp-opt %S/Inputs/shape.mlir --split-input-file 2>&1 | filecheck %s --check-prefix=SHAPE
// RUN: not sbp-opt %S/Inputs/bad-syntax.mlir 2>&1 | filecheck %s --check-prefix=SYNTAX
// RUN: not sbp-opt %S/Inputs/unknown-op.mlir 2>&1 | filecheck %s --check-prefix=UNKNOWN
// RUN: not sbp-opt %S/Inputs/split-axis.mlir 2>&1 | filecheck %s --check-prefix=AXIS
// RUN: not sbp-opt %S/Inputs/mesh-ranks.mlir 2>&1 | filecheck %s --check-prefix=MESH
// RUN: not sbp-opt %S/Inputs/shape.mlir -p no-such-pass 2>&1 | filecheck %s --check-prefix=PASS
// RUN: not sbp-opt %S/Inputs/shape.mlir -p 'compile{to_plan=false,fuse=false}' 2>&1 | filecheck %s --check-prefix=PIPELINE
// RUN: not sbp-opt %S/Inputs/no-such-file.mlir 2>&1 | filecheck %s --check-prefix=FILE
// RUN: not sbp-opt < %S/Inputs/not-utf8.bin 2>&1 | filecheck %s --check-prefix=UTF8
// RUN: not sbp-opt -p compile < %S/Inputs/not-utf8.bin 2>&1 | filecheck %s --check-prefix=UTF8

// SHAPE-NOT:   Traceback
// SHAPE:       'lg.matmul': contracting dimensions differ: [8, 16] @ [8, 16]
// SHAPE:       %y = "lg.matmul"(%x, %x)
// SHAPE-NEXT:  ^^^^^^^^^^^^^^^^

// SYNTAX-NOT:  Traceback
// SYNTAX:      bad-syntax.mlir:2:21
// SYNTAX-NEXT: {{ *}}%x = lg.input "x" tensor<8xf32>
// SYNTAX:      Expected ':'

// UNKNOWN-NOT: Traceback
// UNKNOWN:     unknown-op.mlir:3:20
// UNKNOWN:     Operation lg.softplus is not registered

// AXIS-NOT:    Traceback
// AXIS:        'sbp.annotate': result is split on axis 1 but has rank 1

// MESH-NOT:    Traceback
// MESH:        'sbp.placement' @m: mesh shape [2, 2] holds 4 devices but 3 ranks are given

// PASS-NOT:    Traceback
// PASS:        sbp-opt: error: {{.*}}no-such-pass

// PIPELINE-NOT:  Traceback
// PIPELINE:      sbp-opt: error: Error parsing pass pipeline specification:
// PIPELINE:      compile{to_plan=false,fuse=false}
// PIPELINE:      Malformed pass arguments, expected either a space or `}` here

// FILE-NOT:    Traceback
// FILE:        sbp-opt: error: {{.*}}No such file or directory

// A byte that is not UTF-8 (a flipped bit) is named with its place.
// UTF8-NOT:    Traceback
// UTF8:        stdin:2:40
// UTF8:        the input is not UTF-8 text: byte 0xff (invalid start byte)
