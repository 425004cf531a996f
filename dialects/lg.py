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
"""

from __future__ import annotations

import functools
import math
from abc import ABC
from collections.abc import Sequence
from typing import Any, ClassVar, Protocol, cast

from xdsl.dialects.builtin import (
    I64,
    ArrayAttr,
    BFloat16Type,
    DenseArrayBase,
    DenseIntOrFPElementsAttr,
    Float16Type,
    Float32Type,
    Float64Type,
    FloatAttr,
    FloatData,
    IntegerAttr,
    IntegerType,
    ModuleOp,
    StringAttr,
    SymbolNameConstraint,
    SymbolRefAttr,
    TensorType,
    UnitAttr,
    f64,
    i1,
    i64,
)
from xdsl.ir import Attribute, Dialect, Operation, ParametrizedAttribute, Region, SSAValue
from xdsl.irdl import (
    AttrSizedOperandSegments,
    IRDLOperation,
    VarConstraint,
    irdl_attr_definition,
    lazy_traits_def,
    operand_def,
    opt_operand_def,
    opt_prop_def,
    prop_def,
    region_def,
    result_def,
    traits_def,
    var_operand_def,
)
from xdsl.parser import AttrParser, Parser
from xdsl.printer import Printer
from xdsl.traits import HasParent, IsolatedFromAbove, IsTerminator, OpTrait, Pure, SymbolOpInterface
from xdsl.utils.exceptions import VerifyException

from .builders import i64_array, i64_attr
from .irdl_verify import DirectInit, op_definition, remember
from .sbp import (
    PLACEMENT_ATTR,
    SIGNATURE_ATTR,
    DTensorType,
    PlacementOp,
    PlainNd,
    TensorLike,
    element_type,
    global_shape,
    lookup_placement,
    parse_verified,
    plain_nd,
    tensor_type,
    verify_distribution,
    verify_placement_attr,
    verify_signature,
)

Shape = tuple[int, ...]


class ShapeError(Exception):
    """An op's operands do not fit its shape-and-dtype rule."""


# --------------------------------------------------------------------------
# Op properties, as traits: the passes and backends ask the op, never a list
# --------------------------------------------------------------------------


class Elementwise(OpTrait):
    """Computed element by element, with numpy broadcasting and no
    properties: the same on local pieces as on global tensors. So a chain of
    them is one kernel (plan-fuse-elementwise), and its output may be
    written over a dying input of the output's type (every implementation
    reads an element before writing it)."""


class SameBytes(OpTrait):
    """The result is the operand's bytes in the same order (a reshape): it
    may live in the operand's register."""


def is_elementwise(op: type[Operation]) -> bool:
    return op.has_trait(Elementwise)


def may_run_in_place(op: type[Operation]) -> bool:
    """Whether the output may share bytes with an input: elementwise ops
    (over an input of the output's type) and byte-preserving ones."""
    return op.has_trait(Elementwise) or op.has_trait(SameBytes)


# --------------------------------------------------------------------------
# Element types and shape helpers
# --------------------------------------------------------------------------

FLOAT_TYPES = (Float16Type, BFloat16Type, Float32Type, Float64Type)


def is_float(elem: Attribute) -> bool:
    return isinstance(elem, FLOAT_TYPES)


def is_index(elem: Attribute) -> bool:
    """Integer element types usable as labels and gather indices."""
    return isinstance(elem, IntegerType) and elem.width.data in (32, 64)


def is_bool(elem: Attribute) -> bool:
    """i1: booleans (masks)."""
    return isinstance(elem, IntegerType) and elem.width.data == 1


def fmt_type(shape: Shape, elem: Attribute) -> str:
    return "x".join([*(str(d) for d in shape), str(elem)])


def _require_float(what: str, elem: Attribute) -> None:
    if not is_float(elem):
        raise ShapeError(f"{what} must have a float element type, got {elem}")


def _same_elem(elems: Sequence[Attribute]) -> Attribute:
    _require_float("operands", elems[0])
    if any(e != elems[0] for e in elems[1:]):
        raise ShapeError(f"operands must share one element type, got {', '.join(map(str, elems))}")
    return elems[0]


def broadcast_shapes(*shapes: Shape) -> Shape:
    """numpy broadcasting: align trailing dims; each pair equal or one of them 1."""
    rank = max(len(s) for s in shapes)
    out = []
    for i in range(rank):
        dims = {s[len(s) - rank + i] for s in shapes if len(s) - rank + i >= 0}
        dims.discard(1)
        if len(dims) > 1:
            raise ShapeError(f"shapes {', '.join(str(list(s)) for s in shapes)} do not broadcast")
        out.append(dims.pop() if dims else 1)
    return tuple(out)


def _check_axis(axis: int, rank: int, what: str = "axis") -> None:
    if not 0 <= axis < rank:
        raise ShapeError(f"{what} {axis} is out of range for rank {rank}")


# --------------------------------------------------------------------------
# Parameter initializers
# --------------------------------------------------------------------------


class InitializerAttr(ParametrizedAttribute, ABC):
    """How a parameter gets its first value (see sbpc.semantics.reference.initial_value)."""


def _parse_floats(cls, parser: AttrParser, count: int) -> Sequence[Attribute]:
    def parse():
        with parser.in_angle_brackets():
            values = parser.parse_comma_separated_list(parser.Delimiter.NONE, parser.parse_number)
        if len(values) != count:
            parser.raise_error(f"#{cls.name} takes {count} number(s), got {len(values)}")
        return tuple(FloatData(float(v)) for v in values)

    return parse_verified(cls, parser, parse)


def _print_floats(printer: Printer, values: Sequence[FloatData]) -> None:
    with printer.in_angle_brackets():
        printer.print_list(values, lambda v: printer.print_string(repr(v.data)))


@irdl_attr_definition
class ZerosInitAttr(InitializerAttr):
    name = "lg.zeros"


@irdl_attr_definition
class OnesInitAttr(InitializerAttr):
    name = "lg.ones"


@irdl_attr_definition
class FillInitAttr(InitializerAttr):
    """The constant initializer: every element is `value`."""

    name = "lg.fill"
    value: FloatData

    def __init__(self, value: float):
        super().__init__(FloatData(float(value)))

    @classmethod
    def parse_parameters(cls, parser: AttrParser) -> Sequence[Attribute]:
        return _parse_floats(cls, parser, 1)

    def print_parameters(self, printer: Printer) -> None:
        _print_floats(printer, [self.value])


@irdl_attr_definition
class NormalInitAttr(InitializerAttr):
    name = "lg.normal"
    mean: FloatData
    std: FloatData

    def __init__(self, mean: float, std: float):
        super().__init__(FloatData(float(mean)), FloatData(float(std)))

    @classmethod
    def parse_parameters(cls, parser: AttrParser) -> Sequence[Attribute]:
        return _parse_floats(cls, parser, 2)

    def print_parameters(self, printer: Printer) -> None:
        _print_floats(printer, [self.mean, self.std])

    def verify(self) -> None:
        if not self.std.data >= 0:
            raise VerifyException(f"#lg.normal needs std >= 0, got {self.std.data}")


@irdl_attr_definition
class UniformInitAttr(InitializerAttr):
    name = "lg.uniform"
    low: FloatData
    high: FloatData

    def __init__(self, low: float, high: float):
        super().__init__(FloatData(float(low)), FloatData(float(high)))

    @classmethod
    def parse_parameters(cls, parser: AttrParser) -> Sequence[Attribute]:
        return _parse_floats(cls, parser, 2)

    def print_parameters(self, printer: Printer) -> None:
        _print_floats(printer, [self.low, self.high])

    def verify(self) -> None:
        if not self.low.data < self.high.data:
            raise VerifyException(f"#lg.uniform needs low < high, got {self.low.data} and {self.high.data}")


# --------------------------------------------------------------------------
# Shared verification
# --------------------------------------------------------------------------


MAX_ELEMENTS = 2**60
"""The most elements a tensor may have: 8-byte elements then fill 2^63 bytes."""


_INFERRED: dict[tuple, tuple[TensorType, list[Attribute]]] = {}
"""(op class, ids of its operand types, its properties) -> (the result type
LgOp.infer gave, the operand types): the entry keeps the types alive, so
their ids are not reused; attributes are immutable, so the answer holds."""

_CHECKED_RULES: dict[tuple, tuple[Attribute, list[Attribute]]] = {}
"""(op class, id of its result type, ids of its operand types, its
properties) -> (the result type, the operand types) of an lg op whose
result its shape rule accepted. The entry keeps its types alive, so their
ids are not reused; attributes are immutable, so the verdict holds."""


_CHECKED_DISTRIBUTIONS: dict[tuple, tuple] = {}
"""(ids of an op's operand types, ids of its result types, ids of its
`sbp.signature` and `sbp.placement` attributes) -> (those objects, then the
placements its dtensors name, each with the mesh it had) of an op that
verify_distributions accepted. Its verdict reads these alone, but for the
placements, which the module may have changed: a hit looks each up again,
in the order the checks do, and holds while each has the very mesh it had
(the entry keeps its attributes alive, so their ids are not reused)."""


def verify_distributions(op: IRDLOperation) -> None:
    """Every dtensor of `op` is valid on its placement, all of them share one
    placement (an op runs on one mesh), and a recorded signature matches."""
    # Ops alike (repeated layers share type and signature objects) are
    # checked once; the placements are looked up for each.
    operand_types = tuple([o.type for o in op.operands])
    result_types = tuple([r.type for r in op.results])
    signature, placed = op.attributes.get(SIGNATURE_ATTR), op.attributes.get(PLACEMENT_ATTR)
    key = (tuple(map(id, operand_types)), tuple(map(id, result_types)), id(signature), id(placed))
    checked = _CHECKED_DISTRIBUTIONS.get(key)
    if checked is not None:
        for name, mesh in checked[1]:
            if lookup_placement(op, name).mesh() is not mesh:
                break
        else:
            if isinstance(placed, SymbolRefAttr):
                lookup_placement(op, placed)  # as verify_placement_attr does, last
            return
    placements = set()
    found: dict[str, PlacementOp] = {}  # one placement lookup per name, not per dtensor
    for i, result in enumerate(op.results):
        # Sizes become i64 byte counts in the plan (registers, arenas).
        if isinstance(result.type, TensorType | DTensorType) and math.prod(global_shape(result.type)) > MAX_ELEMENTS:
            raise VerifyException(
                f"'{op.name}': result #{i} of shape {list(global_shape(result.type))} has more than 2^60 elements, "
                "beyond what a plan addresses in 64-bit bytes"
            )
    for kind, values in (("operand", op.operands), ("result", op.results)):
        for i, value in enumerate(values):
            if verify_distribution(op, value.type, f"{kind} #{i}", found) is not None:
                assert isinstance(value.type, DTensorType)  # a mesh comes back only for a dtensor
                placements.add(value.type.placement_name)
    if len(placements) > 1:
        raise VerifyException(
            f"'{op.name}': all operands and results must share one placement, got "
            + ", ".join(f"@{p}" for p in sorted(placements))
        )
    verify_signature(op)
    verify_placement_attr(op)
    remember(_CHECKED_DISTRIBUTIONS, key, ((operand_types, result_types, signature, placed),
                                           tuple((name, p.mesh()) for name, p in found.items())))


Signature = tuple[tuple[str, ...], tuple[str, ...]]
"""A 1-D SBP signature as plain data: (operand SBPs, result SBPs), each SBP a
string "S<axis>" written "S0", "S1", ..., "B", "P" (sum) or "Pmax"."""


def _split_ok(dim: int, p: int) -> bool:
    # Any non-empty axis may be split. With fewer elements than devices some
    # pieces are empty (PyTorch DTensor allows it too): a small batch on many
    # devices, or the last micro-batch of an uneven split. The cost model
    # prices them by the fullest device (cost_model.local_fraction).
    return dim >= 1


def _source_signatures(out_shape: Shape, p: int) -> list[Signature]:
    sigs: list[Signature] = [((), ("B",))]
    return sigs + [((), (f"S{i}",)) for i, d in enumerate(out_shape) if _split_ok(d, p)]


def _aligned_splits(in_shapes: Sequence[Shape], out_shape: Shape, p: int) -> list[Signature]:
    """Elementwise with numpy broadcasting: splitting result axis i splits
    each operand on its aligned axis, or needs it whole (B) where the operand
    broadcasts along i."""
    sigs: list[Signature] = []
    rank = len(out_shape)
    for i, d in enumerate(out_shape):
        if not _split_ok(d, p):
            continue
        ins = []
        for shape in in_shapes:
            j = i - (rank - len(shape))
            ins.append("B" if j < 0 or shape[j] != d else f"S{j}")
        sigs.append((tuple(ins), (f"S{i}",)))
    return sigs


def _passthrough(count: int, kinds: Sequence[str]) -> list[Signature]:
    """All-B gives B; for each partial kind the op is linear (or monotone, for
    max) in, all operands of that kind give it."""
    sigs: list[Signature] = [(("B",) * count, ("B",))]
    return sigs + [((k,) * count, (k,)) for k in kinds]


class SbpRules:
    """How an op may be distributed: its valid 1-D SBP signatures and its
    work, as plain data next to the op's shape rule. sbp-infer builds N-D
    signatures from these, one mesh axis at a time."""

    FLOPS_PER_ELEMENT: ClassVar[float] = 1.0
    SBP_NOTE: ClassVar[str] = ""
    """Why a distribution one might expect is missing, for diagnostics."""

    def params(self) -> dict[str, Any]:
        """The op's properties as plain Python keywords of its rules."""
        return {}

    # The rules' signatures are open (*args, **params) here: each op's
    # override names the properties it reads as keywords, which a fixed base
    # signature would make an incompatible override.

    @classmethod
    def sbp_rule(cls, *args: Any, **params: Any) -> list[Signature]:
        """sbp_rule(in_shapes, out_shape, p, **properties): every valid 1-D
        signature on a mesh axis of `p` devices, written in the SBP text form
        ("S0", "B", "P", "Pmax")."""
        raise NotImplementedError

    @classmethod
    @functools.lru_cache(maxsize=1 << 14)
    def signatures(
        cls, in_shapes: tuple[Shape, ...], out_shape: Shape, p: int, params: tuple[tuple[str, Any], ...] = ()
    ) -> list[tuple[PlainNd, PlainNd]]:
        """sbp_rule's signatures as Sbp values, computed once per distinct
        (shapes, mesh axis size, properties): graphs repeat a few layer
        shapes many times. The list is shared: do not change it."""
        return [
            (plain_nd(ins), plain_nd(outs))
            for ins, outs in cls.sbp_rule(list(in_shapes), out_shape, p, **dict(params))
        ]

    @classmethod
    def flops(cls, *args: Any, **params: Any) -> float:
        """flops(in_shapes, out_shape, **properties): arithmetic of the whole (global) op."""
        out_shape: Shape = args[1]
        return cls.FLOPS_PER_ELEMENT * math.prod(out_shape)


class GradientEmitter(Protocol):
    """What a gradient rule may ask of lg-autodiff: append an op (returning
    its result), make constants like a value, sum a gradient back to an
    operand's shape, and report what it cannot differentiate."""

    def emit(self, op: Operation) -> SSAValue: ...
    def scalar(self, value: float, like: SSAValue) -> SSAValue: ...
    def zeros(self, shape: Sequence[int], like: SSAValue) -> SSAValue: ...
    def unbroadcast(self, grad: SSAValue, shape: Sequence[int]) -> SSAValue: ...
    def swap_last(self, value: SSAValue) -> SSAValue: ...
    def unsupported(self, op: Operation, what: str) -> Exception: ...


