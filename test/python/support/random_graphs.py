"""Random well-typed lg graphs for property tests, built through the op
constructors (so they are well typed by construction), and the same graphs
with random SBP hints (`hinted_graphs`, for sbp-infer and the passes after it)."""

import math
from io import StringIO

import numpy as np
from hypothesis import strategies as st
from xdsl.printer import Printer

from sbpc.dialects import lg
from sbpc.dialects.sbp import AnnotateOp, DTensorType, PlacementOp, global_shape, nd_from_plain
from sbpc.graph_builder import GraphBuilder

FLOAT_DIMS = st.integers(1, 4)


def _shape(draw, rank_min=1, rank_max=3):
    return tuple(draw(st.lists(FLOAT_DIMS, min_size=rank_min, max_size=rank_max)))


@st.composite
def random_graphs(draw, meshes=((2,),)):
    """A random graph built through the op constructors: every op gets
    operands its rule accepts, so the graph is well typed by construction."""
    b = GraphBuilder("random", placement="mesh")
    counter = iter(range(10**6))

    def fresh(prefix):
        return f"{prefix}{next(counter)}"

    feeds: dict[str, np.ndarray] = {}
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))

    def new_input(shape, dtype="f32", high=None):
        key = fresh("x")
        if dtype == "f32":
            feeds[key] = rng.normal(size=shape).astype(np.float32)
        else:
            feeds[key] = rng.integers(0, high, size=shape).astype(np.int64)
        return b.input(key, shape, dtype)

    def new_param(shape):
        init = draw(
            st.sampled_from(
                [lg.ZerosInitAttr(), lg.OnesInitAttr(), lg.FillInitAttr(0.5), lg.NormalInitAttr(0.0, 1.0),
                 lg.UniformInitAttr(-1.0, 1.0)]
            )
        )
        return b.param(fresh("w"), shape, init, seed=draw(st.integers(0, 3)))

    values = [new_input(_shape(draw)) for _ in range(draw(st.integers(1, 2)))]

    def pick(pred=lambda s: True):
        candidates = [v for v in values if pred(global_shape(v.type))]
        return draw(st.sampled_from(candidates)) if candidates else None

    for _ in range(draw(st.integers(1, 12))):
        kind = draw(
            st.sampled_from(
                ["unary", "binary", "matmul", "softmax", "layernorm", "reduce", "reshape", "transpose",
                 "broadcast", "concat", "slice", "pad", "cumsum", "gather", "conv", "embedding", "cross_entropy",
                 "token_cross_entropy", "mse", "constant", "dropout"]
            )
        )
        x = pick(lambda s: len(s) >= 1)
        if x is None:
            continue
        shape = global_shape(x.type)
        rank = len(shape)
        if kind == "unary":
            op = draw(st.sampled_from(lg.UNARY_OPS))(x)
        elif kind == "binary":
            # the other operand: a suffix of x's shape, with some dims set to 1
            suffix = shape[draw(st.integers(0, rank)) :]
            other_shape = tuple(1 if draw(st.booleans()) else d for d in suffix)
            op_cls = draw(st.sampled_from(lg.BINARY_OPS))
            if op_cls is lg.DivOp:
                # Divide by a value bounded away from zero: x / 0 is +-inf
                # globally but NaN (0/0) or the other infinity (-0.0) on a
                # device holding a zero summand, which is IEEE, not SBP.
                init = draw(st.sampled_from([lg.OnesInitAttr(), lg.FillInitAttr(0.5), lg.UniformInitAttr(1.0, 2.0)]))
                op = op_cls(x, b.param(fresh("w"), other_shape, init))
            else:
                other = new_param(other_shape) if draw(st.booleans()) else new_input(other_shape)
                lhs, rhs = (x, other) if draw(st.booleans()) else (other, x)
                op = op_cls(lhs, rhs)
        elif kind == "matmul":
            x = pick(lambda s: len(s) >= 2)
            if x is None:
                continue
            shape = global_shape(x.type)
            n = draw(FLOAT_DIMS)
            transpose_rhs = draw(st.booleans())
            w = new_param((n, shape[-1]) if transpose_rhs else (shape[-1], n))
            op = lg.MatmulOp(x, w, transpose_rhs=transpose_rhs)
        elif kind == "softmax":
            op = draw(st.sampled_from([lg.SoftmaxOp, lg.LogSoftmaxOp]))(x, draw(st.integers(0, rank - 1)))
        elif kind == "layernorm":
            axis = draw(st.integers(0, rank - 1))
            form = draw(st.sampled_from(["affine", "plain", "grad"]))
            if form == "affine":
                op = lg.LayerNormOp(x, axis, 1e-5, new_param(shape[axis:]), new_param(shape[axis:]))
            elif form == "plain":
                op = lg.LayerNormOp(x, axis)
            else:  # its input's gradient (linear in the gradient: a partial one gives a partial result)
                op = lg.LayerNormGradOp(x, new_input(shape), axis, 1e-5)
        elif kind == "reduce":
            axes = draw(st.lists(st.integers(0, rank - 1), min_size=1, unique=True))
            op = draw(st.sampled_from(lg.REDUCE_OPS))(x, axes, draw(st.booleans()))
        elif kind == "reshape":
            target = (math.prod(shape),) if draw(st.booleans()) else (*shape, 1)
            op = lg.ReshapeOp(x, target)
        elif kind == "transpose":
            op = lg.TransposeOp(x, draw(st.permutations(range(rank))))
        elif kind == "broadcast":
            op = lg.BroadcastToOp(x, (draw(FLOAT_DIMS), *shape))
        elif kind == "concat":
            op = lg.ConcatOp([x, x], draw(st.integers(0, rank - 1)))
        elif kind == "slice":
            starts = [draw(st.integers(0, d - 1)) for d in shape]
            limits = [draw(st.integers(s + 1, d)) for s, d in zip(starts, shape)]
            strides = [draw(st.integers(1, 2)) for _ in shape]
            op = lg.SliceOp(x, starts, limits, strides)
        elif kind == "pad":
            low = [draw(st.integers(0, 2)) for _ in shape]
            high = [draw(st.integers(0, 2)) for _ in shape]
            op = lg.PadOp(x, low, high, draw(st.sampled_from([0.0, -1.5])))
        elif kind == "cumsum":
            op = lg.CumsumOp(x, draw(st.integers(0, rank - 1)), draw(st.booleans()))
        elif kind == "dropout":
            # seed and step fed as scalars (a graph's rng.seed and rng.step state);
            # sometimes the copy of micro-batch k of 2 of a batch of one row per example
            seed, step = new_input((), "i64", 2**40), new_input((), "i64", 2**20)
            micro = (2, draw(st.integers(0, 1)), 1) if draw(st.booleans()) else None
            op = lg.DropoutOp(x, seed, step, draw(st.sampled_from([0.0, 0.1, 0.5])), draw(st.integers(0, 9)), micro)
        elif kind == "gather":
            # indices shaped as x but on the gathered axis; the gradient's
            # scatter-add into zeros of x's shape
            axis = draw(st.integers(0, rank - 1))
            picks = draw(FLOAT_DIMS)
            indices = new_input(tuple(picks if i == axis else d for i, d in enumerate(shape)), "i64", shape[axis])
            if draw(st.booleans()):
                op = lg.GatherOp(x, indices, axis)
            else:
                updates = new_input(global_shape(indices.type))
                op = lg.ScatterAddOp(updates, indices, axis, shape[axis] + draw(st.integers(0, 1)))
        elif kind == "conv":
            # a convolution of fresh images (N, C, H, W), or one of its gradients
            groups = draw(st.sampled_from([1, 1, 2]))
            n, c, o = draw(FLOAT_DIMS), groups * draw(st.integers(1, 2)), groups * draw(st.integers(1, 2))
            h, w = draw(st.integers(2, 5)), draw(st.integers(2, 5))
            kernel = (draw(st.integers(1, h)), draw(st.integers(1, w)))
            conv = {"stride": (draw(st.integers(1, 2)), draw(st.integers(1, 2))),
                    "padding": (draw(st.integers(0, 1)), draw(st.integers(0, 1))), "dilation": (1, 1),
                    "groups": groups}
            image, weight = new_input((n, c, h, w)), new_param((o, c // groups, *kernel))
            out = global_shape(lg.Conv2dOp(image, weight, **conv).result.type)
            which = draw(st.sampled_from(["forward", "input", "weight", "pool", "pool grad"]))
            window = {"kernel": kernel, "stride": conv["stride"],
                      "padding": tuple(min(q, k // 2) for q, k in zip(conv["padding"], kernel))}
            if which == "pool":
                op = lg.MaxPool2dOp(image, **window)
            elif which == "pool grad":
                pooled = global_shape(lg.MaxPool2dOp(image, **window).result.type)
                op = lg.MaxPool2dGradOp(image, new_input(pooled), **window)
            elif which == "forward":
                op = lg.Conv2dOp(image, weight, **conv)
            elif which == "input":
                op = lg.Conv2dGradInputOp(new_input(out), weight, (h, w), **conv)
            else:
                op = lg.Conv2dGradWeightOp(image, new_input(out), kernel, **conv)
        elif kind == "embedding":
            vocab, dim = draw(FLOAT_DIMS), draw(FLOAT_DIMS)
            op = lg.EmbeddingOp(new_param((vocab, dim)), new_input(_shape(draw, 1, 2), "i64", vocab))
        elif kind == "cross_entropy":
            labels = new_input(shape[:-1], "i64", shape[-1])
            op = lg.CrossEntropyOp(x, labels)
        elif kind == "token_cross_entropy":
            # the row statistics are ops of the graph too (a partial max and a
            # partial sum when the class axis splits)
            labels = new_input(shape[:-1], "i64", shape[-1])
            row_max = b.add(lg.ReduceMaxOp(x, [rank - 1]))
            sum_exp = b.add(lg.SumExpOp(x, row_max))
            values += [row_max, sum_exp]
            ignore = draw(st.sampled_from([None, 0]))
            if draw(st.booleans()):
                op = lg.TokenCrossEntropyOp(x, labels, row_max, sum_exp, ignore)
            else:
                op = lg.TokenCrossEntropyGradOp(x, labels, row_max, sum_exp, new_input(shape[:-1]), ignore)
        elif kind == "mse":
            op = lg.MseLossOp(x, new_input(shape))
        else:
            from xdsl.dialects.builtin import DenseIntOrFPElementsAttr, TensorType, f32

            data = rng.normal(size=shape).astype(np.float32)
            value = DenseIntOrFPElementsAttr.from_list(TensorType(f32, shape), data.ravel().tolist())
            op = lg.ConstantOp(value)
        values.append(b.add(op))
    outputs = {f"out{i}": v for i, v in enumerate(values[-draw(st.integers(1, min(3, len(values)))) :])}
    mesh = draw(st.sampled_from(meshes))
    module = b.module(outputs, PlacementOp("mesh", "cpu", list(range(math.prod(mesh))), mesh))
    return Case(module, feeds)


class Case:
    """A drawn graph and its feeds; shows as IR text when a test fails."""

    def __init__(self, module, feeds):
        self.module, self.feeds = module, feeds

    def __repr__(self) -> str:
        return text(self.module)


def text(module, generic=False) -> str:
    stream = StringIO()
    Printer(stream=stream, print_generic_format=generic).print_op(module)
    return stream.getvalue()


# -- with SBP hints -------------------------------------------------------------------

MESHES = ((2,), (3,), (4,), (2, 2))
"""The meshes `hinted_graphs` draws from unless told."""

SOURCES = (lg.InputOp, lg.ParamOp, lg.ConstantOp)

# Ops whose operand and result share one type: a hint on their operand would
# also constrain their result, so hints go only to the others' operands.
SAME_TYPE_OPS = (*lg.UNARY_OPS, lg.SoftmaxOp, lg.LogSoftmaxOp, lg.LayerNormOp)


@st.composite
def hinted_graphs(draw, meshes=MESHES):
    """A random graph where some operands are replaced by `sbp.annotate`
    hints with random distributions on the graph's mesh."""
    case = draw(random_graphs(meshes=meshes))
    graph = case.module.ops.last
    mesh = case.module.ops.first.mesh().shape
    hints: dict = {}
    for op in list(graph.body.ops):
        if isinstance(op, (lg.OutputOp, *SOURCES, *SAME_TYPE_OPS)):
            continue
        for j, value in enumerate(op.operands):
            if draw(st.integers(0, 3)) != 0:
                continue
            if value not in hints:
                rank = len(value.type.get_shape())
                # partial sums of integer labels or indices mean nothing
                partial = [] if lg.is_index(value.type.element_type) else ["P"]
                choices = ["B", *partial, *(f"S{i}" for i in range(rank))]
                nd = tuple(draw(st.sampled_from(choices)) for _ in mesh)
                hint = AnnotateOp(
                    value, DTensorType(value.type.get_shape(), value.type.element_type, "mesh", nd_from_plain(nd))
                )
                value.owner.parent_block().insert_op_after(hint, value.owner)
                hints[value] = hint
            operands = list(op.operands)
            operands[j] = hints[value].result
            op.operands = operands
    case.module.verify()
    return case
