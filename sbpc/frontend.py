"""The graph-building frontend: write a model in Python, get `lg` IR.

    import sbpc
    from sbpc import S, B

    mesh = sbpc.placement("cpu", ranks=2)
    g = sbpc.Graph("mlp", placement=mesh)
    x = g.input("x", (32, 64), sbp=S(0))
    labels = g.input("labels", (32,), dtype="i64")
    w = g.param("w", (64, 10), init=sbpc.normal(0.0, 0.1))
    loss = sbpc.cross_entropy(x @ w, labels)
    g.output(loss=loss)
    module = g.module()

Ops are functions (`sbpc.relu(x)`) and operators (`x @ w`, `x + y`, `2 * x`);
`sbp=` on an input or parameter, or `t.to(S(0), B)` on any tensor, is a hint
that SBP inference keeps. `with g.on(stage):` places the ops built inside
on another placement (pipeline stages). Result types are inferred by each op's own shape
rule, so a graph that builds is a graph that verifies.
"""

from __future__ import annotations

import contextlib
import typing
from collections.abc import Sequence
from typing import Any

import numpy as np
from xdsl.dialects.builtin import AnyFloat, DenseIntOrFPElementsAttr, IntegerType, ModuleOp, SymbolRefAttr, TensorType
from xdsl.ir import Operation, SSAValue

from sbpc.arguments import GraphValue, checked
from sbpc.dialects import lg, sbp
from sbpc.dialects.sbp import PLACEMENT_ATTR, DTensorType, PlacementOp, element_type, global_shape
from sbpc.graph_builder import GraphBuilder, check_shape, element, tensor_type

if typing.TYPE_CHECKING:
    from sbpc.runtime.checkpoint import Weights


@checked
def S(axis: int) -> sbp.SplitAttr:
    """Split along tensor axis `axis`."""
    return sbp.SplitAttr(axis)


B = sbp.BroadcastAttr()
"""Broadcast: every device holds the whole tensor."""

P = sbp.PartialAttr()
"""Partial sum: the tensor is the sum of the devices' pieces."""


class Placement:
    """A device mesh: device kind, ranks, and mesh shape (row-major)."""

    @checked
    def __init__(self, device: str, ranks: int | Sequence[int], mesh: Sequence[int] | None = None,
                 name: str | None = None):
        self.device = device
        self.ranks = list(range(ranks)) if isinstance(ranks, int | np.integer) else [int(r) for r in ranks]
        self.mesh = tuple(int(m) for m in mesh) if mesh is not None else (len(self.ranks),)
        self.name = name or f"{device}{'x'.join(map(str, self.mesh))}_{'_'.join(map(str, self.ranks))}"
        self.op()  # a mesh that does not hold its ranks is refused here, where it is written

    def op(self) -> PlacementOp:
        op = PlacementOp(self.name, self.device, self.ranks, self.mesh)
        op.verify()
        return op

    @property
    def size(self) -> int:
        return len(self.ranks)


@checked
def placement(device: str, ranks: int | Sequence[int], mesh: Sequence[int] | None = None,
              name: str | None = None) -> Placement:
    return Placement(device, ranks, mesh, name)


def zeros() -> lg.InitializerAttr:
    return lg.ZerosInitAttr()


def ones() -> lg.InitializerAttr:
    return lg.OnesInitAttr()


@checked
def fill(value: float) -> lg.InitializerAttr:
    return lg.FillInitAttr(value)


@checked
def normal(mean: float = 0.0, std: float = 1.0) -> lg.InitializerAttr:
    return lg.NormalInitAttr(mean, std)


@checked
def uniform(low: float = -1.0, high: float = 1.0) -> lg.InitializerAttr:
    return lg.UniformInitAttr(low, high)


def _nd(sbps) -> list[sbp.SbpAttr]:
    nd = list(sbps) if isinstance(sbps, list | tuple) else [sbps]
    wrong = [x for x in nd if not isinstance(x, sbp.SbpAttr)]
    if wrong or not nd:
        raise TypeError(f"an sbp hint is sbpc.S(axis), sbpc.B or sbpc.P, or a list of them, got {sbps!r}")
    return nd


