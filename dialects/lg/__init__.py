"""The `lg` dialect: the logical graph, one device's view of a model.

Values are global tensors: builtin `tensor<...>` before SBP inference, and
`!sbp.dtensor<...>` (same global shape, plus a placement and an nd-SBP) after
it. Every op checks its operands and result against one shape-and-dtype rule,
written as plain Python (`rule`) so that the verifier, the IR builders and
later passes share it.

    lg.graph @mlp on @mesh {
      %x = lg.input "x" : tensor<8x16xf32>
      %w = lg.param "w" init #lg.normal<0.0, 0.02> seed 1 : tensor<16x4xf32>
      %y = lg.matmul %x, %w : (tensor<8x16xf32>, tensor<16x4xf32>) -> tensor<8x4xf32>
      lg.output ["y"] %y : tensor<8x4xf32>
    }

Axes are non-negative in the IR (builders normalize Python-style negatives).

One module per op family; each op holds its IRDL definition, shape rule
(`rule`), SBP rule (`sbp_rule`), arithmetic (`flops`) and gradient:

    base         LgOp, the traits, element types, the shared rule helpers and the verifier's caches
    graph        lg.graph and lg.output, the sources (input, param, constant) and their initializers
    elementwise  unary and binary arithmetic with numpy broadcasting
    shape        reshape, broadcast_to, transpose, concat, slice, pad
    reduce       reductions over axes, argmax, topk, cumsum
    linalg       matmul
    norm         softmax, log_softmax, layernorm and its input gradient
    random       dropout
    conv         2-D convolution, max pooling and their gradients
    index        embedding, one_hot, gather, scatter_add and their gradients
    loss         cross entropy, MSE, the row statistics of a split vocabulary
    mask         cast, logical and comparison ops, select

Every public name is re-exported here: `lg.MatmulOp`, `lg.LG`.
"""

from __future__ import annotations

from xdsl.ir import Dialect, Operation

from .base import (
    FLOAT_TYPES,
    GEMM_RATE_KINDS,
    KERNEL_KINDS,
    MAX_ELEMENTS,
    Elementwise,
    GradientEmitter,
    LgOp,
    SameBytes,
    SbpRules,
    Shape,
    ShapeError,
    Signature,
    aligned_splits,
    broadcast_shapes,
    check_axis,
    fmt_type,
    is_bool,
    is_elementwise,
    is_float,
    is_index,
    may_run_in_place,
    passthrough_signatures,
    require_float,
    require_value_type,
    same_element_type,
    source_signatures,
    split_ok,
    verify_distributions,
)
from .conv import Conv2dGradInputOp, Conv2dGradWeightOp, Conv2dOp, MaxPool2dGradOp, MaxPool2dOp
from .elementwise import (
    AddOp,
    AtanOp,
    BinaryOp,
    CeilOp,
    CosOp,
    DivOp,
    ErfOp,
    ExpOp,
    FloorDivOp,
    FloorOp,
    GeluOp,
    LogOp,
    MulOp,
    NegOp,
    ReluOp,
    RoundOp,
    RsqrtOp,
    SinOp,
    SqrtOp,
    StepOp,
    StopGradientOp,
    SubOp,
    TanhOp,
    TruncOp,
    UnaryOp,
)
from .graph import (
    ConstantOp,
    FillInitAttr,
    GraphOp,
    InitializerAttr,
    InputOp,
    NormalInitAttr,
    OnesInitAttr,
    OutputOp,
    ParamOp,
    UniformInitAttr,
    ZerosInitAttr,
    ancestors,
    graphs,
    op_flops,
)
from .index import EmbeddingGradOp, EmbeddingOp, GatherOp, OneHotOp, ScatterAddOp, ScatterOp
from .linalg import GroupedMatmulGradWeightOp, GroupedMatmulOp, MatmulOp
from .loss import CrossEntropyOp, MseLossOp, SumExpOp, TokenCrossEntropyGradOp, TokenCrossEntropyOp
from .mask import COMPARE_KINDS, LOGICAL_KINDS, CastOp, CompareOp, LogicalOp, SelectOp
from .norm import (
    AxisOp,
    LayerNormGradOp,
    LayerNormOp,
    LogSoftmaxOp,
    Recognized,
    SoftmaxOp,
    input_gradient_of,
    normalization_of,
)
from .random import DROPOUT_BITS, DropoutOp, UniformOp, dropout_threshold
from .reduce import ArgmaxOp, CumsumOp, ReduceMaxOp, ReduceMeanOp, ReduceOp, ReduceSumOp, TopkOp
from .shape import BroadcastToOp, ConcatOp, PadOp, ReshapeOp, SliceOp, ToShapeOp, TransposeOp

UNARY_OPS = (NegOp, ReluOp, GeluOp, TanhOp, ErfOp, ExpOp, SqrtOp, RsqrtOp, LogOp, SinOp, CosOp, AtanOp, FloorOp,
             CeilOp, RoundOp, TruncOp)


BINARY_OPS = (AddOp, SubOp, MulOp, DivOp)


REDUCE_OPS = (ReduceSumOp, ReduceMeanOp, ReduceMaxOp)


GRADIENT_OPS = (StepOp, OneHotOp, EmbeddingGradOp, TokenCrossEntropyGradOp, ScatterAddOp, Conv2dGradInputOp,
                Conv2dGradWeightOp, MaxPool2dGradOp, GroupedMatmulGradWeightOp, LayerNormGradOp)


MASK_OPS = (CastOp, LogicalOp, CompareOp, SelectOp)


CROSS_ENTROPY_OPS = (SumExpOp, TokenCrossEntropyOp)


LG = Dialect(
    "lg",
    [
        GraphOp,
        OutputOp,
        InputOp,
        ParamOp,
        ConstantOp,
        *UNARY_OPS,
        *BINARY_OPS,
        FloorDivOp,
        StopGradientOp,
        MatmulOp,
        GroupedMatmulOp,
        Conv2dOp,
        MaxPool2dOp,
        SoftmaxOp,
        LogSoftmaxOp,
        LayerNormOp,
        *REDUCE_OPS,
        ArgmaxOp,
        TopkOp,
        ReshapeOp,
        BroadcastToOp,
        TransposeOp,
        ConcatOp,
        SliceOp,
        PadOp,
        CumsumOp,
        DropoutOp,
        UniformOp,
        EmbeddingOp,
        GatherOp,
        ScatterOp,
        CrossEntropyOp,
        *CROSS_ENTROPY_OPS,
        MseLossOp,
        *GRADIENT_OPS,
        *MASK_OPS,
    ],
    [ZerosInitAttr, OnesInitAttr, FillInitAttr, NormalInitAttr, UniformInitAttr],
)


COMPUTE_OPS: tuple[type[LgOp], ...] = tuple(op for op in LG.operations if issubclass(op, LgOp))
"""The ops that are kernels: every backend implements each of them."""


_BY_NAME: dict[str, type[Operation]] = {op.name: op for op in LG.operations}


def op_class(name: str) -> type[Operation]:
    """The lg op class named `name` (a plan's compute actors name their kernel)."""
    found = _BY_NAME.get(name)
    if found is None:
        raise KeyError(f"no lg op named '{name}'")
    return found
