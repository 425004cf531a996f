// RUN: SBP_ROUNDTRIP
// RUN: SBP_GENERIC_ROUNDTRIP
// RUN: sbp-opt %s --split-input-file --print-op-generic | filecheck %s --check-prefix=GENERIC

// Every lg op and initializer, in custom form; the generic form follows below.

sbp.placement @mesh cpu ranks [0, 1] mesh [2]

lg.graph @all_ops on @mesh {
  %x = lg.input "x" : tensor<8x16xf32>
  %labels = lg.input "labels" : tensor<8xi64>
  %ids = lg.input "ids" : tensor<2x3xi32>
  %w = lg.param "w" init #lg.normal<0.0, 0.02> seed 1 : tensor<16x4xf32>
  %b = lg.param "b" init #lg.zeros : tensor<4xf32>
  %g = lg.param "g" init #lg.ones : tensor<4xf32>
  %f = lg.param "f" init #lg.fill<1.5> : tensor<4xf32>
  %u = lg.param "u" init #lg.uniform<-0.1, 0.1> seed 3 : tensor<4xf32>
  %st = lg.param "st" init #lg.zeros state : tensor<4xi64>
  %seed = lg.param "rng.seed" init #lg.zeros state : tensor<i64>
  %rstep = lg.param "rng.step" init #lg.zeros state : tensor<i64>
  %c = lg.constant dense<1.0> : tensor<4xf32>
  %ci = lg.constant dense<[1, 2]> : tensor<2xi64>
  %ci0 = lg.constant dense<0> : tensor<i64>
  %mm = lg.matmul %x, %w : (tensor<8x16xf32>, tensor<16x4xf32>) -> tensor<8x4xf32>
  %mt = lg.matmul %x, %x transpose_rhs : (tensor<8x16xf32>, tensor<8x16xf32>) -> tensor<8x8xf32>
  %mtl = lg.matmul %x, %x transpose_lhs : (tensor<8x16xf32>, tensor<8x16xf32>) -> tensor<16x16xf32>
  %x3 = lg.reshape %x : tensor<8x16xf32> -> tensor<2x4x16xf32>
  %bmm = lg.matmul %x3, %w : (tensor<2x4x16xf32>, tensor<16x4xf32>) -> tensor<2x4x4xf32>
  %bmm2 = lg.matmul %x3, %x3 transpose_rhs : (tensor<2x4x16xf32>, tensor<2x4x16xf32>) -> tensor<2x4x4xf32>
  %bmm3 = lg.matmul %mm, %x3 : (tensor<8x4xf32>, tensor<2x4x16xf32>) -> tensor<2x8x16xf32>
  %ends = lg.constant dense<[3, 3, 6, 8]> : tensor<4xi64>
  %experts = lg.reshape %x : tensor<8x16xf32> -> tensor<4x16x2xf32>
  %gmm = lg.grouped_matmul %x, %experts, %ends : (tensor<8x16xf32>, tensor<4x16x2xf32>, tensor<4xi64>) -> tensor<8x2xf32>
  %expertst = lg.reshape %x : tensor<8x16xf32> -> tensor<4x2x16xf32>
  %gmmt = lg.grouped_matmul %x, %expertst, %ends transpose_rhs : (tensor<8x16xf32>, tensor<4x2x16xf32>, tensor<4xi64>) -> tensor<8x2xf32>
  %gmmw = lg.grouped_matmul_grad_weight %x, %gmmt, %ends : (tensor<8x16xf32>, tensor<8x2xf32>, tensor<4xi64>) -> tensor<4x16x2xf32>
  %add = lg.add %mm, %b : (tensor<8x4xf32>, tensor<4xf32>) -> tensor<8x4xf32>
  %sub = lg.sub %add, %c : (tensor<8x4xf32>, tensor<4xf32>) -> tensor<8x4xf32>
  %mul = lg.mul %sub, %g : (tensor<8x4xf32>, tensor<4xf32>) -> tensor<8x4xf32>
  %div = lg.div %mul, %f : (tensor<8x4xf32>, tensor<4xf32>) -> tensor<8x4xf32>
  %neg = lg.neg %div : tensor<8x4xf32>
  %relu = lg.relu %neg : tensor<8x4xf32>
  %gelu = lg.gelu %relu : tensor<8x4xf32>
  %tanh = lg.tanh %gelu : tensor<8x4xf32>
  %erf = lg.erf %tanh : tensor<8x4xf32>
  %exp = lg.exp %tanh : tensor<8x4xf32>
  %sqrt = lg.sqrt %exp : tensor<8x4xf32>
  %log = lg.log %exp : tensor<8x4xf32>
  %sin = lg.sin %tanh : tensor<8x4xf32>
  %cos = lg.cos %tanh : tensor<8x4xf32>
  %atan = lg.atan %gelu : tensor<8x4xf32>
  %floor = lg.floor %gelu : tensor<8x4xf32>
  %ceil = lg.ceil %gelu : tensor<8x4xf32>
  %round = lg.round %gelu : tensor<8x4xf32>
  %trunc = lg.trunc %gelu : tensor<8x4xf32>
  %rsqrt = lg.rsqrt %sqrt : tensor<8x4xf32>
  %sm = lg.softmax %rsqrt axis 1 : tensor<8x4xf32>
  %lsm = lg.log_softmax %sm axis 0 : tensor<8x4xf32>
  %ln = lg.layernorm %lsm weight %g : tensor<4xf32> bias %b : tensor<4xf32> axis 1 eps 1.0e-05 : tensor<8x4xf32>
  %ln0 = lg.layernorm %x3 axis 1 eps 1.0e-06 : tensor<2x4x16xf32>
  %lng = lg.layernorm_grad %lsm, %rsqrt axis 1 eps 1.0e-05 : (tensor<8x4xf32>, tensor<8x4xf32>) -> tensor<8x4xf32>
  %rs = lg.reduce_sum %ln axes [1] keepdims : tensor<8x4xf32> -> tensor<8x1xf32>
  %rm = lg.reduce_mean %ln axes [0] : tensor<8x4xf32> -> tensor<4xf32>
  %rx = lg.reduce_max %ln axes [0, 1] : tensor<8x4xf32> -> tensor<f32>
  %bt = lg.broadcast_to %rm : tensor<4xf32> -> tensor<3x8x4xf32>
  %tr = lg.transpose %bt perm [2, 0, 1] : tensor<3x8x4xf32> -> tensor<4x3x8xf32>
  %cc = lg.concat %ln, %relu, %mm axis 1 : (tensor<8x4xf32>, tensor<8x4xf32>, tensor<8x4xf32>) -> tensor<8x12xf32>
  %sl = lg.slice %cc starts [0, 1] limits [8, 12] strides [2, 3] : tensor<8x12xf32> -> tensor<4x4xf32>
  %pad = lg.pad %ln low [0, 1] high [2, 0] value -1.000000e+02 : tensor<8x4xf32> -> tensor<10x5xf32>
  %cs = lg.cumsum %ln axis 1 reverse : tensor<8x4xf32> -> tensor<8x4xf32>
  %csi = lg.cumsum %ci axis 0 : tensor<2xi64> -> tensor<2xi64>
  %drop = lg.dropout %ln, %seed, %rstep rate 1.000000e-01 stream 3 : (tensor<8x4xf32>, tensor<i64>, tensor<i64>) -> tensor<8x4xf32>
  %rand = lg.uniform %seed, %rstep stream 5 : (tensor<i64>, tensor<i64>) -> tensor<8x1x1xf32>
  %amax = lg.argmax %ln axis 1 : tensor<8x4xf32> -> tensor<8xi64>
  %top = lg.topk %ln k 2 axis 1 : tensor<8x4xf32> -> tensor<8x2xi64>
  %order = lg.topk %ln k 8 axis 0 smallest : tensor<8x4xf32> -> tensor<8x4xi64>
  %dropmb = lg.dropout %ln, %seed, %rstep rate 5.000000e-01 stream 4 micro_batch [2, 1, 4] : (tensor<8x4xf32>, tensor<i64>, tensor<i64>) -> tensor<8x4xf32>
  %addi = lg.add %csi, %ci : (tensor<2xi64>, tensor<2xi64>) -> tensor<2xi64>
  %fdiv = lg.floordiv %addi, %ci : (tensor<2xi64>, tensor<2xi64>) -> tensor<2xi64>
  %img = lg.reshape %x : tensor<8x16xf32> -> tensor<2x4x4x4xf32>
  %kern = lg.reshape %mm : tensor<8x4xf32> -> tensor<4x2x2x2xf32>
  %cv = lg.conv2d %img, %kern stride [2, 1] padding [1, 0] dilation [1, 2] groups 2 : (tensor<2x4x4x4xf32>, tensor<4x2x2x2xf32>) -> tensor<2x4x3x2xf32>
  %cvi = lg.conv2d_grad_input %cv, %kern size [4, 4] stride [2, 1] padding [1, 0] dilation [1, 2] groups 2 : (tensor<2x4x3x2xf32>, tensor<4x2x2x2xf32>) -> tensor<2x4x4x4xf32>
  %cvw = lg.conv2d_grad_weight %img, %cv kernel [2, 2] stride [2, 1] padding [1, 0] dilation [1, 2] groups 2 : (tensor<2x4x4x4xf32>, tensor<2x4x3x2xf32>) -> tensor<4x2x2x2xf32>
  %mp = lg.max_pool2d %img kernel [3, 2] stride [2, 2] padding [1, 1] : tensor<2x4x4x4xf32> -> tensor<2x4x2x3xf32>
  %mpg = lg.max_pool2d_grad %img, %mp kernel [3, 2] stride [2, 2] padding [1, 1] : (tensor<2x4x4x4xf32>, tensor<2x4x2x3xf32>) -> tensor<2x4x4x4xf32>
  %em = lg.embedding %w, %ids : (tensor<16x4xf32>, tensor<2x3xi32>) -> tensor<2x3x4xf32>
  %ce = lg.cross_entropy %ln, %labels : (tensor<8x4xf32>, tensor<8xi64>) -> tensor<f32>
  %mse = lg.mse_loss %ln, %relu : (tensor<8x4xf32>, tensor<8x4xf32>) -> tensor<f32>
  %step = lg.step %ln : tensor<8x4xf32>
  %sg = lg.stop_gradient %ln : tensor<8x4xf32>
  %oh = lg.one_hot %labels classes 4 : tensor<8xi64> -> tensor<8x4xf32>
  %ohi = lg.one_hot %labels classes 4 ignore -100 : tensor<8xi64> -> tensor<8x4xf32>
  %eg = lg.embedding_grad %em, %ids rows 16 : (tensor<2x3x4xf32>, tensor<2x3xi32>) -> tensor<16x4xf32>
  %gidx = lg.cast %ids : tensor<2x3xi32> -> tensor<2x3xi64>
  %gidx3 = lg.reshape %gidx : tensor<2x3xi64> -> tensor<2x3x1xi64>
  %ga = lg.gather %em, %gidx3 axis 2 : (tensor<2x3x4xf32>, tensor<2x3x1xi64>) -> tensor<2x3x1xf32>
  %sa = lg.scatter_add %ga, %gidx3 axis 2 size 4 : (tensor<2x3x1xf32>, tensor<2x3x1xi64>) -> tensor<2x3x4xf32>
  %sw = lg.scatter %sa, %gidx3, %ga axis 2 : (tensor<2x3x4xf32>, tensor<2x3x1xi64>, tensor<2x3x1xf32>) -> tensor<2x3x4xf32>
  %emp = lg.embedding %w, %ids padding 0 : (tensor<16x4xf32>, tensor<2x3xi32>) -> tensor<2x3x4xf32>
  %egp = lg.embedding_grad %em, %ids rows 16 padding 0 : (tensor<2x3x4xf32>, tensor<2x3xi32>) -> tensor<16x4xf32>
  %rowids = lg.reshape %ids : tensor<2x3xi32> -> tensor<6xi32>
  %rows = lg.embedding %w, %rowids : (tensor<16x4xf32>, tensor<6xi32>) -> tensor<6x4xf32>
  %rowsg = lg.embedding_grad %rows, %rowids rows 16 padding 1 : (tensor<6x4xf32>, tensor<6xi32>) -> tensor<16x4xf32>
  %mask = lg.cast %ids : tensor<2x3xi32> -> tensor<2x3xi1>
  %both = lg.logical "and" %mask, %mask : (tensor<2x3xi1>, tensor<2x3xi1>) -> tensor<2x3xi1>
  %picked = lg.select %both, %ids, %ids : (tensor<2x3xi1>, tensor<2x3xi32>, tensor<2x3xi32>) -> tensor<2x3xi32>
  %less = lg.compare "lt" %ids, %ids : (tensor<2x3xi32>, tensor<2x3xi32>) -> tensor<2x3xi1>
  %kept = lg.compare "ne" %labels, %ci0 : (tensor<8xi64>, tensor<i64>) -> tensor<8xi1>
  %rowmax = lg.reduce_max %ln axes [1] : tensor<8x4xf32> -> tensor<8xf32>
  %sumexp = lg.sum_exp %ln, %rowmax : (tensor<8x4xf32>, tensor<8xf32>) -> tensor<8xf32>
  %tce = lg.token_cross_entropy %ln, %labels, %rowmax, %sumexp ignore -100 : (tensor<8x4xf32>, tensor<8xi64>, tensor<8xf32>, tensor<8xf32>) -> tensor<8xf32>
  %tceg = lg.token_cross_entropy_grad %ln, %labels, %rowmax, %sumexp, %tce : (tensor<8x4xf32>, tensor<8xi64>, tensor<8xf32>, tensor<8xf32>, tensor<8xf32>) -> tensor<8x4xf32>
  lg.output ["loss", "mse", "emb"] %ce, %mse, %em : tensor<f32>, tensor<f32>, tensor<2x3x4xf32>
}