class Tensor(GraphValue):
    """A value of a graph under construction."""

    def __init__(self, graph: Graph, value: SSAValue):
        self.graph = graph
        self.value = value

    @property
    def shape(self) -> tuple[int, ...]:
        return global_shape(self.value.type)

    @property
    def dtype(self):
        return element_type(self.value.type)

    def _lift(self, other) -> Tensor:
        if isinstance(other, Tensor):
            return other
        elem = str(self.dtype)
        return self.graph.constant(np.asarray(other, dtype=_numpy_of(self.dtype)), "bf16" if elem == "bf16" else None)

    def __matmul__(self, other):
        return matmul(self, other)

    def __add__(self, other):
        return add(self, self._lift(other))

    def __radd__(self, other):
        return add(self._lift(other), self)

    def __sub__(self, other):
        return sub(self, self._lift(other))

    def __rsub__(self, other):
        return sub(self._lift(other), self)

    def __mul__(self, other):
        return mul(self, self._lift(other))

    def __rmul__(self, other):
        return mul(self._lift(other), self)

    def __truediv__(self, other):
        return div(self, self._lift(other))

    def __rtruediv__(self, other):
        return div(self._lift(other), self)

    def __neg__(self):
        return neg(self)

    def relu(self):
        return relu(self)

    @checked
    def sum(self, axes: int | Sequence[int] | None = None, keepdims: bool = False):
        return reduce_sum(self, axes, keepdims)

    @checked
    def mean(self, axes: int | Sequence[int] | None = None, keepdims: bool = False):
        return reduce_mean(self, axes, keepdims)

    @checked
    def max(self, axes: int | Sequence[int] | None = None, keepdims: bool = False):
        return reduce_max(self, axes, keepdims)

    @checked
    def reshape(self, *shape: int | Sequence[int]):
        sizes = shape[0] if len(shape) == 1 and isinstance(shape[0], tuple | list) else shape
        return reshape(self, typing.cast("Sequence[int]", sizes))

    @checked
    def transpose(self, *perm: int | Sequence[int]):
        order = perm[0] if len(perm) == 1 and isinstance(perm[0], tuple | list) else perm
        return transpose(self, typing.cast("Sequence[int]", order))

    @property
    def T(self):
        return transpose(self, [*range(len(self.shape) - 2), len(self.shape) - 1, len(self.shape) - 2])

    @checked
    def to(self, *sbps: Any, placement: Placement | None = None) -> Tensor:
        """A hint: this value is distributed so (boxing makes it so)."""
        where = placement or self.graph.current_placement
        if where is None:
            raise ValueError("a hint needs a placement: give the graph one or pass placement=")
        self.graph.use(where)
        nd = _nd(sbps[0]) if len(sbps) == 1 else _nd(list(sbps))
        t = DTensorType(self.shape, self.dtype, where.name, nd)
        return self.graph.add(sbp.AnnotateOp(self.value, t))

    def __repr__(self) -> str:
        return f"Tensor({self.value.type})"


def _numpy_of(elem) -> np.dtype:
    from sbpc.dialects.dtypes import numpy_dtype

    return numpy_dtype(elem)


RANDOM_SEED = "rng.seed"
RANDOM_STEP = "rng.step"
"""The parameters holding a graph's random-number state (Graph.random_state)."""


