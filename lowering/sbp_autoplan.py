"""`sbp-autoplan`: chooses how to distribute a training graph that carries no
hints, for a cluster, by predicting every plan it considers.

    sbp-opt train.mlir -p 'sbp-autoplan{cluster=h100-node devices=8 memory_budget=40000000000},compile'

For the graph's devices (its placement's ranks, or `devices`), the pass
tries every mesh shape (N, and every a x b with a, b >= 2) and every memory
mode:

- `replicated`: parameters and optimizer state wherever sbp-infer puts them;
- `zero`: the optimizer state (`adam.m.*`, `adam.v.*`, `momentum.*` from
  lg-optimizer) split S(0) over the first mesh axis (ZeRO);
- `fsdp`: the parameters split too (FSDP / ZeRO-3: gathered for each use);

from each start of the inputs (free, batch split, replicated: sbp-infer's
search finds different plans from each, and the simulator judges them), and
plain data parallelism (the batch split, every weight replicated) on the
one-axis mesh.
With `training` (the input is the forward graph), it also tries every
split into pipeline stages (a contiguous cut of the forward ops balancing
their flops where the fewest bytes cross, stage i on the i-th block of
ranks) with 2 or 4 micro-batches, in GPipe and in 1F1B order.

For each, sbp-infer chooses every op's nd-SBP (`strategy`: its global
search, or the integer program of `sbp_ilp.py`; priced with the cluster);
the plan is lowered, allocated and replayed by the step-time simulator
(`perf/step_time.py`) on the cluster. The fastest plan whose peak memory
fits the budget (`memory_budget`, or the cluster device's) wins. Its sbp-level IR
replaces the graph: every value typed with its distribution and every
redistribution requested, so `compile` (whose sbp-infer keeps hints)
lowers exactly the plan that was predicted, and a user can read, save,
edit and re-run it. The graph records the choice in `sbp.autoplan`; with
`explain`, `sbp.autoplan.alternatives` lists every plan tried with its
prediction or the reason it was rejected.

Where a layout does not fit the budget, it is tried again with activation
recomputation (`lg-recompute`: `selective`, then `full` where that is not
enough), which trades a share of a forward pass for the activations' memory.

Pipeline layouts are tried in both schedules, GPipe and 1F1B (less memory
on the first stages; see lg-micro-batch), and each stage on every mesh of
its devices (8 devices in 2 stages: 4 or 2x2 per stage). Not yet chosen
here: interleaved schedules, stages of unequal sizes.

The search itself (what layouts exist, what each predicts, the fastest
that fits) is planning's (planning/autoplan/); this pass lowers and
predicts each layout it is asked about, and writes the winner back.

All of the above lowers and simulates the whole training graph once per
layout: exact, and seconds per layout on small graphs, but minutes for a
billion-parameter GPT. `search=layers` (the default beyond 8 devices or
400 forward ops, given `training`) plans by layers instead
(planning/autoplan/: layers.py, profiler.py, compose.py): each kind of layer is profiled on the simulator and
whole plans are composed from the profiles, then written as hints.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects.builtin import ArrayAttr, DenseArrayBase, ModuleOp, StringAttr, SymbolRefAttr, i64
from xdsl.passes import ModulePass, PassPipeline
from xdsl.rewriter import Rewriter
from xdsl.utils.exceptions import PassFailedException, VerifyException

from sbpc.dialects import lg
from sbpc.dialects.lg_analysis import OPTIMIZER_STATE_PREFIXES
from sbpc.dialects.op_tree import structure_key
from sbpc.dialects.sbp import (
    AUTOPLAN_ALTERNATIVES_ATTR,
    AUTOPLAN_ATTR,
    PLACEMENT_ATTR,
    DTensorType,
    PlacementOp,
    Sbp,
    dtensor_of,
    global_shape,
    lookup_placement,
)
from sbpc.perf.cluster import Cluster, ClusterError, load_cluster
from sbpc.perf.step_time import SimulationError, simulate_plan
from sbpc.planning.autoplan import whole
from sbpc.planning.autoplan.candidates import (
    MEMORY_MODES,
    Candidate,
    Layout,
    check_memory_budget,
    fastest_fitting,
    gib,
)
from sbpc.planning.autoplan.compose import notable, plan_layers
from sbpc.planning.autoplan.layers import split_layers
from sbpc.planning.autoplan.profiler import LayerPasses
from sbpc.planning.autoplan.stages import FORWARD_SOURCES, batch_size, cut_into_stages
from sbpc.planning.cost_model import DEFAULT_DEVICE, PLANNED_FOR_ATTR
from sbpc.planning.sbp_ilp import SHARE_ABOVE

from .autoplan_hints import ProfileHints, write_layout
from .compile import lowering_passes
from .lg_autodiff import LgAutodiffPass
from .lg_micro_batch import LgMicroBatchPass, rebatch
from .lg_optimizer import LgOptimizerPass
from .lg_recompute import LgRecomputePass
from .sbp_infer import SbpInferPass

SEARCHES = ("auto", "whole", "layers")
LAYERS_ABOVE_DEVICES = 8
LAYERS_ABOVE_OPS = 400
"""search=auto plans by layers beyond these (whole-graph planning of a
1.3B GPT on 8 devices takes minutes per layout)."""


CHECKED_ABOVE = 0.5
"""The layer search compiles its choice to check the budget where the sum
of its layers' memory is above this share of the budget. The sum leaves
out what no layer's profile holds (buffers between layers, the schedule's
overlap of their lifetimes): it has been seen 14% under the compiled plan,
an error that cannot cross the budget from below half of it."""


class _OverBudget(PassFailedException):
    """A layout the layer search chose that holds more than the budget once compiled."""


def _is_state(key: str) -> bool:
    return key.startswith(OPTIMIZER_STATE_PREFIXES)


def _expert_weights(graph: lg.GraphOp) -> list[lg.ParamOp]:
    """The unhinted parameters a grouped matmul takes as its experts
    (directly or transposed), or a matmul as a batch of weight matrices (a
    3-D parameter): a mixture of experts' stacked weights."""
    found: dict[lg.ParamOp, None] = {}
    for op in graph.body.ops:
        if isinstance(op, lg.GroupedMatmulOp | lg.MatmulOp):
            value = op.rhs
            while isinstance(value.owner, lg.TransposeOp):
                value = value.owner.input
            owner = value.owner
            if isinstance(owner, lg.ParamOp) and not isinstance(owner.result.type, DTensorType) and (
                    isinstance(op, lg.GroupedMatmulOp) or len(global_shape(owner.result.type)) == 3):
                found[owner] = None
    return list(found)