// CHECK:      sbp.placement @mesh cpu ranks [0, 1] mesh [2]
// CHECK-NEXT: lg.graph @all_ops on @mesh {
// CHECK-NEXT:   %x = lg.input "x" : tensor<8x16xf32>
// CHECK-NEXT:   %labels = lg.input "labels" : tensor<8xi64>
// CHECK-NEXT:   %ids = lg.input "ids" : tensor<2x3xi32>
// CHECK-NEXT:   %w = lg.param "w" init #lg.normal<0.0, 0.02> seed 1 : tensor<16x4xf32>
// CHECK-NEXT:   %b = lg.param "b" init #lg.zeros : tensor<4xf32>
// CHECK-NEXT:   %g = lg.param "g" init #lg.ones : tensor<4xf32>
// CHECK-NEXT:   %f = lg.param "f" init #lg.fill<1.5> : tensor<4xf32>
// CHECK-NEXT:   %u = lg.param "u" init #lg.uniform<-0.1, 0.1> seed 3 : tensor<4xf32>
// CHECK-NEXT:   %st = lg.param "st" init #lg.zeros state : tensor<4xi64>
// CHECK-NEXT:   %seed = lg.param "rng.seed" init #lg.zeros state : tensor<i64>
// CHECK-NEXT:   %rstep = lg.param "rng.step" init #lg.zeros state : tensor<i64>
// CHECK-NEXT:   %c = lg.constant dense<1.000000e+00> : tensor<4xf32>
// CHECK-NEXT:   %ci = lg.constant dense<[1, 2]> : tensor<2xi64>
// CHECK-NEXT:   %ci0 = lg.constant dense<0> : tensor<i64>
// CHECK-NEXT:   %mm = lg.matmul %x, %w : (tensor<8x16xf32>, tensor<16x4xf32>) -> tensor<8x4xf32>
// CHECK-NEXT:   %mt = lg.matmul %x, %x transpose_rhs : (tensor<8x16xf32>, tensor<8x16xf32>) -> tensor<8x8xf32>
// CHECK-NEXT:   %mtl = lg.matmul %x, %x transpose_lhs : (tensor<8x16xf32>, tensor<8x16xf32>) -> tensor<16x16xf32>
// CHECK-NEXT:   %x3 = lg.reshape %x : tensor<8x16xf32> -> tensor<2x4x16xf32>
// CHECK-NEXT:   %bmm = lg.matmul %x3, %w : (tensor<2x4x16xf32>, tensor<16x4xf32>) -> tensor<2x4x4xf32>
// CHECK-NEXT:   %bmm2 = lg.matmul %x3, %x3 transpose_rhs : (tensor<2x4x16xf32>, tensor<2x4x16xf32>) -> tensor<2x4x4xf32>
// CHECK-NEXT:   %bmm3 = lg.matmul %mm, %x3 : (tensor<8x4xf32>, tensor<2x4x16xf32>) -> tensor<2x8x16xf32>
// CHECK-NEXT:  %ends = lg.constant dense<[3, 3, 6, 8]> : tensor<4xi64>
// CHECK-NEXT:  %experts = lg.reshape %x : tensor<8x16xf32> -> tensor<4x16x2xf32>
// CHECK-NEXT:  %gmm = lg.grouped_matmul %x, %experts, %ends : (tensor<8x16xf32>, tensor<4x16x2xf32>, tensor<4xi64>) -> tensor<8x2xf32>
// CHECK-NEXT:  %expertst = lg.reshape %x : tensor<8x16xf32> -> tensor<4x2x16xf32>
// CHECK-NEXT:  %gmmt = lg.grouped_matmul %x, %expertst, %ends transpose_rhs : (tensor<8x16xf32>, tensor<4x2x16xf32>, tensor<4xi64>) -> tensor<8x2xf32>
// CHECK-NEXT:  %gmmw = lg.grouped_matmul_grad_weight %x, %gmmt, %ends : (tensor<8x16xf32>, tensor<8x2xf32>, tensor<4xi64>) -> tensor<4x16x2xf32>
// CHECK-NEXT:   %add = lg.add %mm, %b : (tensor<8x4xf32>, tensor<4xf32>) -> tensor<8x4xf32>
// CHECK-NEXT:   %sub = lg.sub %add, %c : (tensor<8x4xf32>, tensor<4xf32>) -> tensor<8x4xf32>
// CHECK-NEXT:   %mul = lg.mul %sub, %g : (tensor<8x4xf32>, tensor<4xf32>) -> tensor<8x4xf32>
// CHECK-NEXT:   %div = lg.div %mul, %f : (tensor<8x4xf32>, tensor<4xf32>) -> tensor<8x4xf32>
// CHECK-NEXT:   %neg = lg.neg %div : tensor<8x4xf32>
// CHECK-NEXT:   %relu = lg.relu %neg : tensor<8x4xf32>
// CHECK-NEXT:   %gelu = lg.gelu %relu : tensor<8x4xf32>
// CHECK-NEXT:   %tanh = lg.tanh %gelu : tensor<8x4xf32>
// CHECK-NEXT:   %erf = lg.erf %tanh : tensor<8x4xf32>
// CHECK-NEXT:   %exp = lg.exp %tanh : tensor<8x4xf32>
// CHECK-NEXT:   %sqrt = lg.sqrt %exp : tensor<8x4xf32>
// CHECK-NEXT:   %log = lg.log %exp : tensor<8x4xf32>
// CHECK-NEXT:   %sin = lg.sin %tanh : tensor<8x4xf32>
// CHECK-NEXT:   %cos = lg.cos %tanh : tensor<8x4xf32>
// CHECK-NEXT:   %atan = lg.atan %gelu : tensor<8x4xf32>
// CHECK-NEXT:   %floor = lg.floor %gelu : tensor<8x4xf32>
// CHECK-NEXT:   %ceil = lg.ceil %gelu : tensor<8x4xf32>
// CHECK-NEXT:   %round = lg.round %gelu : tensor<8x4xf32>
// CHECK-NEXT:   %trunc = lg.trunc %gelu : tensor<8x4xf32>
// CHECK-NEXT:   %rsqrt = lg.rsqrt %sqrt : tensor<8x4xf32>
// CHECK-NEXT:   %sm = lg.softmax %rsqrt axis 1 : tensor<8x4xf32>
// CHECK-NEXT:   %lsm = lg.log_softmax %sm axis 0 : tensor<8x4xf32>
// CHECK-NEXT:   %ln = lg.layernorm %lsm weight %g : tensor<4xf32> bias %b : tensor<4xf32> axis 1 eps 1.000000e-05 : tensor<8x4xf32>
// CHECK-NEXT:   %ln0 = lg.layernorm %x3 axis 1 eps 1.000000e-06 : tensor<2x4x16xf32>
// CHECK-NEXT:   %lng = lg.layernorm_grad %lsm, %rsqrt axis 1 eps 1.000000e-05 : (tensor<8x4xf32>, tensor<8x4xf32>) -> tensor<8x4xf32>
// CHECK-NEXT:   %rs = lg.reduce_sum %ln axes [1] keepdims : tensor<8x4xf32> -> tensor<8x1xf32>
// CHECK-NEXT:   %rm = lg.reduce_mean %ln axes [0] : tensor<8x4xf32> -> tensor<4xf32>
// CHECK-NEXT:   %rx = lg.reduce_max %ln axes [0, 1] : tensor<8x4xf32> -> tensor<f32>
// CHECK-NEXT:   %bt = lg.broadcast_to %rm : tensor<4xf32> -> tensor<3x8x4xf32>
// CHECK-NEXT:   %tr = lg.transpose %bt perm [2, 0, 1] : tensor<3x8x4xf32> -> tensor<4x3x8xf32>
// CHECK-NEXT:   %cc = lg.concat %ln, %relu, %mm axis 1 : (tensor<8x4xf32>, tensor<8x4xf32>, tensor<8x4xf32>) -> tensor<8x12xf32>
// CHECK-NEXT:   %sl = lg.slice %cc starts [0, 1] limits [8, 12] strides [2, 3] : tensor<8x12xf32> -> tensor<4x4xf32>
// CHECK-NEXT:   %pad = lg.pad %ln low [0, 1] high [2, 0] value -1.000000e+02 : tensor<8x4xf32> -> tensor<10x5xf32>
// CHECK-NEXT:  %cs = lg.cumsum %ln axis 1 reverse : tensor<8x4xf32> -> tensor<8x4xf32>
// CHECK-NEXT:  %csi = lg.cumsum %ci axis 0 : tensor<2xi64> -> tensor<2xi64>
// CHECK-NEXT:  %drop = lg.dropout %ln, %seed, %rstep rate 1.000000e-01 stream 3 : (tensor<8x4xf32>, tensor<i64>, tensor<i64>) -> tensor<8x4xf32>
// CHECK-NEXT:  %rand = lg.uniform %seed, %rstep stream 5 : (tensor<i64>, tensor<i64>) -> tensor<8x1x1xf32>
// CHECK-NEXT:  %amax = lg.argmax %ln axis 1 : tensor<8x4xf32> -> tensor<8xi64>
// CHECK-NEXT:  %top = lg.topk %ln k 2 axis 1 : tensor<8x4xf32> -> tensor<8x2xi64>
// CHECK-NEXT:  %order = lg.topk %ln k 8 axis 0 smallest : tensor<8x4xf32> -> tensor<8x4xi64>
// CHECK-NEXT:  %dropmb = lg.dropout %ln, %seed, %rstep rate 5.000000e-01 stream 4 micro_batch [2, 1, 4] : (tensor<8x4xf32>, tensor<i64>, tensor<i64>) -> tensor<8x4xf32>
// CHECK-NEXT:  %addi = lg.add %csi, %ci : (tensor<2xi64>, tensor<2xi64>) -> tensor<2xi64>
// CHECK-NEXT:  %fdiv = lg.floordiv %addi, %ci : (tensor<2xi64>, tensor<2xi64>) -> tensor<2xi64>
// CHECK-NEXT:  %img = lg.reshape %x : tensor<8x16xf32> -> tensor<2x4x4x4xf32>
// CHECK-NEXT:  %kern = lg.reshape %mm : tensor<8x4xf32> -> tensor<4x2x2x2xf32>
// CHECK-NEXT:  %cv = lg.conv2d %img, %kern stride [2, 1] padding [1, 0] dilation [1, 2] groups 2 : (tensor<2x4x4x4xf32>, tensor<4x2x2x2xf32>) -> tensor<2x4x3x2xf32>
// CHECK-NEXT:  %cvi = lg.conv2d_grad_input %cv, %kern size [4, 4] stride [2, 1] padding [1, 0] dilation [1, 2] groups 2 : (tensor<2x4x3x2xf32>, tensor<4x2x2x2xf32>) -> tensor<2x4x4x4xf32>
// CHECK-NEXT:  %cvw = lg.conv2d_grad_weight %img, %cv kernel [2, 2] stride [2, 1] padding [1, 0] dilation [1, 2] groups 2 : (tensor<2x4x4x4xf32>, tensor<2x4x3x2xf32>) -> tensor<4x2x2x2xf32>
// CHECK-NEXT:  %mp = lg.max_pool2d %img kernel [3, 2] stride [2, 2] padding [1, 1] : tensor<2x4x4x4xf32> -> tensor<2x4x2x3xf32>
// CHECK-NEXT:  %mpg = lg.max_pool2d_grad %img, %mp kernel [3, 2] stride [2, 2] padding [1, 1] : (tensor<2x4x4x4xf32>, tensor<2x4x2x3xf32>) -> tensor<2x4x4x4xf32>
// CHECK-NEXT:   %em = lg.embedding %w, %ids : (tensor<16x4xf32>, tensor<2x3xi32>) -> tensor<2x3x4xf32>
// CHECK-NEXT:   %ce = lg.cross_entropy %ln, %labels : (tensor<8x4xf32>, tensor<8xi64>) -> tensor<f32>
// CHECK-NEXT:   %mse = lg.mse_loss %ln, %relu : (tensor<8x4xf32>, tensor<8x4xf32>) -> tensor<f32>
// CHECK-NEXT:   %step = lg.step %ln : tensor<8x4xf32>
// CHECK-NEXT:   %sg = lg.stop_gradient %ln : tensor<8x4xf32>
// CHECK-NEXT:   %oh = lg.one_hot %labels classes 4 : tensor<8xi64> -> tensor<8x4xf32>
// CHECK-NEXT:   %ohi = lg.one_hot %labels classes 4 ignore -100 : tensor<8xi64> -> tensor<8x4xf32>
// CHECK-NEXT:   %eg = lg.embedding_grad %em, %ids rows 16 : (tensor<2x3x4xf32>, tensor<2x3xi32>) -> tensor<16x4xf32>
// CHECK-NEXT:  %gidx = lg.cast %ids : tensor<2x3xi32> -> tensor<2x3xi64>
// CHECK-NEXT:  %gidx3 = lg.reshape %gidx : tensor<2x3xi64> -> tensor<2x3x1xi64>
// CHECK-NEXT:  %ga = lg.gather %em, %gidx3 axis 2 : (tensor<2x3x4xf32>, tensor<2x3x1xi64>) -> tensor<2x3x1xf32>
// CHECK-NEXT:  %sa = lg.scatter_add %ga, %gidx3 axis 2 size 4 : (tensor<2x3x1xf32>, tensor<2x3x1xi64>) -> tensor<2x3x4xf32>
// CHECK-NEXT:  %sw = lg.scatter %sa, %gidx3, %ga axis 2 : (tensor<2x3x4xf32>, tensor<2x3x1xi64>, tensor<2x3x1xf32>) -> tensor<2x3x4xf32>
// CHECK-NEXT:   %emp = lg.embedding %w, %ids padding 0 : (tensor<16x4xf32>, tensor<2x3xi32>) -> tensor<2x3x4xf32>
// CHECK-NEXT:   %egp = lg.embedding_grad %em, %ids rows 16 padding 0 : (tensor<2x3x4xf32>, tensor<2x3xi32>) -> tensor<16x4xf32>
// CHECK-NEXT:   %rowids = lg.reshape %ids : tensor<2x3xi32> -> tensor<6xi32>
// CHECK-NEXT:   %rows = lg.embedding %w, %rowids : (tensor<16x4xf32>, tensor<6xi32>) -> tensor<6x4xf32>
// CHECK-NEXT:   %rowsg = lg.embedding_grad %rows, %rowids rows 16 padding 1 : (tensor<6x4xf32>, tensor<6xi32>) -> tensor<16x4xf32>
// CHECK-NEXT:   %mask = lg.cast %ids : tensor<2x3xi32> -> tensor<2x3xi1>
// CHECK-NEXT:   %both = lg.logical "and" %mask, %mask : (tensor<2x3xi1>, tensor<2x3xi1>) -> tensor<2x3xi1>
// CHECK-NEXT:   %picked = lg.select %both, %ids, %ids : (tensor<2x3xi1>, tensor<2x3xi32>, tensor<2x3xi32>) -> tensor<2x3xi32>
// CHECK-NEXT:   %less = lg.compare "lt" %ids, %ids : (tensor<2x3xi32>, tensor<2x3xi32>) -> tensor<2x3xi1>
// CHECK-NEXT:   %kept = lg.compare "ne" %labels, %ci0 : (tensor<8xi64>, tensor<i64>) -> tensor<8xi1>
// CHECK-NEXT:   %rowmax = lg.reduce_max %ln axes [1] : tensor<8x4xf32> -> tensor<8xf32>
// CHECK-NEXT:   %sumexp = lg.sum_exp %ln, %rowmax : (tensor<8x4xf32>, tensor<8xf32>) -> tensor<8xf32>
// CHECK-NEXT:   %tce = lg.token_cross_entropy %ln, %labels, %rowmax, %sumexp ignore -100 : (tensor<8x4xf32>, tensor<8xi64>, tensor<8xf32>, tensor<8xf32>) -> tensor<8xf32>
// CHECK-NEXT:   %tceg = lg.token_cross_entropy_grad %ln, %labels, %rowmax, %sumexp, %tce : (tensor<8x4xf32>, tensor<8xi64>, tensor<8xf32>, tensor<8xf32>, tensor<8xf32>) -> tensor<8x4xf32>
// CHECK-NEXT:   lg.output ["loss", "mse", "emb"] %ce, %mse, %em : tensor<f32>, tensor<f32>, tensor<2x3x4xf32>
// CHECK-NEXT: }