class Graph:
    """Builds one lg.graph."""

    @checked
    def __init__(self, name: str, placement: Placement | None = None):
        self.name = name
        self.placement = placement
        self.placements: dict[str, Placement] = {}
        if placement is not None:
            self.use(placement)
        self.builder = GraphBuilder(name, placement.name if placement else None)
        self.outputs: dict[str, SSAValue] | None = None
        self._scope: Placement | None = None
        self.initial_values: dict[str, np.ndarray] = {}
        """Parameters' starting values, used instead of their initializers
        (`sbpc.from_torch` puts the module's weights here)."""
        self.state_names: dict[str, str] = {}
        """`state_dict()` names and the parameter each stands for (from_torch:
        several names for one tied weight); empty means the parameters' own keys."""
        self.buffers: dict[str, np.ndarray] = {}
        """State that is not trained, returned by `Executable.state_dict()` as
        it came (PyTorch buffers)."""
        self.weights: Weights | None = None
        """Where the ranks read parameters' starting values instead
        (`from_torch(weights=)`: a safetensors checkpoint)."""
        self._random: tuple[Tensor, Tensor] | None = None
        self._streams = 0

    def use(self, where: Placement) -> None:
        self.placements.setdefault(where.name, where)

    @property
    def current_placement(self) -> Placement | None:
        """Where ops built now run: the innermost `with g.on(...)`, else the graph's."""
        return self._scope or self.placement

    @contextlib.contextmanager
    @checked
    def on(self, where: Placement):
        """Places every op built inside on `where` (a pipeline stage): each
        gets an `sbp.placement` attribute, and hints default to `where`.
        Gradient and update ops inherit it from their forward op."""
        self.use(where)
        outer, self._scope = self._scope, where
        try:
            yield where
        finally:
            self._scope = outer

    def add(self, op: Operation) -> Tensor:
        if getattr(self, "_module", None) is not None:
            raise ValueError(f"graph @{self.name} already has its outputs")
        if self._scope is not None:
            op.attributes[PLACEMENT_ATTR] = SymbolRefAttr(self._scope.name)
        return Tensor(self, self.builder.add(op))

    def _typed(self, shape, dtype, sbp_hint) -> TensorType | DTensorType:
        if sbp_hint is None:
            return tensor_type(shape, dtype)
        where = self.current_placement
        if where is None:
            raise ValueError("an sbp hint needs the graph's placement")
        return DTensorType(check_shape(shape), element(dtype), where.name, _nd(sbp_hint))

    @checked
    def input(self, name: str, shape: Sequence[int], dtype: str = "f32", sbp: Any = None) -> Tensor:
        return self.add(lg.InputOp(name, self._typed(shape, dtype, sbp)))

    @checked
    def param(self, name: str, shape: Sequence[int], init: lg.InitializerAttr | None = None, seed: int = 0,
              dtype: str = "f32", sbp: Any = None, state: bool = False) -> Tensor:
        """A trained parameter, or with `state` a tensor the graph updates
        itself: give it an output named `new.<name>`."""
        return self.add(lg.ParamOp(name, self._typed(shape, dtype, sbp), init or lg.ZerosInitAttr(), seed, state))

    @checked
    def constant(self, value: Any, dtype: str | None = None) -> Tensor:
        """A constant tensor of `value`'s numpy type, or of `dtype` (bf16, which numpy lacks)."""
        array = np.asarray(value)
        types = {"float32": "f32", "float64": "f64", "float16": "f16", "bfloat16": "bf16", "int64": "i64",
                 "int32": "i32", "bool": "i1"}
        if not (array.dtype.kind in "biuf" or str(array.dtype) == "bfloat16") or (
                dtype is None and str(array.dtype) not in types):
            raise ValueError(f"a constant of {array.dtype} values: give float, integer or boolean values "
                             f"({', '.join(types)})")
        dtype = dtype or types[str(array.dtype)]
        elem = element(dtype)
        # the values as the attribute holds them: floats, or integers (i1 from 0s and 1s)
        if lg.is_float(elem):
            array = array.astype(np.float64)
        else:
            array = (array != 0 if str(elem) == "i1" else array).astype(np.int64)
        # a float or an integer tensor by the dtype above; from_list's overloads take one or the other
        t = typing.cast("TensorType[AnyFloat] | TensorType[IntegerType]", tensor_type(array.shape, dtype))
        data = array.ravel().tolist() if array.size else []
        return self.add(lg.ConstantOp(DenseIntOrFPElementsAttr.from_list(t, data)))

    def random_state(self) -> tuple[Tensor, Tensor]:
        """The graph's random-number state, made on first use: the i64
        scalars `rng.seed` (`compile(seed=...)` sets it; a checkpoint keeps
        it) and `rng.step`, which every run of the graph advances by one
        through its `new.rng.step` output, so that each step draws new
        numbers (lg.dropout) and a checkpoint resumes the stream. On the
        graph's placement, not a pipeline stage's: every stage reads them."""
        if self._random is None:
            scope, self._scope = self._scope, None
            try:
                self._random = (self.param(RANDOM_SEED, (), dtype="i64", state=True),
                                self.param(RANDOM_STEP, (), dtype="i64", state=True))
            finally:
                self._scope = scope
        return self._random

    def new_stream(self) -> int:
        """A number no other random op of this graph draws with."""
        self._streams += 1
        return self._streams

    def rand(self, shape: Sequence[int], dtype: str = "f32") -> Tensor:
        """Uniform random numbers in [0, 1) of `shape` (PyTorch's `rand`), a
        new draw at every step, the same under every plan (lg.uniform)."""
        seed, step = self.random_state()
        return self.add(lg.UniformOp(seed.value, step.value, list(shape), element(dtype), self.new_stream()))

    @checked
    def output(self, **outputs: Tensor) -> None:
        if any(t.graph is not self for t in outputs.values()):
            raise ValueError(f"graph @{self.name}: an output is a tensor of another graph")
        self.outputs = {name: t.value for name, t in outputs.items()}

    @checked
    def module(self) -> ModuleOp:
        """The graph as a verified module (a fresh copy on every call)."""
        if self.outputs is None:
            raise ValueError(f"graph @{self.name} has no outputs: call output(name=tensor, ...)")
        if getattr(self, "_module", None) is None:
            outputs = dict(self.outputs)
            if self._random is not None and f"new.{RANDOM_STEP}" not in outputs:
                step = self._random[1]
                scope, self._scope = self._scope, None
                outputs[f"new.{RANDOM_STEP}"] = (step + self.constant(np.int64(1))).value
                self._scope = scope
            placements = [p.op() for p in self.placements.values()]
            self._module = ModuleOp([*placements, self.builder.graph(outputs)])
            self._module.verify()
        return self._module.clone()