def _split_first_axis(param: lg.ParamOp, placement: str, mesh: tuple[int, ...]) -> None:
    """Hints `param` S(0) over the first mesh axis (B over the others), where
    its first dimension has at least as many rows as that axis."""
    t = param.result.type
    shape = global_shape(t)
    if not shape or shape[0] < mesh[0]:
        return
    nd = (Sbp.S(0), *([Sbp.B] * (len(mesh) - 1)))
    Rewriter.replace_value_with_new_type(param.result, dtensor_of(shape, t.element_type, placement, nd))


TRAINING_PASSES: dict[str, Callable[[], type[ModulePass]]] = {
    "lg-micro-batch": lambda: LgMicroBatchPass, "lg-autodiff": lambda: LgAutodiffPass,
    "lg-optimizer": lambda: LgOptimizerPass}
"""What `training` may name."""


def _seed_inputs(graph: lg.GraphOp, layout: Layout) -> None:
    """Hints the graph's unhinted inputs of rank >= 1 as `layout.inputs` says
    (and, for `data`, every unhinted weight replicated, with its optimizer
    state unless ZeRO splits that: as a hand-written data-parallel plan
    hints its weights before lg-optimizer, which hints their state alike)."""
    if layout.inputs == "data":
        for p in graph.body.ops:
            if (isinstance(p, lg.ParamOp) and not isinstance(p.result.type, DTensorType)
                    and (layout.memory == "replicated" or not _is_state(p.key.data))):
                where = p.attributes.get(PLACEMENT_ATTR, graph.placement)
                assert isinstance(where, SymbolRefAttr)
                mesh = lookup_placement(p, where).mesh().shape
                t = p.result.type
                Rewriter.replace_value_with_new_type(p.result, dtensor_of(global_shape(t), t.element_type,
                                                                          where.string_value(), [Sbp.B] * len(mesh)))
    for o in graph.body.ops:
        if not isinstance(o, lg.InputOp) or isinstance(o.result.type, DTensorType):
            continue
        shape = global_shape(o.result.type)
        if not shape:
            continue
        where = o.attributes.get(PLACEMENT_ATTR, graph.placement)
        assert isinstance(where, SymbolRefAttr)
        mesh = lookup_placement(o, where).mesh().shape
        if layout.inputs in ("split", "data") and shape[0] >= mesh[0]:
            nd = (Sbp.S(0), *([Sbp.B] * (len(mesh) - 1)))
        else:
            nd = tuple([Sbp.B] * len(mesh))
        Rewriter.replace_value_with_new_type(o.result, dtensor_of(shape, o.result.type.element_type,
                                                                  where.string_value(), nd))


