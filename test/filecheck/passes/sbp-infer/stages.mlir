// RUN: sbp-opt %s -p sbp-infer,sbp-insert-boxing | filecheck %s
// RUN: sbp-opt %s -p lg-autodiff,sbp-infer,sbp-insert-boxing | filecheck %s --check-prefix=GRAD

// Pipeline stages: ops carry `sbp.placement`; what has none follows its
// first operand. The activation crosses with one sbp.transfer, and the
// backward of each stage's ops runs on that stage (autodiff copies the
// attribute), so the gradient crosses back once.

sbp.placement @stage0 cpu ranks [0] mesh [1]
sbp.placement @stage1 cpu ranks [1] mesh [1]
lg.graph @pp on @stage0 {
  %x = lg.input "x" : tensor<8x4xf32>
  %w1 = lg.param "w1" init #lg.normal<0.0, 0.1> {sbp.placement = @stage0} : tensor<4x4xf32>
  %h = lg.matmul %x, %w1 {sbp.placement = @stage0} : (tensor<8x4xf32>, tensor<4x4xf32>) -> tensor<8x4xf32>
  %w2 = lg.param "w2" init #lg.normal<0.0, 0.1> {sbp.placement = @stage1} : tensor<4x2xf32>
  %y = lg.matmul %h, %w2 {sbp.placement = @stage1} : (tensor<8x4xf32>, tensor<4x2xf32>) -> tensor<8x2xf32>
  %loss = lg.reduce_mean %y axes [0, 1] {sbp.placement = @stage1} : tensor<8x2xf32> -> tensor<f32>
  lg.output ["loss"] %loss : tensor<f32>
}

// CHECK:      %h = lg.matmul %x, %w1 {sbp.placement = @stage0, {{.*}}-> !sbp.dtensor<8x4xf32, @stage0, B>
// CHECK-NEXT: %0 = sbp.transfer %h bytes 128 : !sbp.dtensor<8x4xf32, @stage0, B> -> !sbp.dtensor<8x4xf32, @stage1, B>
// CHECK-NEXT: %w2 = lg.param "w2" {{.*}}: !sbp.dtensor<4x2xf32, @stage1, B>
// CHECK-NEXT: %y = lg.matmul %0, %w2 {sbp.placement = @stage1

// GRAD:         lg.matmul {{.*}} transpose_rhs {sbp.placement = @stage1
// GRAD-NEXT:    sbp.transfer {{.*}} -> !sbp.dtensor<8x4xf32, @stage0, B>
// GRAD:         lg.matmul %x, {{.*}} transpose_lhs {sbp.placement = @stage0
