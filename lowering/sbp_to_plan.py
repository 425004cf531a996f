"""`sbp-to-plan`: lowers a boxed sbp-level graph to the `plan` dialect.

- One register per value per device of its placement, typed with the local
  piece; feeds, parameters (with their initializers), constants and fetched
  outputs are marked, parameters and constants persistent. Values that cross
  placements (pipeline stage boundaries) get `slots` buffers so the producer
  may run ahead.
- One compute actor per lg op per device, carrying the kernel and its
  properties; one communication actor per collective per participating
  device, with its rank group (the devices that differ only on the mesh axes
  it acts on) and a program-wide `id`.
- One global schedule (planning/list_schedule.py), restricted to each device: a topological order that
  issues every communication actor as soon as its input is ready, runs the
  computation that feeds communication early and the computation that reads
  its result late, so collectives overlap with the work in between. Every device takes its actors in
  this one order, so the collectives are issued in the same order on every
  rank, and no two ranks can wait on each other.
- Where the graph's `lg.pipeline_schedule` is `1f1b` (lg-micro-batch), each
  pipeline stage gets its own order instead: stage s of S runs S-1-s
  micro-batches' forwards ahead, then one backward per forward
  (`one_f_one_b`), so at most S-s micro-batches' activations are live on
  it. The ranks of a stage share its order (its collectives stay in one
  order); stages post their transfers in different orders, which is safe
  because transfers match by id.
- Ops lg-recompute made (`lg.recompute`) are held back until the other
  operands of the backward op that reads them are ready.
"""

from __future__ import annotations

from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects.builtin import (
    ArrayAttr,
    DictionaryAttr,
    IntegerAttr,
    ModuleOp,
    StringAttr,
    SymbolRefAttr,
    TensorType,
    UnitAttr,
)
from xdsl.ir import Attribute, Operation, SSAValue
from xdsl.passes import ModulePass
from xdsl.rewriter import Rewriter
from xdsl.utils.exceptions import PassFailedException

from sbpc.dialects import lg, plan, sbp
from sbpc.dialects.builders import flat_symbol_ref, i64_array, i64_attr
from sbpc.dialects.irdl_verify import bare_op
from sbpc.dialects.lg_analysis import one_f_one_b
from sbpc.dialects.pieces import piece_of, rank_group
from sbpc.dialects.sbp import DTensorType, Mesh, lookup_placement
from sbpc.planning.bucketing import pricing_cluster
from sbpc.planning.cost_model import DEFAULT_DEVICE, device_for
from sbpc.planning.list_schedule import schedule, source_kind

from .lg_micro_batch import MICRO_BATCH_ATTR, SCHEDULE_ATTR

SHARED = -1
"""The micro-batch label of an op that combines several (gradient accumulation)."""


def micro_batch_labels(body: list[Operation]) -> dict[Operation, int]:
    """The micro-batch of each op: lg-micro-batch marks the unrolled forward
    ops; another op (autodiff's, boxing's) takes its operands' micro-batch,
    SHARED where they disagree; ops of no micro-batch are left out."""
    labels: dict[Operation, int] = {}
    for op in body:
        mark = op.attributes.get(MICRO_BATCH_ATTR)
        if isinstance(mark, IntegerAttr):
            labels[op] = mark.value.data
            continue
        seen = {labels[o.owner] for o in op.operands if isinstance(o.owner, Operation) and o.owner in labels}
        if len(seen) == 1:
            labels[op] = seen.pop()
        elif seen:
            labels[op] = SHARED
    return labels


def _tail(ops: list[Operation], labels: dict[Operation, int]) -> set[Operation]:
    """A stage's updates: the ops of no one micro-batch that read a value
    reduced over the stage's own ranks (a gradient, summed over the
    micro-batches and reduced over the data axis) and that no micro-batch's
    work reads, even through other ops. They run after the stage's last
    backward (its last slot), whose gradient the stage before is waiting
    for: run as soon as the reduction was ready, they held that send back
    by the whole optimizer (GPT on 2 H100 stages of 2, 4 micro-batches: 6.3
    ms a step simulated, where the stages' work composes to 5.5). What else
    combines micro-batches (a gradient's sum, so that its reduction
    overlaps the backward; a gathered parameter's reshape that each
    micro-batch reads) runs as soon as it is ready."""
    inside = set(ops)
    needed: set[Operation] = set()  # what a micro-batch's op reads, through any chain
    for op in reversed(ops):
        for result in op.results:
            if any(use.operation in inside and (labels.get(use.operation, SHARED) != SHARED
                                                or use.operation in needed) for use in result.uses):
                needed.add(op)
                break
    return {op for op in ops if labels.get(op, SHARED) == SHARED and op not in needed and any(
        isinstance(v.owner, Operation) and v.owner in inside and sbp.communicates(type(v.owner))
        and not isinstance(v.owner, sbp.TransferOp) for v in op.operands)}


