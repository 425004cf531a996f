"""The `sbp` dialect: how a global tensor lies across the devices of a mesh.

OneFlow's SBP (arXiv 2110.15032): every mesh axis holds a tensor either Split
along one tensor axis (`S<i>`), Broadcast (`B`, a full copy on every device) or
Partial (`P`, every device holds a summand; `P<max>` holds candidates of a
max). A list with one entry per mesh axis is an nd-SBP. Placements, the
distributed tensor type, the annotation op and the collective ("boxing") ops
live here. The dialect knows nothing of `lg`; `lg` ops accept its types.

Syntax, in short form inside lists, types and signatures:

    #sbp.S<0>   #sbp.B   #sbp.P   #sbp.P<max>
    #sbp.nd<[S<0>, B]>                      (a single entry may drop the [])
    #sbp.sig<(S<0>, B) -> (S<0>)>           (one nd-SBP per operand/result)
    !sbp.dtensor<8x16xf32, @mesh, [S<0>, B]>
    sbp.placement @mesh cpu ranks [0, 1, 2, 3] mesh [2, 2]
"""

from __future__ import annotations

import functools
import math
import weakref
from abc import ABC
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import auto

from xdsl.dialects.builtin import (
    I64,
    ArrayAttr,
    DenseArrayBase,
    IntAttr,
    IntegerAttr,
    IntegerType,
    StringAttr,
    SymbolNameConstraint,
    SymbolRefAttr,
    TensorType,
    i64,
)
from xdsl.dialects.utils import EnumAttribute
from xdsl.ir import (
    Attribute,
    Dialect,
    Operation,
    ParametrizedAttribute,
    SpacedOpaqueSyntaxAttribute,
    SSAValue,
    TypeAttribute,
)
from xdsl.irdl import (
    AttrSizedOperandSegments,
    IRDLOperation,
    base,
    irdl_attr_definition,
    operand_def,
    opt_operand_def,
    opt_prop_def,
    prop_def,
    result_def,
    traits_def,
)
from xdsl.parser import AttrParser
from xdsl.printer import Printer
from xdsl.traits import Pure, SymbolOpInterface, SymbolTable
from xdsl.utils.exceptions import VerifyException
from xdsl.utils.str_enum import StrEnum

from .builders import i64_array, i64_attr
from .irdl_verify import DirectInit, class_has_trait, op_definition, remember
from .plain_sbp import PlainNd, PlainSbp, Sbp, format_plain, hierarchy_violation

# --------------------------------------------------------------------------
# SBP attributes
# --------------------------------------------------------------------------


def parse_verified(cls: type[ParametrizedAttribute], parser: AttrParser, parse) -> Sequence[Attribute]:
    """Runs `parse` for the parameters of `cls` and verifies them at once, so a
    semantic error in an attribute is reported at its place in the source
    instead of as a location-less exception."""
    start = parser.pos
    params = parse()
    try:
        cls.new(params)
    except VerifyException as e:
        parser.raise_error(str(e), start, parser.pos)
    return params


class SbpAttr(ParametrizedAttribute, ABC):
    """One mesh axis' distribution: split, broadcast or partial."""

    def print_short(self, printer: Printer) -> None:
        """Prints the form used inside lists: `S<0>`, `B`, `P`, `P<max>`."""
        printer.print_string(format_nd((to_plain(self),)))


class _OneInteger(SbpAttr):
    """An SBP with one integer parameter, written in angle brackets (`S<0>`, `I<16>`)."""

    @classmethod
    def parse_parameters(cls, parser: AttrParser) -> Sequence[Attribute]:
        def parse():
            with parser.in_angle_brackets():
                return (IntAttr(parser.parse_integer(allow_boolean=False)),)

        return parse_verified(cls, parser, parse)

    def print_parameters(self, printer: Printer) -> None:
        value = self.parameters[0]
        assert isinstance(value, IntAttr)  # the one parameter each subclass declares
        with printer.in_angle_brackets():
            printer.print_int(value.data)


@irdl_attr_definition
class SplitAttr(_OneInteger):
    """`S<axis>`: each device of the mesh axis holds one slice along `axis`."""

    name = "sbp.S"
    axis: IntAttr

    def __init__(self, axis: int | IntAttr):
        super().__init__(IntAttr(axis) if isinstance(axis, int) else axis)

    def verify(self) -> None:
        if self.axis.data < 0:
            raise VerifyException(f"split axis must be non-negative, got {self.axis.data}")


@irdl_attr_definition
class BroadcastAttr(SbpAttr):
    """`B`: every device of the mesh axis holds the whole tensor."""

    name = "sbp.B"


@irdl_attr_definition
class GroupedAttr(SbpAttr):
    """`G`: rows grouped by expert at run time. The tensor's rows are sorted
    by expert and a vector of cumulative group ends (a router's counts,
    computed at run time: lg.grouped_matmul's `ends`) says where each
    expert's rows stop. With the experts split over the mesh axis as S(0)
    splits the experts' weights, the device owning experts [e0, e1) owns
    the rows from `ends[e0 - 1]` (0 for the first) up to `ends[e1 - 1]`: a
    split of the rows whose boundaries are known only at run time. Each device stores the tensor whole, its own
    rows at their places (the bound: one expert may get every row); the
    other rows are not its to read. Collectives into or out of G read the
    ends to size what they move (MPI's v-collectives)."""

    name = "sbp.G"


class ReduceKind(StrEnum):
    SUM = auto()
    MAX = auto()