class LgOp(SbpRules, DirectInit, ABC):
    """A compute op: its result's global type follows from `rule`."""

    @classmethod
    def rule(cls, *args: Any, **params: Any) -> tuple[Shape, Attribute]:
        """rule(shapes, elems, **properties): the result's global shape and
        element type from the operands' (global) shapes and element types,
        or a ShapeError."""
        raise NotImplementedError

    @classmethod
    def infer(cls, operands: Sequence[SSAValue], **params: Any) -> TensorType:
        types = [o.type for o in operands]
        # The rule reads the class, the types and the properties alone:
        # ops alike (autodiff's and the optimizer's, layer after layer)
        # infer once. A hit holds the very types it was keyed by.
        try:
            key: tuple | None = (cls, tuple(map(id, types)), tuple(sorted(params.items())))
            known = _INFERRED.get(key)  # type: ignore[arg-type]
        except TypeError:  # a property without a hash
            key, known = None, None
        if known is not None:
            return known[0]
        try:
            shape, elem = cls.rule([global_shape(t) for t in types], [element_type(t) for t in types], **params)
        except ShapeError as e:
            raise ValueError(f"{cls.name}: {e}") from None
        result = tensor_type(elem, shape)
        if key is not None:
            remember(_INFERRED, key, (result, types))
        return result

    def gradient(self, g: SSAValue, e: GradientEmitter) -> list[SSAValue | None]:
        """The vector-Jacobian product: one gradient per operand (None where
        none flows, as into indices) from the gradient `g` of the result, the
        ops it needs appended through `e`. An op that does not override it
        (reduce_max, one_hot, embedding_grad) is not differentiable, and
        lg-autodiff says so when a gradient must flow through one."""
        raise NotImplementedError(f"{self.name} has no gradient rule")

    @classmethod
    def differentiable(cls) -> bool:
        return cls.gradient is not LgOp.gradient

    def verify_(self) -> None:
        types = [o.type for o in self.operands]
        result = self.results[0].type
        params = self.params()
        # The rule's verdict reads the op's class, properties and types
        # alone: ops alike (repeated layers share type objects) pass once.
        try:
            key: tuple | None = (type(self), id(result), tuple(map(id, types)), tuple(sorted(params.items())))
            inferred = _CHECKED_RULES.get(key)  # type: ignore[arg-type]
        except TypeError:  # a property without a hash
            key, inferred = None, None
        if inferred is None:  # (a hit is the very objects: the entry keeps them alive)
            try:
                shape, elem = self.rule(
                    [global_shape(t) for t in types], [element_type(t) for t in types], **params
                )
            except ShapeError as e:
                raise VerifyException(f"'{self.name}': {e}") from None
            if global_shape(result) != shape or element_type(result) != elem:
                raise VerifyException(
                    f"'{self.name}': result type {fmt_type(global_shape(result), element_type(result))} does not "
                    f"match the inferred {fmt_type(shape, elem)}"
                )
            if key is not None:
                remember(_CHECKED_RULES, key, (result, types))
        verify_distributions(self)


# --------------------------------------------------------------------------
# Graph structure
# --------------------------------------------------------------------------


@op_definition
class GraphOp(IRDLOperation):
    """One graph: its inputs, parameters, computation and outputs. `on @mesh`
    names the default placement that SBP inference distributes it over."""

    name = "lg.graph"

    sym_name = prop_def(SymbolNameConstraint())
    placement = opt_prop_def(SymbolRefAttr)
    body = region_def("single_block")

    traits = traits_def(SymbolOpInterface(), IsolatedFromAbove())

    assembly_format = "$sym_name (`on` $placement^)? attr-dict-with-keyword $body"

    def __init__(self, name: str, body: Region, placement: str | None = None):
        props: dict[str, Attribute] = {"sym_name": StringAttr(name)}
        if placement is not None:
            props["placement"] = SymbolRefAttr(placement)
        super().__init__(properties=props, regions=[body])

    def output(self) -> OutputOp:
        terminator = self.body.block.last_op
        assert isinstance(terminator, OutputOp)
        return terminator

    def verify_(self) -> None:
        if self.placement is not None:
            lookup_placement(self, self.placement)
        seen: dict[str, str] = {}
        # the values made so far, by id (an SSAValue hashes in Python; they
        # all live in the graph while it is verified)
        defined: set[int] = {id(arg) for arg in self.body.block.args}
        last = self.body.block.last_op
        op: Operation
        for op in self.body.block.ops:
            # passes read a graph in program order: every operand is made
            # above its use (xDSL's parser takes a forward reference)
            for i, operand in enumerate(op.operands):
                if id(operand) not in defined:
                    raise VerifyException(f"'{op.name}': operand #{i} is used before the op that makes it "
                                          "(an lg graph is in program order)")
            results = op.results
            defined.update(map(id, results))
            in_graph, named = _graph_facts(type(op))
            # Passes read every op before the terminator as one value of the
            # graph; a placement or a plan op put here by mistake has none.
            if op is not last and (len(results) != 1 or not in_graph):
                raise VerifyException(
                    f"'{op.name}' cannot stand in graph @{self.sym_name.data}: its body holds lg and sbp ops "
                    f"of one result each (placements belong at module level)"
                )
            for r in results:
                t = r.type
                if type(t) is not DTensorType and isinstance(t, TensorType) and any(d < 0 for d in t.get_shape()):
                    raise VerifyException(f"'{op.name}': result #{r.index} has the dynamic shape {t}; sbpc "
                                          "plans static shapes only")
            if named:
                key = cast(InputOp | ParamOp, op).key.data  # (what _graph_facts said)
                if key in seen:
                    raise VerifyException(
                        f"'{op.name}': name \"{key}\" is already used by an {seen[key]} of graph @{self.sym_name.data}"
                    )
                seen[key] = op.name


@functools.cache
def _graph_facts(op_class: type[Operation]) -> tuple[bool, bool]:
    """What GraphOp's verifier asks of an op's class, once per class: is it
    an lg or sbp op, and is it an input or a parameter (named in the graph)."""
    return op_class.dialect_name() in ("lg", "sbp"), issubclass(op_class, InputOp | ParamOp)


@op_definition
class OutputOp(IRDLOperation):
    """The graph's named results (what a run fetches)."""

    name = "lg.output"

    names = prop_def(ArrayAttr[StringAttr])
    values = var_operand_def(TensorLike)

    traits = lazy_traits_def(lambda: (IsTerminator(), HasParent(GraphOp)))

    assembly_format = "$names ($values^ `:` type($values))? attr-dict"

    def __init__(self, values: Sequence[SSAValue], names: Sequence[str]):
        super().__init__(operands=[values], properties={"names": ArrayAttr([StringAttr(n) for n in names])})

    def verify_(self) -> None:
        names = [n.data for n in self.names.data]
        if len(names) != len(self.values):
            raise VerifyException(f"'{self.name}': {len(names)} names for {len(self.values)} values")
        if len(set(names)) != len(names):
            raise VerifyException(f"'{self.name}': output names must be distinct, got {names}")
        for i, value in enumerate(self.values):
            verify_distribution(self, value.type, f"operand #{i}")


# --------------------------------------------------------------------------
# Sources
# --------------------------------------------------------------------------


def _verify_source(op: IRDLOperation, float_only: bool) -> None:
    elem = element_type(op.results[0].type)
    if float_only and not is_float(elem):
        raise VerifyException(f"'{op.name}': a parameter must have a float element type, got {elem}")
    if not (is_float(elem) or is_index(elem) or is_bool(elem)):
        raise VerifyException(f"'{op.name}': element type {elem} is not supported (float, i32, i64 or i1)")
    verify_distributions(op)


@op_definition
class InputOp(SbpRules, DirectInit):
    """A named feed."""

    FLOPS_PER_ELEMENT: ClassVar[float] = 0.0

    @classmethod
    def sbp_rule(cls, in_shapes, out_shape, p, **params):
        return _source_signatures(out_shape, p)

    name = "lg.input"

    key = prop_def(StringAttr)
    result = result_def(TensorLike)

    assembly_format = "$key attr-dict `:` type($result)"

    def __init__(self, key: str, type: Attribute):
        super().__init__(operands=[], properties={"key": StringAttr(key)}, result_types=[type])

    def verify_(self) -> None:
        _verify_source(self, float_only=False)


@op_definition
class ParamOp(SbpRules, DirectInit):
    """A named tensor that lives across steps and how it is first
    initialized: trained (lg-autodiff gives it a gradient, lg-optimizer an
    update) or, marked `state`, updated by the graph itself through its
    `new.<key>` output, with no gradient and no optimizer update (a
    batch-norm's running statistics and count, which may be integers)."""

    FLOPS_PER_ELEMENT: ClassVar[float] = 0.0

    @classmethod
    def sbp_rule(cls, in_shapes, out_shape, p, **params):
        return _source_signatures(out_shape, p)

    name = "lg.param"

    key = prop_def(StringAttr)
    init = prop_def(InitializerAttr)
    seed = prop_def(IntegerAttr[I64], default_value=IntegerAttr(0, i64))
    state = opt_prop_def(UnitAttr)
    result = result_def(TensorLike)

    assembly_format = "$key `init` $init (`seed` $seed^)? (`state` $state^)? attr-dict `:` type($result)"

    def __init__(self, key: str, type: Attribute, init: InitializerAttr, seed: int = 0, state: bool = False):
        props: dict[str, Attribute] = {"key": StringAttr(key), "init": init, "seed": i64_attr(seed)}
        if state:
            props["state"] = UnitAttr()
        super().__init__(operands=[], properties=props, result_types=[type])

    @property
    def trained(self) -> bool:
        """Whether lg-autodiff and lg-optimizer train it (not `state`)."""
        return self.state is None

    def verify_(self) -> None:
        _verify_source(self, float_only=self.trained)


@op_definition
class ConstantOp(SbpRules, DirectInit):
    """A literal tensor: `lg.constant dense<1.0> : tensor<4xf32>`; after SBP
    inference its distributed type follows `->`."""

    FLOPS_PER_ELEMENT: ClassVar[float] = 0.0

    @classmethod
    def sbp_rule(cls, in_shapes, out_shape, p, **params):
        return _source_signatures(out_shape, p)

    name = "lg.constant"

    value = prop_def(DenseIntOrFPElementsAttr)
    result = result_def(TensorLike)

    traits = traits_def(Pure())

    def __init__(self, value: DenseIntOrFPElementsAttr, type: Attribute | None = None):
        super().__init__(operands=[], properties={"value": value}, result_types=[type or value.type])

    @classmethod
    def parse(cls, parser: Parser) -> ConstantOp:
        start = parser.pos
        try:
            value = parser.parse_attribute()
        except AssertionError:  # xDSL 0.74 asserts on a real literal given a complex type
            parser.raise_error("lg.constant: the literal does not match its element type", start, parser.pos)
        if not isinstance(value, DenseIntOrFPElementsAttr):
            parser.raise_error("lg.constant expects a dense<...> : tensor<...> literal")
        result_type = parser.parse_type() if parser.parse_optional_punctuation("->") else None
        attrs = parser.parse_optional_attr_dict()
        op = cls(value, result_type)
        op.attributes.update(attrs)
        return op

    def print(self, printer: Printer) -> None:
        printer.print_string(" ")
        printer.print_attribute(self.value)
        if self.result.type != self.value.type:
            printer.print_string(" -> ")
            printer.print_attribute(self.result.type)
        printer.print_op_attributes(self.attributes)

    def verify_(self) -> None:
        value_type = self.value.type
        if not isinstance(value_type, TensorType):
            raise VerifyException(f"'{self.name}': the literal must be a tensor")
        if (global_shape(value_type), value_type.element_type) != (
            global_shape(self.result.type),
            element_type(self.result.type),
        ):
            raise VerifyException(f"'{self.name}': result type does not match the literal's type {value_type}")
        _verify_source(self, float_only=False)


# --------------------------------------------------------------------------
# Elementwise ops
# --------------------------------------------------------------------------


class UnaryOp(LgOp, ABC):
    """An elementwise op of one float tensor; the result has the operand's type."""

    T: ClassVar = VarConstraint("T", TensorLike)
    input = operand_def(T)
    result = result_def(T)

    traits = traits_def(Pure(), Elementwise())

    assembly_format = "$input attr-dict `:` type($input)"

    def __init__(self, input: SSAValue):
        super().__init__(operands=[input], result_types=[input.type])

    PARTIALS: ClassVar[tuple[str, ...]] = ()
    """Partial kinds the op keeps: "P" where it is linear, "Pmax" where it is
    monotone non-decreasing (f(max x) = max f(x))."""

    @classmethod
    def rule(cls, shapes, elems, **params):
        _require_float("operand", elems[0])
        return shapes[0], elems[0]

    @classmethod
    def sbp_rule(cls, in_shapes, out_shape, p, **params):
        return _aligned_splits(in_shapes, out_shape, p) + _passthrough(1, cls.PARTIALS)


@op_definition
class NegOp(UnaryOp):
    name = "lg.neg"
    PARTIALS: ClassVar[tuple[str, ...]] = ("P",)

    def gradient(self, g, e):
        return [e.emit(NegOp(g))]


@op_definition
class ReluOp(UnaryOp):
    name = "lg.relu"
    PARTIALS: ClassVar[tuple[str, ...]] = ("Pmax",)

    def gradient(self, g, e):
        return [e.emit(MulOp(g, e.emit(StepOp(self.input))))]


@op_definition
class GeluOp(UnaryOp):
    """GELU, tanh form: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))."""

    name = "lg.gelu"
    FLOPS_PER_ELEMENT: ClassVar[float] = 8.0

    def gradient(self, g, e):
        x = self.input
        k, c = 0.7978845608028654, 0.044715
        x2 = e.emit(MulOp(x, x))
        x3 = e.emit(MulOp(x2, x))
        inner = e.emit(MulOp(e.emit(AddOp(x, e.emit(MulOp(x3, e.scalar(c, x))))), e.scalar(k, x)))
        t = e.emit(TanhOp(inner))
        one_plus_t = e.emit(AddOp(t, e.scalar(1.0, x)))
        sech2 = e.emit(SubOp(e.scalar(1.0, x), e.emit(MulOp(t, t))))
        dinner = e.emit(MulOp(e.emit(AddOp(e.emit(MulOp(x2, e.scalar(3 * c, x))), e.scalar(1.0, x))), e.scalar(k, x)))
        d = e.emit(AddOp(e.emit(MulOp(one_plus_t, e.scalar(0.5, x))),
                         e.emit(MulOp(e.emit(MulOp(e.emit(MulOp(x, sech2)), dinner)), e.scalar(0.5, x)))))
        return [e.emit(MulOp(g, d))]


@op_definition
class TanhOp(UnaryOp):
    name = "lg.tanh"
    PARTIALS: ClassVar[tuple[str, ...]] = ("Pmax",)
    FLOPS_PER_ELEMENT: ClassVar[float] = 4.0

    def gradient(self, g, e):
        return [e.emit(MulOp(g, e.emit(SubOp(e.scalar(1.0, g), e.emit(MulOp(self.result, self.result))))))]


@op_definition
class ErfOp(UnaryOp):
    """The error function; GELU's exact form is 0.5 x (1 + erf(x / sqrt 2))
    (PyTorch's default `nn.GELU()`), which the torch frontend builds from it."""

    name = "lg.erf"
    PARTIALS: ClassVar[tuple[str, ...]] = ("Pmax",)
    FLOPS_PER_ELEMENT: ClassVar[float] = 8.0

    def gradient(self, g, e):
        # d/dx erf(x) = 2 / sqrt(pi) exp(-x^2)
        x = self.input
        gauss = e.emit(ExpOp(e.emit(NegOp(e.emit(MulOp(x, x))))))
        return [e.emit(MulOp(g, e.emit(MulOp(gauss, e.scalar(1.1283791670955126, x)))))]


