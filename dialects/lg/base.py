"""What every lg op shares: the `LgOp` base class (shape rule, SBP rule,
flops, gradient, verifier), the traits the passes and backends ask an op
for (never a list of ops), element types, and the helpers the op families'
rules are written with. The verifier's caches live here too: ops alike
(repeated layers share type objects) are checked once."""

from __future__ import annotations

import functools
import math
from abc import ABC
from collections.abc import Sequence
from typing import Any, ClassVar, Protocol

from xdsl.dialects.builtin import (
    BFloat16Type,
    Float16Type,
    Float32Type,
    Float64Type,
    IntegerType,
    SymbolRefAttr,
    TensorType,
)
from xdsl.ir import Attribute, Operation, SSAValue
from xdsl.irdl import IRDLOperation
from xdsl.traits import OpTrait
from xdsl.utils.exceptions import VerifyException

from ..irdl_verify import DirectInit, remember
from ..plain_sbp import plain_nd
from ..sbp import (
    PLACEMENT_ATTR,
    SIGNATURE_ATTR,
    DTensorType,
    PlacementOp,
    PlainNd,
    Sbp,
    element_type,
    global_shape,
    lookup_placement,
    tensor_type,
    verify_distribution,
    verify_placement_attr,
    verify_signature,
)

Shape = tuple[int, ...]


class ShapeError(Exception):
    """An op's operands do not fit its shape-and-dtype rule."""


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


def require_float(what: str, elem: Attribute) -> None:
    if not is_float(elem):
        raise ShapeError(f"{what} must have a float element type, got {elem}")


def same_element_type(elems: Sequence[Attribute]) -> Attribute:
    require_float("operands", elems[0])
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


def check_axis(axis: int, rank: int, what: str = "axis") -> None:
    if not 0 <= axis < rank:
        raise ShapeError(f"{what} {axis} is out of range for rank {rank}")


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


def split_ok(dim: int, p: int) -> bool:
    # Any non-empty axis may be split. With fewer elements than devices some
    # pieces are empty (PyTorch DTensor allows it too): a small batch on many
    # devices, or the last micro-batch of an uneven split. The cost model
    # prices them by the fullest device (cost_model.local_fraction).
    return dim >= 1


def source_signatures(out_shape: Shape, p: int) -> list[Signature]:
    sigs: list[Signature] = [((), ("B",))]
    return sigs + [((), (f"S{i}",)) for i, d in enumerate(out_shape) if split_ok(d, p)]


def aligned_splits(in_shapes: Sequence[Shape], out_shape: Shape, p: int) -> list[Signature]:
    """Elementwise with numpy broadcasting: splitting result axis i splits
    each operand on its aligned axis, or needs it whole (B) where the operand
    broadcasts along i."""
    sigs: list[Signature] = []
    rank = len(out_shape)
    for i, d in enumerate(out_shape):
        if not split_ok(d, p):
            continue
        ins = []
        for shape in in_shapes:
            j = i - (rank - len(shape))
            ins.append("B" if j < 0 or shape[j] != d else f"S{j}")
        sigs.append((tuple(ins), (f"S{i}",)))
    return sigs


def passthrough_signatures(count: int, kinds: Sequence[str]) -> list[Signature]:
    """All-B gives B; for each partial kind the op is linear (or monotone, for
    max) in, all operands of that kind give it."""
    sigs: list[Signature] = [(("B",) * count, ("B",))]
    return sigs + [((k,) * count, (k,)) for k in kinds]


KERNEL_KINDS = ("gemm", "window", "elementwise", "row", "layout", "gather")
"""How an op's kernel spends its time, for the device model's rates
(`perf.cluster`): GEMMs (matmuls) at the GEMM rate; window kernels
(convolutions: the windows they read copied, then GEMMs), priced by their
arithmetic at the GEMM rate too but scaled apart, as their copies and
narrow GEMMs cost them about twice a matmul's time per flop on a CPU;
elementwise arithmetic; row kernels, which reduce along an axis
(reductions, softmax, layernorm, the losses, pooling); layout kernels,
which only move bytes (reshape, transpose, concat, slice, pad); gathers and
scatters by index. A calibrated device measures a few kernels of each kind
by name, and prices every other kernel as its kind."""
GEMM_RATE_KINDS = ("gemm", "window")
"""The kinds whose arithmetic runs at the GEMM rate."""


class SbpRules:
    """How an op may be distributed: its valid 1-D SBP signatures and its
    work, as plain data next to the op's shape rule. sbp-infer builds N-D
    signatures from these, one mesh axis at a time."""

    FLOPS_PER_ELEMENT: ClassVar[float] = 1.0
    KERNEL_KIND: ClassVar[str] = "elementwise"
    """One of KERNEL_KINDS: how the op's kernel spends its time."""
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
    @functools.lru_cache(maxsize=1 << 12)
    def grouped_signatures(
        cls, in_shapes: tuple[Shape, ...], out_shape: Shape, p: int, params: tuple[tuple[str, Any], ...] = ()
    ) -> list[tuple[PlainNd, PlainNd]]:
        """`signatures` and their twins on rows grouped by expert
        (`grouped_twin`): what an op may take where one routing's ends say
        whose rows are whose (dialects/row_groups.py). Asked for only there:
        elsewhere the twins would be candidates for sbp-infer to drop."""
        sigs = cls.signatures(in_shapes, out_shape, p, params)
        return sigs + [twin for sig in sigs if (twin := grouped_twin(sig, in_shapes, out_shape)) not in sigs
                       and twin is not None]

    @classmethod
    def flops(cls, *args: Any, **params: Any) -> float:
        """flops(in_shapes, out_shape, **properties): arithmetic of the whole (global) op."""
        out_shape: Shape = args[1]
        return cls.FLOPS_PER_ELEMENT * math.prod(out_shape)

    @classmethod
    def bytes_touched(cls, operand_bytes: Sequence[float], result_bytes: float) -> float:
        """The bytes the kernel reads and writes, from the sizes of its
        operands and its result (global or one device's, alike): each
        operand read whole and the result written, unless the op reads only
        part of an operand (a slice, a gather of rows)."""
        return sum(operand_bytes) + result_bytes


def grouped_twin(sig: tuple[PlainNd, PlainNd], in_shapes: Sequence[Shape], out_shape: Shape
                 ) -> tuple[PlainNd, PlainNd] | None:
    """A signature on rows grouped by expert (G) from one on rows split
    evenly: where the result is S(0) and so is every operand with the
    result's rows (at least one), each row of the result is computed from
    the same rows of those operands alone (the rule holds for every even
    split), so it is computed from grouped rows the same way. A grouped
    tensor is stored whole, so the kernel is the one that runs on B."""
    (ins, outs) = sig
    if outs[0] != Sbp.S(0) or not out_shape:
        return None
    rows = [i for i, s in enumerate(ins) if s == Sbp.S(0)]
    if not rows or any(in_shapes[i][0] != out_shape[0] for i in rows):
        return None
    return (tuple(Sbp.G if i in rows else s for i, s in enumerate(ins)), (Sbp.G,))


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


def require_value_type(what: str, elem: Attribute) -> None:
    if not (is_float(elem) or is_index(elem) or is_bool(elem)):
        raise ShapeError(f"{what} must be a float, i32, i64 or i1 tensor, got {elem}")