// GENERIC:      "sbp.placement"() <{sym_name = "mesh", device = #sbp<device cpu>, ranks = array<i64: 0, 1>, shape = array<i64: 2>}> : () -> ()
// GENERIC-NEXT: "lg.graph"() <{sym_name = "all_ops", placement = @mesh}> ({
// GENERIC-NEXT:   %x = "lg.input"() <{key = "x"}> : () -> tensor<8x16xf32>
// GENERIC:        %w = "lg.param"() <{key = "w", init = #lg.normal<0.0, 0.02>, seed = 1 : i64}> : () -> tensor<16x4xf32>
// GENERIC:        %st = "lg.param"() <{key = "st", init = #lg.zeros, state, seed = 0 : i64}> : () -> tensor<4xi64>
// GENERIC:        %c = "lg.constant"() <{value = dense<1.000000e+00> : tensor<4xf32>}> : () -> tensor<4xf32>
// GENERIC:        %mt = "lg.matmul"(%x, %x) <{transpose_rhs}> : (tensor<8x16xf32>, tensor<8x16xf32>) -> tensor<8x8xf32>
// GENERIC:        %gmmt = "lg.grouped_matmul"(%x, %expertst, %ends) <{transpose_rhs}> : (tensor<8x16xf32>, tensor<4x2x16xf32>, tensor<4xi64>) -> tensor<8x2xf32>
// GENERIC-NEXT:   %gmmw = "lg.grouped_matmul_grad_weight"(%x, %gmmt, %ends) : (tensor<8x16xf32>, tensor<8x2xf32>, tensor<4xi64>) -> tensor<4x16x2xf32>
// GENERIC:        %add = "lg.add"(%mm, %b) : (tensor<8x4xf32>, tensor<4xf32>) -> tensor<8x4xf32>
// GENERIC:        %relu = "lg.relu"(%neg) : (tensor<8x4xf32>) -> tensor<8x4xf32>
// GENERIC:        %log = "lg.log"(%exp) : (tensor<8x4xf32>) -> tensor<8x4xf32>
// GENERIC-NEXT:   %sin = "lg.sin"(%tanh) : (tensor<8x4xf32>) -> tensor<8x4xf32>
// GENERIC:        %round = "lg.round"(%gelu) : (tensor<8x4xf32>) -> tensor<8x4xf32>
// GENERIC:        %sm = "lg.softmax"(%rsqrt) <{axis = 1 : i64}> : (tensor<8x4xf32>) -> tensor<8x4xf32>
// GENERIC:        %ln = "lg.layernorm"(%lsm, %g, %b) <{axis = 1 : i64, epsilon = 1.000000e-05 : f64, operandSegmentSizes = array<i32: 1, 1, 1>}> : (tensor<8x4xf32>, tensor<4xf32>, tensor<4xf32>) -> tensor<8x4xf32>
// GENERIC-NEXT:   %ln0 = "lg.layernorm"(%x3) <{axis = 1 : i64, epsilon = 1.000000e-06 : f64, operandSegmentSizes = array<i32: 1, 0, 0>}> : (tensor<2x4x16xf32>) -> tensor<2x4x16xf32>
// GENERIC-NEXT:   %lng = "lg.layernorm_grad"(%lsm, %rsqrt) <{axis = 1 : i64, epsilon = 1.000000e-05 : f64}> : (tensor<8x4xf32>, tensor<8x4xf32>) -> tensor<8x4xf32>
// GENERIC-NEXT:   %rs = "lg.reduce_sum"(%ln) <{axes = array<i64: 1>, keepdims}> : (tensor<8x4xf32>) -> tensor<8x1xf32>
// GENERIC:        %tr = "lg.transpose"(%bt) <{perm = array<i64: 2, 0, 1>}> : (tensor<3x8x4xf32>) -> tensor<4x3x8xf32>
// GENERIC-NEXT:   %cc = "lg.concat"(%ln, %relu, %mm) <{axis = 1 : i64}> : (tensor<8x4xf32>, tensor<8x4xf32>, tensor<8x4xf32>) -> tensor<8x12xf32>
// GENERIC-NEXT:   %sl = "lg.slice"(%cc) <{starts = array<i64: 0, 1>, limits = array<i64: 8, 12>, strides = array<i64: 2, 3>}> : (tensor<8x12xf32>) -> tensor<4x4xf32>
// GENERIC:        %pad = "lg.pad"(%ln) <{low = array<i64: 0, 1>, high = array<i64: 2, 0>, value = -1.000000e+02 : f64}> : (tensor<8x4xf32>) -> tensor<10x5xf32>
// GENERIC:        %cs = "lg.cumsum"(%ln) <{axis = 1 : i64, reverse}> : (tensor<8x4xf32>) -> tensor<8x4xf32>
// GENERIC:        %amax = "lg.argmax"(%ln) <{axis = 1 : i64}> : (tensor<8x4xf32>) -> tensor<8xi64>
// GENERIC:        %top = "lg.topk"(%ln) <{k = 2 : i64, axis = 1 : i64}> : (tensor<8x4xf32>) -> tensor<8x2xi64>
// GENERIC:        %order = "lg.topk"(%ln) <{k = 8 : i64, axis = 0 : i64, smallest}> : (tensor<8x4xf32>) -> tensor<8x4xi64>
// GENERIC:        %dropmb = "lg.dropout"(%ln, %seed, %rstep) <{rate = 5.000000e-01 : f64, stream = 4 : i64, micro_batch = array<i64: 2, 1, 4>}> : (tensor<8x4xf32>, tensor<i64>, tensor<i64>) -> tensor<8x4xf32>
// GENERIC:        %cv = "lg.conv2d"(%img, %kern) <{stride = array<i64: 2, 1>, padding = array<i64: 1, 0>, dilation = array<i64: 1, 2>, groups = 2 : i64}> : (tensor<2x4x4x4xf32>, tensor<4x2x2x2xf32>) -> tensor<2x4x3x2xf32>
// GENERIC:        %mp = "lg.max_pool2d"(%img) <{kernel = array<i64: 3, 2>, stride = array<i64: 2, 2>, padding = array<i64: 1, 1>}> : (tensor<2x4x4x4xf32>) -> tensor<2x4x2x3xf32>
// GENERIC:        %oh = "lg.one_hot"(%labels) <{classes = 4 : i64}> : (tensor<8xi64>) -> tensor<8x4xf32>
// GENERIC-NEXT:   %ohi = "lg.one_hot"(%labels) <{classes = 4 : i64, ignore_index = -100 : i64}> : (tensor<8xi64>) -> tensor<8x4xf32>
// GENERIC-NEXT:   %eg = "lg.embedding_grad"(%em, %ids) <{rows = 16 : i64}> : (tensor<2x3x4xf32>, tensor<2x3xi32>) -> tensor<16x4xf32>
// GENERIC:        %ga = "lg.gather"(%em, %gidx3) <{axis = 2 : i64}> : (tensor<2x3x4xf32>, tensor<2x3x1xi64>) -> tensor<2x3x1xf32>
// GENERIC-NEXT:   %sa = "lg.scatter_add"(%ga, %gidx3) <{axis = 2 : i64, size = 4 : i64}> : (tensor<2x3x1xf32>, tensor<2x3x1xi64>) -> tensor<2x3x4xf32>
// GENERIC:   %emp = "lg.embedding"(%w, %ids) <{padding_idx = 0 : i64}> : (tensor<16x4xf32>, tensor<2x3xi32>) -> tensor<2x3x4xf32>
// GENERIC-NEXT:   %egp = "lg.embedding_grad"(%em, %ids) <{rows = 16 : i64, padding_idx = 0 : i64}> : (tensor<2x3x4xf32>, tensor<2x3xi32>) -> tensor<16x4xf32>
// GENERIC:        %mask = "lg.cast"(%ids) : (tensor<2x3xi32>) -> tensor<2x3xi1>
// GENERIC-NEXT:   %both = "lg.logical"(%mask, %mask) <{kind = "and"}> : (tensor<2x3xi1>, tensor<2x3xi1>) -> tensor<2x3xi1>
// GENERIC-NEXT:   %picked = "lg.select"(%both, %ids, %ids) : (tensor<2x3xi1>, tensor<2x3xi32>, tensor<2x3xi32>) -> tensor<2x3xi32>
// GENERIC-NEXT:   %less = "lg.compare"(%ids, %ids) <{kind = "lt"}> : (tensor<2x3xi32>, tensor<2x3xi32>) -> tensor<2x3xi1>
// GENERIC:        %sumexp = "lg.sum_exp"(%ln, %rowmax) : (tensor<8x4xf32>, tensor<8xf32>) -> tensor<8xf32>
// GENERIC-NEXT:   %tce = "lg.token_cross_entropy"(%ln, %labels, %rowmax, %sumexp) <{ignore_index = -100 : i64}> : (tensor<8x4xf32>, tensor<8xi64>, tensor<8xf32>, tensor<8xf32>) -> tensor<8xf32>
// GENERIC-NEXT:   %tceg = "lg.token_cross_entropy_grad"(%ln, %labels, %rowmax, %sumexp, %tce) : (tensor<8x4xf32>, tensor<8xi64>, tensor<8xf32>, tensor<8xf32>, tensor<8xf32>) -> tensor<8x4xf32>
// GENERIC:        "lg.output"(%ce, %mse, %em) <{names = ["loss", "mse", "emb"]}> : (tensor<f32>, tensor<f32>, tensor<2x3x4xf32>) -> ()

