"""The `plan` dialect: OneFlow's physical graph of actors and registers.

A program holds one device per MPI rank. A device holds registers (the
buffers between a producer and its consumers: local type, size, slot count,
arena offset, role) and actors, whose order in the device body is the
device's schedule. A compute actor runs one lg kernel on local pieces; a
communication actor takes part in one collective, identified across devices
by its `id`, with its rank group.

    plan.program @mlp {
      plan.device @rank0 rank 0 arena 4096 persistent 2048 {
        plan.register @x : tensor<16x32xf32> bytes 2048 offset 0 feed "x" of !sbp.dtensor<32x32xf32, @dp, S<0>>
        plan.register @w : tensor<32x8xf32> bytes 1024 offset 0 persistent param "w" of !sbp.dtensor<32x8xf32, @dp, B>
        plan.register @y : tensor<16x8xf32> bytes 512 offset 2048 fetch "y" of !sbp.dtensor<32x8xf32, @dp, S<0>>
        plan.compute @mm "lg.matmul" (@x, @w) -> (@y)
      }
      ...
    }

Registers carry the global dtensor they hold a piece of, so every local
shape can be checked against the global shape, the nd-SBP and the device's
place in the mesh; actors carry everything their kernel needs, so a plan file
is all the runtime loads.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import ClassVar, cast

from xdsl.dialects.builtin import (
    I64,
    ArrayAttr,
    DenseArrayBase,
    DictionaryAttr,
    IntegerAttr,
    ModuleOp,
    StringAttr,
    SymbolNameConstraint,
    SymbolRefAttr,
    TensorType,
    UnitAttr,
    i64,
)
from xdsl.ir import Attribute, Block, Dialect, Operation, Region
from xdsl.irdl import (
    IRDLOperation,
    lazy_traits_def,
    opt_prop_def,
    prop_def,
    region_def,
    traits_def,
)
from xdsl.parser import Parser
from xdsl.printer import Printer
from xdsl.traits import HasParent, IsolatedFromAbove, NoTerminator, SymbolOpInterface, SymbolTable
from xdsl.utils.exceptions import VerifyException

from . import lg
from .irdl_verify import op_definition, remember
from .lg import InitializerAttr
from .pieces import local_shape
from .sbp import (
    COLLECTIVES,
    TRANSFER,
    DTensorType,
    Mesh,
    PlacementOp,
    Sbp,
    element_bytes,
    format_nd,
    nd_to_plain,
    owns_rows,
    reads_group_ends,
    reads_index,
    verify_distribution,
)


def tensor_bytes(t: TensorType) -> int:
    return math.prod(t.get_shape()) * element_bytes(t.element_type)


@op_definition
class ProgramOp(IRDLOperation):
    """The physical plan of one graph: one device per rank."""

    name = "plan.program"

    sym_name = prop_def(SymbolNameConstraint())
    body = region_def("single_block")

    traits = traits_def(SymbolOpInterface(), SymbolTable(), NoTerminator(), IsolatedFromAbove())

    assembly_format = "$sym_name attr-dict-with-keyword $body"

    def __init__(self, name: str, devices: Sequence[DeviceOp]):
        super().__init__(properties={"sym_name": StringAttr(name)}, regions=[Region(Block(devices))])

    def devices(self) -> list[DeviceOp]:
        return [op for op in self.body.block.ops if isinstance(op, DeviceOp)]

    def verify_(self) -> None:
        ranks = [d.rank.value.data for d in self.devices()]
        if len(set(ranks)) != len(ranks):
            raise VerifyException(f"'{self.name}' @{self.sym_name.data}: two devices share a rank ({sorted(ranks)})")
        for op in self.body.block.ops:
            if not isinstance(op, DeviceOp):
                raise VerifyException(f"'{self.name}': holds only plan.device, not '{op.name}'")


@op_definition
class DeviceOp(IRDLOperation):
    """One rank: its registers, then its actors in schedule order. After
    memory allocation it records the arena size, the persistent region's size,
    the live-set lower bound and the no-reuse total, all in bytes.

    A device `like @other` has no body of its own: it runs @other's
    registers and actors as its own rank, which holds the same pieces and
    takes part in the same collectives (sbp-to-plan gives the ranks whose
    bodies would be equal one body: every rank of a data-parallel plan).
    Readers get the body through registers(), actors() and contents(); a
    pass that writes rank-specific attributes on actors expands it first."""

    name = "plan.device"

    sym_name = prop_def(SymbolNameConstraint())
    rank = prop_def(IntegerAttr[I64])
    like = opt_prop_def(SymbolRefAttr)
    arena = opt_prop_def(IntegerAttr[I64])
    persistent = opt_prop_def(IntegerAttr[I64])
    live_bound = opt_prop_def(IntegerAttr[I64])
    no_reuse = opt_prop_def(IntegerAttr[I64])
    body = region_def("single_block")

    traits = lazy_traits_def(lambda: (SymbolOpInterface(), SymbolTable(), NoTerminator(), HasParent(ProgramOp)))

    REGIONS: ClassVar[tuple[str, ...]] = ("arena", "persistent", "live_bound", "no_reuse")
    """The byte counts plan-allocate-memory records, in the order they print."""

    # `@rank0 rank 0 (like @d)? (arena N)? (persistent N)? (live_bound N)?
    # (no_reuse N)? attr-dict-with-keyword {body}`, written out rather than
    # declared: a declared region prints an empty block as `{ ^bb0: }`, and a
    # device like another has an empty body; `{}` parses back to that block.

    def print(self, printer: Printer) -> None:
        printer.print_string(" ")
        printer.print_symbol_name(self.sym_name.data)
        printer.print_string(f" rank {self.rank.value.data}")
        if self.like is not None:
            printer.print_string(" like ")
            printer.print_attribute(self.like)
        for field in self.REGIONS:
            attr = getattr(self, field)
            if attr is not None:
                printer.print_string(f" {field} {attr.value.data}")
        printer.print_op_attributes(self.attributes, print_keyword=True)
        printer.print_string(" ")
        printer.print_region(self.body, print_empty_block=False)

    @classmethod
    def parse(cls, parser: Parser) -> DeviceOp:
        properties: dict[str, Attribute] = {"sym_name": parser.parse_symbol_name()}
        parser.parse_keyword("rank")
        properties["rank"] = IntegerAttr(parser.parse_integer(allow_boolean=False), i64)
        if parser.parse_optional_keyword("like") is not None:
            properties["like"] = parser.parse_attribute()
        for field in cls.REGIONS:
            if parser.parse_optional_keyword(field) is not None:
                properties[field] = IntegerAttr(parser.parse_integer(allow_boolean=False), i64)
        attributes = parser.parse_optional_attr_dict_with_keyword()
        body = parser.parse_region()
        if not body.blocks:
            body.add_block(Block())
        return cls.create(properties=properties, attributes=attributes.data if attributes is not None else {},
                          regions=[body])

    def __init__(self, name: str, rank: int, ops: Sequence[Operation], like: str | None = None):
        properties: dict[str, Attribute] = {"sym_name": StringAttr(name), "rank": IntegerAttr(rank, i64)}
        if like is not None:
            properties["like"] = SymbolRefAttr(like)
        super().__init__(properties=properties, regions=[Region(Block(ops))])

    def source(self) -> DeviceOp:
        """The device whose body this one runs: the one it is `like`, or itself."""
        if self.like is None:
            return self
        name = self.like.string_value()
        program = self.parent_op()
        found = None if program is None else next(
            (op for op in program.regions[0].ops if isinstance(op, DeviceOp) and op.sym_name.data == name), None)
        if found is None or found.like is not None:
            raise ValueError(f"'plan.device' @{self.sym_name.data}: like @{name}, which is not a device with a body "
                             "in its program")
        return found

    def expand(self) -> None:
        """Gives a device `like` another a copy of that body as its own (for
        a pass that writes attributes particular to this rank on actors)."""
        if self.like is not None:
            self.body.block.add_ops([op.clone() for op in self.source().body.block.ops])
            self.like = None

    def registers(self) -> list[RegisterOp]:
        return [op for op in self.source().body.block.ops if isinstance(op, RegisterOp)]

    def region_bytes(self) -> tuple[int, int]:
        """(arena, persistent region) in bytes, as plan-allocate-memory sized them."""
        if self.arena is None or self.persistent is None:
            raise ValueError(f"'plan.device' @{self.sym_name.data}: not allocated; run plan-allocate-memory")
        return self.arena.value.data, self.persistent.value.data

    def actors(self) -> list[ComputeOp | CommOp]:
        """The schedule."""
        return [op for op in self.source().body.block.ops if isinstance(op, ComputeOp | CommOp)]

    def contents(self) -> tuple[list[RegisterOp], list[ComputeOp | CommOp]]:
        """registers() and actors() in one walk of the body (passes that
        need both on a large plan)."""
        registers: list[RegisterOp] = []
        actors: list[ComputeOp | CommOp] = []
        for op in self.source().body.block.ops:
            if isinstance(op, RegisterOp):
                registers.append(op)
            elif isinstance(op, ComputeOp | CommOp):
                actors.append(op)
        return registers, actors

    def verify_(self) -> None:
        for field in ("arena", "persistent"):
            attr = getattr(self, field)
            if attr is not None and attr.value.data < 0:
                raise VerifyException(f"'{self.name}' @{self.sym_name.data}: {field} size must be non-negative")
        if self.like is not None:
            self._verify_like()
            return
        # One walk of the body gives the register table and the schedule and
        # finds the first op out of place; that error is raised after the
        # actors' checks, as a second walk found it before.
        registers: dict[str, RegisterOp] = {}
        actors: list[ComputeOp | CommOp] = []
        misplaced: str | None = None
        for op in self.body.block.ops:
            if isinstance(op, RegisterOp):
                registers[op.sym_name.data] = op
                if actors and misplaced is None:
                    misplaced = (
                        f"'{self.name}' @{self.sym_name.data}: register @{op.sym_name.data} comes after an actor; "
                        "registers come first, then the actors in schedule order"
                    )
            elif isinstance(op, ComputeOp | CommOp):
                actors.append(op)
            elif misplaced is None:
                misplaced = f"'{self.name}' @{self.sym_name.data}: unexpected '{op.name}'"
        for actor in actors:
            for kind, refs in (("input", actor.ins), ("output", actor.outs)):
                for ref in refs.data:
                    if ref.string_value() not in registers:
                        raise VerifyException(
                            f"'{actor.name}' @{actor.sym_name.data}: {kind} register {ref} does not exist on "
                            f"@{self.sym_name.data}"
                        )
            if isinstance(actor, ComputeOp) and actor.kernel.data == FUSED:
                # Checked here, not in the actor's verify_: the device holds the register table, and a lookup
                # per actor would scan the whole device (quadratic in the plan's size).
                steps = _checked_steps(actor)
                out = registers[actor.outs.data[0].string_value()]
                if steps and out.type != steps[-1].type:
                    raise VerifyException(
                        f"'{actor.name}' @{actor.sym_name.data}: the last step gives {steps[-1].type}, "
                        f"the output register is {out.type}"
                    )
        if misplaced is not None:
            raise VerifyException(misplaced)

    def _verify_like(self) -> None:
        """A device like another: no body of its own, the other one has a
        body, the same regions where both are allocated, and this rank holds
        the pieces the registers there are of and is in every group there
        (the other device's own checks cover the rest of that body)."""
        where = f"'{self.name}' @{self.sym_name.data}"
        if self.body.block.first_op is not None:
            raise VerifyException(f"{where}: a device like {self.like} has no ops of its own")
        try:
            source = self.source()
        except ValueError as e:
            raise VerifyException(str(e)) from None
        for field in ("arena", "persistent"):
            mine, theirs = getattr(self, field), getattr(source, field)
            if mine is not None and theirs is not None and mine != theirs:
                raise VerifyException(
                    f"{where}: its {field} differs from @{source.sym_name.data}'s, whose body it runs")
        rank = self.rank.value.data
        # verify_piece's verdict reads the two types (and the module's
        # placements) alone: registers alike (a value's registers, repeated
        # layers' values) are checked once here (ids: they live in the body)
        checked: set[tuple[int, int]] = set()
        try:
            for op in source.body.block.ops:
                if isinstance(op, RegisterOp):
                    pair = (id(op.type), id(op.value))
                    if pair not in checked:
                        checked.add(pair)
                        op.verify_piece(rank)
                elif isinstance(op, CommOp) and rank not in op.group.get_values():
                    raise VerifyException(f"'{op.name}' @{op.sym_name.data}: rank {rank} is not in its group "
                                          f"{list(op.group.get_values())}")
        except VerifyException as e:
            raise VerifyException(f"{where} (like @{source.sym_name.data}): {e}") from None


@op_definition
class RegisterOp(IRDLOperation):
    """A buffer: the local piece of a global value on this device, with
    `slots` copies (how far its producer may run ahead), its offset in the
    device's arena (or in its persistent region) once allocated, and its role:
    a feed, a trained parameter (with its initializer), a constant, or a
    fetched output. `alias @p` says it takes the bytes of register @p (an
    updated parameter written over the parameter, which is dead by then),
    so the update needs no copy back."""

    name = "plan.register"

    sym_name = prop_def(SymbolNameConstraint())
    type = prop_def(TensorType)
    bytes = prop_def(IntegerAttr[I64])
    slots = prop_def(IntegerAttr[I64], default_value=IntegerAttr(1, i64))
    offset = opt_prop_def(IntegerAttr[I64])
    is_persistent = opt_prop_def(UnitAttr, prop_name="persistent")
    feed = opt_prop_def(StringAttr)
    param = opt_prop_def(StringAttr)
    init = opt_prop_def(InitializerAttr)
    seed = opt_prop_def(IntegerAttr[I64])
    constant = opt_prop_def(Attribute)
    fetch = opt_prop_def(StringAttr)
    alias = opt_prop_def(SymbolRefAttr)
    value = prop_def(DTensorType)

    traits = traits_def(SymbolOpInterface(), HasParent(DeviceOp))

    assembly_format = (
        "$sym_name `:` $type `bytes` $bytes (`slots` $slots^)? (`offset` $offset^)? (`persistent` $persistent^)? "
        "(`feed` $feed^)? (`param` $param^)? (`init` qualified($init)^)? (`seed` $seed^)? (`constant` $constant^)? "
        "(`fetch` $fetch^)? (`alias` $alias^)? `of` qualified($value) attr-dict"
    )

    def byte_offset(self) -> int:
        """Where plan-allocate-memory put the register in its region."""
        if self.offset is None:
            raise ValueError(f"register @{self.sym_name.data} has no offset; run plan-allocate-memory")
        return self.offset.value.data

    @property
    def size(self) -> int:
        """Bytes it takes in the arena: one buffer per slot."""
        return self.bytes.value.data * self.slots.value.data

    def verify_(self) -> None:
        # Reads the properties once (a plan holds tens of thousands of
        # registers, and every module verification checks each).
        local_type, value = self.type, self.value
        local_bytes = _CHECKED_BYTES.get(id(local_type))
        if local_bytes is None or local_bytes[0] is not local_type:
            try:
                local_bytes = (local_type, tensor_bytes(local_type))
            except VerifyException as e:
                raise VerifyException(f"{self._where()}: {e}") from None
            remember(_CHECKED_BYTES, id(local_type), local_bytes)
        if self.bytes.value.data != local_bytes[1]:
            raise VerifyException(
                f"{self._where()}: {local_type} takes {local_bytes[1]} bytes, not {self.bytes.value.data}"
            )
        if self.slots.value.data < 1:
            raise VerifyException(f"{self._where()}: needs at least one slot")
        props = self.properties
        offset = props.get("offset")
        if offset is not None and offset.value.data < 0:  # type: ignore[attr-defined]  # an i64 (checked above)
            raise VerifyException(f"{self._where()}: negative offset")
        param = props.get("param")
        if (param is not None) != (props.get("init") is not None):
            raise VerifyException(f"{self._where()}: a parameter needs its initializer, and only a parameter has one")
        if (param is not None or props.get("constant") is not None) and props.get("persistent") is None:
            raise VerifyException(f"{self._where()}: parameters and constants live in the persistent region")
        if local_type.element_type != value.element_type:
            raise VerifyException(
                f"{self._where()}: element type {local_type.element_type} is not the value's {value.element_type}"
            )
        device = self.parent_op()
        if isinstance(device, DeviceOp):
            self.verify_piece(device.rank.value.data)

    def verify_piece(self, rank: int) -> None:
        """That this register's local type is the piece `rank` holds of its
        value: the rank of its device, or of a device like that one."""
        local_type, value = self.type, self.value
        mesh = verify_distribution(self, value, "its value")
        assert mesh is not None  # the value is a dtensor
        # What follows depends on the attributes, the mesh and the rank alone:
        # a local type and a value type checked together on this mesh and
        # rank before (the registers of a value on every rank share its
        # attributes) pass again.
        checked = _CHECKED_PIECES.get((id(local_type), id(value)))
        if (checked is not None and checked[0] is local_type and checked[1] is value and checked[2] is mesh
                and rank in checked[3]):
            return
        if rank not in mesh.ranks:
            raise VerifyException(f"{self._where()}: rank {rank} is not in placement @{mesh.name}")
        expected = local_shape(value, mesh, rank)
        if tuple(local_type.get_shape()) != expected:
            raise VerifyException(
                f"{self._where()}: local shape {list(local_type.get_shape())} is not the piece {list(expected)} that "
                f"rank {rank} holds of {list(value.get_shape())} under {_nd_text(value)}"
            )
        if checked is not None and checked[0] is local_type and checked[1] is value and checked[2] is mesh:
            checked[3].add(rank)
        else:
            remember(_CHECKED_PIECES, (id(local_type), id(value)), (local_type, value, mesh, {rank}))

    def _where(self) -> str:
        return f"'{self.name}' @{self.sym_name.data}"


_CHECKED_BYTES: dict[int, tuple[TensorType, int]] = {}
"""id(local type) -> (the type, its bytes): registers share their local types."""

_CHECKED_PIECES: dict[tuple[int, int], tuple[TensorType, DTensorType, Mesh, set[int]]] = {}
"""(id(local type), id(value type)) -> (the two types, a mesh, the ranks of
it) where the local type is the rank's piece of the value on the mesh (as
plan.register's verifier checks). An entry keeps its attributes alive, so their ids are not reused;
attributes are immutable, so the verdict holds for the same objects."""


def _nd_text(t: DTensorType) -> str:
    return format_nd(t.nd_sbp)


class ActorOp(IRDLOperation):
    """What compute and communication actors share: registers they read
    (`ins`) and write (`outs`), by symbol. That they exist on the device is
    checked by plan.device (one pass over its registers, not one lookup per
    reference)."""


CUDA_SOURCE_ATTR = "cuda.source"
"""String attribute of a compute actor: its CUDA C (plan-codegen)."""
CUDA_ENTRY_ATTR = "cuda.entry"
"""String attribute of a compute actor: the kernel's entry point in its source."""
CUDA_LAUNCH_ATTR = "cuda.launch"
"""Dense i64 array of a compute actor: its launch, grid x, y, z and block x, y, z."""

FUSED = "plan.fused"
"""The kernel of a compute actor that runs a chain of elementwise lg ops
(plan-fuse-elementwise): its `props` hold `steps`, each a dictionary with
the step's `kernel` (a property-less elementwise lg op), its `args` (an
index below the actor's input count names that input, above it the result
of step index - input count) and its local result `type`. The last step's
result is the actor's output."""


FUSABLE_KERNELS = frozenset(op.name for op in lg.COMPUTE_OPS if lg.is_elementwise(op))
"""Property-less kernels computed element by element (with broadcasting):
the same locally as globally, so a chain of them is one kernel (the ops
with the lg.Elementwise trait)."""

IN_PLACE_KERNELS = FUSABLE_KERNELS | {FUSED}
"""Kernels that read each element before writing it, so their output may
take the bytes of a dying input of its type (a fused chain keeps its
intermediates elsewhere and writes the output last)."""

REINTERPRETING_KERNELS = frozenset(op.name for op in lg.COMPUTE_OPS if op.has_trait(lg.SameBytes))
"""Kernels whose output is their input's bytes in the same order under
another shape (lg.SameBytes): written over a dying input, they have
nothing to do."""

OVERWRITING_KERNELS = IN_PLACE_KERNELS | REINTERPRETING_KERNELS
"""Kernels whose output may be written over a dying input (either kind above)."""


SLICE_KERNEL = "lg.slice"
"""A slice's output may lie on its input's bytes where it is one run of
them (slice_view_start): a gradient bucket's members after its collective."""

CONCAT_KERNEL = "lg.concat"
"""A concatenation's inputs may lie on its output's bytes where each is one
run of them: a gradient bucket's members before its collective."""


def does_nothing(actor: Operation) -> bool:
    """A reinterpreting actor the memory plan wrote over its input (a
    reshape in place), a slice it placed on its input's bytes or a
    concatenation whose inputs it placed on its output's (views): its
    output already holds its bytes, so the runtime skips it and the
    simulator prices it at nothing."""
    return (isinstance(actor, ComputeOp) and actor.in_place is not None
            and (actor.kernel.data in REINTERPRETING_KERNELS
                 or actor.kernel.data in (SLICE_KERNEL, CONCAT_KERNEL)))


def slice_view_start(actor: ComputeOp, in_shape: Sequence[int]) -> int | None:
    """Where a slice actor's output starts in its input (an element index,
    row-major, of the local piece `in_shape`) when the output is one run of
    the input's elements in their order (unit strides; before the last
    partly kept axis, one index per axis; after it, every axis whole), so
    that it can be a view of those bytes; None otherwise. An axis the slice
    keeps whole may be split, so whole is read against the local extent
    (as the numpy kernel reads it)."""
    props = actor.props.data
    starts, limits, strides = (cast(DenseArrayBase[I64], props[k]).get_values()
                              for k in ("starts", "limits", "strides"))
    if any(st != 1 for st in strides) or len(starts) != len(in_shape):
        return None
    local = [(0, d) if lo == 0 and hi >= d else (lo, hi) for lo, hi, d in zip(starts, limits, in_shape)]
    axis = len(in_shape) - 1
    while axis >= 0 and local[axis] == (0, in_shape[axis]):
        axis -= 1
    if any(hi - lo != 1 for lo, hi in local[:max(axis, 0)]):
        return None
    start, stride = 0, 1
    for (lo, _), d in zip(reversed(local), reversed(in_shape)):
        start += lo * stride
        stride *= d
    return start


def slice_view_offset(actor: ComputeOp, src: RegisterOp) -> int | None:
    """How many bytes into `src`'s (one slot's) bytes a slice actor's
    output starts where it is one run of them (slice_view_start); None
    otherwise, or where `src` has several slots (each slot's run would lie
    elsewhere)."""
    from .dtypes import numpy_dtype  # here: sbp-opt reads and verifies IR without importing numpy

    first = slice_view_start(actor, src.type.get_shape())
    if first is None or src.slots.value.data != 1:
        return None
    return first * numpy_dtype(src.type.element_type).itemsize


@dataclass(frozen=True)
class FusedStep:
    kernel: str
    args: tuple[int, ...]
    type: TensorType

    def attr(self) -> DictionaryAttr:
        return DictionaryAttr({"kernel": StringAttr(self.kernel), "args": DenseArrayBase.from_list(i64, self.args),
                               "type": self.type})


def fused_steps(actor: ComputeOp) -> list[FusedStep]:
    """The steps of a `plan.fused` actor (checked by its verifier)."""
    steps = actor.props.data.get("steps")
    if not isinstance(steps, ArrayAttr):
        raise VerifyException(f"'plan.compute' @{actor.sym_name.data}: a {FUSED} actor needs props {{steps = [...]}}")
    out = []
    for i, step in enumerate(steps.data):
        fields = step.data if isinstance(step, DictionaryAttr) else {}
        kernel, args, t = fields.get("kernel"), fields.get("args"), fields.get("type")
        if not (isinstance(kernel, StringAttr) and isinstance(args, DenseArrayBase) and isinstance(t, TensorType)):
            raise VerifyException(
                f"'plan.compute' @{actor.sym_name.data}: step {i} needs kernel (string), args (array<i64>) "
                "and type (tensor)"
            )
        out.append(FusedStep(kernel.data, tuple(args.get_values()), t))
    return out


_CHECKED_STEPS: dict[int, tuple[DictionaryAttr, list[FusedStep]]] = {}
"""id(props of a plan.fused actor) -> (the props, fused_steps of them): the
verifiers of the actor and of its device both read its steps, and the
actors of a chain on every rank share one props attribute. An entry keeps
its attribute alive, so the id is not reused."""


def _checked_steps(actor: ComputeOp) -> list[FusedStep]:
    """fused_steps(actor) for the verifiers, which only read it, parsed
    once per props attribute (a steps list that fails to parse raises
    each time)."""
    props = actor.props
    found = _CHECKED_STEPS.get(id(props))
    if found is not None and found[0] is props:
        return found[1]
    steps = fused_steps(actor)
    remember(_CHECKED_STEPS, id(props), (props, steps))
    return steps


@op_definition
class ComputeOp(ActorOp):
    """Runs one lg kernel (`kernel` names the op, `props` holds its
    properties) on the local pieces in its input registers, writing its
    output register; or, with kernel `plan.fused`, a chain of elementwise
    ones (see FUSED)."""

    name = "plan.compute"

    sym_name = prop_def(SymbolNameConstraint())
    kernel = prop_def(StringAttr)
    props = prop_def(DictionaryAttr, default_value=DictionaryAttr({}))
    ins = prop_def(ArrayAttr[SymbolRefAttr])
    outs = prop_def(ArrayAttr[SymbolRefAttr])
    in_place = opt_prop_def(UnitAttr)

    traits = traits_def(SymbolOpInterface(), HasParent(DeviceOp))

    assembly_format = "$sym_name $kernel $ins `->` $outs (`props` $props^)? (`in_place` $in_place^)? attr-dict"

    def verify_(self) -> None:
        if len(self.outs.data) != 1:
            raise VerifyException(f"'{self.name}' @{self.sym_name.data}: a compute actor writes one register")
        if self.kernel.data == FUSED:
            self._verify_fused()

    def _verify_fused(self) -> None:
        where = f"'{self.name}' @{self.sym_name.data}"
        steps = _checked_steps(self)
        if not steps:
            raise VerifyException(f"{where}: a {FUSED} actor needs at least one step")
        n = len(self.ins.data)
        for i, step in enumerate(steps):
            if step.kernel not in FUSABLE_KERNELS:
                raise VerifyException(f"{where}: step {i} runs {step.kernel}, which is not an elementwise kernel")
            if not step.args or any(a < 0 or a >= n + i for a in step.args):
                raise VerifyException(
                    f"{where}: step {i} ({step.kernel}) reads {list(step.args)}; it may read inputs 0..{n - 1} "
                    f"and the results of earlier steps ({n}..{n + i - 1})"
                )


@op_definition
class CommOp(ActorOp):
    """This device's part in one collective (`id` names it on every member):
    its kind, its rank group in order, the mesh axes it acts on, and the
    distributions before (`from`) and after (`to`). A transfer's sending
    devices have only inputs, its receiving devices only outputs."""

    name = "plan.comm"

    sym_name = prop_def(SymbolNameConstraint())
    kind = prop_def(StringAttr)
    comm_id = prop_def(IntegerAttr[I64], prop_name="id")
    group = prop_def(DenseArrayBase.constr(i64))
    mesh_axes = prop_def(DenseArrayBase.constr(i64), default_value=DenseArrayBase.from_list(i64, []))
    source = prop_def(DTensorType, prop_name="from")
    dest = prop_def(DTensorType, prop_name="to")
    bytes = opt_prop_def(IntegerAttr[I64])
    ins = prop_def(ArrayAttr[SymbolRefAttr])
    outs = prop_def(ArrayAttr[SymbolRefAttr])

    traits = traits_def(SymbolOpInterface(), HasParent(DeviceOp))

    assembly_format = (
        "$sym_name $kind `id` $id $ins `->` $outs `group` $group (`over` $mesh_axes^)? (`bytes` $bytes^)? "
        "`from` qualified($from) `to` qualified($to) attr-dict"
    )

    KINDS: ClassVar[tuple[str, ...]] = (*COLLECTIVES, TRANSFER)

    def verify_(self) -> None:
        where = f"'{self.name}' @{self.sym_name.data}"
        if self.kind.data not in self.KINDS:
            raise VerifyException(f"{where}: unknown collective '{self.kind.data}'")
        group = list(self.group.get_values())
        if len(set(group)) != len(group) or not group:
            raise VerifyException(f"{where}: the rank group must be non-empty and distinct, got {group}")
        device = self.parent_op()
        if isinstance(device, DeviceOp) and device.rank.value.data not in group:
            raise VerifyException(f"{where}: rank {device.rank.value.data} is not in its own group {group}")
        grouped, indexed = self.reads_group_ends(), self.reads_index()
        if self.kind.data != "transfer" and (len(self.ins.data), len(self.outs.data)) != (1 + grouped + indexed, 1):
            raise VerifyException(f"{where}: a {self.kind.data} reads one register and writes one"
                                  + (", and reads the group ends" if grouped else "")
                                  + (", and reads the index" if indexed else ""))
        if self.kind.data == "transfer" and not (self.ins.data or self.outs.data):
            raise VerifyException(f"{where}: a transfer actor sends, receives, or both")


    def reads_group_ends(self) -> bool:
        """Whether it goes into or out of rows grouped by expert (G) on its
        mesh axes, so it reads the group ends too (its second input)."""
        return self._reads(reads_group_ends)

    def reads_index(self) -> bool:
        """Whether it goes into or out of rows gathered by an index (I), so
        it reads the index too (its last input)."""
        return self._reads(reads_index)

    def _reads(self, step_reads: Callable[[Sbp, Sbp], bool]) -> bool:
        if not (owns_rows(self.source) or owns_rows(self.dest)):
            return False  # every collective but those of rows owned at run time: verified often
        src, dst = nd_to_plain(self.source.nd_sbp), nd_to_plain(self.dest.nd_sbp)
        return any(step_reads(src[a], dst[a]) for a in self.mesh_axes.get_values() if a < len(src))


MATMUL_BLOCK_FLOPS = 400e6
"""While communication is in flight, a long matmul actor runs in column
blocks of about this many flops (a few ms on one core), so MPI, which moves
bytes only inside MPI calls, gets a call between blocks; a shorter one runs
whole, and in-flight collectives wait for its end."""
MIN_BLOCK_COLUMNS = 2048
"""Narrower blocks lose GEMM efficiency: BLAS packs the whole left operand
again for every block, so a block of W columns pays about 1/W of the
packing per output column. One core of a 2-core Intel Xeon, OpenBLAS's
SkylakeX kernels, 2026-12-01, best of 9, two runs: GPT-2 small's GEMMs
(512 rows a rank) in blocks of 256 columns ran at 0.59-0.94x one call's
rate, of 512 at 0.66-0.96x, of 1024 at 0.70-0.98x, of 2048 at 0.94-0.99x;
the MLP's 4096 x 128 x 4096 weight gradient at 0.51x (256), 0.71x (512),
0.87x (1024) and 0.91x (2048). In whole training steps no plan measured
ran faster in narrow blocks: GPT-2 small on 2 ranks, in eight interleaved
rounds, took 6% less time a step in one call than in blocks of 256 (the
mean of the rounds' medians; faster in seven), and within the machine's
noise the same in blocks of 2048."""


def matmul_blocks(flops: float, columns: int) -> int:
    """The column blocks a matmul actor of `flops` with `columns` output
    columns runs in while communication is in flight (1: in one call). The
    runtime's kernels and the step-time simulator both read it here."""
    count = min(int(flops // MATMUL_BLOCK_FLOPS), columns // MIN_BLOCK_COLUMNS)
    return count if count >= 2 else 1


def update_pairs(device: DeviceOp) -> list[tuple[str, str]]:
    """(register of `new.<key>`, register of parameter <key>) pairs whose
    local pieces match: after each step the runtime copies the update over
    its parameter (lg-optimizer's outputs), so the next step trains on. An
    update the memory plan already wrote over its parameter (`alias`) needs
    no copy."""
    registers = {r.sym_name.data: r for r in device.registers()}
    params = {r.param.data: name for name, r in registers.items() if r.param is not None}
    pairs = []
    for name, reg in registers.items():
        if reg.fetch is not None and reg.fetch.data.startswith("new."):
            target = params.get(reg.fetch.data.removeprefix("new."))
            if reg.alias is not None and reg.alias.string_value() == target:
                continue
            if target is not None and registers[target].value == reg.value:
                pairs.append((name, target))
    return pairs


def programs(module: ModuleOp) -> list[ProgramOp]:
    """The plan programs of a module, in order."""
    return [op for op in module.ops if isinstance(op, ProgramOp)]


PLAN = Dialect("plan", [ProgramOp, DeviceOp, RegisterOp, ComputeOp, CommOp], [])


REPRESENTATIVES = "plan.representatives"
"""Unit attribute of a plan.program that holds one device per equivalence
class (for simulation only; the runtime refuses it)."""


def equivalence_classes(placements: Sequence[PlacementOp], ranks: Sequence[int] = ()) -> dict[int, int]:
    """rank -> the representative rank of its class: the smallest rank on the
    same set of placements (`ranks` adds ranks on none)."""
    on: dict[int, list[str]] = {r: [] for r in ranks}
    for p in placements:
        for r in p.mesh().ranks:
            on.setdefault(r, []).append(p.sym_name.data)
    first: dict[tuple[str, ...], int] = {}
    for r in sorted(on):
        first.setdefault(tuple(sorted(on[r])), r)
    return {r: first[tuple(sorted(on[r]))] for r in on}