@dataclass(frozen=True)
class WholeGraphHints:
    """The whole-graph search's layout as hints for sbp-infer, which chooses
    the rest: the devices and mesh (or the stages, cut where the fewest
    bytes cross), then, on the training step, the inputs' start and the
    memory mode's split of the optimizer state (ZeRO) or of the parameters
    too (FSDP) over the first mesh axis."""

    layout: Layout
    ranks: list[int]

    def place(self, module: ModuleOp, graph: lg.GraphOp, placement: PlacementOp) -> None:
        layout = self.layout
        if layout.stages == 1:
            axes = len(placement.mesh().shape)
            placement.ranks = DenseArrayBase.from_list(i64, self.ranks)
            placement.shape = DenseArrayBase.from_list(i64, layout.mesh)
            if len(layout.mesh) != axes:  # the user's hints name the old mesh's axes
                module.verify()
        else:
            cut_into_stages(module, graph, placement, layout.stages, layout.mesh, self.ranks)
        if layout.experts:  # before lg-optimizer, which gives their state their distribution
            for p in _expert_weights(graph):
                _split_first_axis(p, placement.sym_name.data, layout.mesh)

    def after_autodiff(self, graph: lg.GraphOp) -> None:
        pass

    def after_training(self, graph: lg.GraphOp) -> None:
        layout = self.layout
        if layout.inputs != "free":
            _seed_inputs(graph, layout)
        if layout.memory != "replicated":
            for p in graph.body.ops:
                hinted = isinstance(p, lg.ParamOp) and isinstance(p.result.type, DTensorType)
                if isinstance(p, lg.ParamOp) and not hinted and (layout.memory == "fsdp" or _is_state(p.key.data)):
                    where = p.attributes.get(PLACEMENT_ATTR, graph.placement)
                    assert isinstance(where, SymbolRefAttr)
                    _split_first_axis(p, where.string_value(), layout.mesh)