@op_definition
class ExpOp(UnaryOp):
    name = "lg.exp"
    PARTIALS: ClassVar[tuple[str, ...]] = ("Pmax",)
    FLOPS_PER_ELEMENT: ClassVar[float] = 4.0

    def gradient(self, g, e):
        return [e.emit(MulOp(g, self.result))]


@op_definition
class SqrtOp(UnaryOp):
    """No Pmax: a device's candidate may lie outside sqrt's domain."""

    name = "lg.sqrt"
    FLOPS_PER_ELEMENT: ClassVar[float] = 4.0

    def gradient(self, g, e):
        return [e.emit(DivOp(e.emit(MulOp(g, e.scalar(0.5, g))), self.result))]


@op_definition
class RsqrtOp(UnaryOp):
    name = "lg.rsqrt"
    FLOPS_PER_ELEMENT: ClassVar[float] = 4.0

    def gradient(self, g, e):
        cube = e.emit(MulOp(self.result, e.emit(MulOp(self.result, self.result))))
        return [e.emit(MulOp(e.emit(MulOp(g, e.scalar(-0.5, g))), cube))]


@op_definition
class StepOp(UnaryOp):
    """Heaviside step: 1 where x > 0, else 0 (relu's derivative)."""

    name = "lg.step"

    def gradient(self, g, e):
        return [None]  # zero almost everywhere


class BinaryOp(LgOp, ABC):
    """An elementwise op of two float tensors with numpy broadcasting."""

    lhs = operand_def(TensorLike)
    rhs = operand_def(TensorLike)
    result = result_def(TensorLike)

    traits = traits_def(Pure(), Elementwise())

    assembly_format = "$lhs `,` $rhs attr-dict `:` functional-type(operands, results)"

    def __init__(self, lhs: SSAValue, rhs: SSAValue, result_type: Attribute | None = None):
        super().__init__(operands=[lhs, rhs], result_types=[result_type or self.infer([lhs, rhs])])

    PARTIAL_SIGNATURES: ClassVar[tuple[Signature, ...]] = ()
    """Signatures with partial operands, where the op is linear (P) or
    monotone (Pmax) in them."""

    INTEGERS: ClassVar[bool] = False
    """Whether i32/i64 operands are taken too (exact integer arithmetic:
    positions counted from masks); their results get no gradient."""

    @classmethod
    def rule(cls, shapes, elems, **params):
        if cls.INTEGERS and is_index(elems[0]):
            if any(e != elems[0] for e in elems[1:]):
                raise ShapeError(f"operands must share one element type, got {', '.join(map(str, elems))}")
            return broadcast_shapes(*shapes), elems[0]
        return broadcast_shapes(*shapes), _same_elem(elems)

    @classmethod
    def sbp_rule(cls, in_shapes, out_shape, p, **params):
        return _aligned_splits(in_shapes, out_shape, p) + [(("B", "B"), ("B",)), *cls.PARTIAL_SIGNATURES]


@op_definition
class AddOp(BinaryOp):
    name = "lg.add"
    INTEGERS: ClassVar[bool] = True
    PARTIAL_SIGNATURES: ClassVar[tuple[Signature, ...]] = (
        (("P", "P"), ("P",)),
        (("Pmax", "B"), ("Pmax",)),
        (("B", "Pmax"), ("Pmax",)),
    )

    def gradient(self, g, e):
        return [e.unbroadcast(g, global_shape(self.lhs.type)), e.unbroadcast(g, global_shape(self.rhs.type))]


@op_definition
class SubOp(BinaryOp):
    name = "lg.sub"
    INTEGERS: ClassVar[bool] = True
    PARTIAL_SIGNATURES: ClassVar[tuple[Signature, ...]] = ((("P", "P"), ("P",)), (("Pmax", "B"), ("Pmax",)))

    def gradient(self, g, e):
        return [e.unbroadcast(g, global_shape(self.lhs.type)),
                e.unbroadcast(e.emit(NegOp(g)), global_shape(self.rhs.type))]


@op_definition
class MulOp(BinaryOp):
    name = "lg.mul"
    INTEGERS: ClassVar[bool] = True
    PARTIAL_SIGNATURES: ClassVar[tuple[Signature, ...]] = ((("P", "B"), ("P",)), (("B", "P"), ("P",)))

    def gradient(self, g, e):
        return [e.unbroadcast(e.emit(MulOp(g, self.rhs)), global_shape(self.lhs.type)),
                e.unbroadcast(e.emit(MulOp(g, self.lhs)), global_shape(self.rhs.type))]


@op_definition
class DivOp(BinaryOp):
    name = "lg.div"
    PARTIAL_SIGNATURES: ClassVar[tuple[Signature, ...]] = ((("P", "B"), ("P",)),)
    FLOPS_PER_ELEMENT: ClassVar[float] = 4.0

    def gradient(self, g, e):
        quotient = e.emit(NegOp(e.emit(DivOp(e.emit(MulOp(g, self.result)), self.rhs))))
        return [e.unbroadcast(e.emit(DivOp(g, self.rhs)), global_shape(self.lhs.type)),
                e.unbroadcast(quotient, global_shape(self.rhs.type))]


# --------------------------------------------------------------------------
# Linear algebra
# --------------------------------------------------------------------------


@op_definition
class MatmulOp(LgOp):
    """Matrix product of the last two axes; leading (batch) axes broadcast as
    in numpy.matmul. `transpose_lhs`/`transpose_rhs` swap an operand's last two
    axes first."""

    name = "lg.matmul"

    lhs = operand_def(TensorLike)
    rhs = operand_def(TensorLike)
    transpose_lhs = opt_prop_def(UnitAttr)
    transpose_rhs = opt_prop_def(UnitAttr)
    result = result_def(TensorLike)

    traits = traits_def(Pure())

    assembly_format = (
        "$lhs `,` $rhs (`transpose_lhs` $transpose_lhs^)? (`transpose_rhs` $transpose_rhs^)? "
        "attr-dict `:` functional-type(operands, results)"
    )

    def __init__(
        self,
        lhs: SSAValue,
        rhs: SSAValue,
        transpose_lhs: bool = False,
        transpose_rhs: bool = False,
        result_type: Attribute | None = None,
    ):
        props = {}
        if transpose_lhs:
            props["transpose_lhs"] = UnitAttr()
        if transpose_rhs:
            props["transpose_rhs"] = UnitAttr()
        result_type = result_type or self.infer(
            [lhs, rhs], transpose_lhs=transpose_lhs, transpose_rhs=transpose_rhs
        )
        super().__init__(operands=[lhs, rhs], properties=props, result_types=[result_type])

    def params(self):
        return {"transpose_lhs": self.transpose_lhs is not None, "transpose_rhs": self.transpose_rhs is not None}

    @classmethod
    def rule(cls, shapes, elems, transpose_lhs=False, transpose_rhs=False):
        a, b = shapes
        if len(a) < 2 or len(b) < 2:
            raise ShapeError(f"operands must have rank >= 2, got {list(a)} and {list(b)}")
        if transpose_lhs:
            a = (*a[:-2], a[-1], a[-2])
        if transpose_rhs:
            b = (*b[:-2], b[-1], b[-2])
        if a[-1] != b[-2]:
            raise ShapeError(f"contracting dimensions differ: {list(a)} @ {list(b)}")
        batch = broadcast_shapes(a[:-2], b[:-2])
        return (*batch, a[-2], b[-1]), _same_elem(elems)

    @classmethod
    def sbp_rule(cls, in_shapes, out_shape, p, transpose_lhs=False, transpose_rhs=False):
        """OneFlow's Table 1 with transposes remapped: (S<m>, B) -> S, (B, S<n>) -> S,
        (S<k>, S<k>) -> P, (P, B) -> P, (B, P) -> P, (B, B) -> B, and the batch
        axes split alike (an operand that broadcasts along one stays B)."""
        a, b = in_shapes
        m_axis, k_axis = (len(a) - 1, len(a) - 2) if transpose_lhs else (len(a) - 2, len(a) - 1)
        kb_axis, n_axis = (len(b) - 1, len(b) - 2) if transpose_rhs else (len(b) - 2, len(b) - 1)
        rank = len(out_shape)
        sigs = _aligned_splits([a[:-2], b[:-2]], out_shape[:-2], p)
        if _split_ok(a[m_axis], p):
            sigs.append(((f"S{m_axis}", "B"), (f"S{rank - 2}",)))
        if _split_ok(b[n_axis], p):
            sigs.append((("B", f"S{n_axis}"), (f"S{rank - 1}",)))
        if _split_ok(a[k_axis], p):
            sigs.append(((f"S{k_axis}", f"S{kb_axis}"), ("P",)))
        return sigs + [(("B", "B"), ("B",)), (("P", "B"), ("P",)), (("B", "P"), ("P",))]

    @classmethod
    def flops(cls, in_shapes, out_shape, transpose_lhs=False, transpose_rhs=False):
        a = in_shapes[0]
        k = a[-2] if transpose_lhs else a[-1]
        return 2.0 * math.prod(out_shape) * k

    def gradient(self, g, e):
        a, b = self.lhs, self.rhs
        ta, tb = self.transpose_lhs is not None, self.transpose_rhs is not None
        # C = A' B' with A' = A or A^T, B' = B or B^T
        da_ = e.emit(MatmulOp(g, b, transpose_rhs=not tb))  # dA' = g B'^T
        a_shape, g_shape = global_shape(a.type), global_shape(g.type)
        if len(global_shape(b.type)) == 2 and len(a_shape) > 2 and not ta:
            # A weight applied to a batch of matrices (tokens of sequences): its
            # gradient is one GEMM over every row, A and g flattened to
            # [rows, K] and [rows, N], not a batched product summed over the batch.
            rows = math.prod(a_shape[:-1])
            a2 = e.emit(ReshapeOp(a, (rows, a_shape[-1])))
            g2 = e.emit(ReshapeOp(g, (rows, g_shape[-1])))
            db_ = e.emit(MatmulOp(a2, g2, transpose_lhs=True))
        else:
            db_ = e.emit(MatmulOp(a, g, transpose_lhs=not ta))  # dB' = A'^T g
        if ta:
            da_ = e.swap_last(da_)
        if tb:
            db_ = e.swap_last(db_)
        return [e.unbroadcast(da_, global_shape(a.type)), e.unbroadcast(db_, global_shape(b.type))]


# --------------------------------------------------------------------------
# Normalizations
# --------------------------------------------------------------------------


class AxisOp(LgOp, ABC):
    """softmax-like: normalizes along one axis; the result has the operand's type."""

    T: ClassVar = VarConstraint("T", TensorLike)
    input = operand_def(T)
    axis = prop_def(IntegerAttr[I64])
    result = result_def(T)

    traits = traits_def(Pure())

    assembly_format = "$input `axis` $axis attr-dict `:` type($input)"

    def __init__(self, input: SSAValue, axis: int):
        axis = axis % max(len(global_shape(input.type)), 1)
        super().__init__(operands=[input], properties={"axis": IntegerAttr(axis, i64)}, result_types=[input.type])

    def params(self):
        return {"axis": self.axis.value.data}

    FLOPS_PER_ELEMENT: ClassVar[float] = 5.0

    @classmethod
    def rule(cls, shapes, elems, axis):
        _require_float("operand", elems[0])
        _check_axis(axis, len(shapes[0]))
        return shapes[0], elems[0]

    @classmethod
    def sbp_rule(cls, in_shapes, out_shape, p, axis):
        sigs = [sig for sig in _aligned_splits(in_shapes, out_shape, p) if sig[1][0] != f"S{axis}"]
        return sigs + _passthrough(1, ())


@op_definition
class SoftmaxOp(AxisOp):
    name = "lg.softmax"

    def gradient(self, g, e):
        dot = e.emit(ReduceSumOp(e.emit(MulOp(g, self.result)), [self.axis.value.data], keepdims=True))
        return [e.emit(MulOp(self.result, e.emit(SubOp(g, dot))))]


@op_definition
class LogSoftmaxOp(AxisOp):
    name = "lg.log_softmax"

    def gradient(self, g, e):
        total = e.emit(ReduceSumOp(g, [self.axis.value.data], keepdims=True))
        return [e.emit(SubOp(g, e.emit(MulOp(e.emit(ExpOp(self.result)), total))))]


@op_definition
class LayerNormOp(LgOp):
    """Normalizes over the axes `axis..rank-1` (ONNX LayerNormalization); with
    `weight` and `bias` (affine) it then scales and shifts, both shaped like
    the normalized axes."""

    name = "lg.layernorm"

    T: ClassVar = VarConstraint("T", TensorLike)
    input = operand_def(T)
    weight = opt_operand_def(TensorLike)
    bias = opt_operand_def(TensorLike)
    axis = prop_def(IntegerAttr[I64])
    epsilon = prop_def(FloatAttr[Float64Type])
    result = result_def(T)

    traits = traits_def(Pure())
    irdl_options = (AttrSizedOperandSegments(as_property=True),)

    assembly_format = (
        "$input (`weight` $weight^ `:` type($weight))? (`bias` $bias^ `:` type($bias))? "
        "`axis` $axis `eps` $epsilon attr-dict `:` type($input)"
    )

    def __init__(
        self,
        input: SSAValue,
        axis: int,
        epsilon: float = 1e-5,
        weight: SSAValue | None = None,
        bias: SSAValue | None = None,
    ):
        axis = axis % max(len(global_shape(input.type)), 1)
        super().__init__(
            operands=[input, [weight] if weight else [], [bias] if bias else []],
            properties={"axis": IntegerAttr(axis, i64), "epsilon": FloatAttr(epsilon, f64)},
            result_types=[input.type],
        )

    FLOPS_PER_ELEMENT: ClassVar[float] = 8.0

    def params(self):
        return {"axis": self.axis.value.data, "affine": self.weight is not None, "has_bias": self.bias is not None}

    @classmethod
    def sbp_rule(cls, in_shapes, out_shape, p, axis, affine, has_bias):
        """Split any axis before the normalized ones; weight and bias stay whole."""
        extra = ("B",) * (len(in_shapes) - 1)
        sigs = [((f"S{i}", *extra), (f"S{i}",)) for i in range(axis) if _split_ok(out_shape[i], p)]
        return sigs + [(("B", *extra), ("B",))]

    @classmethod
    def rule(cls, shapes, elems, axis, affine, has_bias):
        x = shapes[0]
        _check_axis(axis, len(x))
        if affine != has_bias:
            raise ShapeError("an affine layernorm needs both weight and bias")
        for what, shape in zip(("weight", "bias"), shapes[1:]):
            if shape != x[axis:]:
                raise ShapeError(f"{what} shape {list(shape)} must equal the normalized shape {list(x[axis:])}")
        return x, _same_elem(elems)

    def verify_(self) -> None:
        if self.epsilon.value.data <= 0:
            raise VerifyException(f"'{self.name}': eps must be positive, got {self.epsilon.value.data}")
        super().verify_()

    def gradient(self, g, e):
        x = self.input
        shape = global_shape(x.type)
        axis = self.axis.value.data
        axes = list(range(axis, len(shape)))
        mean = e.emit(ReduceMeanOp(x, axes, keepdims=True))
        xc = e.emit(SubOp(x, mean))
        var = e.emit(ReduceMeanOp(e.emit(MulOp(xc, xc)), axes, keepdims=True))
        rstd = e.emit(RsqrtOp(e.emit(AddOp(var, e.scalar(self.epsilon.value.data, x)))))
        xhat = e.emit(MulOp(xc, rstd))
        grads: list[SSAValue | None] = [None, None, None]
        dxhat = g
        if self.weight is not None:
            dxhat = e.emit(MulOp(g, self.weight))
            lead = list(range(axis))
            gw = e.emit(MulOp(g, xhat))
            grads[1] = e.emit(ReduceSumOp(gw, lead)) if lead else gw
            grads[2] = e.emit(ReduceSumOp(g, lead)) if lead else g
        m1 = e.emit(ReduceMeanOp(dxhat, axes, keepdims=True))
        m2 = e.emit(ReduceMeanOp(e.emit(MulOp(dxhat, xhat)), axes, keepdims=True))
        dx = e.emit(MulOp(rstd, e.emit(SubOp(e.emit(SubOp(dxhat, m1)), e.emit(MulOp(xhat, m2))))))
        grads[0] = dx
        return grads if self.weight is not None else [dx]