Spec = tuple[type[plan.RegisterOp | plan.ComputeOp | plan.CommOp], dict[str, Attribute]]
"""A register or actor to build: its class and properties."""


@dataclass
class Lowering:
    graph: lg.GraphOp
    pipeline_slots: int
    only: set[int] | None = None
    """Ranks to lower (the representatives of their classes); None: all."""
    share_bodies: bool = True
    """Give a rank whose registers and actors equal an earlier rank's no body
    of its own, but `like` that rank (see SbpToPlanPass.share_bodies)."""
    stream_per_group: bool = False
    """The device runs each group's collectives on a stream of its own (the schedule's waits)."""

    def __post_init__(self) -> None:
        # Per value by its id (an SSAValue hashes in Python; every value
        # lives in the graph while it is lowered): its register name, that
        # name as an attribute, and a reference to it.
        self.names: dict[int, str] = {}
        self.meshes: dict[str, Mesh] = {}  # placement name -> its mesh
        self.taken: set[str] = set()  # the values of `names`, kept as a set for the uniqueness test
        self.devices: dict[int, list[Operation]] = {}
        self.comm_count = 0
        self.comm_ids: dict[Operation, int] = {}
        self.stage: set[int] | None = None
        """While lowering one pipeline stage's order: its ranks."""
        # Attributes are immutable, so every register and actor that needs
        # the same one can share it; building them (each verifies itself) was
        # most of this pass's time.
        self.ref_attrs: dict[int, SymbolRefAttr] = {}
        self.local_types: dict[tuple, TensorType] = {}
        self.local_bytes: dict[tuple, IntegerAttr] = {}  # per local type (same key): its bytes
        # (id(value type), rank) -> (the type, its local type there, its bytes); the entry keeps the type alive
        self.pieces: dict[tuple[int, int], tuple[DTensorType, TensorType, IntegerAttr]] = {}
        self.kernels: dict[str, StringAttr] = {}  # op name -> the kernel attribute of its actors
        self.no_props = DictionaryAttr({})
        self.ints: dict[int, IntegerAttr] = {}
        self.name_attrs: dict[int, StringAttr] = {}

    def name_of(self, value: SSAValue) -> str:
        name = self.names.get(id(value))
        if name is None:
            base = value.name_hint or f"v{len(self.names)}"
            name, k = base, 1
            while name in self.taken:
                name, k = f"{base}_{k}", k + 1
            self.names[id(value)] = name
            self.taken.add(name)
        return name

    def name_attr(self, value: SSAValue) -> StringAttr:
        """The register name of `value` as an attribute, shared by its registers on every rank."""
        attr = self.name_attrs.get(id(value))
        if attr is None:
            attr = self.name_attrs[id(value)] = StringAttr(self.name_of(value))
        return attr

    def ref(self, value: SSAValue) -> SymbolRefAttr:
        ref = self.ref_attrs.get(id(value))
        if ref is None:
            # from the register's name attribute (built once), unchecked: its parts are verified attributes
            ref = self.ref_attrs[id(value)] = flat_symbol_ref(self.name_attr(value))
        return ref

    def int_attr(self, n: int) -> IntegerAttr:
        if n not in self.ints:
            self.ints[n] = i64_attr(n)
        return self.ints[n]

    def mesh_of(self, value: SSAValue) -> Mesh:
        t = value.type
        if not isinstance(t, DTensorType):
            owner = value.owner
            what = f"'{owner.name}': its result" if isinstance(owner, Operation) else "a block argument"
            raise PassFailedException(f"{what} has no distribution; run sbp-infer first")
        # by placement name: the graph's placements do not change while it is lowered
        mesh = self.meshes.get(t.placement_name)
        if mesh is None:
            mesh = self.meshes[t.placement_name] = lookup_placement(self.graph, t.placement).mesh()
        return mesh

    def registers(self, value: SSAValue, ranks, fetched: dict[int, str], crossing: set[int]) -> list[Spec]:
        """The registers of `value` on `ranks`, as specs: what they share
        (name, value, role, all attributes) is read once, only the local
        piece per rank."""
        t = value.type
        mesh = self.mesh_of(value)
        assert isinstance(t, DTensorType)  # mesh_of raised otherwise
        name = self.name_attr(value)
        # in the order register properties have always been given (the generic form prints them so)
        role: dict[str, Attribute] = {}
        if id(value) in crossing:
            role["slots"] = self.int_attr(self.pipeline_slots)
        owner = value.owner
        source = source_kind(type(owner))
        if source is lg.InputOp:
            assert isinstance(owner, lg.InputOp)
            role["feed"] = owner.key
        elif source is lg.ParamOp:
            assert isinstance(owner, lg.ParamOp)
            role.update(persistent=UnitAttr(), param=owner.key, init=owner.init, seed=owner.seed)
        elif source is lg.ConstantOp:
            assert isinstance(owner, lg.ConstantOp)
            role.update(persistent=UnitAttr(), constant=owner.value)
        if id(value) in fetched:
            role["fetch"] = StringAttr(fetched[id(value)])
        out: list[Spec] = []
        for rank in ranks:
            # values alike share their type object: its piece on a rank is found once
            piece = self.pieces.get((id(t), rank))
            if piece is None or piece[0] is not t:
                region = piece_of(t, mesh, rank)
                key = (t.element_type, tuple(s.stop - s.start for s in region))
                local = self.local_types.get(key)
                if local is None:
                    local = self.local_types[key] = TensorType(t.element_type, list(key[1]))
                    self.local_bytes[key] = self.int_attr(plan.tensor_bytes(local))
                piece = self.pieces[(id(t), rank)] = (t, local, self.local_bytes[key])
            _, local, nbytes = piece
            props = {"sym_name": name, "type": local, "bytes": nbytes, "value": t, **role}
            out.append((plan.RegisterOp, props))
        return out

    def ranks(self, ranks):
        if self.only is not None:
            ranks = [r for r in ranks if r in self.only]
        if self.stage is not None:
            ranks = [r for r in ranks if r in self.stage]
        return ranks

    def stage_orders(self, body: list[Operation]) -> list[tuple[set[int], list[Operation]]] | None:
        """Per pipeline stage, its ranks and its ops in the order of the
        graph's `lg.pipeline_schedule`; None for one global order (GPipe, or
        no stages). Each stage orders its own ops, so stages run different
        interleavings of the micro-batches (point-to-point transfers match
        by id, not order); every rank of a stage shares its stage's order,
        so the collectives inside a stage stay in one order."""
        kind = self.graph.attributes.get(SCHEDULE_ATTR)
        if not isinstance(kind, StringAttr) or kind.data != "1f1b":
            return None
        stage_ops: dict[str, list[Operation]] = {}
        for op in body:
            names = [self.placement_name(op.results[0])]
            if isinstance(op, sbp.TransferOp):
                names.insert(0, self.placement_name(op.input))
            for name in dict.fromkeys(names):
                stage_ops.setdefault(name, []).append(op)
        if len(stage_ops) < 2:
            return None
        labels = micro_batch_labels(body)
        forward = self.forward_ops()
        micro = 1 + max((k for k in labels.values() if k >= 0), default=0)
        # A stage's index is its depth in the forward pass's flow between
        # stages (the longest chain of forward transfers that reaches it).
        edges = {(self.placement_name(op.input), self.placement_name(op.result)) for op in body
                 if isinstance(op, sbp.TransferOp) and op in forward}
        depth = dict.fromkeys(stage_ops, 0)
        for _ in stage_ops:
            for a, b in edges:
                if a != b:
                    depth[b] = max(depth[b], depth[a] + 1)
        out = []
        for s, name in enumerate(sorted(stage_ops, key=depth.__getitem__)):
            ops = stage_ops[name]
            place = one_f_one_b(s, len(stage_ops), micro)

            tail = _tail(ops, labels)
            after_every_phase = 1 + max(place.values(), default=0)

            def slot(op: Operation, place=place, name=name, tail=tail, after=after_every_phase) -> int:
                k = labels.get(op, SHARED)
                if k == SHARED:
                    return after if op in tail else SHARED
                # A stage sends a forward activation in its forward slot, even
                # when a backward op reads it (a recomputed op on the next
                # stage): in the backward slot the send would wait for the
                # gradient the receiver cannot make without it.
                sends_activation = isinstance(op, sbp.TransferOp) and self.placement_name(op.input) == name \
                    and op.input.owner in forward
                return place[(op not in forward and not sends_activation, k)]

            mesh = lookup_placement(self.graph, SymbolRefAttr(name)).mesh()
            out.append((set(mesh.ranks), schedule(ops, slot)))
        return out

    def placement_name(self, value: SSAValue) -> str:
        self.mesh_of(value)  # a value without a distribution gets its diagnostic there
        assert isinstance(value.type, DTensorType)
        return value.type.placement_name

    def forward_ops(self) -> set[Operation]:
        """What the outputs other than gradients and updates depend on (the loss)."""
        output = self.graph.output()
        return lg.ancestors([v for n, v in zip(output.names.data, output.values)
                             if not n.data.startswith(("grad.", "new."))])

    def refs(self, values) -> ArrayAttr:
        return ArrayAttr([self.ref(v) for v in values])

    def lower(self) -> plan.ProgramOp:
        body = [op for op in self.graph.body.ops if not isinstance(op, lg.OutputOp)]
        output = self.graph.output()
        # by value id (an SSAValue hashes in Python; the graph keeps them alive)
        fetched: dict[int, str] = {}
        for name, v in zip(output.names.data, output.values):
            fetched.setdefault(id(v), name.data)
        crossing: set[int] = set()
        for op in body:
            if isinstance(op, sbp.AnnotateOp):
                raise PassFailedException(f"'{op.name}': a redistribution is left; run sbp-insert-boxing first")
            if isinstance(op, sbp.TransferOp):
                crossing.update((id(op.input), id(op.result)))
        registers: dict[int, list[Spec]] = {}
        for op in body:
            v = op.results[0]
            ranks = self.ranks(self.mesh_of(v).ranks)
            for rank, reg in zip(ranks, self.registers(v, ranks, fetched, crossing)):
                registers.setdefault(rank, []).append(reg)
        actors: dict[int, list[Spec]] = {rank: [] for rank in registers}
        stages = self.stage_orders(body)
        if stages is None:
            for op in schedule(body, stream_per_group=self.stream_per_group):
                self.lower_op(op, actors)
        else:
            for ranks, order in stages:
                self.stage = ranks
                for op in order:
                    self.lower_op(op, actors)
            self.stage = None
        # The ops are built only for the ranks that get a body: the others'
        # specs are compared with those and dropped.
        devices: list[plan.DeviceOp] = []
        bodies: list[tuple[list[Spec], str]] = []  # (specs, device name) of each device given a body
        for rank in sorted(registers):
            specs, device_name = [*registers[rank], *actors[rank]], f"rank{rank}"
            if self.share_bodies:
                # Equal specs (class, properties) make equal ops. Cheap to
                # compare: ranks alike share most attribute objects (compared
                # by identity first); other ranks differ early.
                like = next((owner for owner_specs, owner in bodies if owner_specs == specs), None)
                if like is not None:
                    devices.append(plan.DeviceOp(device_name, rank, [], like=like))
                    continue
                bodies.append((specs, device_name))
            # (a copy: an op fills in its defaults, and later ranks compare with these specs)
            ops = [bare_op(kind, dict(props)) for kind, props in specs]
            devices.append(plan.DeviceOp(device_name, rank, ops))
        return plan.ProgramOp(self.graph.sym_name.data, devices)

    def lower_op(self, op: Operation, actors: dict[int, list[Spec]]) -> None:
        if source_kind(type(op)) is not None:  # its register is all it needs
            return
        out = op.results[0]
        name = self.name_of(out)
        if isinstance(op, lg.SbpRules):
            # one set of (immutable) attributes for the actor on every rank
            kernel = self.kernels.get(op.name)
            if kernel is None:
                kernel = self.kernels[op.name] = StringAttr(op.name)
            props: dict[str, Attribute] = {
                "sym_name": StringAttr(f"{name}.{op.name.removeprefix('lg.')}"),
                "kernel": kernel,
                "props": DictionaryAttr(dict(op.properties)) if op.properties else self.no_props,
                "ins": self.refs(op.operands),
                "outs": self.refs([out]),
            }
            for rank in self.ranks(self.mesh_of(out).ranks):
                actors[rank].append((plan.ComputeOp, dict(props)))
        elif sbp.is_collective(type(op)):
            self.lower_collective(op, actors)
        else:
            raise PassFailedException(f"'{op.name}': sbp-to-plan cannot lower this op")

    def lower_collective(self, op: Operation, actors: dict[int, list[Spec]]) -> None:
        assert isinstance(op, sbp.CollectiveOp | sbp.TransferOp)  # what COLLECTIVE_OPS holds
        source, out = op.operands[0], op.results[0]
        src_mesh, dst_mesh = self.mesh_of(source), self.mesh_of(out)
        kind = op.name.removeprefix("sbp.")
        if op not in self.comm_ids:  # a transfer is lowered once per stage it joins
            self.comm_ids[op] = self.comm_count
            self.comm_count += 1
        comm_id = self.comm_ids[op]
        base = {
            "kind": StringAttr(kind),
            "id": i64_attr(comm_id),
            "from": source.type,
            "to": out.type,
        }
        if op.bytes is not None:
            base["bytes"] = op.bytes
        name = f"{self.name_of(out)}.{kind}"
        if isinstance(op, sbp.TransferOp):
            group = list(dict.fromkeys([*src_mesh.ranks, *dst_mesh.ranks]))
            for rank in self.ranks(group):
                actors.setdefault(rank, []).append((plan.CommOp, {
                    **base,
                    "sym_name": StringAttr(name),
                    "group": i64_array(group),
                    "ins": self.refs([source] if rank in src_mesh.ranks else []),
                    "outs": self.refs([out] if rank in dst_mesh.ranks else []),
                }))
            return
        axes = list(op.mesh_axes.get_values())
        for rank in self.ranks(src_mesh.ranks):
            actors[rank].append((plan.CommOp, {
                **base,
                "sym_name": StringAttr(name),
                "group": i64_array(rank_group(src_mesh, rank, axes)),
                "mesh_axes": op.mesh_axes,
                # the group ends and the index, where it goes into or out of grouped or gathered rows
                "ins": self.refs([source, *(v for v in (op.ends, op.index) if v is not None)]),
                "outs": self.refs([out]),
            }))