def layer_passes(optimizer: ModulePass | None = None, device: str = DEFAULT_DEVICE) -> LayerPasses:
    """The passes the layer search's profiler runs on a layer; `optimizer`:
    the training step's (lg-optimizer as configured; none: plain SGD);
    `device`: the cluster it lowers for (as compile's)."""

    def train(module: ModuleOp, recompute: str) -> None:
        ctx = Context()
        LgAutodiffPass(loss="loss").apply(ctx, module)
        # A plain SGD update makes each gradient take its parameter's
        # distribution (a tensor-parallel weight's gradient is reduced
        # over the tensor axis if its weight is replicated); its own
        # kernels are taken off the profile's time.
        LgOptimizerPass(algorithm="sgd").apply(ctx, module)
        if recompute != "none":
            LgRecomputePass(policy=recompute, loss="loss").apply(ctx, module)

    def lower(module: ModuleOp) -> None:
        ctx = Context()
        # a layer's own gradients are not bucketed: the composition prices
        # the whole step's buckets
        for p in lowering_passes(device=device, bucket=False, representatives=True):
            p.apply(ctx, module)

    def update(module: ModuleOp, which: str) -> None:
        ctx = Context()
        LgAutodiffPass(loss="loss").apply(ctx, module)
        if which == "step" and optimizer is not None:
            optimizer.apply(ctx, module)
        elif which != "none":
            LgOptimizerPass(algorithm="sgd").apply(ctx, module)

    return LayerPasses(rebatch, train, lower, update)