# -- ops as functions ------------------------------------------------------------


def _unary(cls):
    def fn(x: Tensor) -> Tensor:
        return x.graph.add(cls(x.value))

    fn.__name__ = fn.__qualname__ = cls.name.removeprefix("lg.")
    fn.__doc__ = f"`{cls.name}`"
    return checked(fn)


_UNARY = {c.name.removeprefix("lg."): _unary(c) for c in lg.UNARY_OPS}
# by name, not by position: reordering lg.UNARY_OPS must not swap two functions
neg, relu, gelu, tanh, erf = _UNARY["neg"], _UNARY["relu"], _UNARY["gelu"], _UNARY["tanh"], _UNARY["erf"]
exp, sqrt, rsqrt = _UNARY["exp"], _UNARY["sqrt"], _UNARY["rsqrt"]
log, sin, cos, atan = _UNARY["log"], _UNARY["sin"], _UNARY["cos"], _UNARY["atan"]
# (`round` as torch.round: halves to even; this module does not use the builtin)
floor, ceil, round, trunc = _UNARY["floor"], _UNARY["ceil"], _UNARY["round"], _UNARY["trunc"]
stop_gradient = _unary(lg.StopGradientOp)
"""`lg.stop_gradient`: the value, through which no gradient flows (PyTorch's `detach`)."""


def _binary(cls):
    def fn(a: Tensor, b: Tensor) -> Tensor:
        return a.graph.add(cls(a.value, b.value))

    fn.__name__ = fn.__qualname__ = cls.name.removeprefix("lg.")
    return checked(fn)


_BINARY = {c.name.removeprefix("lg."): _binary(c) for c in lg.BINARY_OPS}
add, sub, mul, div = _BINARY["add"], _BINARY["sub"], _BINARY["mul"], _BINARY["div"]