@dataclass(frozen=True)
class SbpToPlanPass(ModulePass):
    name = "sbp-to-plan"

    pipeline_slots: int = 2
    """Slots of registers that cross placements, so a stage may run ahead."""

    representatives: bool = False
    """Lower only one device per equivalence class (the smallest rank on each
    set of placements), for the step-time simulator on large clusters: a
    plan it cannot run (the program is marked `plan.representatives`)."""

    share_bodies: bool = True
    """A rank lowered to the same registers and actors as an earlier rank
    (same pieces, same collective groups: every rank of a data-parallel
    plan) gets a `plan.device ... like @that` with no body of its own, so
    the plan passes, the verifier and the runtime's loader handle each
    distinct body once. False gives every rank its own copy."""

    device: str = DEFAULT_DEVICE
    """The cluster the plan runs on (as sbp-infer's `device`): whether it
    runs each group's collectives on a stream of its own decides which of
    the ops waiting for collectives the schedule runs first."""

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        only = None
        placements = [p for p in op.ops if isinstance(p, sbp.PlacementOp)]
        if self.representatives:
            only = set(plan.equivalence_classes(placements).values())
        devices = 1 + max((r for p in placements for r in p.mesh().ranks), default=0)
        for graph in lg.graphs(op):
            try:
                streams = pricing_cluster(device_for(graph, self.device), devices).device.stream_per_group
            except ValueError as e:
                raise PassFailedException(f"sbp-to-plan: {e}") from None
            program = Lowering(graph, self.pipeline_slots, only, self.share_bodies, streams).lower()
            if only is not None:
                program.attributes[plan.REPRESENTATIVES] = UnitAttr()
            op.body.block.insert_op_before(program, graph)
            Rewriter.erase_op(graph)
