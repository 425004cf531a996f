"""Planning by layers: how sbp-autoplan scales to thousands of devices and
ops (Alpa's profile-then-compose, on sbpc's own simulator).

Planning a whole training graph per layout (sbp_autoplan.py) costs a full
lowering and simulation per candidate: seconds for a small graph, minutes
for a 48-layer GPT unrolled over 16 micro-batches. Here the forward graph
is cut into *layers* where the fewest activations cross (a transformer's
residual stream between its attention and MLP halves), layers of the same
structure form one class, and each class is profiled once per (tensor
degree t, examples per micro-batch, recomputation policy): the layer alone
becomes a small training graph on a mesh of t devices inside a node (its
incoming activations replicated over them, Megatron-style), sbp-infer
chooses its ops' SBP, and the step-time simulator replays it forward only
and forward plus backward. A candidate plan (pipeline stages x data
parallel degree x tensor degree, micro-batches, schedule, memory mode,
recomputation) is then priced by composition:

- stages: a contiguous partition of the layers minimizing the slowest
  stage (dynamic programming);
- pipeline: sum over stages of one micro-batch's forward and backward, plus
  (micro-batches - 1) x the slowest stage, plus the activation transfers
  between stages on the links the stage boundary crosses;
- data parallelism: each gradient's collective (all_reduce, or
  reduce_scatter and all_gather for ZeRO, gathers per use for FSDP) over
  the replica group, issued as the last micro-batch's backward makes it and
  overlapped with the rest of that backward on a communication stream;
- the optimizer's fused update per parameter (sharded for ZeRO and FSDP);
- memory per device: parameters, gradients and optimizer state (sharded as
  the mode says), each layer's saved activations times the micro-batches in
  flight (all of them in GPipe, stages - s on stage s in 1F1B), and the
  largest layer's working memory.

Each composed figure is a simulator figure of a layer, so the planner ranks
candidates in seconds; how far the composition is from simulating the
whole chosen plan is measured by bench/simulator_scale.py's autoplan rows.
The chosen plan is written as hints (inputs split over the data axis,
every layer's parameters as its class's profile chose, per stage
placements) and the training passes (micro-batches, autodiff, optimizer,
recomputation, ZeRO state), so `compile` lowers it like a hand plan.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from xdsl.context import Context
from xdsl.dialects.builtin import DenseArrayBase, ModuleOp, SymbolRefAttr, TensorType, UnitAttr, f32, i64
from xdsl.ir import Block, Operation, Region, SSAValue
from xdsl.irdl import VarConstraint
from xdsl.passes import PassPipeline
from xdsl.rewriter import Rewriter
from xdsl.utils.exceptions import PassFailedException

from sbpc.dialects import lg
from sbpc.dialects.layout import local_shape
from sbpc.dialects.sbp import (
    PLACEMENT_ATTR,
    AnnotateOp,
    DTensorType,
    PlacementOp,
    Sbp,
    dtensor_of,
    element_bytes,
    element_type,
    global_shape,
    lookup_placement,
    nd_to_plain,
)
from sbpc.perf.cluster import Cluster
from sbpc.perf.step_time import SimulationError, simulate_plan
from sbpc.planning.cost_model import load_device
from sbpc.planning.sbp_problem import build_problem, solve_auto
from sbpc.planning.sbp_search import solve_ilp

from .lg_autodiff import LgAutodiffPass
from .lg_micro_batch import LgMicroBatchPass, rebatch
from .lg_optimizer import STATE_PREFIXES, LgOptimizerPass
from .lg_recompute import SOURCES as RECOMPUTE_SOURCES
from .lg_recompute import LgRecomputePass, forward_ops, narrow_cuts, saved_values
from .plan_allocate_memory import PlanAllocateMemoryPass
from .plan_fuse_elementwise import PlanFuseElementwisePass
from .sbp_infer import apply_solution
from .sbp_insert_boxing import SbpInsertBoxingPass
from .sbp_simplify import SbpSimplifyPass
from .sbp_to_plan import SbpToPlanPass, one_f_one_b

SOURCES = (*RECOMPUTE_SOURCES, lg.OutputOp)
MIN_LAYER_OPS = 4
"""A layer of fewer ops joins the next one (the embedding's add, the head's loss)."""
STATE_COPIES = {"adam": 2, "adamw": 2, "momentum": 1}
"""Optimizer state per parameter (Adam's m and v; the momentum buffer)."""
ILP_GAP = 0.05
"""HiGHS stops within 5% of its bound, then the plan is refined locally: on
GPT-1.3B layers on 8 devices 0.2-1 s and within 0.5% of the optimum, which
HiGHS takes 2-11 s to prove (auto's search: 13-25% above it)."""
REQUEST_ATTR = "sbp.autoplan.request"
"""Marks the requests the planner writes (the profile's distribution of a value)."""
ADAM_STEPS = 12
"""Elementwise steps of one fused optimizer update (lg-optimizer's Adam chain)."""


# -- layers --------------------------------------------------------------------------------


@dataclass
class Layer:
    ops: list[Operation]
    ins: list[SSAValue]
    """Activations made by earlier layers and read here, in first-use order."""
    outs: list[SSAValue]
    """Values made here and read by later layers or the graph's outputs."""
    params: list[lg.ParamOp]
    """The parameters it reads, in first-use order."""
    key: tuple = ()
    """Its structure: layers with equal keys share one profile and one choice."""


def split_layers(graph: lg.GraphOp) -> list[Layer]:
    """The forward graph's ops in program order, cut after every op where
    the fewest activations cross (lg_recompute.narrow_cuts)."""
    order = [op for op in graph.body.ops if not isinstance(op, SOURCES)]
    if not order:
        return []
    crossing = narrow_cuts(order)
    fewest = min((len(c) for c in crossing if c), default=0)
    ends = [i for i, c in enumerate(crossing) if c and len(c) == fewest]
    if not ends or ends[-1] != len(order) - 1:
        ends.append(len(order) - 1)
    pieces: list[list[Operation]] = []
    start = 0
    for end in ends:
        pieces.append(order[start:end + 1])
        start = end + 1
    # A short piece of its own kind (the embedding's lookup, the head's
    # loss) joins the next piece (the last ones, the one before), so
    # profiles stay few; repeated pieces stay layers of their own.
    keys = [_layer(piece).key for piece in pieces]
    merged: list[list[Operation]] = []
    pending: list[Operation] = []
    for piece, key in zip(pieces, keys, strict=True):
        pending += piece
        if len(pending) >= MIN_LAYER_OPS or keys.count(key) > 1:
            merged.append(pending)
            pending = []
    if pending:
        if merged:
            merged[-1] += pending
        else:
            merged.append(pending)
    return [_layer(ops) for ops in merged]


def _layer(ops: list[Operation]) -> Layer:
    inside = set(ops)
    ins: list[SSAValue] = []
    params: list[lg.ParamOp] = []
    for op in ops:
        for v in op.operands:
            owner = v.owner
            if isinstance(owner, lg.ParamOp) and owner not in params:
                params.append(owner)
            elif isinstance(owner, Operation) and not isinstance(owner, SOURCES) and owner not in inside \
                    and v not in ins:
                ins.append(v)
    outs: list[SSAValue] = [r for op in ops for r in op.results if any(u.operation not in inside for u in r.uses)]
    layer = Layer(ops, ins, outs, params)
    layer.key = _structure(layer)
    return layer


def _structure(layer: Layer) -> tuple:
    local: dict[SSAValue, tuple] = {}
    ins = {v: ("in", k) for k, v in enumerate(layer.ins)}
    key: list[tuple] = []
    for i, op in enumerate(layer.ops):
        refs = []
        for v in op.operands:
            ref = local.get(v) or ins.get(v)
            if ref is None:
                owner = v.owner
                ref = (owner.name if isinstance(owner, Operation) else "arg", str(v.type))
            refs.append(ref)
        props = tuple(sorted((k, str(a)) for k, a in op.properties.items()))
        key.append((op.name, props, tuple(str(r.type) for r in op.results), tuple(refs)))
        for j, r in enumerate(op.results):
            local[r] = ("op", i, j)
    key.append(tuple(local[v] for v in layer.outs))
    return tuple(key)


def _local_bytes(value: SSAValue) -> int:
    t = value.type
    if isinstance(t, DTensorType):
        owner = value.owner
        assert isinstance(owner, Operation)
        mesh = lookup_placement(owner, SymbolRefAttr(t.placement_name)).mesh()
        shape = local_shape(t, mesh, mesh.ranks[0])
    else:
        shape = global_shape(t)
    return math.prod(shape) * element_bytes(element_type(t))


# -- profiles --------------------------------------------------------------------------------


@dataclass
class Profile:
    """One layer class at one (tensor degree, micro-batch, recomputation), per device."""

    forward: float
    backward: float
    """Seconds of one micro-batch's backward (recomputation included)."""
    params: list[int]
    """Bytes of each parameter's piece on a device (first-use order)."""
    param_sbp: list[Sbp]
    """Each parameter's distribution over the tensor axis."""
    saved: int
    """Bytes of activations one micro-batch keeps from its forward to its backward."""
    working: int
    """Bytes the layer needs on top while it runs."""
    outs: int
    """Bytes of the activations it hands the next layer (replicated over the tensor axis)."""
    value_sbp: list[Sbp | None] = field(default_factory=list)
    """The distribution over the tensor axis of each of the layer's ops' result (None: a scalar)."""
    backward_comm: float = 0.0
    """Seconds its backward keeps the communication stream busy (tensor-parallel collectives)."""
    itemsize: int = 4
    """Bytes per element of its parameters."""


class Profiler:
    def __init__(self, graph: lg.GraphOp, loss: str, cluster: Cluster, device: str, kind: str, batch: int):
        self.graph = graph
        self.batch = batch
        self.loss = loss
        self.cluster = cluster
        self.device = device
        self.kind = kind
        names = [n.data for n in graph.output().names.data]
        if loss not in names:
            raise PassFailedException(f"sbp-autoplan: the graph has no output named \"{loss}\"")
        self.loss_value = graph.output().values[names.index(loss)]
        self.cache: dict[tuple, Profile] = {}
        self.compiles = 0
        self.references: dict[tuple, list] = {}
        """(layer class, tensor degree, recomputation) -> the signatures chosen
        at the first micro-batch size profiled (the integer program's)."""

    def profile(self, layer: Layer, tensor: int, micro: int, recompute: str) -> Profile:
        key = (layer.key, tensor, micro, recompute)
        if key not in self.cache:
            self.cache[key] = self._profile(layer, tensor, micro, recompute)
        return self.cache[key]

    def module(self, layer: Layer, tensor: int, micro: int) -> ModuleOp:
        """The layer alone, on `micro` examples, on a mesh of `tensor` devices:
        its incoming activations become parameters (so the backward computes
        their gradients, as the layer before needs them), replicated over the
        mesh; a layer without the loss gets a stand-in: the sum of the means
        of what it hands on."""
        block = Block()
        mapping: dict[SSAValue, SSAValue] = {}

        def add(op: Operation) -> Operation:
            op.attributes.pop(PLACEMENT_ATTR, None)
            block.add_op(op)
            return op

        for k, v in enumerate(layer.ins):
            mapping[v] = add(lg.InputOp(f"activation{k}", _plain(v.type))).results[0]
        for op in layer.ops:
            for v in op.operands:
                if v not in mapping and isinstance(v.owner, (lg.InputOp, lg.ParamOp, lg.ConstantOp)):
                    source = v.owner.clone()
                    Rewriter.replace_value_with_new_type(source.results[0], _plain(v.type))
                    mapping[v] = add(source).results[0]
            new = add(op.clone(value_mapper=dict(mapping)))
            for old, made in zip(op.results, new.results, strict=True):
                Rewriter.replace_value_with_new_type(made, _plain(old.type))
                mapping[old] = new.results[old.index]
        if self.loss_value in mapping:
            loss = mapping[self.loss_value]
        else:
            terms = []
            for v in layer.outs:
                shape = global_shape(v.type)
                value = mapping[v]
                if shape:
                    # handed on replicated over the tensor axis, as the next layer's profile takes it
                    value = add(AnnotateOp(value, _replicated(v.type))).results[0]
                if not lg.is_float(element_type(v.type)):  # a mask or labels handed on (no gradient)
                    value = add(lg.CastOp(value, f32)).results[0]
                if shape:
                    value = add(lg.ReduceMeanOp(value, list(range(len(shape))))).results[0]
                terms.append(value)
            loss = terms[0]
            for t in terms[1:]:
                loss = add(lg.AddOp(loss, t)).results[0]
        add(lg.OutputOp([loss], ["loss"]))
        graph = lg.GraphOp("layer", Region(block), "mesh")
        module = ModuleOp([PlacementOp("mesh", self.kind, list(range(tensor)), (tensor,)), graph])
        rebatch(graph, micro)
        for op in list(block.ops):
            if (isinstance(op, lg.InputOp) and op.key.data.startswith("activation")
                    and lg.is_float(element_type(op.result.type))):
                param = lg.ParamOp(op.key.data, _replicated(op.result.type), lg.NormalInitAttr(0.0, 0.02))
                block.insert_op_before(param, op)
                op.result.replace_all_uses_with(param.result)
                op.detach()
                op.erase()
            elif isinstance(op, lg.InputOp) and global_shape(op.result.type):
                Rewriter.replace_value_with_new_type(op.result, _replicated(op.result.type))
        return module

    def _simulate(self, module: ModuleOp) -> tuple[float, int, float]:
        """Step time, peak memory and seconds of collectives in flight."""
        ctx = Context()
        self.compiles += 1
        for p in (SbpInsertBoxingPass(), SbpSimplifyPass(), SbpToPlanPass(representatives=True),
                  PlanFuseElementwisePass(), PlanAllocateMemoryPass()):
            p.apply(ctx, module)
        prediction = simulate_plan(module, self.cluster, steps=2)
        return prediction.step_time, prediction.peak_memory, max(d.comm for d in prediction.devices)

    @staticmethod
    def _training(module: ModuleOp, recompute: str = "none") -> None:
        ctx = Context()
        LgAutodiffPass(loss="loss").apply(ctx, module)
        # A plain SGD update makes each gradient take its parameter's
        # distribution (a tensor-parallel weight's gradient is reduced over
        # the tensor axis if its weight is replicated); its own kernels are
        # taken off the profile's time.
        LgOptimizerPass(algorithm="sgd").apply(ctx, module)
        if recompute != "none":
            LgRecomputePass(policy=recompute, loss="loss").apply(ctx, module)

    def _infer(self, module: ModuleOp, tensor: int, reference: list | None) -> list:
        """sbp-infer on a profiled layer: with no reference, the integer
        program (within ILP_GAP, refined); else each op starts from the
        reference's signature (the same layer at another micro-batch size),
        refined locally, or auto's search where that is cheaper. Returns the
        chosen signatures."""
        graph = lg.graphs(module)[0]
        device = load_device(self.device, list(range(tensor)))
        problem = build_problem(graph, device)
        if tensor == 1:  # nothing to choose but where a value sits (auto's search, milliseconds)
            choice = solve_auto(problem)
        elif reference is None or len(reference) != len(problem.nodes):
            choice = solve_ilp(problem, ILP_GAP)
        else:
            start = [node.candidates.index(sig) if sig in node.candidates else 0
                     for node, sig in zip(problem.nodes, reference, strict=True)]
            exact = problem.exact()
            choice = min(exact.refine(start), solve_auto(problem), key=exact.total)
        apply_solution(graph, problem, choice, "ilp", False)
        return [node.candidates[k] for node, k in zip(problem.nodes, choice, strict=True)]

    def _profile(self, layer: Layer, tensor: int, micro: int, recompute: str) -> Profile:
        train = self.module(layer, tensor, micro)
        self._training(train, recompute)
        key = (layer.key, tensor, recompute)
        chosen = self._infer(train, tensor, self.references.get(key))
        self.references.setdefault(key, chosen)
        forward = _forward_only(train)
        graph = lg.graphs(train)[0]
        params = [op for op in graph.body.ops if isinstance(op, lg.ParamOp)]
        weights = [p for p in params if not p.key.data.startswith("activation")]
        activations = [p for p in params if p.key.data.startswith("activation")]
        keys = [p.key.data for p in layer.params]
        by_key = {p.key.data: p for p in weights}
        ordered = [by_key[k] for k in keys]
        param_bytes = [_local_bytes(p.result) for p in ordered]
        param_sbp = [nd_to_plain(p.result.type.nd_sbp)[0] if isinstance(p.result.type, DTensorType) else Sbp.B
                     for p in ordered]
        forward_set = forward_ops(graph, "loss")
        computed = [op for op in graph.body.ops
                    if op in forward_set and not isinstance(op, (*SOURCES, AnnotateOp))][:len(layer.ops)]
        assert [op.name for op in computed] == [op.name for op in layer.ops]  # the layer's ops, in its order
        value_sbp = [nd_to_plain(op.results[0].type.nd_sbp)[0]
                     if isinstance(op.results[0].type, DTensorType) and global_shape(op.results[0].type) else None
                     for op in computed]
        saved = sum(_local_bytes(v) for v in saved_values(graph, forward_set))
        in_bytes = sum(_local_bytes(p.result) for p in activations)
        out_bytes = sum(math.prod(_rows(global_shape(v.type), self.batch, micro)) * element_bytes(element_type(v.type))
                        for v in layer.outs)
        fwd_time, _, fwd_comm = self._simulate(forward)
        train_time, peak, train_comm = self._simulate(train)
        persistent = 2 * (sum(param_bytes) + in_bytes)
        working = max(0, peak - persistent - saved)
        updates = sum(self.cluster.work_time("plan.fused", 2 * n / 2, 3 * n, "f32", 2)
                      for n in [*param_bytes, in_bytes])
        return Profile(fwd_time, max(0.0, train_time - fwd_time - updates), param_bytes, param_sbp,
                       saved + in_bytes, working, out_bytes, value_sbp, max(0.0, train_comm - fwd_comm),
                       element_bytes(element_type(ordered[0].result.type)) if ordered else 4)


def _forward_only(train: ModuleOp) -> ModuleOp:
    """The inferred training step cut to its forward pass (the same
    distributions): what the loss depends on."""
    forward = train.clone()
    graph = lg.graphs(forward)[0]
    output = graph.output()
    loss = output.values[[n.data for n in output.names.data].index("loss")]
    keep = forward_ops(graph, "loss")
    output.detach()
    output.erase()
    for op in reversed(list(graph.body.ops)):
        if op not in keep and not isinstance(op, SOURCES):
            op.detach()
            op.erase()
    graph.body.block.add_op(lg.OutputOp([loss], ["loss"]))
    return forward


def _rows(shape: Sequence[int], batch: int, micro: int) -> tuple[int, ...]:
    """`shape` with its batch axis (axis 0 of `batch` rows) at `micro` rows."""
    return (micro, *shape[1:]) if shape and shape[0] == batch else tuple(shape)


def _plain(t) -> TensorType:
    return TensorType(element_type(t), list(global_shape(t)))


def _replicated(t) -> DTensorType:
    return dtensor_of(global_shape(t), element_type(t), "mesh", (Sbp.B,))


# -- candidates and their composed cost -------------------------------------------------------


@dataclass(frozen=True)
class LayerLayout:
    stages: int
    data: int
    tensor: int
    micro_batches: int
    memory: str
    schedule: str = "1f1b"
    recompute: str = "none"

    @property
    def mesh(self) -> tuple[int, ...]:
        return tuple(d for d in (self.data, self.tensor) if d > 1) or (1,)

    def describe(self) -> str:
        mesh = f"data {self.data} x tensor {self.tensor}"
        parts = [f"{self.stages} stages of {mesh}" if self.stages > 1 else mesh]
        if self.micro_batches > 1:
            parts.append(f"{self.micro_batches} micro-batches" + (f" {self.schedule}" if self.stages > 1 else ""))
        parts.append(self.memory)
        if self.recompute != "none":
            parts.append(f"recompute {self.recompute}")
        return ", ".join(parts)


@dataclass
class Estimate:
    layout: LayerLayout
    step_time: float = math.inf
    peak_memory: float = math.inf
    stages: list[list[int]] = field(default_factory=list)
    """The layers of each stage."""
    breakdown: dict[str, float] = field(default_factory=dict)
    rejected: str = ""

    def describe(self, budget: float) -> str:
        if self.rejected:
            return f"{self.layout.describe()}: rejected: {self.rejected}"
        over = "" if self.peak_memory <= budget else f" (over the budget of {_gib(budget)})"
        return (f"{self.layout.describe()}: predicted {self.step_time * 1e3:.3f} ms/step, "
                f"{_gib(self.peak_memory)} per device{over}")


def _gib(n: float) -> str:
    return f"{n / 2**30:.3g} GiB" if n >= 2**27 else f"{n / 2**20:.3g} MiB"


def _volume(kind: str, p: int, nbytes: float) -> float:
    """Bytes one device moves in `kind` over p devices of an `nbytes` piece (cost_model.axis_volume)."""
    return nbytes * (2 * (p - 1) / p if kind == "all_reduce" else (p - 1) / p)


def partition(costs: Sequence[float], parts: int) -> list[list[int]]:
    """Contiguous split of `costs` into `parts` non-empty runs minimizing the largest run's sum."""
    n = len(costs)
    prefix = [0.0]
    for c in costs:
        prefix.append(prefix[-1] + c)
    best = [[math.inf] * (n + 1) for _ in range(parts + 1)]
    cut = [[0] * (n + 1) for _ in range(parts + 1)]
    best[0][0] = 0.0
    for k in range(1, parts + 1):
        for j in range(k, n - (parts - k) + 1):
            for i in range(k - 1, j):
                value = max(best[k - 1][i], prefix[j] - prefix[i])
                if value < best[k][j]:
                    best[k][j], cut[k][j] = value, i
    runs, j = [], n
    for k in range(parts, 0, -1):
        i = cut[k][j]
        runs.append(list(range(i, j)))
        j = i
    return runs[::-1]


class Composer:
    def __init__(self, layers: list[Layer], profiler: Profiler, cluster: Cluster, ranks: list[int], batch: int,
                 optimizer: str):
        self.layers = layers
        self.profiler = profiler
        self.cluster = cluster
        self.ranks = ranks
        self.batch = batch
        self.state_copies = STATE_COPIES.get(optimizer, 0)

    def estimate(self, layout: LayerLayout) -> Estimate:
        est = Estimate(layout)
        micro = self.batch // (layout.data * layout.micro_batches)
        try:
            profiles = [self.profiler.profile(layer, layout.tensor, micro, layout.recompute) for layer in self.layers]
        except (PassFailedException, SimulationError, ValueError) as e:
            est.rejected = str(e)
            return est
        per_layer = [p.forward + p.backward for p in profiles]
        est.stages = partition(per_layer, layout.stages)
        p, m, dp, t = layout.stages, layout.micro_batches, layout.data, layout.tensor
        per_stage = dp * t
        fwd = [sum(profiles[j].forward for j in s) for s in est.stages]
        bwd = [sum(profiles[j].backward for j in s) for s in est.stages]
        work = [f + b for f, b in zip(fwd, bwd, strict=True)]
        hop = [self.cluster.collective_time("transfer", [self.ranks[s * per_stage], self.ranks[(s + 1) * per_stage]],
                                            profiles[est.stages[s][-1]].outs) for s in range(p - 1)]
        overlap = self.cluster.device.comm_overlap
        per_group = self.cluster.device.stream_per_group
        tail, memory, drags = [], [], []
        for s, run in enumerate(est.stages):
            base = s * per_stage
            group = [self.ranks[base + d * t] for d in range(dp)]
            sharded = layout.memory in ("zero", "fsdp") and dp > 1
            # The last micro-batch's backward makes each layer's gradients in
            # reverse layer order, and they are reduced over the data axis
            # while the next layers' backward runs; what is still queued
            # when the backward ends is exposed. On one lane per device
            # (stream_per_group false: the MPI runtime) a layer with
            # collectives of its own (tensor parallelism) hides none: its
            # first collective waits for everything queued before it, and
            # its compute behind that, so the backward stretches (`drag`),
            # which delays the gradient the stage hands the stage before it.
            queued, comm_total, gathers, drag = 0.0, 0.0, 0.0, 0.0
            for j in reversed(run):
                if profiles[j].backward_comm > 0 and not per_group:
                    drag += queued
                    queued = 0.0
                queued = max(0.0, queued - profiles[j].backward)
                if dp > 1:
                    kind = "reduce_scatter" if sharded else "all_reduce"
                    sent = sum(self.cluster.collective_time(kind, group, _volume(kind, dp, g))
                               for g in profiles[j].params)
                    queued += sent
                    comm_total += sent
            exposed = queued + (1 - overlap) * comm_total
            drags.append(drag)
            params = sum(sum(profiles[j].params) for j in run)
            if layout.memory == "fsdp" and dp > 1:
                # gathered before each use, forward and backward, per micro-batch
                gathers = 2 * m * sum(self.cluster.collective_time("all_gather", group, _volume("all_gather", dp, g))
                                      for j in run for g in profiles[j].params)
                # each is issued one op ahead of its use (sbp_to_plan's
                # parameter gathers): on the simulator about half hide
                exposed += max(gathers / 2, gathers - m * work[s]) + (1 - overlap) * gathers
            elif layout.memory == "zero" and dp > 1:
                exposed += sum(self.cluster.collective_time("all_gather", group, _volume("all_gather", dp, g))
                               for j in run for g in profiles[j].params)
            shard = dp if sharded else 1
            optimizer = sum(self.cluster.work_time("plan.fused", ADAM_STEPS * g / profiles[j].itemsize / shard,
                                                   7 * g / shard, "f32", ADAM_STEPS)
                            for j in run for g in profiles[j].params)
            tail.append(exposed + optimizer)
            in_flight = m if layout.schedule == "gpipe" else min(m, p - s)
            activations = in_flight * sum(profiles[j].saved for j in run) + max(profiles[j].working for j in run)
            if layout.memory == "fsdp" and dp > 1:
                weights = params / dp + max(sum(profiles[j].params) for j in run)
            else:
                weights = params
            memory.append(weights + params + self.state_copies * params / shard + activations)
        if p == 1:
            est.step_time = m * work[0] + drags[0] + tail[0]
        else:
            est.step_time = pipeline_period(fwd, bwd, hop, tail, m, layout.schedule, drags)
        est.peak_memory = max(memory)
        est.breakdown = {"compute": sum(work) * m / p, "tail": max(tail)}
        return est


def pipeline_period(fwd: Sequence[float], bwd: Sequence[float], hop: Sequence[float], tail: Sequence[float],
                    micro_batches: int, schedule: str, drag: Sequence[float] = (), steps: int = 3) -> float:
    """Seconds per step of a pipeline in its steady state: each stage runs
    its micro-batches' forwards and backwards in the schedule's order
    (sbp-to-plan's, the same function), each waiting for its input from the
    neighbouring stage (`hop` seconds per boundary), then its tail (exposed
    gradient communication, the optimizer) before the next step's first
    forward. `drag` stretches each stage's last backward (its gradient
    reductions in the way of its own collectives). Replaying it at stage
    granularity catches what the textbook (m + p - 1) fill and drain
    misses: an unbalanced stage's backlog in the drain, transfers in every
    cycle, and steps that overlap."""
    p, m = len(fwd), micro_batches
    drag = list(drag) or [0.0] * p
    orders = []
    for s in range(p):
        if schedule == "1f1b":
            place = one_f_one_b(s, p, m)
            orders.append(sorted(place, key=place.__getitem__))
        else:  # GPipe: every forward, then the backwards in reverse
            orders.append([(False, k) for k in range(m)] + [(True, k) for k in reversed(range(m))])
    free = [0.0] * p
    ends = []
    for _ in range(steps):
        done: dict[tuple[int, bool, int], float] = {}
        position = [0] * p
        while any(position[s] < len(orders[s]) for s in range(p)):
            progressed = False
            for s in range(p):
                while position[s] < len(orders[s]):
                    backward, k = orders[s][position[s]]
                    if not backward:
                        need = (s - 1, False, k) if s > 0 else None
                        wait = hop[s - 1] if s > 0 else 0.0
                    else:
                        need = (s + 1, True, k) if s < p - 1 else (s, False, k)
                        wait = hop[s] if s < p - 1 else 0.0
                    if need is not None and need not in done:
                        break
                    start = max(free[s], done[need] + wait if need is not None else 0.0)
                    last = position[s] == len(orders[s]) - 1
                    free[s] = start + (bwd[s] + (drag[s] if last else 0.0) if backward else fwd[s])
                    done[(s, backward, k)] = free[s]
                    position[s] += 1
                    progressed = True
            assert progressed  # the schedule's orders never wait on each other in a cycle
        for s in range(p):
            free[s] += tail[s]
        ends.append(max(free))
    return (ends[-1] - ends[0]) / (steps - 1)


def candidate_layouts(devices: int, node: int, batch: int, layers: int, modes: Sequence[str],
                      recompute: str = "none") -> list[LayerLayout]:
    """Every (stages, data, tensor, micro-batches, memory mode): tensor degrees
    inside a node, stages up to one per layer, micro-batches that divide each
    replica's batch (powers of two up to 4 per stage beyond the stage count)."""
    out = []
    for t in range(1, min(node, devices) + 1):
        if devices % t or node % t:
            continue
        for p in range(1, min(devices // t, layers) + 1):
            if (devices // t) % p:
                continue
            dp = devices // (t * p)
            if batch % dp:
                continue
            per_replica = batch // dp
            micros = [m for m in (1, 2, 4, 8, 16, 32, 64) if per_replica % m == 0 and (m <= 4 * p)]
            for m in micros:
                if p > 1 and m < p:
                    continue
                for mode in modes:
                    if mode != "replicated" and dp == 1:
                        continue
                    out.append(LayerLayout(p, dp, t, m, mode, "1f1b" if p > 1 else "gpipe", recompute))
    return out


# -- the chosen plan, as hints ---------------------------------------------------------------


def write_plan(module: ModuleOp, graph: lg.GraphOp, placement: PlacementOp, layers: list[Layer],
               chosen: Estimate, profiler: Profiler, ranks: list[int], training: str, passes: dict,
               batch: int, loss: str) -> None:
    """Writes `chosen` into the forward graph as a hand plan would be
    written: a placement per stage (stage i on the i-th block of ranks, its
    mesh data x tensor, the tensor axis inside a node), each op on its
    layer's stage, the inputs split over the data axis, every layer's
    parameters and forward values requested as its class's profile
    distributed them; then the training passes (micro-batches in the chosen
    schedule, `training`, with each gradient requested where its update
    runs; recomputation; ZeRO's state split over the data axis)."""
    layout = chosen.layout
    per = layout.data * layout.tensor
    names = [f"stage{i}" for i in range(layout.stages)] if layout.stages > 1 else [placement.sym_name.data]
    mesh = layout.mesh
    for i, name in enumerate(names):
        if layout.stages > 1:
            module.body.block.insert_op_before(
                PlacementOp(name, placement.device.data, ranks[i * per:(i + 1) * per], mesh), placement)
    if layout.stages == 1:
        placement.ranks = DenseArrayBase.from_list(i64, ranks)
        placement.shape = DenseArrayBase.from_list(i64, mesh)
    stage_of_layer = {j: s for s, run in enumerate(chosen.stages) for j in run}
    stage_of: dict[Operation, int] = {}
    for j, layer in enumerate(layers):
        for op in layer.ops:
            stage_of[op] = stage_of_layer[j]
    micro = batch // (layout.data * layout.micro_batches)
    data_axis = 0 if layout.data > 1 else None
    tensor_axis = (1 if layout.data > 1 else 0) if layout.tensor > 1 else None
    hinted: set[lg.ParamOp] = set()
    for j, layer in enumerate(layers):
        profile = profiler.profile(layer, layout.tensor, micro, layout.recompute)
        name = names[stage_of_layer[j]]
        for param, on_tensor in zip(layer.params, profile.param_sbp, strict=True):
            if param in hinted:
                continue
            hinted.add(param)
            nd = [Sbp.B] * len(mesh)
            if tensor_axis is not None:
                nd[tensor_axis] = on_tensor
            shape = global_shape(param.result.type)
            if layout.memory == "fsdp" and data_axis is not None and shape and on_tensor != Sbp.S(0) \
                    and shape[0] % layout.data == 0:
                nd[data_axis] = Sbp.S(0)
            Rewriter.replace_value_with_new_type(
                param.result, dtensor_of(shape, param.result.type.element_type, name, tuple(nd)))
    # Every forward value of a layer is requested as its class's profile
    # distributed it (the profile's integer program chose them together;
    # sbp-infer's search, given only the parameters, finds worse plans).
    for j, layer in enumerate(layers):
        profile = profiler.profile(layer, layout.tensor, micro, layout.recompute)
        name = names[stage_of_layer[j]]
        for op, value_on_tensor in zip(layer.ops, profile.value_sbp, strict=True):
            value = op.results[0]
            if value_on_tensor is None or isinstance(value.type, DTensorType):
                continue
            shape = global_shape(value.type)
            nd = [Sbp.B] * len(mesh)
            if tensor_axis is not None:
                nd[tensor_axis] = value_on_tensor
            if data_axis is not None and shape[0] == batch:
                nd[data_axis] = Sbp.S(0)
            uses = list(value.uses)
            request = AnnotateOp(value, dtensor_of(shape, element_type(value.type), name, tuple(nd)))
            request.attributes[PLACEMENT_ATTR] = SymbolRefAttr(name)
            request.attributes[REQUEST_ATTR] = UnitAttr()
            graph.body.block.insert_op_after(request, op)
            stage_of[request] = stage_of_layer[j]
            # a later stage reads it through its own request (the transfer), as a hand plan's `.to()` in that stage
            moved: dict[int, AnnotateOp] = {}
            for use in uses:
                if isinstance(getattr(type(use.operation), "T", None), VarConstraint):
                    # an op typed like its operand (layernorm, softmax, GELU)
                    # would take the request as a hint on its own result,
                    # which it may not be able to give: it reads the value
                    continue
                there = stage_of.get(use.operation, stage_of_layer[j])
                if there != stage_of_layer[j] and there not in moved:
                    moved[there] = AnnotateOp(request.result, dtensor_of(
                        shape, element_type(value.type), names[there], tuple(nd)))
                    moved[there].attributes[PLACEMENT_ATTR] = SymbolRefAttr(names[there])
                    graph.body.block.insert_op_after(moved[there], request)
                    stage_of[moved[there]] = there
                use.operation.operands[use.index] = moved.get(there, request).result
    _same_type_results(graph)
    for o in graph.body.ops:
        if isinstance(o, lg.OutputOp):
            continue
        if o in stage_of:
            stage = stage_of[o]
        else:
            users = [u.operation for r in o.results for u in r.uses if u.operation in stage_of]
            stage = min((stage_of[u] for u in users), default=0)
        o.attributes[PLACEMENT_ATTR] = SymbolRefAttr(names[stage])
        if isinstance(o, lg.InputOp) and global_shape(o.result.type) and not isinstance(o.result.type, DTensorType):
            nd = [Sbp.B] * len(mesh)
            if data_axis is not None:
                nd[data_axis] = Sbp.S(0)
            Rewriter.replace_value_with_new_type(
                o.result, dtensor_of(global_shape(o.result.type), o.result.type.element_type, names[stage],
                                     tuple(nd)))
    graph.placement = SymbolRefAttr(names[0])
    if layout.stages > 1:
        placement.detach()
        placement.erase()
    ctx = Context()
    if layout.micro_batches > 1:
        LgMicroBatchPass(count=layout.micro_batches, schedule=layout.schedule).apply(ctx, module)
    for step in PassPipeline.parse_spec(passes, training).passes:
        step.apply(ctx, module)
        if isinstance(step, LgAutodiffPass):
            _pin_gradients(graph, layout, data_axis, tensor_axis)
    if layout.recompute != "none":
        LgRecomputePass(policy=layout.recompute, loss=loss).apply(ctx, module)
    _unrequest_same_type_ops(graph)
    if layout.memory == "zero" and data_axis is not None:
        params = {p.key.data: p for p in graph.body.ops if isinstance(p, lg.ParamOp)}
        for p in params.values():
            prefix = next((x for x in STATE_PREFIXES if p.key.data.startswith(x)), None)
            owner = params.get(p.key.data.removeprefix(prefix)) if prefix else None
            if owner is not None and global_shape(p.result.type) and isinstance(owner.result.type, DTensorType):
                Rewriter.replace_value_with_new_type(
                    p.result, _zero_type(owner.result.type, layout, data_axis, tensor_axis))


RECOMPUTE_POLICIES = ("selective", "full")


def plan_layers(graph: lg.GraphOp, loss: str, cluster: Cluster, device: str, ranks: list[int], batch: int,
                budget: float, modes: Sequence[str], optimizer: str) -> tuple[Estimate, list[Estimate], Profiler,
                                                                             list[Layer]]:
    """The fastest composed plan within `budget`: every candidate layout
    without recomputation, then, fewest first, recomputation for the
    candidates over the budget that could still win (recomputing never
    makes a step faster, so one slower than the best plan that fits is
    skipped). Raises PassFailedException when nothing fits."""
    layers = split_layers(graph)
    if not layers:
        raise PassFailedException("sbp-autoplan: the graph computes nothing")
    assert graph.placement is not None
    kind = lookup_placement(graph, graph.placement).device.data
    profiler = Profiler(graph, loss, cluster, device, kind, batch)
    composer = Composer(layers, profiler, cluster, ranks, batch, optimizer)
    node = cluster.levels[0].size if cluster.levels else len(ranks)
    estimates = [composer.estimate(layout)
                 for layout in candidate_layouts(len(ranks), node, batch, len(layers), modes)]
    if not estimates:
        raise PassFailedException(
            f"sbp-autoplan: no layout of {len(ranks)} devices divides a batch of {batch} examples")

    def best_fitting() -> float:
        return min((e.step_time for e in estimates if not e.rejected and e.peak_memory <= budget), default=math.inf)

    previous = "none"
    for policy in RECOMPUTE_POLICIES:
        over = sorted((e for e in estimates if not e.rejected and e.peak_memory > budget
                       and e.layout.recompute == previous), key=lambda e: e.step_time)
        for e in over:
            if e.step_time >= best_fitting():
                break
            estimates.append(composer.estimate(dataclasses.replace(e.layout, recompute=policy)))
        previous = policy
    fitting = [e for e in estimates if not e.rejected and e.peak_memory <= budget]
    if not fitting:
        priced = [e for e in estimates if not e.rejected]
        if not priced:
            raise PassFailedException(
                "sbp-autoplan: no layout works: " + "; ".join(e.describe(budget) for e in estimates[:4]))
        least = min(priced, key=lambda e: e.peak_memory)
        raise PassFailedException(f"sbp-autoplan: no plan fits {_gib(budget)} per device; the smallest needs "
                                  f"{_gib(least.peak_memory)} ({least.layout.describe()})")
    best = min(fitting, key=lambda e: e.step_time)
    return best, estimates, profiler, layers


def _unrequest_same_type_ops(graph: lg.GraphOp) -> None:
    """The ops autodiff made that are typed like their operand (a softmax
    in cross-entropy's gradient) read the unrequested value, and are
    untyped again: a request's type on their result would be a hint they
    may not be able to give."""
    for op in graph.body.ops:
        if not isinstance(getattr(type(op), "T", None), VarConstraint) or not op.operands:
            continue
        source = op.operands[0].owner
        if isinstance(source, AnnotateOp) and REQUEST_ATTR in source.attributes:
            op.operands[0] = source.input
        result = op.results[0]
        if not isinstance(op.operands[0].type, DTensorType) and isinstance(result.type, DTensorType):
            Rewriter.replace_value_with_new_type(result, _plain(result.type))


def _same_type_results(graph: lg.GraphOp) -> None:
    """Ops whose result has their operand's type (elementwise unary ops,
    softmax, layernorm: a `T` constraint) take a requested operand's
    distributed type, as the frontend types them after a hint."""
    for op in graph.body.ops:
        if not isinstance(getattr(type(op), "T", None), VarConstraint) or not op.operands:
            continue
        t = op.operands[0].type
        if isinstance(t, DTensorType) and op.results[0].type != t:
            Rewriter.replace_value_with_new_type(op.results[0], t)


def _zero_type(t: DTensorType, layout: LayerLayout, data_axis: int, tensor_axis: int | None) -> DTensorType:
    """ZeRO: a parameter's optimizer state (and the gradient its update
    reads) distributed as the parameter over the tensor axis and split over
    the data axis, where the rows divide."""
    nd = list(nd_to_plain(t.nd_sbp))
    rows = global_shape(t)[0] if global_shape(t) else 0
    split_on_tensor = tensor_axis is not None and nd[tensor_axis] == Sbp.S(0)
    if rows and rows % (layout.data * (layout.tensor if split_on_tensor else 1)) == 0:
        nd[data_axis] = Sbp.S(0)
    return dtensor_of(global_shape(t), t.element_type, t.placement_name, tuple(nd))


def _pin_gradients(graph: lg.GraphOp, layout: LayerLayout, data_axis: int | None, tensor_axis: int | None) -> None:
    """Requests each parameter's gradient where its update runs: distributed
    as the parameter (one all-reduce over the data axis per step), or for
    ZeRO as its state (a reduce-scatter), as the composition priced it.
    Left free, sbp-infer's search shards a replicated update over the data
    axis on its own (its cost model prefers it; on the simulator it costs a
    slice and a gather per parameter)."""
    params = {p.key.data: p for p in graph.body.ops if isinstance(p, lg.ParamOp)}
    output = graph.output()
    values = list(output.values)
    for i, name in enumerate(n.data for n in output.names.data):
        param = params.get(name.removeprefix("grad.")) if name.startswith("grad.") else None
        if param is None or not isinstance(param.result.type, DTensorType):
            continue
        want = param.result.type
        if layout.memory == "zero" and data_axis is not None:
            want = _zero_type(want, layout, data_axis, tensor_axis)
        request = AnnotateOp(values[i], want)
        request.attributes[PLACEMENT_ATTR] = SymbolRefAttr(want.placement_name)
        graph.body.block.insert_op_before(request, output)
        values[i] = request.result
    output.operands = values


def notable(estimates: list[Estimate], budget: float, top: int = 8) -> list[Estimate]:
    """What explain lists: the fastest plans, then the best of each kind
    (data parallel, tensor parallel, pipeline, ZeRO, FSDP, recomputation)
    not among them, then the rejected."""
    priced = sorted((e for e in estimates if not e.rejected), key=lambda e: (e.peak_memory > budget, e.step_time))
    kinds = {
        "data parallel": lambda e: e.layout.stages == 1 and e.layout.tensor == 1,
        "tensor parallel": lambda e: e.layout.stages == 1 and e.layout.tensor > 1,
        "pipeline": lambda e: e.layout.stages > 1,
        "zero": lambda e: e.layout.memory == "zero",
        "fsdp": lambda e: e.layout.memory == "fsdp",
        "recomputation": lambda e: e.layout.recompute != "none",
    }
    chosen = priced[:top]
    for test in kinds.values():
        first = next((e for e in priced if test(e)), None)
        if first is not None and first not in chosen:
            chosen.append(first)
    return chosen + [e for e in estimates if e.rejected][:4]