# --------------------------------------------------------------------------
# Reductions
# --------------------------------------------------------------------------


def _axes_prop(axes: Sequence[int], rank: int) -> DenseArrayBase[IntegerType]:
    return i64_array(sorted({a % max(rank, 1) for a in axes}))


class ReduceOp(LgOp, ABC):
    """Reduces the listed axes (sorted, distinct); `keepdims` keeps them as 1."""

    input = operand_def(TensorLike)
    axes = prop_def(DenseArrayBase.constr(i64))
    keepdims = opt_prop_def(UnitAttr)
    result = result_def(TensorLike)

    traits = traits_def(Pure())

    assembly_format = (
        "$input `axes` $axes (`keepdims` $keepdims^)? attr-dict `:` type($input) `->` type($result)"
    )

    def __init__(self, input: SSAValue, axes: Sequence[int], keepdims: bool = False):
        axes_prop = _axes_prop(axes, len(global_shape(input.type)))
        props: dict[str, Attribute] = {"axes": axes_prop}
        if keepdims:
            props["keepdims"] = UnitAttr()
        result_type = self.infer([input], axes=tuple(axes_prop.get_values()), keepdims=keepdims)
        super().__init__(operands=[input], properties=props, result_types=[result_type])

    def params(self):
        return {"axes": tuple(self.axes.get_values()), "keepdims": self.keepdims is not None}

    INTEGERS: ClassVar[bool] = False
    """Whether i32/i64 operands are taken too (counting a mask's tokens)."""

    @classmethod
    def rule(cls, shapes, elems, axes, keepdims):
        x = shapes[0]
        if not (cls.INTEGERS and is_index(elems[0])):
            _require_float("operand", elems[0])
        if list(axes) != sorted(set(axes)):
            raise ShapeError(f"axes {list(axes)} must be sorted and distinct")
        for a in axes:
            _check_axis(a, len(x))
        if keepdims:
            return tuple(1 if i in axes else d for i, d in enumerate(x)), elems[0]
        return tuple(d for i, d in enumerate(x) if i not in axes), elems[0]

    PARTIAL: ClassVar[str] = "P"
    """What a split on a reduced axis becomes, and the partial kind kept."""

    @classmethod
    def sbp_rule(cls, in_shapes, out_shape, p, axes, keepdims):
        """S on a reduced axis gives a partial result; S on a kept axis stays S."""
        sigs = []
        for i, d in enumerate(in_shapes[0]):
            if not _split_ok(d, p):
                continue
            if i in axes:
                sigs.append(((f"S{i}",), (cls.PARTIAL,)))
            else:
                out_axis = i if keepdims else i - sum(1 for a in axes if a < i)
                sigs.append(((f"S{i}",), (f"S{out_axis}",)))
        return sigs + _passthrough(1, (cls.PARTIAL,))

    @classmethod
    def flops(cls, in_shapes, out_shape, **params):
        return float(math.prod(in_shapes[0]))

    def _spread(self, g, e, scale: float | None = None) -> list[SSAValue | None]:
        """The gradient of a sum (times `scale`): g broadcast back over the reduced axes."""
        x_shape = global_shape(self.input.type)
        axes = list(self.axes.get_values())
        kept = tuple(1 if i in axes else d for i, d in enumerate(x_shape))
        if global_shape(g.type) != kept:
            g = e.emit(ReshapeOp(g, kept))
        if scale is not None:
            g = e.emit(MulOp(g, e.scalar(scale, g)))
        return [e.emit(BroadcastToOp(g, x_shape))]


@op_definition
class ReduceSumOp(ReduceOp):
    name = "lg.reduce_sum"
    INTEGERS: ClassVar[bool] = True

    def gradient(self, g, e):
        return self._spread(g, e)


@op_definition
class ReduceMeanOp(ReduceOp):
    name = "lg.reduce_mean"

    def gradient(self, g, e):
        return self._spread(g, e, 1.0 / math.prod(global_shape(self.input.type)[a] for a in self.axes.get_values()))


@op_definition
class ReduceMaxOp(ReduceOp):
    name = "lg.reduce_max"
    INTEGERS: ClassVar[bool] = True
    PARTIAL: ClassVar[str] = "Pmax"


@op_definition
class ArgmaxOp(LgOp):
    """The index (i64) of the largest element along `axis`, which the result
    drops: the first where several are largest, the first NaN where there is
    one (numpy's and PyTorch's `argmax`). Splits along the other axes pass
    through; the reduced axis must be whole (a piece's index and its maximum
    would have to travel together). No gradient flows through an index."""

    name = "lg.argmax"

    input = operand_def(TensorLike)
    axis = prop_def(IntegerAttr[I64])
    result = result_def(TensorLike)

    traits = traits_def(Pure())

    assembly_format = "$input `axis` $axis attr-dict `:` type($input) `->` type($result)"

    def __init__(self, input: SSAValue, axis: int):
        super().__init__(operands=[input], properties={"axis": IntegerAttr(axis, i64)},
                         result_types=[self.infer([input], axis=axis)])

    def params(self):
        return {"axis": self.axis.value.data}

    @classmethod
    def rule(cls, shapes, elems, axis):
        _require_value_type("operand", elems[0])
        _check_axis(axis, len(shapes[0]))
        if shapes[0][axis] == 0:
            raise ShapeError(f"axis {axis} is empty: no element to pick")
        return tuple(d for i, d in enumerate(shapes[0]) if i != axis), i64

    @classmethod
    def sbp_rule(cls, in_shapes, out_shape, p, axis):
        sigs = [((f"S{i}",), (f"S{i if i < axis else i - 1}",)) for i, d in enumerate(in_shapes[0])
                if i != axis and _split_ok(d, p)]
        return sigs + [(("B",), ("B",))]


# --------------------------------------------------------------------------
# Shape manipulation
# --------------------------------------------------------------------------


class ToShapeOp(LgOp, ABC):
    """An op whose target shape is its result type's shape."""

    input = operand_def(TensorLike)
    result = result_def(TensorLike)

    traits = traits_def(Pure())

    assembly_format = "$input attr-dict `:` type($input) `->` type($result)"

    def __init__(self, input: SSAValue, shape: Sequence[int]):
        super().__init__(operands=[input], result_types=[self.infer([input], shape=tuple(shape))])

    def params(self):
        return {"shape": global_shape(self.result.type)}


@op_definition
class ReshapeOp(ToShapeOp):
    """Same elements, row-major, in a new shape."""

    name = "lg.reshape"

    traits = traits_def(SameBytes())

    @classmethod
    def rule(cls, shapes, elems, shape):
        if math.prod(shapes[0]) != math.prod(shape):
            raise ShapeError(
                f"cannot reshape {list(shapes[0])} ({math.prod(shapes[0])} elements) to "
                f"{list(shape)} ({math.prod(shape)} elements)"
            )
        return tuple(shape), elems[0]

    @classmethod
    def sbp_rule(cls, in_shapes, out_shape, p, shape):
        """S<i> maps to the result axis j with the same leading element count
        (prod(in[:i]) == prod(out[:j])) when both axes divide by p: then every
        device's piece is one contiguous run of each leading block on both sides."""
        x = in_shapes[0]
        sigs = []
        for i, d in enumerate(x):
            if d < p or d % p:
                continue
            lead = math.prod(x[:i])
            for j, e in enumerate(out_shape):
                if math.prod(out_shape[:j]) == lead and e >= p and e % p == 0:
                    sigs.append(((f"S{i}",), (f"S{j}",)))
                    break
        return sigs + _passthrough(1, ("P", "Pmax"))

    def gradient(self, g, e):
        return [e.emit(ReshapeOp(g, global_shape(self.input.type)))]


@op_definition
class BroadcastToOp(ToShapeOp):
    """Expands size-1 and missing leading axes, as numpy.broadcast_to."""

    name = "lg.broadcast_to"

    @classmethod
    def rule(cls, shapes, elems, shape):
        if broadcast_shapes(shapes[0], tuple(shape)) != tuple(shape):
            raise ShapeError(f"cannot broadcast {list(shapes[0])} to {list(shape)}")
        return tuple(shape), elems[0]

    @classmethod
    def sbp_rule(cls, in_shapes, out_shape, p, shape):
        """A kept axis splits alike; an expanded axis can be split from a whole
        (B) input, each device materializing only its slice."""
        return _aligned_splits(in_shapes, out_shape, p) + _passthrough(1, ("P", "Pmax"))

    def gradient(self, g, e):
        return [e.unbroadcast(g, global_shape(self.input.type))]


@op_definition
class TransposeOp(LgOp):
    """Permutes axes: result axis i is operand axis perm[i]."""

    name = "lg.transpose"

    input = operand_def(TensorLike)
    perm = prop_def(DenseArrayBase.constr(i64))
    result = result_def(TensorLike)

    traits = traits_def(Pure())

    assembly_format = "$input `perm` $perm attr-dict `:` type($input) `->` type($result)"

    def __init__(self, input: SSAValue, perm: Sequence[int]):
        result_type = self.infer([input], perm=tuple(perm))
        super().__init__(
            operands=[input], properties={"perm": DenseArrayBase.from_list(i64, perm)}, result_types=[result_type]
        )

    def params(self):
        return {"perm": tuple(self.perm.get_values())}

    @classmethod
    def rule(cls, shapes, elems, perm):
        x = shapes[0]
        if sorted(perm) != list(range(len(x))):
            raise ShapeError(f"perm {list(perm)} is not a permutation of the {len(x)} axes")
        return tuple(x[p] for p in perm), elems[0]

    @classmethod
    def sbp_rule(cls, in_shapes, out_shape, p, perm):
        sigs = [((f"S{src}",), (f"S{i}",)) for i, src in enumerate(perm) if _split_ok(out_shape[i], p)]
        return sigs + _passthrough(1, ("P", "Pmax"))

    def gradient(self, g, e):
        perm = list(self.perm.get_values())
        return [e.emit(TransposeOp(g, [perm.index(i) for i in range(len(perm))]))]


@op_definition
class ConcatOp(LgOp):
    """Joins tensors along `axis`; all other axes must agree."""

    name = "lg.concat"

    inputs = var_operand_def(TensorLike)
    axis = prop_def(IntegerAttr[I64])
    result = result_def(TensorLike)

    traits = traits_def(Pure())

    assembly_format = "$inputs `axis` $axis attr-dict `:` functional-type($inputs, $result)"

    def __init__(self, inputs: Sequence[SSAValue], axis: int):
        axis = axis % max(len(global_shape(inputs[0].type)), 1)
        result_type = self.infer(inputs, axis=axis)
        super().__init__(operands=[inputs], properties={"axis": IntegerAttr(axis, i64)}, result_types=[result_type])

    def params(self):
        return {"axis": self.axis.value.data}

    @classmethod
    def rule(cls, shapes, elems, axis):
        if not shapes:
            raise ShapeError("needs at least one operand")
        first = shapes[0]
        _check_axis(axis, len(first))
        for s in shapes[1:]:
            if len(s) != len(first) or any(a != b for i, (a, b) in enumerate(zip(s, first)) if i != axis):
                raise ShapeError(f"shapes {[list(s) for s in shapes]} differ outside axis {axis}")
        if any(e != elems[0] for e in elems):
            raise ShapeError(f"operands must share one element type, got {', '.join(map(str, elems))}")
        return (*first[:axis], sum(s[axis] for s in shapes), *first[axis + 1 :]), elems[0]

    @classmethod
    def sbp_rule(cls, in_shapes, out_shape, p, axis):
        n = len(in_shapes)
        sigs = [((f"S{i}",) * n, (f"S{i}",)) for i, d in enumerate(out_shape) if i != axis and _split_ok(d, p)]
        return sigs + _passthrough(n, ("P", "Pmax"))

    def gradient(self, g, e):
        axis = self.axis.value.data
        out: list[SSAValue | None] = []
        at = 0
        full = global_shape(g.type)
        for value in self.inputs:
            n = global_shape(value.type)[axis]
            starts = [at if i == axis else 0 for i in range(len(full))]
            limits = [at + n if i == axis else d for i, d in enumerate(full)]
            out.append(e.emit(SliceOp(g, starts, limits)))
            at += n
        return out