@dataclass(frozen=True)
class SbpAutoplanPass(ModulePass):
    name = "sbp-autoplan"

    cluster: str = "cpu"
    """A cluster preset or file (`docs/CLUSTER.md`) to plan for."""
    devices: int = 0
    """Devices to plan for (ranks 0..devices-1); 0: the graph's placement's ranks."""
    memory_budget: int | None = None
    """Bytes per device the plan may use; none: the cluster device's memory."""
    strategy: str = "best"
    """How sbp-infer chooses each op's nd-SBP for a layout: `best` (the
    integer program on 1-D meshes where the training graph is small enough
    for its proof, else `auto`), `auto` (seconds at most; within 0.1% of the proven optimum
    on the GPTs measured, 2% off on an MLP where the optimum is tensor
    parallelism) or `ilp` (sbp_ilp.py; up to a minute per layout on large
    2-D meshes)."""
    explain: bool = False
    """Record every layout tried in `sbp.autoplan.alternatives`."""
    loss: str = "loss"
    """The output the forward pass computes (for recomputation)."""
    search: str = "auto"
    """`whole`: plan every layout by lowering and simulating the whole
    training graph (exact, seconds per layout on small graphs); `layers`:
    profile each layer class and compose (planning/autoplan/: large graphs
    and clusters, needs `training`); `auto`: `layers` beyond
    LAYERS_ABOVE_DEVICES devices or LAYERS_ABOVE_OPS forward ops."""
    training: str = ""
    """The passes that make the graph a training step (for example
    `lg-autodiff,lg-optimizer{algorithm=adam}`), run by the planner on each
    layout: given, the input is the forward graph, and pipeline stages and
    micro-batches are planned too (they must be placed and cut before
    autodiff). Empty: the input is already a training step."""

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        try:
            training = list(PassPipeline.parse_spec(TRAINING_PASSES, self.training).passes) if self.training else []
        except Exception as e:  # noqa: BLE001 - xDSL's spec errors are several types
            raise PassFailedException(f"sbp-autoplan: training passes '{self.training}': {e}") from None
        self.plan(op, training)

    def plan(self, op: ModuleOp, training: Sequence[ModulePass]) -> None:
        """Plans `op` as `apply` does, with the training passes given as
        objects (the API hands down its own, not pipeline text)."""
        graphs = list(lg.graphs(op))
        if len(graphs) != 1:
            raise PassFailedException(f"sbp-autoplan: plans one lg.graph, found {len(graphs)}")
        graph = graphs[0]
        if graph.placement is None:
            raise PassFailedException(
                f"sbp-autoplan: graph @{graph.sym_name.data} has no placement (`on @mesh`) naming its devices")
        placement = lookup_placement(graph, graph.placement)
        placements = {p.sym_name.data for p in op.ops if isinstance(p, PlacementOp)}
        if len(placements) > 1:
            raise PassFailedException(
                "sbp-autoplan: the graph spans several placements (pipeline stages); planning stages is not "
                "supported yet: give one placement")
        ranks = list(range(self.devices)) if self.devices > 0 else list(placement.mesh().ranks)
        try:
            cluster = load_cluster(self.cluster, max(ranks) + 1)
        except (ClusterError, ValueError) as e:
            raise PassFailedException(f"sbp-autoplan: {e}") from None
        try:
            check_memory_budget(self.memory_budget)
        except ValueError as e:
            raise PassFailedException(f"sbp-autoplan: {e}") from None
        budget = self.memory_budget if self.memory_budget is not None else int(cluster.device.memory)
        modes = MEMORY_MODES if any(isinstance(o, lg.ParamOp) for o in graph.body.ops) else MEMORY_MODES[:1]
        kinds = {type(p) for p in training}
        batch = batch_size(graph) if training and LgMicroBatchPass not in kinds else None
        forward = len([o for o in graph.body.ops if not isinstance(o, FORWARD_SOURCES)])
        if self.search not in SEARCHES:
            raise PassFailedException(f"sbp-autoplan: unknown search '{self.search}' (choose {', '.join(SEARCHES)})")
        layered = LgAutodiffPass in kinds and batch is not None
        if self.search == "layers" and not layered:
            raise PassFailedException(
                "sbp-autoplan: search=layers plans a forward graph with a batch: give `training` with lg-autodiff "
                "(and no lg-micro-batch: the planner chooses the micro-batches)")
        if layered and (self.search == "layers" or (self.search == "auto" and (
                len(ranks) > LAYERS_ABOVE_DEVICES or forward > LAYERS_ABOVE_OPS))):
            assert batch is not None
            self._plan_layers(op, graph, placement, ranks, cluster, budget, modes, batch, training)
            return
        seen: dict[tuple, Candidate] = {}
        experts = bool(_expert_weights(graph))
        tries = whole.layouts(len(ranks), modes, batch, forward, experts)
        best, candidates = whole.search(tries, lambda layout: self._try(op, layout, ranks, cluster, seen, training),
                                        budget, len(ranks), self._has_backward(graph, training))
        assert best.module is not None
        for old in list(op.body.block.ops):
            old.detach()
            old.erase()
        for new in list(best.module.body.block.ops):
            new.detach()
            op.body.block.add_op(new)
        chosen = next(iter(lg.graphs(op)))
        chosen.attributes[AUTOPLAN_ATTR] = StringAttr(f"{best.describe(budget)} on {cluster.name}")
        chosen.attributes[PLANNED_FOR_ATTR] = StringAttr(self._cluster_spec())
        if self.explain:
            ranked = sorted(candidates, key=lambda c: (not c.priced, c.step_time))
            chosen.attributes[AUTOPLAN_ALTERNATIVES_ATTR] = ArrayAttr(
                [StringAttr(t.describe(budget)) for t in ranked])

    def _cluster_spec(self) -> str:
        """The cluster option as later passes find it: a file by its absolute path."""
        return os.path.abspath(self.cluster) if os.path.isfile(self.cluster) else self.cluster

    def _plan_layers(self, op: ModuleOp, graph: lg.GraphOp, placement: PlacementOp, ranks: list[int],
                     cluster: Cluster, budget: int, modes: Sequence[str], batch: int,
                     training: Sequence[ModulePass]) -> None:
        update = next((p for p in training if isinstance(p, LgOptimizerPass)), None)
        optimizer = update.algorithm if update is not None else "sgd"
        device = self.cluster
        best, estimates, profiler, layers = plan_layers(graph, self.loss, cluster, device, ranks, batch, budget,
                                                        modes, optimizer, layer_passes(update, device))
        # The layouts were priced from the layers' profiles, not lowered: one
        # the whole graph refuses (1F1B micro-batches of a graph with an op
        # that needs the whole batch, a batch-norm's statistics) gives way
        # to the next fastest that fits.
        before = op.clone()
        while True:
            try:
                write_layout(op, best.layout, training, self.loss, ProfileHints(layers, best, profiler, ranks, batch))
                if best.peak_memory > CHECKED_ABOVE * budget:
                    held = self._compiled_memory(op, cluster)
                    if held > budget:
                        best.peak_memory = held
                        raise _OverBudget(f"compiled, it holds {gib(held)} per device, over the budget "
                                          f"of {gib(budget)} (its layers' sum was under it)")
                break
            except PassFailedException as e:
                best.rejected = str(e) if isinstance(e, _OverBudget) else f"the whole graph refuses it: {e}"
                for old in list(op.body.block.ops):
                    old.detach()
                    old.erase()
                for again in list(before.clone().body.block.ops):
                    again.detach()
                    op.body.block.add_op(again)
                graph = next(iter(lg.graphs(op)))
                layers = split_layers(graph)  # the same cuts, of the graph as it was
                best = fastest_fitting(estimates, budget, len(ranks))
        classes = len({layer.key for layer in layers})
        graph.attributes[PLANNED_FOR_ATTR] = StringAttr(self._cluster_spec())
        graph.attributes[AUTOPLAN_ATTR] = StringAttr(
            f"{best.describe(budget)} on {cluster.name} (by layers: {len(layers)} layers of {classes} kinds, "
            f"{profiler.compiles} layer plans simulated, {len(estimates)} layouts composed)")
        if self.explain:
            graph.attributes[AUTOPLAN_ALTERNATIVES_ATTR] = ArrayAttr(
                [StringAttr(e.describe(budget)) for e in notable(estimates, budget)])

    def _compiled_memory(self, op: ModuleOp, cluster: Cluster) -> float:
        """Bytes per device the planned graph holds once compiled: its
        arena and persistent region, as the step simulator counts them."""
        candidate = op.clone()
        ctx = Context()
        SbpInferPass(device=self.cluster).apply(ctx, candidate)
        for p in lowering_passes(device=self.cluster, representatives=True):
            p.apply(ctx, candidate)
        return simulate_plan(candidate, cluster, steps=1).peak_memory

    def _has_backward(self, graph: lg.GraphOp, training: Sequence[ModulePass]) -> bool:
        """Whether the planned step has a backward pass to recompute for."""
        if training:
            return any(isinstance(p, LgAutodiffPass) for p in training)
        return any(n.data.startswith(("grad.", "new.")) for n in graph.output().names.data)

    def _try(self, module: ModuleOp, layout: Layout, ranks: list[int], cluster: Cluster,
             seen: dict[tuple, Candidate], training: Sequence[ModulePass]) -> Candidate:
        """Plans and predicts one layout (the whole-graph search's
        `evaluate`). Layouts whose inference gives the same sbp-level IR
        (say, inputs free and inputs replicated, where the search replicates
        them anyway) share one lowering and prediction: `seen` maps the IR
        (its structure_key, which equal texts share) to the candidate that
        predicted it."""
        trial = Candidate(layout)
        candidate = module.clone()
        ctx = Context()
        try:
            write_layout(candidate, layout, training, self.loss, WholeGraphHints(layout, ranks))
            strategy = self.strategy
            if strategy == "best":  # the program proves its optimum in seconds on these; 2-D meshes take minutes
                ops = sum(len(g.body.ops) for g in lg.graphs(candidate))
                strategy = "ilp" if ops <= SHARE_ABOVE and len(layout.mesh) == 1 else "auto"
            SbpInferPass(strategy=strategy, device=self.cluster).apply(ctx, candidate)
            key = structure_key(candidate)
            same = seen.get(key)
            if same is not None:
                return dataclasses.replace(same, layout=layout)
            seen[key] = trial
            trial.module = candidate.clone()
            for p in lowering_passes(device=self.cluster, representatives=True):
                p.apply(ctx, candidate)
            prediction = simulate_plan(candidate, cluster, steps=3)
            trial.step_time, trial.peak_memory = prediction.step_time, prediction.peak_memory
        except (PassFailedException, VerifyException, SimulationError) as e:
            trial.rejected = str(e)
            trial.module = None
        return trial