@irdl_attr_definition
class PartialAttr(SbpAttr):
    """`P` / `P<max>`: the global value is the sum (max) of the devices' pieces."""

    name = "sbp.P"
    kind: StringAttr

    def __init__(self, kind: str | ReduceKind = ReduceKind.SUM):
        super().__init__(StringAttr(str(kind)))

    @property
    def reduce_kind(self) -> ReduceKind:
        return ReduceKind(self.kind.data)

    @classmethod
    def parse_parameters(cls, parser: AttrParser) -> Sequence[Attribute]:
        if parser.parse_optional_punctuation("<") is None:
            return (StringAttr(ReduceKind.SUM),)
        kind = parser.parse_str_enum(ReduceKind)
        parser.parse_punctuation(">")
        return (StringAttr(kind),)

    def print_parameters(self, printer: Printer) -> None:
        if self.reduce_kind is not ReduceKind.SUM:
            with printer.in_angle_brackets():
                printer.print_string(self.kind.data)

    def verify(self) -> None:
        if self.kind.data not in set(ReduceKind):
            raise VerifyException(
                f"partial reduction must be one of {', '.join(ReduceKind)}, got '{self.kind.data}'"
            )


@irdl_attr_definition
class IndexedAttr(_OneInteger):
    """`I<n>`: rows gathered from a table of n rows split evenly (S(0)) over
    the mesh axis, each row held by the device that holds the table row it
    was gathered from: row j by the holder of table row `index[j]`, for an
    index computed at run time (the tokens a router sorts by expert). A
    gather from a split table computes exactly those rows, with no
    communication; an all_to_all then sends each row where its expert is
    (into rows grouped by expert, G), and back. Each device stores the
    tensor whole (the bound: it may hold every row); the other rows are not
    its to read. Collectives into or out of I read the index."""

    name = "sbp.I"
    rows: IntAttr

    def __init__(self, rows: int | IntAttr):
        super().__init__(IntAttr(rows) if isinstance(rows, int) else rows)

    def verify(self) -> None:
        if self.rows.data < 1:
            raise VerifyException(f"the table of rows gathered by an index has at least one row, got {self.rows.data}")


_SBP_BY_KEYWORD: dict[str, type[SbpAttr]] = {"S": SplitAttr, "B": BroadcastAttr, "P": PartialAttr,
                                             "G": GroupedAttr, "I": IndexedAttr}


def parse_sbp(parser: AttrParser) -> SbpAttr:
    """Parses the short form `S<0>`, `B`, `P`, `P<max>`, `G` or `I<rows>`."""
    keyword = parser.parse_keyword_in(_SBP_BY_KEYWORD, " for an SBP (S<axis>, B, P, G or I<rows>)")
    cls = _SBP_BY_KEYWORD[keyword]
    return cls.new(cls.parse_parameters(parser))


@irdl_attr_definition
class NdSbpAttr(ParametrizedAttribute):
    """One SBP per mesh axis, outermost mesh axis first."""

    name = "sbp.nd"
    entries: ArrayAttr[SbpAttr]

    def __init__(self, entries: Sequence[SbpAttr] | ArrayAttr[SbpAttr]):
        super().__init__(entries if isinstance(entries, ArrayAttr) else ArrayAttr(entries))

    def __len__(self) -> int:
        return len(self.entries.data)

    def __iter__(self):
        return iter(self.entries.data)

    def __getitem__(self, index: int) -> SbpAttr:
        return self.entries.data[index]

    @classmethod
    def parse_short(cls, parser: AttrParser) -> NdSbpAttr:
        """`[S<0>, B]`, or a single entry without brackets."""
        if parser.parse_optional_punctuation("[") is None:
            return cls([parse_sbp(parser)])
        entries = parser.parse_comma_separated_list(parser.Delimiter.NONE, lambda: parse_sbp(parser))
        parser.parse_punctuation("]")
        return cls(entries)

    def print_short(self, printer: Printer) -> None:
        printer.print_string(format_nd(self))

    @classmethod
    def parse_parameters(cls, parser: AttrParser) -> Sequence[Attribute]:
        def parse():
            with parser.in_angle_brackets():
                return (cls.parse_short(parser).entries,)

        return parse_verified(cls, parser, parse)

    def print_parameters(self, printer: Printer) -> None:
        with printer.in_angle_brackets():
            self.print_short(printer)

    def verify(self) -> None:
        if not self.entries.data:
            raise VerifyException("an nd-SBP needs at least one entry (one per mesh axis)")
        owned = sum(isinstance(e, GroupedAttr | IndexedAttr) for e in self.entries.data)
        if owned and (owned > 1 or any(isinstance(e, SplitAttr) and e.axis.data == 0 for e in self.entries.data)):
            raise VerifyException(
                "rows grouped by expert (G) or gathered by an index (I) are on one mesh axis and not split (S<0>) "
                f"by another: got {format_nd(self)}"
            )


def _parse_nd_list(parser: AttrParser) -> ArrayAttr[NdSbpAttr]:
    return ArrayAttr(
        parser.parse_comma_separated_list(parser.Delimiter.PAREN, lambda: NdSbpAttr.parse_short(parser))
    )


def _print_nd_list(printer: Printer, nds: ArrayAttr[NdSbpAttr]) -> None:
    with printer.in_parens():
        printer.print_list(nds.data, lambda nd: nd.print_short(printer))


@irdl_attr_definition
class SignatureAttr(ParametrizedAttribute):
    """The SBP signature of an op: one nd-SBP per operand and per result."""

    name = "sbp.sig"
    inputs: ArrayAttr[NdSbpAttr]
    outputs: ArrayAttr[NdSbpAttr]

    def __init__(self, inputs: Sequence[NdSbpAttr], outputs: Sequence[NdSbpAttr]):
        super().__init__(ArrayAttr(inputs), ArrayAttr(outputs))

    @classmethod
    def parse_parameters(cls, parser: AttrParser) -> Sequence[Attribute]:
        def parse():
            with parser.in_angle_brackets():
                inputs = _parse_nd_list(parser)
                parser.parse_punctuation("->")
                outputs = _parse_nd_list(parser)
            return (inputs, outputs)

        return parse_verified(cls, parser, parse)

    def print_parameters(self, printer: Printer) -> None:
        with printer.in_angle_brackets():
            _print_nd_list(printer, self.inputs)
            printer.print_string(" -> ")
            _print_nd_list(printer, self.outputs)

    def verify(self) -> None:
        widths = {len(nd) for nd in (*self.inputs.data, *self.outputs.data)}
        if len(widths) > 1:
            raise VerifyException(
                f"all nd-SBPs of a signature must have one entry per mesh axis, got widths {sorted(widths)}"
            )