@op_definition
class SliceOp(LgOp):
    """Strided slice: per axis, elements start, start+stride, ... below limit."""

    name = "lg.slice"

    input = operand_def(TensorLike)
    starts = prop_def(DenseArrayBase.constr(i64))
    limits = prop_def(DenseArrayBase.constr(i64))
    strides = prop_def(DenseArrayBase.constr(i64))
    result = result_def(TensorLike)

    traits = traits_def(Pure())

    assembly_format = (
        "$input `starts` $starts `limits` $limits `strides` $strides attr-dict `:` type($input) `->` type($result)"
    )

    def __init__(
        self, input: SSAValue, starts: Sequence[int], limits: Sequence[int], strides: Sequence[int] | None = None
    ):
        strides = list(strides) if strides is not None else [1] * len(starts)
        result_type = self.infer([input], starts=tuple(starts), limits=tuple(limits), strides=tuple(strides))
        super().__init__(
            operands=[input],
            properties={
                "starts": i64_array(starts),
                "limits": i64_array(limits),
                "strides": i64_array(strides),
            },
            result_types=[result_type],
        )

    def params(self):
        return {
            "starts": tuple(self.starts.get_values()),
            "limits": tuple(self.limits.get_values()),
            "strides": tuple(self.strides.get_values()),
        }

    @classmethod
    def rule(cls, shapes, elems, starts, limits, strides):
        x = shapes[0]
        if not len(starts) == len(limits) == len(strides) == len(x):
            raise ShapeError(f"starts, limits and strides need one entry per axis ({len(x)})")
        out = []
        for axis, (d, lo, hi, st) in enumerate(zip(x, starts, limits, strides)):
            if not (0 <= lo <= hi <= d and st >= 1):
                raise ShapeError(f"axis {axis}: need 0 <= start <= limit <= {d} and stride >= 1, got {lo}:{hi}:{st}")
            out.append(-(-(hi - lo) // st))
        return tuple(out), elems[0]

    @classmethod
    def sbp_rule(cls, in_shapes, out_shape, p, starts, limits, strides):
        """Only axes the slice keeps whole may be split."""
        x = in_shapes[0]
        sigs = [
            ((f"S{i}",), (f"S{i}",))
            for i, d in enumerate(x)
            if (starts[i], limits[i], strides[i]) == (0, d, 1) and _split_ok(d, p)
        ]
        return sigs + _passthrough(1, ("P", "Pmax"))

    def gradient(self, g, e):
        """The gradient placed back where the slice took it, zeros between:
        along a strided axis each element is first followed by stride - 1
        zeros (a unit axis added after it, padded, merged back), then every
        axis gets the zeros before its start and after its end."""
        p = self.params()
        x_shape = list(global_shape(self.input.type))
        current = g
        for axis, (lo, st) in enumerate(zip(p["starts"], p["strides"])):
            cur_shape = list(global_shape(current.type))
            length = cur_shape[axis]
            if st > 1 and length:
                widened = [*cur_shape[:axis + 1], 1, *cur_shape[axis + 1:]]
                high = [0] * len(widened)
                high[axis + 1] = st - 1
                spread = e.emit(PadOp(e.emit(ReshapeOp(current, widened)), [0] * len(widened), high))
                length = min(length * st, x_shape[axis] - lo)  # the last element's trailing zeros past the end go
                merged = [*cur_shape[:axis], cur_shape[axis] * st, *cur_shape[axis + 1:]]
                current = e.emit(ReshapeOp(spread, merged))
                if merged[axis] != length:
                    limits = list(merged)
                    limits[axis] = length
                    current = e.emit(SliceOp(current, [0] * len(merged), limits))
                cur_shape = list(global_shape(current.type))
            parts = []
            if lo:
                parts.append(e.zeros([*cur_shape[:axis], lo, *cur_shape[axis + 1:]], current))
            parts.append(current)
            if x_shape[axis] - lo - length:
                parts.append(e.zeros([*cur_shape[:axis], x_shape[axis] - lo - length, *cur_shape[axis + 1:]], current))
            if len(parts) > 1:
                current = e.emit(ConcatOp(parts, axis))
        return [current]


@op_definition
class PadOp(LgOp):
    """Constant padding: `low[i]` elements of `value` before axis i and
    `high[i]` after it (PyTorch's `constant_pad_nd`, `F.pad` in constant
    mode, with widths of at least 0). Axes without padding may be split."""

    name = "lg.pad"

    input = operand_def(TensorLike)
    low = prop_def(DenseArrayBase.constr(i64))
    high = prop_def(DenseArrayBase.constr(i64))
    value = prop_def(FloatAttr[Float64Type])
    result = result_def(TensorLike)

    traits = traits_def(Pure())

    assembly_format = "$input `low` $low `high` $high `value` $value attr-dict `:` type($input) `->` type($result)"

    def __init__(self, input: SSAValue, low: Sequence[int], high: Sequence[int], value: float = 0.0):
        result_type = self.infer([input], low=tuple(low), high=tuple(high), value=float(value))
        super().__init__(
            operands=[input],
            properties={"low": DenseArrayBase.from_list(i64, low), "high": DenseArrayBase.from_list(i64, high),
                        "value": FloatAttr(float(value), f64)},
            result_types=[result_type],
        )

    def params(self):
        return {"low": tuple(self.low.get_values()), "high": tuple(self.high.get_values()),
                "value": self.value.value.data}

    @classmethod
    def rule(cls, shapes, elems, low, high, value):
        x = shapes[0]
        if not len(low) == len(high) == len(x):
            raise ShapeError(f"low and high need one entry per axis ({len(x)})")
        if any(w < 0 for w in (*low, *high)):
            raise ShapeError(f"padding widths must be at least 0, got low {list(low)} high {list(high)}")
        _require_value_type("operand", elems[0])
        if not is_float(elems[0]) and value != int(value):
            raise ShapeError(f"a {elems[0]} tensor cannot be padded with {value}")
        return tuple(d + lo + hi for d, lo, hi in zip(x, low, high)), elems[0]

    @classmethod
    def sbp_rule(cls, in_shapes, out_shape, p, low, high, value):
        sigs = [((f"S{i}",), (f"S{i}",)) for i, d in enumerate(in_shapes[0])
                if low[i] == high[i] == 0 and _split_ok(d, p)]
        return sigs + [(("B",), ("B",))] + ([(("P",), ("P",))] if value == 0 else [])

    def gradient(self, g, e):
        if not is_float(element_type(self.input.type)):
            return [None]
        p = self.params()
        shape = global_shape(g.type)
        return [e.emit(SliceOp(g, p["low"], [d - hi for d, hi in zip(shape, p["high"])]))]


@op_definition
class CumsumOp(LgOp):
    """Running sum along `axis` (PyTorch's `cumsum`): element i is the sum
    of elements 0..i, or with `reverse` of elements i..end, of floats or
    integers. With the scanned axis split, each device computes what its
    elements add to every position of the whole axis (0 before them, their
    running sum along them, their total after them): a partial sum, so the
    scan needs no exchange of running totals between devices."""

    name = "lg.cumsum"

    input = operand_def(TensorLike)
    axis = prop_def(IntegerAttr[I64])
    reverse = opt_prop_def(UnitAttr)
    result = result_def(TensorLike)

    traits = traits_def(Pure())

    assembly_format = "$input `axis` $axis (`reverse` $reverse^)? attr-dict `:` type($input) `->` type($result)"

    def __init__(self, input: SSAValue, axis: int, reverse: bool = False):
        props: dict[str, Attribute] = {"axis": IntegerAttr(axis, i64)}
        if reverse:
            props["reverse"] = UnitAttr()
        super().__init__(operands=[input], properties=props,
                         result_types=[self.infer([input], axis=axis, reverse=reverse)])

    def params(self):
        return {"axis": self.axis.value.data, "reverse": self.reverse is not None}

    @classmethod
    def rule(cls, shapes, elems, axis, reverse):
        if not (is_float(elems[0]) or is_index(elems[0])):
            raise ShapeError(f"operand must be a float, i32 or i64 tensor, got {elems[0]}")
        _check_axis(axis, len(shapes[0]))
        return shapes[0], elems[0]

    @classmethod
    def sbp_rule(cls, in_shapes, out_shape, p, axis, reverse):
        sigs = [((f"S{i}",), (f"S{i}" if i != axis else "P",)) for i, d in enumerate(in_shapes[0]) if _split_ok(d, p)]
        return sigs + _passthrough(1, ("P",))

    def gradient(self, g, e):
        if not is_float(element_type(self.input.type)):
            return [None]
        return [e.emit(CumsumOp(g, self.axis.value.data, reverse=self.reverse is None))]


# --------------------------------------------------------------------------
# Random numbers
# --------------------------------------------------------------------------


DROPOUT_BITS = 24
"""Bits of each random word a keep decision compares: element e is kept when
its 24-bit draw is at least round(rate * 2^24) (exact in every backend)."""


def dropout_threshold(rate: float) -> int:
    return round(rate * (1 << DROPOUT_BITS))


@op_definition
class DropoutOp(LgOp):
    """Dropout: each element of `input` times 0 (dropped, with probability
    `rate`) or 1 / (1 - rate), as PyTorch's `dropout` in training.

    The decision for an element is a function of the seed, the step, the
    op's `stream` and the element's index in the whole (global) tensor only:
    the 24 high bits of word (index mod 4) of Philox4x32-10 (Random123) with
    key = seed (64 bits) and counter = (index / 4 as 64 bits, stream, step
    mod 2^32). So every plan draws the same mask: a device holding a piece
    computes its elements' indices from where the piece starts, and a copy
    made by lg-micro-batch maps its rows back to the batch's with
    `micro_batch` = (count, index, rows per example): micro-batch k of K
    holds examples k, k+K, ... (the same definition as the reference
    interpreter's on the whole batch). `seed` and `step` are i64 scalars
    (the frontend's `rng.seed` and `rng.step` state, which each step
    advances). Linear in `input`, so a split or a partial sum passes
    through, and its gradient is the same dropout of the incoming gradient
    (the mask drawn again, not stored)."""

    name = "lg.dropout"

    input = operand_def(TensorLike)
    seed = operand_def(TensorLike)
    step = operand_def(TensorLike)
    rate = prop_def(FloatAttr[Float64Type])
    stream = prop_def(IntegerAttr[I64])
    micro_batch = opt_prop_def(DenseArrayBase.constr(i64))
    result = result_def(TensorLike)

    traits = traits_def(Pure())

    FLOPS_PER_ELEMENT: ClassVar[float] = 16.0  # a Philox round's two multiplies and xors, ten rounds per four elements

    assembly_format = (
        "$input `,` $seed `,` $step `rate` $rate `stream` $stream (`micro_batch` $micro_batch^)? attr-dict `:` "
        "functional-type(operands, results)"
    )

    def __init__(self, input: SSAValue, seed: SSAValue, step: SSAValue, rate: float, stream: int,
                 micro_batch: Sequence[int] | None = None):
        props: dict[str, Attribute] = {"rate": FloatAttr(float(rate), f64), "stream": IntegerAttr(stream, i64)}
        if micro_batch is not None and tuple(micro_batch) != (1, 0, 1):
            props["micro_batch"] = DenseArrayBase.from_list(i64, list(micro_batch))
        operands = [input, seed, step]
        super().__init__(operands=operands, properties=props,
                         result_types=[self.infer(operands, **self._params_of(props))])

    @staticmethod
    def _params_of(props: dict[str, Attribute]) -> dict[str, Any]:
        batch = props.get("micro_batch")
        return {"rate": cast(FloatAttr, props["rate"]).value.data,
                "stream": cast(IntegerAttr, props["stream"]).value.data,
                "micro_batch": (1, 0, 1) if batch is None
                else tuple(cast("DenseArrayBase[IntegerType]", batch).get_values())}

    def params(self):
        return self._params_of(dict(self.properties))

    @classmethod
    def rule(cls, shapes, elems, rate, stream, micro_batch):
        if not is_float(elems[0]):
            raise ShapeError(f"input must be a float tensor, got {elems[0]}")
        for what, shape, elem in (("seed", shapes[1], elems[1]), ("step", shapes[2], elems[2])):
            if shape or elem != i64:
                raise ShapeError(f"{what} must be an i64 scalar, got {fmt_type(shape, elem)}")
        if not 0.0 <= rate < 1.0:
            raise ShapeError(f"rate must be in [0, 1), got {rate}")
        if not 0 <= stream < 1 << 32:
            raise ShapeError(f"stream must be in [0, 2^32), got {stream}")
        if len(micro_batch) != 3:
            raise ShapeError(f"micro_batch is (count, index, rows per example), got {list(micro_batch)}")
        count, index, rows = micro_batch
        if not (count >= 1 and 0 <= index < count and rows >= 1) or (count > 1 and not shapes[0]):
            raise ShapeError(f"micro_batch (count, index, rows per example) = {list(micro_batch)} is not a "
                             "micro-batch of a batch along axis 0")
        return shapes[0], elems[0]

    @classmethod
    def sbp_rule(cls, in_shapes, out_shape, p, **params):
        sigs = [((f"S{i}", "B", "B"), (f"S{i}",)) for i, d in enumerate(in_shapes[0]) if _split_ok(d, p)]
        return sigs + [(("B", "B", "B"), ("B",)), (("P", "B", "B"), ("P",))]

    def gradient(self, g, e):
        p = self.params()
        return [e.emit(DropoutOp(g, self.seed, self.step, p["rate"], p["stream"], p["micro_batch"])), None, None]


# --------------------------------------------------------------------------
# Convolutions
# --------------------------------------------------------------------------


def _conv_output_size(size: int, kernel: int, stride: int, padding: int, dilation: int) -> int:
    return (size + 2 * padding - dilation * (kernel - 1) - 1) // stride + 1


class _ConvOp(LgOp, ABC):
    """What a 2-D convolution and its gradients share: stride, padding and
    dilation (height, width) and the number of groups, as PyTorch's
    `conv2d` takes them; images are NCHW and weights (O, C/groups, kh, kw)."""

    stride = prop_def(DenseArrayBase.constr(i64))
    padding = prop_def(DenseArrayBase.constr(i64))
    dilation = prop_def(DenseArrayBase.constr(i64))
    groups = prop_def(IntegerAttr[I64])

    @staticmethod
    def _conv(stride, padding, dilation, groups: int) -> dict[str, Any]:
        """The convolution's keywords as the rules take them."""
        return {"stride": tuple(stride), "padding": tuple(padding), "dilation": tuple(dilation), "groups": groups}

    @staticmethod
    def _props(stride, padding, dilation, groups) -> dict[str, Attribute]:
        return {"stride": DenseArrayBase.from_list(i64, list(stride)),
                "padding": DenseArrayBase.from_list(i64, list(padding)),
                "dilation": DenseArrayBase.from_list(i64, list(dilation)), "groups": IntegerAttr(groups, i64)}

    def params(self):
        return {"stride": tuple(self.stride.get_values()), "padding": tuple(self.padding.get_values()),
                "dilation": tuple(self.dilation.get_values()), "groups": self.groups.value.data}

    @staticmethod
    def _check(image: Shape, weight: Shape, stride, padding, dilation, groups) -> tuple[int, int]:
        """The output's height and width, or a ShapeError."""
        if len(image) != 4 or len(weight) != 4:
            raise ShapeError(f"images must be NCHW and weights (O, C/groups, kh, kw), got {list(image)} and "
                             f"{list(weight)}")
        if not (len(stride) == len(padding) == len(dilation) == 2):
            raise ShapeError("stride, padding and dilation need 2 entries (height, width)")
        if min(stride) < 1 or min(dilation) < 1 or min(padding) < 0 or groups < 1:
            raise ShapeError(f"need stride >= 1, dilation >= 1, padding >= 0 and groups >= 1, got stride "
                             f"{list(stride)}, padding {list(padding)}, dilation {list(dilation)}, groups {groups}")
        if image[1] != weight[1] * groups or weight[0] % groups:
            raise ShapeError(f"{image[1]} input channels and {weight[0]} output channels do not fit weights "
                             f"{list(weight)} in {groups} groups")
        sizes = (_conv_output_size(image[2], weight[2], stride[0], padding[0], dilation[0]),
                 _conv_output_size(image[3], weight[3], stride[1], padding[1], dilation[1]))
        if min(sizes) < 1:
            raise ShapeError(f"the kernel {list(weight[2:])} (dilation {list(dilation)}) does not fit the padded "
                             f"image {[image[2] + 2 * padding[0], image[3] + 2 * padding[1]]}")
        return sizes


@op_definition
class Conv2dOp(_ConvOp):
    """2-D convolution (cross-correlation, as PyTorch's `conv2d`, without
    bias: the importer adds it): x (N, C, H, W), weight (O, C/groups, kh,
    kw) -> (N, O, Ho, Wo). A split batch stays split (data parallel);
    split output channels split the result (the weight split by rows);
    split input channels give a partial sum."""

    name = "lg.conv2d"

    input = operand_def(TensorLike)
    weight = operand_def(TensorLike)
    result = result_def(TensorLike)

    traits = traits_def(Pure())

    assembly_format = (
        "$input `,` $weight `stride` $stride `padding` $padding `dilation` $dilation `groups` $groups attr-dict "
        "`:` functional-type(operands, results)"
    )

    def __init__(self, input: SSAValue, weight: SSAValue, stride=(1, 1), padding=(0, 0), dilation=(1, 1),
                 groups: int = 1):
        params = self._conv(stride, padding, dilation, groups)
        super().__init__(operands=[input, weight], properties=self._props(**params),
                         result_types=[self.infer([input, weight], **params)])

    @classmethod
    def rule(cls, shapes, elems, stride, padding, dilation, groups):
        image, weight = shapes
        _require_float("input", elems[0])
        height, width = cls._check(image, weight, stride, padding, dilation, groups)
        return (image[0], weight[0], height, width), _same_elem(elems)

    @classmethod
    def sbp_rule(cls, in_shapes, out_shape, p, stride, padding, dilation, groups):
        image, weight = in_shapes
        sigs: list[Signature] = []
        if _split_ok(image[0], p):
            sigs.append((("S0", "B"), ("S0",)))
        if groups == 1 and _split_ok(weight[0], p):
            sigs.append((("B", "S0"), ("S1",)))
        if groups == 1 and _split_ok(image[1], p):
            sigs.append((("S1", "S1"), ("P",)))
        return sigs + [(("B", "B"), ("B",)), (("P", "B"), ("P",)), (("B", "P"), ("P",))]

    @classmethod
    def flops(cls, in_shapes, out_shape, **params):
        return 2.0 * math.prod(out_shape) * math.prod(in_shapes[1][1:])

    def gradient(self, g, e):
        p = self.params()
        image = global_shape(self.input.type)
        return [e.emit(Conv2dGradInputOp(g, self.weight, image[2:], **p)),
                e.emit(Conv2dGradWeightOp(self.input, g, global_shape(self.weight.type)[2:], **p))]


@op_definition
class Conv2dGradInputOp(_ConvOp):
    """The gradient of lg.conv2d for its input: (N, O, Ho, Wo) gradient and
    the weight -> (N, C, H, W) (a transposed convolution), `size` (H, W)."""

    name = "lg.conv2d_grad_input"

    grad = operand_def(TensorLike)
    weight = operand_def(TensorLike)
    size = prop_def(DenseArrayBase.constr(i64))
    result = result_def(TensorLike)

    traits = traits_def(Pure())

    assembly_format = (
        "$grad `,` $weight `size` $size `stride` $stride `padding` $padding `dilation` $dilation `groups` $groups "
        "attr-dict `:` functional-type(operands, results)"
    )

    def __init__(self, grad: SSAValue, weight: SSAValue, size, stride=(1, 1), padding=(0, 0), dilation=(1, 1),
                 groups: int = 1):
        params = self._conv(stride, padding, dilation, groups)
        props = {**self._props(**params), "size": DenseArrayBase.from_list(i64, list(size))}
        super().__init__(operands=[grad, weight], properties=props,
                         result_types=[self.infer([grad, weight], size=tuple(size), **params)])

    def params(self):
        return {**super().params(), "size": tuple(self.size.get_values())}

    @classmethod
    def rule(cls, shapes, elems, size, stride, padding, dilation, groups):
        grad, weight = shapes
        _require_float("grad", elems[0])
        if len(size) != 2 or len(grad) != 4 or len(weight) != 4:
            raise ShapeError(f"size needs (H, W), grad (N, O, Ho, Wo) and weight (O, C/groups, kh, kw), got "
                             f"{list(size)}, {list(grad)} and {list(weight)}")
        image = (grad[0], weight[1] * groups, *size)
        if tuple(grad[1:]) != (weight[0], *cls._check(image, weight, stride, padding, dilation, groups)):
            raise ShapeError(f"grad shape {list(grad)} is not the convolution's output for images of size "
                             f"{list(size)} and weights {list(weight)}")
        return image, _same_elem(elems)

    @classmethod
    def sbp_rule(cls, in_shapes, out_shape, p, size, stride, padding, dilation, groups):
        grad, weight = in_shapes
        sigs: list[Signature] = []
        if _split_ok(grad[0], p):
            sigs.append((("S0", "B"), ("S0",)))
        if groups == 1 and _split_ok(weight[0], p):
            sigs.append((("S1", "S0"), ("P",)))
        if groups == 1 and _split_ok(weight[1], p):
            sigs.append((("B", "S1"), ("S1",)))
        return sigs + [(("B", "B"), ("B",)), (("P", "B"), ("P",)), (("B", "P"), ("P",))]

    @classmethod
    def flops(cls, in_shapes, out_shape, **params):
        return 2.0 * math.prod(in_shapes[0]) * math.prod(in_shapes[1][1:])


@op_definition
class Conv2dGradWeightOp(_ConvOp):
    """The gradient of lg.conv2d for its weight: the input (N, C, H, W) and
    the (N, O, Ho, Wo) gradient -> (O, C/groups, kh, kw), `kernel` (kh, kw).
    A split batch gives a partial sum (each device's examples)."""

    name = "lg.conv2d_grad_weight"

    input = operand_def(TensorLike)
    grad = operand_def(TensorLike)
    kernel = prop_def(DenseArrayBase.constr(i64))
    result = result_def(TensorLike)

    traits = traits_def(Pure())

    assembly_format = (
        "$input `,` $grad `kernel` $kernel `stride` $stride `padding` $padding `dilation` $dilation `groups` "
        "$groups attr-dict `:` functional-type(operands, results)"
    )

    def __init__(self, input: SSAValue, grad: SSAValue, kernel, stride=(1, 1), padding=(0, 0), dilation=(1, 1),
                 groups: int = 1):
        params = self._conv(stride, padding, dilation, groups)
        props = {**self._props(**params), "kernel": DenseArrayBase.from_list(i64, list(kernel))}
        super().__init__(operands=[input, grad], properties=props,
                         result_types=[self.infer([input, grad], kernel=tuple(kernel), **params)])

    def params(self):
        return {**super().params(), "kernel": tuple(self.kernel.get_values())}

    @classmethod
    def rule(cls, shapes, elems, kernel, stride, padding, dilation, groups):
        image, grad = shapes
        _require_float("input", elems[0])
        if len(kernel) != 2 or len(grad) != 4 or len(image) != 4:
            raise ShapeError(f"kernel needs (kh, kw), input (N, C, H, W) and grad (N, O, Ho, Wo), got "
                             f"{list(kernel)}, {list(image)} and {list(grad)}")
        weight = (grad[1], image[1] // groups, *kernel)
        if (grad[0], *grad[2:]) != (image[0], *cls._check(image, weight, stride, padding, dilation, groups)):
            raise ShapeError(f"grad shape {list(grad)} is not the convolution's output for input {list(image)} and "
                             f"a kernel {list(kernel)}")
        return weight, _same_elem(elems)

    @classmethod
    def sbp_rule(cls, in_shapes, out_shape, p, kernel, stride, padding, dilation, groups):
        image, grad = in_shapes
        sigs: list[Signature] = []
        if _split_ok(image[0], p):
            sigs.append((("S0", "S0"), ("P",)))
        if groups == 1 and _split_ok(grad[1], p):
            sigs.append((("B", "S1"), ("S0",)))
        if groups == 1 and _split_ok(image[1], p):
            sigs.append((("S1", "B"), ("S1",)))
        return sigs + [(("B", "B"), ("B",)), (("P", "B"), ("P",)), (("B", "P"), ("P",))]

    @classmethod
    def flops(cls, in_shapes, out_shape, **params):
        return 2.0 * math.prod(in_shapes[1]) * math.prod(out_shape[1:])


class _PoolOp(LgOp, ABC):
    """What max pooling and its gradient share: the window (kh, kw), stride
    and padding (height, width) over NCHW images; padding counts as minus
    infinity (PyTorch's max_pool2d), so it is never the maximum."""

    kernel = prop_def(DenseArrayBase.constr(i64))
    stride = prop_def(DenseArrayBase.constr(i64))
    padding = prop_def(DenseArrayBase.constr(i64))

    @staticmethod
    def _props(kernel, stride, padding) -> dict[str, Attribute]:
        return {"kernel": DenseArrayBase.from_list(i64, list(kernel)),
                "stride": DenseArrayBase.from_list(i64, list(stride)),
                "padding": DenseArrayBase.from_list(i64, list(padding))}

    def params(self):
        return {"kernel": tuple(self.kernel.get_values()), "stride": tuple(self.stride.get_values()),
                "padding": tuple(self.padding.get_values())}

    @staticmethod
    def _pooled(image: Shape, kernel, stride, padding) -> tuple[int, int, int, int]:
        if len(image) != 4:
            raise ShapeError(f"images must be NCHW, got {list(image)}")
        if not (len(kernel) == len(stride) == len(padding) == 2):
            raise ShapeError("kernel, stride and padding need 2 entries (height, width)")
        if min(kernel) < 1 or min(stride) < 1 or min(padding) < 0 or any(2 * p > k for p, k in zip(padding, kernel)):
            raise ShapeError(f"need kernel >= 1, stride >= 1 and 0 <= padding <= kernel / 2, got kernel "
                             f"{list(kernel)}, stride {list(stride)}, padding {list(padding)}")
        sizes = (_conv_output_size(image[2], kernel[0], stride[0], padding[0], 1),
                 _conv_output_size(image[3], kernel[1], stride[1], padding[1], 1))
        if min(sizes) < 1:
            raise ShapeError(f"the window {list(kernel)} does not fit the padded image "
                             f"{[image[2] + 2 * padding[0], image[3] + 2 * padding[1]]}")
        return image[0], image[1], sizes[0], sizes[1]


@op_definition
class MaxPool2dOp(_PoolOp):
    """Each window's maximum (PyTorch's `max_pool2d`, without dilation or
    ceil mode): (N, C, H, W) -> (N, C, Ho, Wo). Batch and channels may be
    split; a maximum of candidates (P<max>) stays one."""

    name = "lg.max_pool2d"

    input = operand_def(TensorLike)
    result = result_def(TensorLike)

    traits = traits_def(Pure())

    assembly_format = (
        "$input `kernel` $kernel `stride` $stride `padding` $padding attr-dict `:` type($input) `->` type($result)"
    )

    def __init__(self, input: SSAValue, kernel, stride, padding=(0, 0)):
        params = {"kernel": tuple(kernel), "stride": tuple(stride), "padding": tuple(padding)}
        super().__init__(operands=[input], properties=self._props(**params),
                         result_types=[self.infer([input], **params)])

    @classmethod
    def rule(cls, shapes, elems, kernel, stride, padding):
        _require_float("input", elems[0])
        return cls._pooled(shapes[0], kernel, stride, padding), elems[0]

    @classmethod
    def sbp_rule(cls, in_shapes, out_shape, p, kernel, stride, padding):
        sigs = [((f"S{i}",), (f"S{i}",)) for i in (0, 1) if _split_ok(in_shapes[0][i], p)]
        return sigs + _passthrough(1, ("Pmax",))

    @classmethod
    def flops(cls, in_shapes, out_shape, kernel, **params):
        return float(math.prod(out_shape) * math.prod(kernel))

    def gradient(self, g, e):
        return [e.emit(MaxPool2dGradOp(self.input, g, **self.params()))]


@op_definition
class MaxPool2dGradOp(_PoolOp):
    """The gradient of lg.max_pool2d: each window's gradient goes to the
    first element (in row-major order) that holds its maximum, as PyTorch
    routes it; the images (N, C, H, W) and the gradient (N, C, Ho, Wo) ->
    (N, C, H, W)."""

    name = "lg.max_pool2d_grad"

    input = operand_def(TensorLike)
    grad = operand_def(TensorLike)
    result = result_def(TensorLike)

    traits = traits_def(Pure())

    assembly_format = (
        "$input `,` $grad `kernel` $kernel `stride` $stride `padding` $padding attr-dict `:` "
        "functional-type(operands, results)"
    )

    def __init__(self, input: SSAValue, grad: SSAValue, kernel, stride, padding=(0, 0)):
        params = {"kernel": tuple(kernel), "stride": tuple(stride), "padding": tuple(padding)}
        super().__init__(operands=[input, grad], properties=self._props(**params),
                         result_types=[self.infer([input, grad], **params)])

    @classmethod
    def rule(cls, shapes, elems, kernel, stride, padding):
        _require_float("input", elems[0])
        if tuple(shapes[1]) != cls._pooled(shapes[0], kernel, stride, padding):
            raise ShapeError(f"grad shape {list(shapes[1])} is not the pooling's output for images "
                             f"{list(shapes[0])}")
        return shapes[0], _same_elem(elems)

    @classmethod
    def sbp_rule(cls, in_shapes, out_shape, p, kernel, stride, padding):
        """Linear in the gradient: a partial gradient under whole images gives a partial result."""
        sigs = [((f"S{i}", f"S{i}"), (f"S{i}",)) for i in (0, 1) if _split_ok(in_shapes[0][i], p)]
        return sigs + [(("B", "B"), ("B",)), (("B", "P"), ("P",))]

    @classmethod
    def flops(cls, in_shapes, out_shape, kernel, **params):
        return float(math.prod(in_shapes[1]) * math.prod(kernel))


# --------------------------------------------------------------------------
# Gathers and losses
# --------------------------------------------------------------------------


@op_definition
class EmbeddingOp(LgOp):
    """Row gather: result[..., :] = table[indices[...], :]. With `padding`,
    the table's row of that index gets no gradient (PyTorch's `padding_idx`:
    BERT's padding token); the gather itself is unchanged."""

    name = "lg.embedding"

    table = operand_def(TensorLike)
    indices = operand_def(TensorLike)
    padding_idx = opt_prop_def(IntegerAttr[I64])
    result = result_def(TensorLike)

    traits = traits_def(Pure())

    assembly_format = (
        "$table `,` $indices (`padding` $padding_idx^)? attr-dict `:` functional-type(operands, results)"
    )

    def __init__(self, table: SSAValue, indices: SSAValue, padding_idx: int | None = None):
        props = {} if padding_idx is None else {"padding_idx": IntegerAttr(padding_idx, i64)}
        super().__init__(operands=[table, indices], properties=props, result_types=[self.infer([table, indices])])

    @property
    def padding(self) -> int | None:
        """The row that gets no gradient, if any."""
        return None if self.padding_idx is None else self.padding_idx.value.data

    def verify_(self) -> None:
        super().verify_()
        _verify_padding(self, self.padding, global_shape(self.table.type)[0])

    @classmethod
    def rule(cls, shapes, elems, **params):
        table, indices = shapes
        if len(table) != 2:
            raise ShapeError(f"table must have rank 2, got {list(table)}")
        _require_float("table", elems[0])
        if not is_index(elems[1]):
            raise ShapeError(f"indices must be i32 or i64, got {elems[1]}")
        return (*indices, table[1]), elems[0]

    @classmethod
    def sbp_rule(cls, in_shapes, out_shape, p, **params):
        """Table S<0>: each device gathers the rows it holds and zeros the
        others, a partial sum. Table S<1>: the embedding dim splits. Split
        indices split the result alike. Gathering is linear in the table."""
        table, indices = in_shapes
        last = len(out_shape) - 1
        sigs = [(("B", f"S{i}"), (f"S{i}",)) for i, d in enumerate(indices) if _split_ok(d, p)]
        if _split_ok(table[0], p):
            sigs.append((("S0", "B"), ("P",)))
        if _split_ok(table[1], p):
            sigs.append((("S1", "B"), (f"S{last}",)))
        return sigs + [(("B", "B"), ("B",)), (("P", "B"), ("P",))]

    def gradient(self, g, e):
        return [e.emit(EmbeddingGradOp(g, self.indices, global_shape(self.table.type)[0], self.padding)), None]


def _verify_padding(op: Operation, padding: int | None, rows: int) -> None:
    if padding is not None and not 0 <= padding < rows:
        raise VerifyException(f"'{op.name}': padding {padding} is not a row of the {rows}-row table")


def _logits_and_labels_rule(shapes: Sequence[Shape], elems: Sequence[Attribute]) -> None:
    """Float logits [..., C] and integer labels [...] of a cross-entropy."""
    logits, labels = shapes[:2]
    if len(logits) < 1:
        raise ShapeError("logits must have a class axis")
    _require_float("logits", elems[0])
    if not is_index(elems[1]):
        raise ShapeError(f"labels must be i32 or i64, got {elems[1]}")
    if labels != logits[:-1]:
        raise ShapeError(
            f"labels shape {list(labels)} must be the logits shape without its class axis {list(logits[:-1])}"
        )


@op_definition
class CrossEntropyOp(LgOp):
    """Mean softmax cross-entropy: logits [..., C], integer labels [...]."""

    name = "lg.cross_entropy"

    logits = operand_def(TensorLike)
    labels = operand_def(TensorLike)
    result = result_def(TensorLike)

    traits = traits_def(Pure())

    assembly_format = "$logits `,` $labels attr-dict `:` functional-type(operands, results)"

    def __init__(self, logits: SSAValue, labels: SSAValue):
        super().__init__(operands=[logits, labels], result_types=[self.infer([logits, labels])])

    @classmethod
    def rule(cls, shapes, elems, **params):
        _logits_and_labels_rule(shapes, elems)
        return (), elems[0]

    FLOPS_PER_ELEMENT: ClassVar[float] = 6.0
    SBP_NOTE: ClassVar[str] = (
        "class-split logits (S on the class axis) are not supported: they need a distributed "
        "max and sum-exp reduction; split the batch instead"
    )

    @classmethod
    def sbp_rule(cls, in_shapes, out_shape, p, **params):
        """Split batch axes give partial sums of the mean (each device divides
        its local sum by the global count)."""
        logits, _ = in_shapes
        sigs = [((f"S{i}", f"S{i}"), ("P",)) for i, d in enumerate(logits[:-1]) if _split_ok(d, p)]
        return sigs + [(("B", "B"), ("B",))]

    @classmethod
    def flops(cls, in_shapes, out_shape, **params):
        return cls.FLOPS_PER_ELEMENT * math.prod(in_shapes[0])

    def gradient(self, g, e):
        logits, labels = self.logits, self.labels
        count = math.prod(global_shape(labels.type)) or 1
        probs = e.emit(SoftmaxOp(logits, len(global_shape(logits.type)) - 1))
        onehot = e.emit(OneHotOp(labels, global_shape(logits.type)[-1], element_type(logits.type)))
        scaled = e.emit(MulOp(g, e.scalar(1.0 / count, g)))
        return [e.emit(MulOp(e.emit(SubOp(probs, onehot)), scaled)), None]


@op_definition
class MseLossOp(LgOp):
    """Mean squared error of two tensors of one shape."""

    name = "lg.mse_loss"

    lhs = operand_def(TensorLike)
    rhs = operand_def(TensorLike)
    result = result_def(TensorLike)

    traits = traits_def(Pure())

    assembly_format = "$lhs `,` $rhs attr-dict `:` functional-type(operands, results)"

    def __init__(self, lhs: SSAValue, rhs: SSAValue):
        super().__init__(operands=[lhs, rhs], result_types=[self.infer([lhs, rhs])])

    @classmethod
    def rule(cls, shapes, elems, **params):
        if shapes[0] != shapes[1]:
            raise ShapeError(f"operands must have one shape, got {list(shapes[0])} and {list(shapes[1])}")
        return (), _same_elem(elems)

    @classmethod
    def sbp_rule(cls, in_shapes, out_shape, p, **params):
        sigs = [((f"S{i}", f"S{i}"), ("P",)) for i, d in enumerate(in_shapes[0]) if _split_ok(d, p)]
        return sigs + [(("B", "B"), ("B",))]

    @classmethod
    def flops(cls, in_shapes, out_shape, **params):
        return 3.0 * math.prod(in_shapes[0])

    def gradient(self, g, e):
        count = math.prod(global_shape(self.lhs.type)) or 1
        diff = e.emit(SubOp(self.lhs, self.rhs))
        da = e.emit(MulOp(diff, e.emit(MulOp(g, e.scalar(2.0 / count, g)))))
        return [da, e.emit(NegOp(da))]


# --------------------------------------------------------------------------
# Vocabulary-parallel cross-entropy
# --------------------------------------------------------------------------
#
# Megatron's cross-entropy over logits split by class, in SBP terms: each
# row's max (lg.reduce_max: a partial max) and sum of exponentials
# (lg.sum_exp: a partial sum) are reduced across the class shards, and the
# loss of a row takes its target logit from the shard that holds it. No
# device forms a one-hot row of the vocabulary, forward or backward.


def _row_statistics_rule(what: str, row_shape: Shape, elem: Attribute, logits: Shape, logits_elem: Attribute) -> None:
    if row_shape != logits[:-1]:
        raise ShapeError(f"{what} shape {list(row_shape)} must be the logits shape without its class axis "
                         f"{list(logits[:-1])}")
    if elem != logits_elem:
        raise ShapeError(f"{what} must be {logits_elem} as the logits are, got {elem}")


def _row_signatures(in_shapes: Sequence[Shape], p: int, class_split: Signature, partial_ok: bool) -> list[Signature]:
    """Signatures of an op over rows of logits [..., C] and per-row operands:
    a split row axis splits every operand and the result alike; a split
    class axis (with the per-row operands whole) gives `class_split`."""
    logits = in_shapes[0]
    count = len(in_shapes)
    sigs: list[Signature] = [((f"S{i}",) * count, (f"S{i}",)) for i, d in enumerate(logits[:-1]) if _split_ok(d, p)]
    if logits and _split_ok(logits[-1], p):
        sigs.append(class_split)
    return sigs + [(("B",) * count, ("B",))] + ([(("B",) * (count - 1) + ("P",), ("P",))] if partial_ok else [])


@op_definition
class SumExpOp(LgOp):
    """Each row's sum of exponentials, sum_c exp(x[..., c] - shift[...]),
    over the last axis: x [..., C], shift [...] (the row's max, so that no
    term overflows) -> [...]. With x split over its last axis each device
    sums the classes it holds: a partial sum."""

    name = "lg.sum_exp"

    input = operand_def(TensorLike)
    shift = operand_def(TensorLike)
    result = result_def(TensorLike)

    traits = traits_def(Pure())

    assembly_format = "$input `,` $shift attr-dict `:` functional-type(operands, results)"

    def __init__(self, input: SSAValue, shift: SSAValue):
        super().__init__(operands=[input, shift], result_types=[self.infer([input, shift])])

    @classmethod
    def rule(cls, shapes, elems, **params):
        x, shift = shapes
        if len(x) < 1:
            raise ShapeError("operand must have an axis to sum over")
        _require_float("operand", elems[0])
        _row_statistics_rule("shift", shift, elems[1], x, elems[0])
        return x[:-1], elems[0]

    @classmethod
    def sbp_rule(cls, in_shapes, out_shape, p, **params):
        last = len(in_shapes[0]) - 1
        return _row_signatures(in_shapes, p, ((f"S{last}", "B"), ("P",)), partial_ok=False)

    @classmethod
    def flops(cls, in_shapes, out_shape, **params):
        return 3.0 * math.prod(in_shapes[0])

    def gradient(self, g, e):
        x_shape = global_shape(self.input.type)
        rows = (*x_shape[:-1], 1)
        shifted = e.emit(SubOp(self.input, e.emit(ReshapeOp(self.shift, rows))))
        dx = e.emit(MulOp(e.emit(ExpOp(shifted)), e.emit(ReshapeOp(g, rows))))
        return [dx, e.emit(NegOp(e.emit(MulOp(self.result, g))))]


class _TokenCrossEntropyBase(LgOp, ABC):
    """What the per-token cross-entropy and its gradient share. Each
    declares its operands itself (logits, labels, row_max, sum_exp, and the
    gradient's grad last): IRDL orders a subclass's fields first."""

    @property
    def ignored(self) -> int | None:
        """The label whose rows give no loss and no gradient, if any."""
        attr = self.properties.get("ignore_index")
        return attr.value.data if isinstance(attr, IntegerAttr) else None

    @staticmethod
    def _props(ignore_index: int | None) -> dict[str, Attribute]:
        return {} if ignore_index is None else {"ignore_index": IntegerAttr(ignore_index, i64)}

    @classmethod
    def _check_operands(cls, shapes, elems) -> None:
        logits, _, row_max, sum_exp = shapes[:4]
        _logits_and_labels_rule(shapes, elems)
        _row_statistics_rule("row_max", row_max, elems[2], logits, elems[0])
        _row_statistics_rule("sum_exp", sum_exp, elems[3], logits, elems[0])


@op_definition
class TokenCrossEntropyOp(_TokenCrossEntropyBase):
    """Each row's cross-entropy -log softmax(logits)[label] = log(sum_exp) +
    row_max - logits[label], from logits [..., C], integer labels [...] and
    the row statistics lg.reduce_max and lg.sum_exp computed of these
    logits -> [...]; a row whose label is `ignore_index` gives 0.

    With the logits split over classes, the device holding a row's label
    subtracts its logit and the device holding class 0 adds log(sum_exp) +
    row_max: a partial sum. The gradient for the logits is the whole
    derivative, softmax minus one-hot through the statistics too
    (lg.token_cross_entropy_grad), so the statistics get none: they must be
    those of the logits."""

    name = "lg.token_cross_entropy"

    logits = operand_def(TensorLike)
    labels = operand_def(TensorLike)
    row_max = operand_def(TensorLike)
    sum_exp = operand_def(TensorLike)
    ignore_index = opt_prop_def(IntegerAttr[I64])
    result = result_def(TensorLike)

    traits = traits_def(Pure())

    assembly_format = (
        "$logits `,` $labels `,` $row_max `,` $sum_exp (`ignore` $ignore_index^)? attr-dict `:` "
        "functional-type(operands, results)"
    )

    def __init__(self, logits: SSAValue, labels: SSAValue, row_max: SSAValue, sum_exp: SSAValue,
                 ignore_index: int | None = None):
        operands = [logits, labels, row_max, sum_exp]
        super().__init__(operands=operands, properties=self._props(ignore_index),
                         result_types=[self.infer(operands)])

    @classmethod
    def rule(cls, shapes, elems, **params):
        cls._check_operands(shapes, elems)
        return shapes[1], elems[0]

    @classmethod
    def sbp_rule(cls, in_shapes, out_shape, p, **params):
        last = len(in_shapes[0]) - 1
        return _row_signatures(in_shapes, p, ((f"S{last}", "B", "B", "B"), ("P",)), partial_ok=False)

    @classmethod
    def flops(cls, in_shapes, out_shape, **params):
        return 4.0 * math.prod(out_shape)

    def gradient(self, g, e):
        return [e.emit(TokenCrossEntropyGradOp(self.logits, self.labels, self.row_max, self.sum_exp, g,
                                               self.ignored)), None, None, None]


@op_definition
class TokenCrossEntropyGradOp(_TokenCrossEntropyBase):
    """The gradient of lg.token_cross_entropy for its logits: row r is
    grad[r] * (exp(logits[r] - row_max[r]) / sum_exp[r] - one_hot(label[r])),
    and 0 where the label is `ignore_index`. With the logits split over
    classes each device writes its classes; only the device holding a
    row's label subtracts grad[r] there."""

    name = "lg.token_cross_entropy_grad"

    logits = operand_def(TensorLike)
    labels = operand_def(TensorLike)
    row_max = operand_def(TensorLike)
    sum_exp = operand_def(TensorLike)
    grad = operand_def(TensorLike)
    ignore_index = opt_prop_def(IntegerAttr[I64])
    result = result_def(TensorLike)

    traits = traits_def(Pure())

    assembly_format = (
        "$logits `,` $labels `,` $row_max `,` $sum_exp `,` $grad (`ignore` $ignore_index^)? attr-dict `:` "
        "functional-type(operands, results)"
    )

    def __init__(self, logits: SSAValue, labels: SSAValue, row_max: SSAValue, sum_exp: SSAValue, grad: SSAValue,
                 ignore_index: int | None = None):
        operands = [logits, labels, row_max, sum_exp, grad]
        super().__init__(operands=operands, properties=self._props(ignore_index),
                         result_types=[self.infer(operands)])

    @classmethod
    def rule(cls, shapes, elems, **params):
        cls._check_operands(shapes, elems)
        _row_statistics_rule("grad", shapes[4], elems[4], shapes[0], elems[0])
        return shapes[0], elems[0]

    @classmethod
    def sbp_rule(cls, in_shapes, out_shape, p, **params):
        """Linear in the incoming gradient: a partial gradient under whole
        logits gives a partial result."""
        last = len(in_shapes[0]) - 1
        return _row_signatures(in_shapes, p, ((f"S{last}", "B", "B", "B", "B"), (f"S{last}",)), partial_ok=True)

    @classmethod
    def flops(cls, in_shapes, out_shape, **params):
        return 4.0 * math.prod(out_shape)


# --------------------------------------------------------------------------
# Ops that gradients need
# --------------------------------------------------------------------------


@op_definition
class OneHotOp(LgOp):
    """Integer labels [...] to float rows [..., classes] with a 1 at each
    label. A label equal to `ignore_index` gives a row of zeros: PyTorch's
    ignored cross-entropy targets (`ignore_index=-100`, nanoGPT's -1)."""

    name = "lg.one_hot"

    labels = operand_def(TensorLike)
    classes = prop_def(IntegerAttr[I64])
    ignore_index = opt_prop_def(IntegerAttr[I64])
    result = result_def(TensorLike)

    traits = traits_def(Pure())

    assembly_format = (
        "$labels `classes` $classes (`ignore` $ignore_index^)? attr-dict `:` type($labels) `->` type($result)"
    )

    def __init__(self, labels: SSAValue, classes: int, elem: Attribute, ignore_index: int | None = None):
        shape = (*global_shape(labels.type), classes)
        props: dict[str, Attribute] = {"classes": IntegerAttr(classes, i64)}
        if ignore_index is not None:
            props["ignore_index"] = IntegerAttr(ignore_index, i64)
        super().__init__(operands=[labels], properties=props, result_types=[TensorType(elem, shape)])

    def params(self):
        return {"classes": self.classes.value.data, "elem": element_type(self.result.type)}

    @property
    def ignored(self) -> int | None:
        """The label that gives a row of zeros, if any."""
        return None if self.ignore_index is None else self.ignore_index.value.data

    @classmethod
    def rule(cls, shapes, elems, classes, elem):
        if not is_index(elems[0]):
            raise ShapeError(f"labels must be i32 or i64, got {elems[0]}")
        if classes < 1:
            raise ShapeError(f"classes must be positive, got {classes}")
        _require_float("result", elem)
        return (*shapes[0], classes), elem

    @classmethod
    def sbp_rule(cls, in_shapes, out_shape, p, classes, elem):
        sigs = [((f"S{i}",), (f"S{i}",)) for i, d in enumerate(in_shapes[0]) if _split_ok(d, p)]
        return sigs + [(("B",), ("B",))]


@op_definition
class EmbeddingGradOp(LgOp):
    """The gradient of lg.embedding for its table: rows [rows, D] where row r
    is the sum of the gradient rows whose index is r (a scatter-add); the
    row `padding`, if given, stays zero."""

    name = "lg.embedding_grad"

    grad = operand_def(TensorLike)
    indices = operand_def(TensorLike)
    rows = prop_def(IntegerAttr[I64])
    padding_idx = opt_prop_def(IntegerAttr[I64])
    result = result_def(TensorLike)

    traits = traits_def(Pure())

    assembly_format = (
        "$grad `,` $indices `rows` $rows (`padding` $padding_idx^)? attr-dict `:` functional-type(operands, results)"
    )

    def __init__(self, grad: SSAValue, indices: SSAValue, rows: int, padding_idx: int | None = None):
        result_type = self.infer([grad, indices], rows=rows)
        props: dict[str, Attribute] = {"rows": IntegerAttr(rows, i64)}
        if padding_idx is not None:
            props["padding_idx"] = IntegerAttr(padding_idx, i64)
        super().__init__(operands=[grad, indices], properties=props, result_types=[result_type])

    @property
    def padding(self) -> int | None:
        """The row that stays zero, if any."""
        return None if self.padding_idx is None else self.padding_idx.value.data

    def verify_(self) -> None:
        super().verify_()
        _verify_padding(self, self.padding, self.rows.value.data)

    def params(self):
        return {"rows": self.rows.value.data}

    @classmethod
    def rule(cls, shapes, elems, rows):
        grad, indices = shapes
        _require_float("grad", elems[0])
        if not is_index(elems[1]):
            raise ShapeError(f"indices must be i32 or i64, got {elems[1]}")
        if grad[:-1] != indices or not grad:
            raise ShapeError(f"grad shape {list(grad)} must be the indices shape {list(indices)} plus one axis")
        return (rows, grad[-1]), elems[0]

    @classmethod
    def sbp_rule(cls, in_shapes, out_shape, p, rows):
        """Split index positions give partial tables (each device adds its
        rows); a split embedding dim stays split; linear in the gradient."""
        grad, indices = in_shapes
        sigs = [((f"S{i}", f"S{i}"), ("P",)) for i, d in enumerate(indices) if _split_ok(d, p)]
        if _split_ok(grad[-1], p):
            sigs.append(((f"S{len(grad) - 1}", "B"), ("S1",)))
        return sigs + [(("B", "B"), ("B",)), (("P", "B"), ("P",))]


# --------------------------------------------------------------------------
# Booleans, integers and casts (masks computed from the inputs)
# --------------------------------------------------------------------------


def _require_value_type(what: str, elem: Attribute) -> None:
    if not (is_float(elem) or is_index(elem) or is_bool(elem)):
        raise ShapeError(f"{what} must be a float, i32, i64 or i1 tensor, got {elem}")


def _gather_rule(what: str, data: Shape, indices: Shape, axis: int, index_elem: Attribute) -> None:
    _check_axis(axis, len(data))
    if not is_index(index_elem):
        raise ShapeError(f"indices must be i32 or i64, got {index_elem}")
    if len(indices) != len(data) or any(a != b for i, (a, b) in enumerate(zip(data, indices)) if i != axis):
        raise ShapeError(f"indices shape {list(indices)} must be the {what} shape {list(data)} but on axis {axis}")


@op_definition
class GatherOp(LgOp):
    """Elements picked along `axis` by computed indices (PyTorch's `gather`,
    numpy's `take_along_axis`): result[..., j, ...] = input[..., indices[...,
    j, ...], ...], the indices shaped as the input but on `axis`. With the
    input split on `axis` each device picks the elements it holds and zeros
    the others: a partial sum, as a vocabulary-split embedding."""

    name = "lg.gather"

    input = operand_def(TensorLike)
    indices = operand_def(TensorLike)
    axis = prop_def(IntegerAttr[I64])
    result = result_def(TensorLike)

    traits = traits_def(Pure())

    assembly_format = "$input `,` $indices `axis` $axis attr-dict `:` functional-type(operands, results)"

    def __init__(self, input: SSAValue, indices: SSAValue, axis: int):
        super().__init__(operands=[input, indices], properties={"axis": IntegerAttr(axis, i64)},
                         result_types=[self.infer([input, indices], axis=axis)])

    def params(self):
        return {"axis": self.axis.value.data}

    @classmethod
    def rule(cls, shapes, elems, axis):
        _require_value_type("input", elems[0])
        _gather_rule("input", shapes[0], shapes[1], axis, elems[1])
        return shapes[1], elems[0]

    @classmethod
    def sbp_rule(cls, in_shapes, out_shape, p, axis):
        data, indices = in_shapes
        sigs = [((f"S{i}", f"S{i}"), (f"S{i}",)) for i, d in enumerate(indices) if i != axis and _split_ok(d, p)]
        if _split_ok(indices[axis], p):
            sigs.append((("B", f"S{axis}"), (f"S{axis}",)))
        if _split_ok(data[axis], p):
            sigs.append(((f"S{axis}", "B"), ("P",)))
        return sigs + [(("B", "B"), ("B",)), (("P", "B"), ("P",))]

    def gradient(self, g, e):
        if not is_float(element_type(self.input.type)):
            return [None, None]
        size = global_shape(self.input.type)[self.axis.value.data]
        return [e.emit(ScatterAddOp(g, self.indices, self.axis.value.data, size)), None]


@op_definition
class ScatterAddOp(LgOp):
    """The gradient of lg.gather for its input: zeros of `size` along
    `axis`, with each update added where its index points (PyTorch's
    `scatter_add` into zeros)."""

    name = "lg.scatter_add"

    updates = operand_def(TensorLike)
    indices = operand_def(TensorLike)
    axis = prop_def(IntegerAttr[I64])
    size = prop_def(IntegerAttr[I64])
    result = result_def(TensorLike)

    traits = traits_def(Pure())

    assembly_format = (
        "$updates `,` $indices `axis` $axis `size` $size attr-dict `:` functional-type(operands, results)"
    )

    def __init__(self, updates: SSAValue, indices: SSAValue, axis: int, size: int):
        params = {"axis": axis, "size": size}
        super().__init__(operands=[updates, indices],
                         properties={k: IntegerAttr(v, i64) for k, v in params.items()},
                         result_types=[self.infer([updates, indices], **params)])

    def params(self):
        return {"axis": self.axis.value.data, "size": self.size.value.data}

    @classmethod
    def rule(cls, shapes, elems, axis, size):
        _require_float("updates", elems[0])
        _gather_rule("updates", shapes[0], shapes[1], axis, elems[1])
        if size < 0:
            raise ShapeError(f"size must be at least 0, got {size}")
        return tuple(size if i == axis else d for i, d in enumerate(shapes[0])), elems[0]

    @classmethod
    def sbp_rule(cls, in_shapes, out_shape, p, axis, size):
        """Split positions along `axis` give partial results (each device adds
        its updates); whole updates and indices may fill a result split on
        `axis` (each device keeps the rows it holds); linear in the updates."""
        updates, indices = in_shapes
        sigs = [((f"S{i}", f"S{i}"), (f"S{i}",)) for i, d in enumerate(indices) if i != axis and _split_ok(d, p)]
        if _split_ok(indices[axis], p):
            sigs.append(((f"S{axis}", f"S{axis}"), ("P",)))
        if _split_ok(size, p):
            sigs.append((("B", "B"), (f"S{axis}",)))
        return sigs + [(("B", "B"), ("B",)), (("P", "B"), ("P",))]


@op_definition
class CastOp(LgOp):
    """Elementwise conversion to another element type, as PyTorch's
    `.to(dtype)`: float to integer truncates toward zero, anything to i1 is
    `!= 0`, i1 to a number is 0 or 1. The gradient flows between float types
    only (an integer or boolean has none)."""

    name = "lg.cast"

    input = operand_def(TensorLike)
    result = result_def(TensorLike)

    traits = traits_def(Pure())

    assembly_format = "$input attr-dict `:` type($input) `->` type($result)"

    def __init__(self, input: SSAValue, elem: Attribute):
        super().__init__(operands=[input], result_types=[TensorType(elem, global_shape(input.type))])

    def params(self):
        return {"elem": element_type(self.result.type)}

    @classmethod
    def rule(cls, shapes, elems, elem):
        _require_value_type("operand", elems[0])
        _require_value_type("result", elem)
        return shapes[0], elem

    @classmethod
    def sbp_rule(cls, in_shapes, out_shape, p, elem):
        return _aligned_splits(in_shapes, out_shape, p) + [(("B",), ("B",))]

    def gradient(self, g, e):
        if not (is_float(element_type(self.input.type)) and is_float(element_type(self.result.type))):
            return [None]
        return [e.emit(CastOp(g, element_type(self.input.type)))]


class _KindedBinaryOp(LgOp, ABC):
    """An elementwise op of two tensors with numpy broadcasting whose
    `kind` (one of KINDS) says what it computes; no gradient flows through
    it (its result is boolean)."""

    lhs = operand_def(TensorLike)
    rhs = operand_def(TensorLike)
    kind = prop_def(StringAttr)
    result = result_def(TensorLike)

    traits = traits_def(Pure())

    assembly_format = "$kind $lhs `,` $rhs attr-dict `:` functional-type(operands, results)"

    KINDS: ClassVar[tuple[str, ...]] = ()

    def __init__(self, kind: str, lhs: SSAValue, rhs: SSAValue):
        props = {"kind": StringAttr(kind)}
        super().__init__(operands=[lhs, rhs], properties=props,
                         result_types=[self.infer([lhs, rhs], kind=kind)])

    def params(self):
        return {"kind": self.kind.data}

    @classmethod
    def _check_kind(cls, kind: str) -> None:
        if kind not in cls.KINDS:
            raise ShapeError(f"kind must be one of {', '.join(cls.KINDS)}, got '{kind}'")

    @classmethod
    def sbp_rule(cls, in_shapes, out_shape, p, kind):
        return _aligned_splits(in_shapes, out_shape, p) + [(("B", "B"), ("B",))]

    def gradient(self, g, e):
        return [None, None]


LOGICAL_KINDS = ("and", "or", "xor")


@op_definition
class LogicalOp(_KindedBinaryOp):
    """Elementwise `and`, `or` or `xor` of two i1 tensors, with numpy
    broadcasting (`not x` is `x xor true`)."""

    name = "lg.logical"
    KINDS: ClassVar[tuple[str, ...]] = LOGICAL_KINDS

    @classmethod
    def rule(cls, shapes, elems, kind):
        cls._check_kind(kind)
        for elem in elems:
            if not is_bool(elem):
                raise ShapeError(f"operands must be i1, got {elem}")
        return broadcast_shapes(*shapes), elems[0]


COMPARE_KINDS = ("eq", "ne", "lt", "le", "gt", "ge")


@op_definition
class CompareOp(_KindedBinaryOp):
    """Elementwise comparison `eq`, `ne`, `lt`, `le`, `gt` or `ge` of two
    tensors of one element type, with numpy broadcasting: an i1 tensor
    (PyTorch's `==`, `<`, ... on tensors: causal and padding masks built
    from positions, the count of labels not ignored)."""

    name = "lg.compare"
    KINDS: ClassVar[tuple[str, ...]] = COMPARE_KINDS

    @classmethod
    def rule(cls, shapes, elems, kind):
        cls._check_kind(kind)
        _require_value_type("operands", elems[0])
        if elems[0] != elems[1]:
            raise ShapeError(f"operands must share one element type, got {elems[0]}, {elems[1]}")
        return broadcast_shapes(*shapes), i1

@op_definition
class SelectOp(LgOp):
    """`where`: elementwise, `if_true` where the i1 condition holds and
    `if_false` elsewhere, all three broadcast as in numpy."""

    name = "lg.select"

    condition = operand_def(TensorLike)
    if_true = operand_def(TensorLike)
    if_false = operand_def(TensorLike)
    result = result_def(TensorLike)

    traits = traits_def(Pure())

    assembly_format = "$condition `,` $if_true `,` $if_false attr-dict `:` functional-type(operands, results)"

    def __init__(self, condition: SSAValue, if_true: SSAValue, if_false: SSAValue):
        super().__init__(operands=[condition, if_true, if_false],
                         result_types=[self.infer([condition, if_true, if_false])])

    @classmethod
    def rule(cls, shapes, elems, **params):
        if not is_bool(elems[0]):
            raise ShapeError(f"condition must be i1, got {elems[0]}")
        _require_value_type("values", elems[1])
        if elems[1] != elems[2]:
            raise ShapeError(f"values must share one element type, got {elems[1]}, {elems[2]}")
        return broadcast_shapes(*shapes), elems[1]

    @classmethod
    def sbp_rule(cls, in_shapes, out_shape, p, **params):
        """Linear in the two values together: partial values under one whole
        condition stay partial."""
        return _aligned_splits(in_shapes, out_shape, p) + [(("B", "B", "B"), ("B",)), (("B", "P", "P"), ("P",))]

    def gradient(self, g, e):
        zero = e.scalar(0.0, g)
        return [None,
                e.unbroadcast(e.emit(SelectOp(self.condition, g, zero)), global_shape(self.if_true.type)),
                e.unbroadcast(e.emit(SelectOp(self.condition, zero, g)), global_shape(self.if_false.type))]


UNARY_OPS = (NegOp, ReluOp, GeluOp, TanhOp, ErfOp, ExpOp, SqrtOp, RsqrtOp)
BINARY_OPS = (AddOp, SubOp, MulOp, DivOp)
REDUCE_OPS = (ReduceSumOp, ReduceMeanOp, ReduceMaxOp)
GRADIENT_OPS = (StepOp, OneHotOp, EmbeddingGradOp, TokenCrossEntropyGradOp, ScatterAddOp, Conv2dGradInputOp,
                Conv2dGradWeightOp, MaxPool2dGradOp)
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
        MatmulOp,
        Conv2dOp,
        MaxPool2dOp,
        SoftmaxOp,
        LogSoftmaxOp,
        LayerNormOp,
        *REDUCE_OPS,
        ArgmaxOp,
        ReshapeOp,
        BroadcastToOp,
        TransposeOp,
        ConcatOp,
        SliceOp,
        PadOp,
        CumsumOp,
        DropoutOp,
        EmbeddingOp,
        GatherOp,
        CrossEntropyOp,
        *CROSS_ENTROPY_OPS,
        MseLossOp,
        *GRADIENT_OPS,
        *MASK_OPS,
    ],
    [ZerosInitAttr, OnesInitAttr, FillInitAttr, NormalInitAttr, UniformInitAttr],
)

def graphs(module: ModuleOp) -> list[GraphOp]:
    """The graphs of a module, in order (a list: a pass may add ops to the
    module while it goes through them)."""
    return [op for op in module.ops if isinstance(op, GraphOp)]


COMPUTE_OPS: tuple[type[LgOp], ...] = tuple(op for op in LG.operations if issubclass(op, LgOp))
"""The ops that are kernels: every backend implements each of them."""

_BY_NAME: dict[str, type[Operation]] = {op.name: op for op in LG.operations}


MICRO_BATCH_ATTR = "lg.micro_batch"
"""Integer attribute: the micro-batch an op of lg-micro-batch's unrolled
graph works on (the ops autodiff adds inherit it through their operands)."""

SCHEDULE_ATTR = "lg.pipeline_schedule"
"""String attribute of a micro-batched lg.graph: the order in which each
pipeline stage runs its micro-batches' forward and backward passes."""

OPTIMIZER_STATE_PREFIXES = ("adam.m.", "adam.v.", "momentum.")
"""How the keys of a parameter's optimizer state begin (the parameter's
key follows): lg-optimizer names them so, and ZeRO, the planner and the
API's checkpoints find them by it."""
ADAM_STEP_KEY = "adam.step"
"""Adam's step count (i64 state), from which its bias corrections are computed."""
OPTIMIZER_STATE_KEYS = (*OPTIMIZER_STATE_PREFIXES, ADAM_STEP_KEY)
"""Every parameter key the optimizer adds begins so."""
SCHEDULES = ("gpipe", "1f1b")

RECOMPUTE_ATTR = "lg.recompute"
"""Unit attribute of an op that lg-recompute cloned to repeat a forward
value for the backward pass: sbp-to-plan runs it just before its use."""


def op_class(name: str) -> type[Operation]:
    """The lg op class named `name` (a plan's compute actors name their kernel)."""
    found = _BY_NAME.get(name)
    if found is None:
        raise KeyError(f"no lg op named '{name}'")
    return found


def ancestors(values: Sequence[SSAValue]) -> set[Operation]:
    """The ops that make `values` and everything they depend on."""
    seen: set[Operation] = set()
    todo = [v.owner for v in values]
    while todo:
        op = todo.pop()
        if isinstance(op, Operation) and op not in seen:
            seen.add(op)
            todo.extend(o.owner for o in op.operands)
    return seen


def op_flops(op: Operation) -> float:
    """The arithmetic of one lg op of a graph, at its global shapes (at least
    1: an op without a flop count, a source or a reshape, weighs one per
    result element, as moving it does)."""
    try:
        shapes = [global_shape(o.type) for o in op.operands]
        flops = float(type(op).flops(shapes, global_shape(op.results[0].type), **op.params()))  # type: ignore[attr-defined]
    except Exception:  # noqa: BLE001 - sources and ops without rules have no flop count
        flops = float(sum(math.prod(global_shape(r.type)) for r in op.results))
    return max(flops, 1.0)