// -----

// A graph with no placement and no outputs, and a second graph in one module.
lg.graph @empty {
  lg.output []
}
lg.graph @id {
  %x = lg.input "x" : tensor<f64>
  lg.output ["x"] %x : tensor<f64>
}

// CHECK:      lg.graph @empty {
// CHECK-NEXT:   lg.output []
// CHECK-NEXT: }
// CHECK-NEXT: lg.graph @id {
// CHECK-NEXT:   %x = lg.input "x" : tensor<f64>
// CHECK-NEXT:   lg.output ["x"] %x : tensor<f64>
// CHECK-NEXT: }

// -----

// After SBP inference lg ops carry dtensors and record their signature.
sbp.placement @m2 cpu ranks [0, 1, 2, 3] mesh [2, 2]
lg.graph @distributed on @m2 {
  %x = lg.input "x" : !sbp.dtensor<8x16xf32, @m2, [S<0>, B]>
  %w = lg.param "w" init #lg.zeros : !sbp.dtensor<16x4xf32, @m2, [B, S<1>]>
  %y = lg.matmul %x, %w {sbp.signature = #sbp.sig<([S<0>, B], [B, S<1>]) -> ([S<0>, S<1>])>} : (!sbp.dtensor<8x16xf32, @m2, [S<0>, B]>, !sbp.dtensor<16x4xf32, @m2, [B, S<1>]>) -> !sbp.dtensor<8x4xf32, @m2, [S<0>, S<1>]>
  %r = lg.relu %y : !sbp.dtensor<8x4xf32, @m2, [S<0>, S<1>]>
  %c = lg.constant dense<2.0> : tensor<4xf32> -> !sbp.dtensor<4xf32, @m2, [B, B]>
  lg.output ["r"] %r : !sbp.dtensor<8x4xf32, @m2, [S<0>, S<1>]>
}

// CHECK:      %x = lg.input "x" : !sbp.dtensor<8x16xf32, @m2, [S<0>, B]>
// CHECK-NEXT: %w = lg.param "w" init #lg.zeros : !sbp.dtensor<16x4xf32, @m2, [B, S<1>]>
// CHECK-NEXT: %y = lg.matmul %x, %w {sbp.signature = #sbp.sig<([S<0>, B], [B, S<1>]) -> ([S<0>, S<1>])>} : (!sbp.dtensor<8x16xf32, @m2, [S<0>, B]>, !sbp.dtensor<16x4xf32, @m2, [B, S<1>]>) -> !sbp.dtensor<8x4xf32, @m2, [S<0>, S<1>]>
// CHECK-NEXT: %r = lg.relu %y : !sbp.dtensor<8x4xf32, @m2, [S<0>, S<1>]>
// CHECK-NEXT: %c = lg.constant dense<2.000000e+00> : tensor<4xf32> -> !sbp.dtensor<4xf32, @m2, [B, B]>