@checked
def floordiv(a: Tensor, b: Tensor | int) -> Tensor:
    """Integer division rounded down (Python's `//`) of i32 or i64 tensors;
    a zero divisor gives 0."""
    divisor = b if isinstance(b, Tensor) else a.graph.constant(np.asarray(b, dtype=_numpy_of(a.dtype)))
    return a.graph.add(lg.FloorDivOp(a.value, divisor.value))


@checked
def matmul(a: Tensor, b: Tensor, transpose_a: bool = False, transpose_b: bool = False) -> Tensor:
    return a.graph.add(lg.MatmulOp(a.value, b.value, transpose_a, transpose_b))


@checked
def grouped_matmul(x: Tensor, experts: Tensor, ends: Tensor, transpose_experts: bool = False) -> Tensor:
    """Rows of `x` [S, K] grouped by expert, each group times its expert's
    matrix in `experts` [E, K, N] (`transpose_experts`: [E, N, K], each
    transposed): group g is the rows from `ends[g-1]` (0 for the first) to
    `ends[g]`, cumulative counts (i32 or i64) computed at run time, as a
    router's sorted tokens; rows in no group give zeros. PyTorch's
    `_grouped_mm(x, experts, offs=ends)`."""
    return x.graph.add(lg.GroupedMatmulOp(x.value, experts.value, ends.value, transpose_experts))


@checked
def softmax(x: Tensor, axis: int = -1) -> Tensor:
    return x.graph.add(lg.SoftmaxOp(x.value, axis))


@checked
def log_softmax(x: Tensor, axis: int = -1) -> Tensor:
    return x.graph.add(lg.LogSoftmaxOp(x.value, axis))


@checked
def layernorm(x: Tensor, weight: Tensor | None = None, bias: Tensor | None = None, axis: int = -1,
              eps: float = 1e-5) -> Tensor:
    w = weight.value if weight else None
    b = bias.value if bias else None
    return x.graph.add(lg.LayerNormOp(x.value, axis, eps, w, b))


def _axes(x: Tensor, axes: int | Sequence[int] | None) -> list[int]:
    if axes is None:
        return list(range(len(x.shape)))
    return [axes] if isinstance(axes, int) else list(axes)


@checked
def conv2d(x: Tensor, weight: Tensor, stride: int | Sequence[int] = 1, padding: int | Sequence[int] = 0,
           dilation: int | Sequence[int] = 1, groups: int = 1) -> Tensor:
    """2-D convolution of NCHW images by (O, C/groups, kh, kw) weights, as
    PyTorch's `conv2d` without bias; stride, padding and dilation are ints
    or (height, width) pairs."""
    return x.graph.add(lg.Conv2dOp(x.value, weight.value, _pair(stride), _pair(padding), _pair(dilation), groups))


def _pair(v: int | Sequence[int]) -> tuple[int, int]:
    """An image op's (height, width) option from an int or a pair."""
    if not isinstance(v, int | np.integer) and len(v) != 2:
        raise ValueError(f"a kernel, stride, padding or dilation is an int or a (height, width) pair, got {v!r}")
    return (int(v), int(v)) if isinstance(v, int | np.integer) else (int(v[0]), int(v[1]))


@checked
def max_pool2d(x: Tensor, kernel: int | Sequence[int], stride: int | Sequence[int] | None = None,
               padding: int | Sequence[int] = 0) -> Tensor:
    """Max pooling of NCHW images, as PyTorch's `max_pool2d` (the stride
    defaults to the kernel); kernel, stride and padding are ints or
    (height, width) pairs. The gradient goes to each window's first maximum."""
    return x.graph.add(lg.MaxPool2dOp(x.value, _pair(kernel), _pair(kernel if stride is None else stride),
                                      _pair(padding)))


@checked
def reduce_sum(x: Tensor, axes: int | Sequence[int] | None = None, keepdims: bool = False) -> Tensor:
    return x.graph.add(lg.ReduceSumOp(x.value, _axes(x, axes), keepdims))


@checked
def reduce_mean(x: Tensor, axes: int | Sequence[int] | None = None, keepdims: bool = False) -> Tensor:
    return x.graph.add(lg.ReduceMeanOp(x.value, _axes(x, axes), keepdims))


