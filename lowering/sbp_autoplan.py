"""`sbp-autoplan`: chooses how to distribute a training graph that carries no
hints, for a cluster, by predicting every plan it considers.

    sbp-opt train.mlir -p 'sbp-autoplan{cluster=h100-node devices=8 memory=40000000000},compile'

For the graph's devices (its placement's ranks, or `devices`), the pass
tries every mesh shape (N, and every a x b with a, b >= 2) and every memory
mode:

- `replicated`: parameters and optimizer state wherever sbp-infer puts them;
- `zero`: the optimizer state (`adam.m.*`, `adam.v.*`, `momentum.*` from
  lg-optimizer) split S(0) over the first mesh axis (ZeRO);
- `fsdp`: the parameters split too (FSDP / ZeRO-3: gathered for each use).

For each, sbp-infer chooses every op's nd-SBP (`strategy`: its global
search, or the integer program of `sbp_ilp.py`; priced with the cluster);
the plan is lowered, allocated and replayed by the step-time simulator
(`perf/step_time.py`) on the cluster. The fastest plan whose peak memory
fits the budget (`memory`, or the cluster device's) wins. Its sbp-level IR
replaces the graph: every value typed with its distribution and every
redistribution requested, so `compile` (whose sbp-infer keeps hints)
lowers exactly the plan that was predicted, and a user can read, save,
edit and re-run it. The graph records the choice in `sbp.autoplan`; with
`explain`, `sbp.autoplan.alternatives` lists every plan tried with its
prediction or the reason it was rejected.

Not yet chosen here: pipeline stages, micro-batches and activation
recomputation (the graph keeps the stages and micro-batches it has).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from xdsl.context import Context
from xdsl.dialects.builtin import ArrayAttr, DenseArrayBase, ModuleOp, StringAttr, i64
from xdsl.passes import ModulePass
from xdsl.rewriter import Rewriter
from xdsl.utils.exceptions import PassFailedException

from sbpc.dialects import lg
from sbpc.dialects.sbp import DTensorType, PlacementOp, Sbp, dtensor_of, global_shape, lookup_placement
from sbpc.perf.cluster import Cluster, ClusterError, load_cluster
from sbpc.perf.step_time import EXACT_LIMIT, Prediction, SimulationError, simulate_plan

from .plan_allocate_memory import PlanAllocateMemoryPass
from .plan_fuse_elementwise import PlanFuseElementwisePass
from .sbp_infer import SbpInferPass
from .sbp_insert_boxing import SbpInsertBoxingPass
from .sbp_simplify import SbpSimplifyPass
from .sbp_to_plan import SbpToPlanPass

MEMORY_MODES = ("replicated", "zero", "fsdp")
STATE_PREFIXES = ("adam.m.", "adam.v.", "momentum.")
"""Keys lg-optimizer gives optimizer state."""


def mesh_shapes(devices: int) -> list[tuple[int, ...]]:
    """Every mesh of `devices`: one axis, and every a x b with both axes > 1."""
    shapes: list[tuple[int, ...]] = [(devices,)]
    shapes += [(a, devices // a) for a in range(2, devices) if devices % a == 0 and devices // a > 1]
    return shapes


@dataclass(frozen=True)
class Layout:
    mesh: tuple[int, ...]
    memory: str

    def describe(self) -> str:
        return f"mesh {'x'.join(map(str, self.mesh))}, {self.memory}"


@dataclass
class Trial:
    layout: Layout
    prediction: Prediction | None = None
    module: ModuleOp | None = field(default=None, repr=False)
    """The inferred sbp-level IR (what the pass writes if this trial wins)."""
    rejected: str = ""

    def describe(self, budget: float) -> str:
        if self.prediction is None:
            return f"{self.layout.describe()}: rejected: {self.rejected}"
        p = self.prediction
        verdict = "" if p.peak_memory <= budget else f" (over the budget of {_gib(budget)})"
        return (f"{self.layout.describe()}: predicted {p.step_time * 1e3:.3f} ms/step, "
                f"{_gib(p.peak_memory)} per device{verdict}")


def _gib(n: float) -> str:
    return f"{n / 2**30:.3g} GiB" if n >= 2**27 else f"{n / 2**20:.3g} MiB"


def _is_state(key: str) -> bool:
    return key.startswith(STATE_PREFIXES)


def _split_first_axis(param: lg.ParamOp, placement: str, mesh: tuple[int, ...]) -> None:
    """Hints `param` S(0) over the first mesh axis (B over the others), where
    its first dimension has at least as many rows as that axis."""
    t = param.result.type
    shape = global_shape(t)
    if not shape or shape[0] < mesh[0]:
        return
    nd = (Sbp.S(0), *([Sbp.B] * (len(mesh) - 1)))
    Rewriter.replace_value_with_new_type(param.result, dtensor_of(shape, t.element_type, placement, nd))


@dataclass(frozen=True)
class SbpAutoplanPass(ModulePass):
    name = "sbp-autoplan"

    cluster: str = "cpu"
    """A cluster preset or file (`docs/CLUSTER.md`) to plan for."""
    devices: int = 0
    """Devices to plan for (ranks 0..devices-1); 0: the graph's placement's ranks."""
    memory: int = 0
    """Bytes per device the plan may use; 0: the cluster device's memory."""
    strategy: str = "auto"
    """How sbp-infer chooses each op's nd-SBP for a layout: `auto` (seconds
    at most, within 0.1% of the proven optimum on the GPTs measured), or
    `ilp` (the integer program of sbp_ilp.py: proven optimal on small
    graphs, up to a minute per layout on large 2-D ones)."""
    explain: bool = False
    """Record every layout tried in `sbp.autoplan.alternatives`."""

    def apply(self, ctx: Context, op: ModuleOp) -> None:
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
        budget = float(self.memory) if self.memory > 0 else cluster.device.memory
        modes = MEMORY_MODES if any(isinstance(o, lg.ParamOp) for o in graph.body.ops) else MEMORY_MODES[:1]
        trials = [self._try(op, Layout(mesh, mode), ranks, cluster)
                  for mesh in mesh_shapes(len(ranks)) for mode in modes]
        fitting = [t for t in trials if t.prediction is not None and t.prediction.peak_memory <= budget]
        if not fitting:
            predicted = [t for t in trials if t.prediction is not None]
            if not predicted:
                reasons = "; ".join(t.describe(budget) for t in trials)
                raise PassFailedException(f"sbp-autoplan: no layout of {len(ranks)} devices works: {reasons}")
            least = min(predicted, key=lambda t: t.prediction.peak_memory)  # type: ignore[union-attr]
            raise PassFailedException(
                f"sbp-autoplan: no plan fits {_gib(budget)} per device; the smallest needs "
                f"{_gib(least.prediction.peak_memory)} ({least.layout.describe()})")  # type: ignore[union-attr]
        best = min(fitting, key=lambda t: t.prediction.step_time)  # type: ignore[union-attr]
        assert best.module is not None
        for old in list(op.body.block.ops):
            old.detach()
            old.erase()
        for new in list(best.module.body.block.ops):
            new.detach()
            op.body.block.add_op(new)
        chosen = next(iter(lg.graphs(op)))
        chosen.attributes["sbp.autoplan"] = StringAttr(f"{best.describe(budget)} on {cluster.name}")
        if self.explain:
            ranked = sorted(trials, key=lambda t: (t.prediction is None, t.prediction.step_time if t.prediction
                                                   else math.inf))
            chosen.attributes["sbp.autoplan.alternatives"] = ArrayAttr(
                [StringAttr(t.describe(budget)) for t in ranked])

    def _try(self, module: ModuleOp, layout: Layout, ranks: list[int], cluster: Cluster) -> Trial:
        trial = Trial(layout)
        candidate = module.clone()
        graph = next(iter(lg.graphs(candidate)))
        assert graph.placement is not None  # checked by apply
        placement = lookup_placement(graph, graph.placement)
        placement.ranks = DenseArrayBase.from_list(i64, ranks)
        placement.shape = DenseArrayBase.from_list(i64, layout.mesh)
        name = placement.sym_name.data
        if layout.memory != "replicated":
            for p in graph.body.ops:
                hinted = isinstance(p, lg.ParamOp) and isinstance(p.result.type, DTensorType)
                if isinstance(p, lg.ParamOp) and not hinted and (layout.memory == "fsdp" or _is_state(p.key.data)):
                    _split_first_axis(p, name, layout.mesh)
        ctx = Context()
        try:
            SbpInferPass(strategy=self.strategy, device=self.cluster).apply(ctx, candidate)
            trial.module = candidate.clone()
            representatives = len(ranks) > EXACT_LIMIT
            for p in (SbpInsertBoxingPass(), SbpSimplifyPass(), SbpToPlanPass(representatives=representatives),
                      PlanFuseElementwisePass(), PlanAllocateMemoryPass()):
                p.apply(ctx, candidate)
            trial.prediction = simulate_plan(candidate, cluster, steps=3)
        except (PassFailedException, SimulationError) as e:
            trial.rejected = str(e)
            trial.module = None
        return trial