# --------------------------------------------------------------------------
# Placement
# --------------------------------------------------------------------------


class DeviceKind(StrEnum):
    CPU = auto()
    CUDA = auto()


@irdl_attr_definition
class DeviceKindAttr(EnumAttribute[DeviceKind], SpacedOpaqueSyntaxAttribute):
    name = "sbp.device"


@dataclass(frozen=True)
class Mesh:
    """A placement as plain data, for passes that must not touch xDSL attributes."""

    name: str
    device: DeviceKind
    ranks: tuple[int, ...]
    shape: tuple[int, ...]

    @property
    def size(self) -> int:
        return len(self.ranks)


@op_definition
class PlacementOp(IRDLOperation):
    """A named device mesh: device kind, the ranks it uses, and its shape.

    Devices are laid out row-major: `ranks[i]` sits at the mesh coordinate whose
    row-major linear index is `i`.
    """

    name = "sbp.placement"

    sym_name = prop_def(SymbolNameConstraint())
    device = prop_def(DeviceKindAttr)
    ranks = prop_def(DenseArrayBase.constr(i64))
    shape = prop_def(DenseArrayBase.constr(i64))

    traits = traits_def(SymbolOpInterface())

    assembly_format = "$sym_name $device `ranks` $ranks `mesh` $shape attr-dict"

    def __init__(self, name: str, device: DeviceKind | str, ranks: Sequence[int], shape: Sequence[int]):
        super().__init__(
            properties={
                "sym_name": StringAttr(name),
                "device": DeviceKindAttr(DeviceKind(device)),
                "ranks": DenseArrayBase.from_list(i64, ranks),
                "shape": DenseArrayBase.from_list(i64, shape),
            }
        )

    def mesh(self) -> Mesh:
        # Verifiers ask for the mesh of every dtensor of every op; unpacking
        # the attributes each time dominated module verification. The cache
        # holds the attributes it was built from and is rebuilt when any
        # differs (properties are replaced, never mutated). The tuples
        # compare their attributes by identity first, and equal ones make
        # the same mesh.
        properties = self.properties
        key = (properties["sym_name"], properties["device"], properties["ranks"], properties["shape"])
        cached = self.__dict__.get("_mesh_cache")
        if cached is not None and cached[0] == key:
            return cached[1]
        mesh = Mesh(
            self.sym_name.data,
            self.device.data,
            tuple(self.ranks.get_values()),
            tuple(self.shape.get_values()),
        )
        self.__dict__["_mesh_cache"] = (key, mesh)
        return mesh

    def verify_(self) -> None:
        ranks = self.ranks.get_values()
        shape = self.shape.get_values()
        if not shape:
            raise VerifyException(f"'{self.name}' @{self.sym_name.data}: the mesh needs at least one axis")
        if any(d <= 0 for d in shape):
            raise VerifyException(
                f"'{self.name}' @{self.sym_name.data}: mesh dimensions must be positive, got {list(shape)}"
            )
        if math.prod(shape) != len(ranks):
            raise VerifyException(
                f"'{self.name}' @{self.sym_name.data}: mesh shape {list(shape)} holds {math.prod(shape)} devices "
                f"but {len(ranks)} ranks are given"
            )
        if any(r < 0 for r in ranks) or len(set(ranks)) != len(ranks):
            raise VerifyException(
                f"'{self.name}' @{self.sym_name.data}: ranks must be distinct and non-negative, got {list(ranks)}"
            )


# --------------------------------------------------------------------------
# The distributed tensor type
# --------------------------------------------------------------------------


@irdl_attr_definition
class DTensorType(ParametrizedAttribute, TypeAttribute):
    """A global tensor placed on a mesh with one SBP per mesh axis.

    The shape is the global (logical) shape; the local piece on a device
    follows from the nd-SBP and the device's mesh coordinate.
    """

    name = "sbp.dtensor"
    shape: ArrayAttr[IntAttr]
    element_type: Attribute
    placement: SymbolRefAttr
    nd_sbp: NdSbpAttr

    def __init__(
        self,
        shape: Sequence[int],
        element_type: Attribute,
        placement: str | SymbolRefAttr,
        nd_sbp: NdSbpAttr | Sequence[SbpAttr],
    ):
        super().__init__(
            ArrayAttr([IntAttr(d) for d in shape]),
            element_type,
            SymbolRefAttr(placement) if isinstance(placement, str) else placement,
            nd_sbp if isinstance(nd_sbp, NdSbpAttr) else NdSbpAttr(nd_sbp),
        )

    def get_shape(self) -> tuple[int, ...]:
        return tuple(d.data for d in self.shape.data)

    @property
    def placement_name(self) -> str:
        return self.placement.string_value()

    def with_distribution(self, placement: str | SymbolRefAttr, nd_sbp: NdSbpAttr | Sequence[SbpAttr]) -> DTensorType:
        return DTensorType(self.get_shape(), self.element_type, placement, nd_sbp)

    @classmethod
    def parse_parameters(cls, parser: AttrParser) -> Sequence[Attribute]:
        def parse():
            with parser.in_angle_brackets():
                dims, element_type = parser.parse_ranked_shape()
                parser.parse_punctuation(",")
                placement = SymbolRefAttr(parser.parse_symbol_name())
                parser.parse_punctuation(",")
                nd_sbp = NdSbpAttr.parse_short(parser)
            return (ArrayAttr([IntAttr(d) for d in dims]), element_type, placement, nd_sbp)

        return parse_verified(cls, parser, parse)

    def print_parameters(self, printer: Printer) -> None:
        with printer.in_angle_brackets():
            for d in self.get_shape():
                printer.print_string(f"{d}x")
            printer.print_attribute(self.element_type)
            printer.print_string(", ")
            printer.print_attribute(self.placement)
            printer.print_string(", ")
            self.nd_sbp.print_short(printer)

    def verify(self) -> None:
        if any(d < 0 for d in self.get_shape()):
            dims = "x".join("?" if d < 0 else str(d) for d in self.get_shape())
            raise VerifyException(f"a dtensor's global shape must be static, got {dims}")