@checked
def reduce_max(x: Tensor, axes: int | Sequence[int] | None = None, keepdims: bool = False) -> Tensor:
    return x.graph.add(lg.ReduceMaxOp(x.value, _axes(x, axes), keepdims))


@checked
def argmax(x: Tensor, axis: int = -1) -> Tensor:
    """The index (i64) of the largest element along `axis` (the first of
    equals, or the first NaN), that axis dropped: PyTorch's `argmax(dim)`."""
    if not -len(x.shape) <= axis < len(x.shape):
        raise ValueError(f"axis {axis} is out of range for a tensor of rank {len(x.shape)}")
    return x.graph.add(lg.ArgmaxOp(x.value, axis % len(x.shape)))


@checked
def topk(x: Tensor, k: int, axis: int = -1, largest: bool = True) -> tuple[Tensor, Tensor]:
    """(values, indices) of the `k` largest (`largest=False`: smallest)
    elements along `axis`, the largest (smallest) first, NaN above every
    number, the lower index first among equals: PyTorch's `topk` (whose
    order of equals PyTorch leaves unspecified) and, with k the whole axis,
    its stable `sort`. The values are gathered at the indices, so their
    gradient reaches the elements picked; the indices (i64) carry none."""
    if not -len(x.shape) <= axis < len(x.shape):
        raise ValueError(f"axis {axis} is out of range for a tensor of rank {len(x.shape)}")
    axis %= len(x.shape)
    if not 0 <= k <= x.shape[axis]:
        raise ValueError(f"k {k} is not between 0 and the size {x.shape[axis]} of axis {axis}")
    indices = x.graph.add(lg.TopkOp(x.value, k, axis, smallest=not largest))
    return gather(x, indices, axis), indices


@checked
def reshape(x: Tensor, shape: Sequence[int]) -> Tensor:
    shape = list(shape)
    if shape.count(-1) > 1:
        raise ValueError(f"at most one size may be -1 (inferred), got {shape}")
    if -1 in shape:
        known = int(np.prod([d for d in shape if d != -1]))
        total = int(np.prod(x.shape))
        if known == 0 or total % known:
            raise ValueError(f"cannot reshape {list(x.shape)} to {shape}: no size for -1 makes {total} elements")
        shape[shape.index(-1)] = total // known
    return x.graph.add(lg.ReshapeOp(x.value, shape))


@checked
def transpose(x: Tensor, perm: Sequence[int]) -> Tensor:
    return x.graph.add(lg.TransposeOp(x.value, list(perm)))


@checked
def broadcast_to(x: Tensor, shape: Sequence[int]) -> Tensor:
    return x.graph.add(lg.BroadcastToOp(x.value, shape))


@checked
def cast(x: Tensor, dtype: str) -> Tensor:
    """`x` converted elementwise to `dtype` ("f32", "i64", "i1", ...): to
    "i1" is `!= 0`, float to integer truncates toward zero."""
    return x.graph.add(lg.CastOp(x.value, element(dtype)))


@checked
def logical(kind: str, a: Tensor, b: Tensor) -> Tensor:
    """Elementwise "and", "or" or "xor" of two i1 tensors (broadcast)."""
    return a.graph.add(lg.LogicalOp(kind, a.value, b.value))


@checked
def compare(kind: str, a: Tensor, b: Tensor) -> Tensor:
    """Elementwise "eq", "ne", "lt", "le", "gt" or "ge" of two tensors of one
    dtype (broadcast): an i1 tensor."""
    return a.graph.add(lg.CompareOp(kind, a.value, b.value))


@checked
def where(condition: Tensor, if_true: Tensor, if_false: Tensor) -> Tensor:
    """`if_true` where the i1 `condition` holds, `if_false` elsewhere (broadcast)."""
    return condition.graph.add(lg.SelectOp(condition.value, if_true.value, if_false.value))


@checked
def concat(xs: Sequence[Tensor], axis: int = 0) -> Tensor:
    if not xs:
        raise ValueError("concat needs at least one tensor")
    return xs[0].graph.add(lg.ConcatOp([x.value for x in xs], axis))


@checked
def slice(x: Tensor, starts: Sequence[int], limits: Sequence[int], strides: Sequence[int] | None = None) -> Tensor:  # noqa: A001
    return x.graph.add(lg.SliceOp(x.value, starts, limits, strides))


@checked
def pad(x: Tensor, low: Sequence[int], high: Sequence[int], value: float = 0.0) -> Tensor:
    """`x` with `low[i]` elements of `value` before axis i and `high[i]` after it."""
    return x.graph.add(lg.PadOp(x.value, low, high, value))


@checked
def dropout(x: Tensor, p: float = 0.5, training: bool = True) -> Tensor:
    """PyTorch's `dropout`: each element zeroed with probability `p`, the
    others scaled by 1 / (1 - p) (the identity when not `training` or p is
    0). The mask is a function of the graph's seed and step, this op and
    the element's place in the whole tensor (lg.dropout): every plan, and
    the reference interpreter, draws the same one."""
    if not 0.0 <= p < 1.0:
        raise ValueError(f"dropout probability must be in [0, 1), got {p}")
    if not training or p == 0.0:
        return x
    seed, step = x.graph.random_state()
    return x.graph.add(lg.DropoutOp(x.value, seed.value, step.value, p, x.graph.new_stream()))


@checked
def cumsum(x: Tensor, axis: int, reverse: bool = False) -> Tensor:
    """Running sums along `axis` (from the end with `reverse`)."""
    return x.graph.add(lg.CumsumOp(x.value, axis, reverse))


@checked
def gather(x: Tensor, indices: Tensor, axis: int) -> Tensor:
    """Elements of `x` picked along `axis` by integer `indices` (PyTorch's
    `gather`): the indices have `x`'s shape but on `axis`."""
    return x.graph.add(lg.GatherOp(x.value, indices.value, axis))


@checked
def scatter_add(updates: Tensor, indices: Tensor, axis: int, size: int) -> Tensor:
    """Zeros of `size` along `axis` with each update added where its index
    points (PyTorch's `scatter_add` into zeros): the indices have the
    updates' shape, the result has it but on `axis`."""
    return updates.graph.add(lg.ScatterAddOp(updates.value, indices.value, axis, size))


@checked
def scatter(x: Tensor, indices: Tensor, updates: Tensor, axis: int) -> Tensor:
    """`x` with each update written where its index points along `axis`
    (PyTorch's `scatter`): the indices have the updates' shape, `x` has it
    but on `axis`; the last update aimed at an element wins."""
    return x.graph.add(lg.ScatterOp(x.value, indices.value, updates.value, axis))


@checked
def embedding(table: Tensor, indices: Tensor, padding_idx: int | None = None) -> Tensor:
    """Rows of `table` at `indices`; the row `padding_idx` gets no gradient."""
    return table.graph.add(lg.EmbeddingOp(table.value, indices.value, padding_idx))


@checked
def cross_entropy(logits: Tensor, labels: Tensor) -> Tensor:
    return logits.graph.add(lg.CrossEntropyOp(logits.value, labels.value))


@checked
def token_cross_entropy(logits: Tensor, labels: Tensor, ignore_index: int | None = None) -> Tensor:
    """Each row's cross-entropy, -log softmax(logits)[label], over the last
    axis of `logits` (0 where the label is `ignore_index`): the row max
    (lg.reduce_max), the sum of exponentials (lg.sum_exp) and the loss
    (lg.token_cross_entropy). With the logits split over classes (a
    vocabulary-parallel head) the row statistics are partial values reduced
    across devices, and no device forms a one-hot of the classes."""
    row_max = reduce_max(logits, [len(logits.shape) - 1])
    sum_exp = logits.graph.add(lg.SumExpOp(logits.value, row_max.value))
    return logits.graph.add(
        lg.TokenCrossEntropyOp(logits.value, labels.value, row_max.value, sum_exp.value, ignore_index))


@checked
def mse_loss(a: Tensor, b: Tensor) -> Tensor:
    return a.graph.add(lg.MseLossOp(a.value, b.value))