def global_shape(type: Attribute) -> tuple[int, ...]:
    """The global shape of a builtin tensor or a dtensor."""
    if isinstance(type, DTensorType):
        return type.get_shape()
    assert isinstance(type, TensorType)
    return tuple(type.get_shape())


def element_type(type: Attribute) -> Attribute:
    assert isinstance(type, DTensorType | TensorType)
    return type.element_type


def element_bytes(elem: Attribute) -> int:
    """Bytes of one element of a float or integer type (a VerifyException
    for any other element type: a tensor of tensors has no byte size)."""
    width = getattr(elem, "bitwidth", None) or getattr(getattr(elem, "width", None), "data", None)
    if not isinstance(width, int):
        raise VerifyException(f"element type {elem} is not a float or integer type")
    return max(1, width // 8)


def lookup_placement(op: Operation, ref: SymbolRefAttr | str) -> PlacementOp:
    """Resolves a placement symbol from `op`, or raises a VerifyException naming it."""
    name = ref if isinstance(ref, str) else ref.string_value()
    # Placements live at module level: look in the outermost symbol table
    # first (it is small; nested tables such as plan devices hold thousands
    # of symbols and would make every lookup linear in their size).
    # Verifiers ask for the same few placements of one module tens of
    # thousands of times: what the outermost table gave is remembered, and
    # holds while that op is still in it under that name.
    root = op
    while True:  # root.parent_op() until there is none, by the fields it reads
        block = root.parent
        region = block.parent if block is not None else None
        if region is None or region.parent is None:
            break
        root = region.parent
    known = _ROOT_PLACEMENTS.get((id(root), name))
    if known is not None and known[0]() is root:
        placement = known[1]()
        if placement is not None and _in_table(placement, root, name):
            return placement
    tables = []
    anchor: Operation | None = op
    while anchor is not None:
        if class_has_trait(type(anchor), SymbolTable):
            tables.append(anchor)
        block = anchor.parent
        region = block.parent if block is not None else None
        anchor = region.parent if region is not None else None
    found = None
    for table in reversed(tables):
        found = _symbol(table, name)
        if isinstance(found, PlacementOp):
            break
    if not isinstance(found, PlacementOp):
        what = "is not a placement" if found is not None else "does not exist"
        raise VerifyException(f"'{op.name}': placement @{name} {what}")
    if tables and tables[-1] is root and _in_table(found, root, name):
        remember(_ROOT_PLACEMENTS, (id(root), name), (weakref.ref(root), weakref.ref(found)))
    return found


_ROOT_PLACEMENTS: dict[tuple[int, str], tuple[weakref.ref[Operation], weakref.ref[PlacementOp]]] = {}
"""(id of an outermost symbol table, a name) -> (the table, the placement
named so in it), as lookup_placement found it there. Both are held weakly:
an op reaches its whole module through its parents, and holding them kept
every module a process had verified alive (the planner's candidates, each
test's plans: 2.5 million objects in a test process, walked by every full
collection). An entry whose table died no longer matches, since the table
of a reused id is another object."""


def _in_table(placement: PlacementOp, table: Operation, name: str) -> bool:
    """Whether `placement` lies directly in `table`'s body, named `name`."""
    block = placement.parent
    return (block is not None and block.parent is not None and block.parent.parent is table
            and placement.sym_name.data == name)


def _symbol(table: Operation, name: str) -> Operation | None:
    """The op named `name` directly in symbol table `table`: what
    SymbolTable.lookup_symbol finds for a flat name, without building a
    SymbolRefAttr per call (verifiers look up a placement per dtensor)."""
    region = table.regions[0]
    for block in region.blocks:  # one block, unless the input is malformed
        op = block.first_op
        while op is not None:
            sym = op.properties.get("sym_name")  # op.get_attr_or_prop("sym_name"), without the call
            if sym is None:
                sym = op.attributes.get("sym_name")
            if isinstance(sym, StringAttr) and sym.data == name and class_has_trait(type(op), SymbolOpInterface):
                return op
            op = op.next_op
    return None


def verify_distribution(op: Operation, type: Attribute, what: str,
                        placements: dict[str, PlacementOp] | None = None) -> Mesh | None:
    """Checks a dtensor against its placement: the placement exists, the nd-SBP
    has one entry per mesh axis, and every split axis is in range. Returns the
    mesh, or None for a builtin tensor. `placements` keeps the placements
    `op` found by name, for a caller checking several dtensors of one op
    (they nearly always share one placement)."""
    if not isinstance(type, DTensorType):
        return None
    if placements is None:
        placement = lookup_placement(op, type.placement)
    else:
        name = type.placement.string_value()
        found = placements.get(name)
        if found is None:
            found = placements[name] = lookup_placement(op, name)
        placement = found
    mesh = placement.mesh()
    # The checks below read the type and the mesh alone: a type that passed
    # them on this very mesh passes again (a graph shares one type object
    # among the values alike, a plan among a value's registers).
    checked = _CHECKED_ON.get(id(type))
    if checked is not None and checked[0] is type and checked[1] is mesh:
        return mesh
    if len(type.nd_sbp) != len(mesh.shape):
        raise VerifyException(
            f"'{op.name}': {what} has {len(type.nd_sbp)} SBP entries but placement @{mesh.name} "
            f"has a {len(mesh.shape)}-D mesh {list(mesh.shape)}"
        )
    rank = len(type.get_shape())
    for entry in type.nd_sbp:
        if isinstance(entry, SplitAttr) and entry.axis.data >= rank:
            raise VerifyException(
                f"'{op.name}': {what} is split on axis {entry.axis.data} but has rank {rank}"
            )
    if any(isinstance(e, GroupedAttr | IndexedAttr) for e in type.nd_sbp) and rank == 0:
        raise VerifyException(f"'{op.name}': {what} is split by rows (G or I) but is a scalar")
    remember(_CHECKED_ON, id(type), (type, mesh))
    return mesh


_CHECKED_ON: dict[int, tuple[DTensorType, Mesh]] = {}
"""id(dtensor type) -> (the type, the mesh it last passed verify_distribution's
checks on). An entry keeps its type alive, so the id is not reused; types
and meshes are immutable, so the verdict holds for the same objects."""


# --------------------------------------------------------------------------
# Plain data (plain_sbp.py: the passes that search, the interpreters, the
# simulator and the runtime work on Sbp values, not attributes) and the
# conversions between the two.
# --------------------------------------------------------------------------


def to_plain(attr: SbpAttr) -> Sbp:
    if isinstance(attr, SplitAttr):
        return Sbp.S(attr.axis.data)
    if isinstance(attr, BroadcastAttr):
        return Sbp.B
    if isinstance(attr, GroupedAttr):
        return Sbp.G
    if isinstance(attr, IndexedAttr):
        return Sbp.of(f"I{attr.rows.data}")
    assert isinstance(attr, PartialAttr)
    return Sbp.P if attr.reduce_kind is ReduceKind.SUM else Sbp.PMAX


def from_plain(sbp: Sbp | str) -> SbpAttr:
    sbp = Sbp.of(sbp)
    if sbp.axis is not None:
        return SplitAttr(sbp.axis)
    if sbp == Sbp.B:
        return BroadcastAttr()
    if sbp == Sbp.G:
        return GroupedAttr()
    if sbp.is_indexed:
        assert sbp.rows is not None  # every I names its table's rows
        return IndexedAttr(sbp.rows)
    return PartialAttr(ReduceKind.MAX if sbp == Sbp.PMAX else ReduceKind.SUM)


def nd_to_plain(nd: NdSbpAttr) -> PlainNd:
    return tuple(to_plain(e) for e in nd)


def nd_from_plain(nd: Sequence[PlainSbp]) -> NdSbpAttr:
    return _nd_attr(tuple(nd))


def dtensor_of(shape: Sequence[int], element_type: Attribute, placement: str, nd: Sequence[PlainSbp]) -> DTensorType:
    """`DTensorType(shape, element_type, placement, nd_from_plain(nd))`, one
    shared instance per distinct type: sbp-infer writes a type per value and
    per redistribution request, and building each (which verifies every
    parameter) was a fifth of its time on large graphs."""
    return _dtensor(tuple(shape), element_type, placement, tuple(nd))


@functools.lru_cache(maxsize=1 << 14)
def _dtensor(shape: tuple[int, ...], element_type: Attribute, placement: str, nd: PlainNd) -> DTensorType:
    return DTensorType(shape, element_type, placement, _nd_attr(nd))


def retype(value: SSAValue, new_type: Attribute) -> None:
    """Gives `value` the type `new_type`, in place. xDSL's
    `Rewriter.replace_value_with_new_type` makes a new value and moves every
    use to it, each move re-registering the user's operands: a third of
    writing sbp-infer's answer into a 10k-op graph. xDSL keeps a value's
    type in its `_type` field, which `type` returns and nothing caches; the
    value keeps its uses and its name."""
    value._type = new_type


def tensor_type(element_type: Attribute, shape: Sequence[int]) -> TensorType:
    """`TensorType(element_type, shape)`, one shared instance per distinct
    type: lg ops infer a result type each (autodiff and the optimizer build
    thousands), and building one verifies every parameter."""
    return _tensor(element_type, tuple(shape))


@functools.lru_cache(maxsize=1 << 14)
def _tensor(element_type: Attribute, shape: tuple[int, ...]) -> TensorType:
    return TensorType(element_type, shape)


def signature_of(ins: Sequence[Sequence[PlainSbp]], outs: Sequence[Sequence[PlainSbp]]) -> SignatureAttr:
    """`SignatureAttr` of plain nd-SBPs, one shared instance per distinct signature."""
    return _signature(tuple(tuple(nd) for nd in ins), tuple(tuple(nd) for nd in outs))


@functools.lru_cache(maxsize=1 << 12)
def _signature(ins: tuple[PlainNd, ...], outs: tuple[PlainNd, ...]) -> SignatureAttr:
    return SignatureAttr([_nd_attr(nd) for nd in ins], [_nd_attr(nd) for nd in outs])


@functools.lru_cache(maxsize=4096)
def _nd_attr(nd: PlainNd) -> NdSbpAttr:
    # Attributes are immutable, so one per distinct nd-SBP can be shared;
    # passes build one per value and signature, and building (which verifies)
    # was a large part of sbp-infer's time.
    return NdSbpAttr([from_plain(e) for e in nd])


SIGNATURE_ATTR = "sbp.signature"
"""The discardable attribute by which an op records its chosen SBP signature."""


AUTOPLAN_ATTR = "sbp.autoplan"
"""String attribute of an lg.graph: the layout sbp-autoplan chose and its prediction."""
AUTOPLAN_ALTERNATIVES_ATTR = "sbp.autoplan.alternatives"
"""Array attribute of an lg.graph: every layout sbp-autoplan tried, fastest first (explain)."""

PLACEMENT_ATTR = "sbp.placement"
"""The discardable attribute placing an op on a placement (a pipeline stage)
when no hint on its result says where it runs. Gradient and update ops
inherit it from the op they come from, as OneFlow's backward ops inherit
their forward op's placement."""


def verify_placement_attr(op: Operation) -> None:
    """An `sbp.placement` names a placement, and the op's dtensors lie on it."""
    ref = op.attributes.get(PLACEMENT_ATTR)
    if ref is None:
        return
    if not isinstance(ref, SymbolRefAttr):
        raise VerifyException(f"'{op.name}': attribute '{PLACEMENT_ATTR}' must be a placement symbol (@name)")
    lookup_placement(op, ref)
    name = ref.string_value()
    for kind, values in (("operand", op.operands), ("result", op.results)):
        for i, value in enumerate(values):
            if isinstance(value.type, DTensorType) and value.type.placement_name != name:
                raise VerifyException(
                    f"'{op.name}': {kind} #{i} is on @{value.type.placement_name} but the op is placed on @{name}"
                )


def verify_signature(op: Operation) -> None:
    """If `op` records an SBP signature, its operands and results must be
    dtensors whose nd-SBPs are exactly the signature's."""
    sig = op.attributes.get(SIGNATURE_ATTR)
    if sig is None:
        return
    if not isinstance(sig, SignatureAttr):
        raise VerifyException(f"'{op.name}': attribute '{SIGNATURE_ATTR}' must be an #sbp.sig")
    for kind, values, expected in (
        ("operand", op.operands, sig.inputs.data),
        ("result", op.results, sig.outputs.data),
    ):
        if len(values) != len(expected):
            raise VerifyException(
                f"'{op.name}': signature has {len(expected)} {kind}s but the op has {len(values)}"
            )
        for i, (value, nd) in enumerate(zip(values, expected)):
            if not isinstance(value.type, DTensorType):
                raise VerifyException(f"'{op.name}': {kind} #{i} has no distribution but the op has a signature")
            if value.type.nd_sbp != nd:
                raise VerifyException(
                    f"'{op.name}': {kind} #{i} is {format_nd(value.type.nd_sbp)} but the signature "
                    f"requires {format_nd(nd)}"
                )


def format_nd(nd: NdSbpAttr | PlainNd) -> str:
    """The short text of an nd-SBP, as the IR writes it inside lists and types
    (`S<0>`, `[S<0>, B]`, `P<max>`): what the printer prints, and diagnostics."""
    plain = nd_to_plain(nd) if isinstance(nd, NdSbpAttr) else nd
    return format_plain(tuple(plain))


# --------------------------------------------------------------------------
# Collectives: one table of the single-axis redistributions. The ops, the
# boxing planner, the plan's communication kinds, the interpreters, the simulator and the
# runtime all read it.
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class CollectiveRule:
    """One redistribution on one mesh axis: which (source, destination) SBP
    kinds it connects ("S", "B", "P" or "G", the first letter of a plain
    SBP), whether devices exchange data, and its text for diagnostics."""

    kind: str
    steps: frozenset[tuple[str, str]]
    communicates: bool
    transition: str
    doc: str

    def performs(self, source: PlainSbp, dest: PlainSbp) -> bool:
        """Whether it takes a mesh axis from `source` to `dest` (two splits
        must split different tensor axes; grouped rows trade with a split of
        the rows only)."""
        if (source.kind, dest.kind) not in self.steps or source == dest:
            return False
        if source.is_grouped and dest.is_split or dest.is_grouped and source.is_split:
            return (source.axis if source.is_split else dest.axis) == 0
        return True


def owns_rows(t: DTensorType) -> bool:
    """Whether some mesh axis of `t` owns its rows at run time (G or I): the
    one question the verifiers of every collective ask first, cheaply."""
    return any(isinstance(e, GroupedAttr | IndexedAttr) for e in t.nd_sbp)


def reads_group_ends(source: PlainSbp, dest: PlainSbp) -> bool:
    """Whether the step from `source` to `dest` on one mesh axis needs the
    group ends, to know each device's rows at run time: every step into or
    out of rows grouped by expert (G) but B -> G, which keeps the whole."""
    return source != dest and (source.is_grouped or dest.is_grouped) and source != Sbp.B


def reads_index(source: PlainSbp, dest: PlainSbp) -> bool:
    """Whether the step needs the index that gathered rows (I), to know each
    device's rows at run time: every step into or out of I but B -> I."""
    return source != dest and (source.is_indexed or dest.is_indexed) and source != Sbp.B


COLLECTIVES: dict[str, CollectiveRule] = {
    c.kind: c
    for c in (
        CollectiveRule("all_reduce", frozenset({("P", "B")}), True, "P -> B",
                   "P -> B: every device gets the reduction of all pieces."),
        CollectiveRule("all_gather", frozenset({("S", "B"), ("G", "B"), ("I", "B")}), True, "S<i>, G or I -> B",
                   "S(i), G or I -> B: every device gets the concatenation of all slices (of every device's "
                   "grouped or gathered rows, as many as the group ends or the index give it)."),
        CollectiveRule("reduce_scatter", frozenset({("P", "S"), ("P", "G")}), True, "P -> S<i> or G",
                   "P -> S(i) or G: every device gets its slice of the reduction (its grouped rows)."),
        CollectiveRule("all_to_all", frozenset({("S", "S"), ("S", "G"), ("G", "S"), ("I", "G"), ("G", "I")}), True,
                   "S<i> -> S<j> with i != j, S<0> or I -> G, G -> S<0> or I",
                   "S(i) -> S(j), i != j: every device trades slices with every other; between even rows "
                   "(S(0)) or rows gathered by an index (I) and rows grouped by expert (G), each device "
                   "sends each row to its new owner, the counts read from the group ends and the index at "
                   "run time."),
        CollectiveRule("slice", frozenset({("B", "S"), ("B", "G"), ("B", "I")}), False,
                   "B -> S<i>, G or I (local)",
                   "B -> S(i) with no communication: every device keeps its own slice (B -> G or I keeps "
                   "the whole, its own rows among them)."),
        CollectiveRule("make_partial", frozenset({("B", "P"), ("S", "P"), ("G", "P"), ("I", "P")}), False,
                   "B, S<i>, G or I -> P (local)",
                   "B, S<i>, G or I -> P (or P<max>) with no communication: a B value stays on the group's "
                   "first device and the others hold zeros (-inf for max); a split value (grouped or gathered "
                   "rows) is embedded in zeros (-inf) at its place."),
    )
}
"""The collectives by kind (`sbp.<kind>` is the op, `plan.comm` names the kind)."""

TRANSFER = "transfer"
"""The communication between placements (sbp.transfer), outside the table:
it moves pieces between meshes rather than changing one mesh axis."""


def step_collective(source: PlainSbp, dest: PlainSbp) -> CollectiveRule | None:
    """The collective that changes one mesh axis from `source` to `dest`, if one does."""
    collective = _STEP_COLLECTIVE.get((source.kind, dest.kind))
    if collective is not None and (source.is_grouped or dest.is_grouped) and not collective.performs(source, dest):
        return None  # grouped rows trade with a split of the rows only
    if collective is not None and source.is_indexed and dest.is_indexed and source != dest:
        return None  # rows gathered from one table are not another table's
    return collective


_STEP_COLLECTIVE = {step: c for c in COLLECTIVES.values() for step in c.steps}


# --------------------------------------------------------------------------
# Ops
# --------------------------------------------------------------------------

TensorLike = TensorType.constr() | base(DTensorType)


def _same_global(op: Operation, source: Attribute, dest: Attribute) -> None:
    if global_shape(source) != global_shape(dest) or element_type(source) != element_type(dest):
        raise VerifyException(
            f"'{op.name}': result must have the operand's global shape and element type "
            f"({list(global_shape(source))}x{element_type(source)} vs {list(global_shape(dest))}x{element_type(dest)})"
        )


@op_definition
class AnnotateOp(DirectInit):
    """Attaches a placement and an nd-SBP to a value: a user hint before
    inference, or a requested redistribution of a dtensor. Globally the value
    is unchanged."""

    name = "sbp.annotate"

    input = operand_def(TensorLike)
    result = result_def(DTensorType)

    traits = traits_def(Pure())

    assembly_format = "$input attr-dict `:` type($input) `->` type($result)"

    def __init__(self, input, result_type: DTensorType):
        super().__init__(operands=[input], result_types=[result_type])

    def verify_(self) -> None:
        _same_global(self, self.input.type, self.result.type)
        verify_distribution(self, self.input.type, "operand")
        verify_distribution(self, self.result.type, "result")


class CollectiveOp(DirectInit, ABC):
    """A collective over some axes of one mesh. On the listed axes the input
    and output SBPs must form the collective's transition; every other axis
    and the placement stay the same."""

    input = operand_def(DTensorType)
    ends = opt_operand_def(DTensorType)
    """The group ends (a vector of cumulative row counts, one per expert,
    whole on every device) where the collective goes into or out of rows
    grouped by expert (G): who holds which rows is known only at run time."""
    index = opt_operand_def(DTensorType)
    """The index that gathered the rows (whole on every device), where the
    collective goes into or out of rows gathered by an index (I)."""
    result = result_def(DTensorType)
    mesh_axes = prop_def(DenseArrayBase.constr(i64))
    bytes = opt_prop_def(IntegerAttr[I64])
    """Bytes a device of the group receives, on average (recorded by sbp-insert-boxing)."""

    traits = traits_def(Pure())
    irdl_options = (AttrSizedOperandSegments(as_property=True),)

    assembly_format = (
        "$input (`grouped` `by` $ends^ `:` type($ends))? (`indexed` `by` $index^ `:` type($index))? "
        "`over` $mesh_axes (`bytes` $bytes^)? attr-dict `:` type($input) `->` type($result)"
    )

    def __init__(self, input, mesh_axes: Sequence[int], result_type: DTensorType, bytes: int | None = None,
                 ends: SSAValue | None = None, index: SSAValue | None = None):
        props: dict[str, Attribute] = {"mesh_axes": i64_array(mesh_axes)}
        if bytes is not None:
            props["bytes"] = i64_attr(bytes)
        super().__init__(operands=[input, [ends] if ends is not None else [], [index] if index is not None else []],
                         result_types=[result_type], properties=props)

    def verify_(self) -> None:
        source, dest = self.input.type, self.result.type
        assert isinstance(source, DTensorType) and isinstance(dest, DTensorType)
        _same_global(self, source, dest)
        mesh = verify_distribution(self, source, "operand")
        verify_distribution(self, dest, "result")
        assert mesh is not None
        if source.placement != dest.placement:
            raise VerifyException(
                f"'{self.name}': operand and result must share a placement "
                f"(@{source.placement_name} vs @{dest.placement_name}); use sbp.transfer to move between placements"
            )
        collective = COLLECTIVES[self.name.removeprefix("sbp.")]
        axes = list(self.mesh_axes.get_values())
        if not axes or len(set(axes)) != len(axes) or any(not 0 <= a < len(mesh.shape) for a in axes):
            raise VerifyException(
                f"'{self.name}': mesh axes {axes} must be distinct axes of the {len(mesh.shape)}-D mesh @{mesh.name}"
            )
        for a in range(len(mesh.shape)):
            s, d = source.nd_sbp[a], dest.nd_sbp[a]
            if a in axes and not collective.performs(to_plain(s), to_plain(d)):
                raise VerifyException(
                    f"'{self.name}': mesh axis {a} goes from {format_nd(NdSbpAttr([s]))} to "
                    f"{format_nd(NdSbpAttr([d]))}, but {self.name} performs {collective.transition}"
                )
            if a not in axes and s != d:
                raise VerifyException(
                    f"'{self.name}': mesh axis {a} is not in mesh_axes {axes} but changes from "
                    f"{format_nd(NdSbpAttr([s]))} to {format_nd(NdSbpAttr([d]))}"
                )
        if self.ends is not None or self.index is not None or owns_rows(source) or owns_rows(dest):
            self._verify_group_ends(source, dest, axes)
            self._verify_index(source, dest, axes)
        inner = hierarchy_violation(nd_to_plain(source.nd_sbp), nd_to_plain(dest.nd_sbp), axes)
        if inner is not None:
            a, k, b = inner
            raise VerifyException(
                f"'{self.name}': mesh axis {a} changes the split of tensor axis {k}, which inner mesh axis {b} "
                f"still splits; pieces are nested outer axis first, so change mesh axis {b} first"
            )


    def _verify_group_ends(self, source: DTensorType, dest: DTensorType, axes: list[int]) -> None:
        self._verify_read(self.ends, source, dest, axes, reads_group_ends, "group ends", "group ends are",
                          "rows grouped by expert (G)", "`grouped by %ends`", None)

    def _verify_index(self, source: DTensorType, dest: DTensorType, axes: list[int]) -> None:
        self._verify_read(self.index, source, dest, axes, reads_index, "index", "an index is",
                          "rows gathered by an index (I)", "`indexed by %index`", source.get_shape()[0])

    def _verify_read(self, value: SSAValue | None, source: DTensorType, dest: DTensorType, axes: list[int],
                     reads: Callable[[Sbp, Sbp], bool], what: str, given: str, rows: str, syntax: str,
                     length: int | None) -> None:
        """A vector the collective reads at run time (the group ends, the
        index): given exactly where a mesh axis goes into or out of the rows
        it says the owners of, a vector of integers (`length` of them, where
        fixed) held whole on the collective's placement."""
        src_nd, dst_nd = nd_to_plain(source.nd_sbp), nd_to_plain(dest.nd_sbp)
        needed = [a for a in axes if reads(src_nd[a], dst_nd[a])]
        if not needed:
            if value is not None:
                raise VerifyException(f"'{self.name}': {given} given but no mesh axis goes into or out of {rows}")
            return
        if value is None:
            raise VerifyException(f"'{self.name}': mesh axis {needed[0]} goes into or out of {rows}: it needs the "
                                  f"{what} ({syntax})")
        t = value.type
        assert isinstance(t, DTensorType)  # the operand's constraint
        shape = t.get_shape()
        if len(shape) != 1 or (length is not None and shape[0] != length) or not isinstance(t.element_type,
                                                                                            IntegerType):
            per_row = f", one per row ({length})" if length is not None else ""
            raise VerifyException(f"'{self.name}': the {what} must be a vector of integers{per_row}, got "
                                  f"{list(shape)}x{t.element_type}")
        if t.placement != source.placement or any(s != Sbp.B for s in nd_to_plain(t.nd_sbp)):
            raise VerifyException(f"'{self.name}': the {what} must be whole (B) on every device of "
                                  f"@{source.placement_name}, got {format_nd(t.nd_sbp)} on @{t.placement_name}")


def _collective_op(c: CollectiveRule) -> type[CollectiveOp]:
    """The op class of a row of COLLECTIVES: `sbp.<kind>`."""
    class_name = "".join(part.title() for part in c.kind.split("_")) + "Op"
    body = {"name": f"sbp.{c.kind}", "__doc__": c.doc, "__module__": __name__, "__qualname__": class_name}
    return op_definition(type(class_name, (CollectiveOp,), body))


COLLECTIVE_OP_OF_KIND: dict[str, type[CollectiveOp]] = {kind: _collective_op(c) for kind, c in COLLECTIVES.items()}
AllReduceOp, AllGatherOp, ReduceScatterOp, AllToAllOp, SliceOp, MakePartialOp = COLLECTIVE_OP_OF_KIND.values()


@op_definition
class TransferOp(IRDLOperation):
    """Moves a tensor between two placements: every destination piece is
    assembled from the source pieces it intersects, each sent once from a
    device that holds it. The source must not be partial (reduce it first);
    a partial destination is built by sbp.make_partial after the transfer."""

    name = "sbp.transfer"

    input = operand_def(DTensorType)
    result = result_def(DTensorType)
    bytes = opt_prop_def(IntegerAttr[I64])
    """Bytes a destination device receives from other ranks, on average."""

    traits = traits_def(Pure())

    assembly_format = "$input (`bytes` $bytes^)? attr-dict `:` type($input) `->` type($result)"

    def __init__(self, input, result_type: DTensorType, bytes: int | None = None):
        props = {} if bytes is None else {"bytes": i64_attr(bytes)}
        super().__init__(operands=[input], result_types=[result_type], properties=props)

    def verify_(self) -> None:
        _same_global(self, self.input.type, self.result.type)
        verify_distribution(self, self.input.type, "operand")
        verify_distribution(self, self.result.type, "result")


COLLECTIVE_OPS: tuple[type[CollectiveOp] | type[TransferOp], ...] = (
    AllReduceOp,
    AllGatherOp,
    ReduceScatterOp,
    AllToAllOp,
    SliceOp,
    MakePartialOp,
    TransferOp,
)


@functools.cache
def is_collective(op_class: type[Operation]) -> bool:
    """Whether ops of `op_class` are collectives (COLLECTIVE_OPS), once per
    class: op classes are ABCs, and isinstance against the seven of them
    cost microseconds per op in the passes' loops."""
    return issubclass(op_class, COLLECTIVE_OPS)


@functools.cache
def communicates(op_class: type[Operation]) -> bool:
    """Whether ops of `op_class` move data between devices: a transfer, or a
    collective of a kind that does (COLLECTIVES); a local slice or
    make_partial only copies. Once per class, as is_collective."""
    if not is_collective(op_class):
        return False
    kind = op_class.name.removeprefix("sbp.")
    return issubclass(op_class, TransferOp) or (kind in COLLECTIVES and COLLECTIVES[kind].communicates)


SBP = Dialect(
    "sbp",
    [PlacementOp, AnnotateOp, *COLLECTIVE_OPS],
    [SplitAttr, BroadcastAttr, PartialAttr, GroupedAttr, IndexedAttr, NdSbpAttr, SignatureAttr, DeviceKindAttr,
     DTensorType],
)
