"""Composing a plan from layer profiles (Alpa's profile-then-compose, on
sbpc's own simulator): a candidate (pipeline stages x data-parallel degree
x tensor degree, micro-batches, schedule, memory mode, recomputation) is
priced from its layers' profiles in microseconds, so the layer search
ranks thousands of candidates where the whole-graph search lowers each."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

from xdsl.utils.exceptions import PassFailedException

from sbpc.dialects import lg
from sbpc.dialects.lg_analysis import one_f_one_b
from sbpc.dialects.sbp import element_bytes, lookup_placement
from sbpc.perf.cluster import Cluster
from sbpc.perf.step_time import SimulationError

from .candidates import RECOMPUTE_POLICIES, Candidate, Layout, by_layers, fastest_fitting
from .layers import Layer, split_layers
from .profiler import LayerPasses, Profiler

STATE_COPIES = {"adam": 2, "adamw": 2, "momentum": 1}
"""Optimizer state per parameter (Adam's m and v; the momentum buffer)."""


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
    """Prices layer-search layouts from the layers' profiles."""

    def __init__(self, layers: list[Layer], profiler: Profiler, cluster: Cluster, ranks: list[int], batch: int,
                 optimizer: str):
        self.layers = layers
        self.profiler = profiler
        self.cluster = cluster
        self.ranks = ranks
        self.batch = batch
        self.state_copies = STATE_COPIES.get(optimizer, 0)

    def estimate(self, layout: Layout) -> Candidate:
        """The composed step time and peak memory of `layout` (a by_layers layout)."""
        est = Candidate(layout)
        micro = self.batch // (layout.data * layout.micro_batches)
        try:
            profiles = [self.profiler.profile(layer, layout.tensor, micro, layout.recompute) for layer in self.layers]
        except (PassFailedException, SimulationError, ValueError) as e:
            est.rejected = str(e)
            return est
        per_layer = [p.forward + p.backward for p in profiles]
        est.stage_layers = partition(per_layer, layout.stages)
        p, m, dp, t = layout.stages, layout.micro_batches, layout.data, layout.tensor
        per_stage = dp * t
        # A layer is profiled on the t devices of one tensor group; the
        # layout's ranks all compute at once, so where they crowd more of
        # them on a CPU than its group did, each computes that much slower.
        crowding = self.cluster.crowding(len(self.ranks)) / self.cluster.crowding(t)
        fwd = [crowding * sum(profiles[j].forward for j in s) for s in est.stage_layers]
        bwd = [crowding * sum(profiles[j].backward for j in s) for s in est.stage_layers]
        work = [f + b for f, b in zip(fwd, bwd, strict=True)]
        hop = [self.cluster.collective_time("transfer", [self.ranks[s * per_stage], self.ranks[(s + 1) * per_stage]],
                                            profiles[est.stage_layers[s][-1]].outs) for s in range(p - 1)]
        overlap = self.cluster.device.comm_overlap
        per_group = self.cluster.device.stream_per_group
        tail, memory, drags = [], [], []
        for s, run in enumerate(est.stage_layers):
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
            queued, comm_total, gathers, drag, reduced = 0.0, 0.0, 0.0, 0.0, 0.0
            kind = "reduce_scatter" if sharded else "all_reduce"
            for j in reversed(run):
                if profiles[j].backward_comm > 0 and not per_group:
                    drag += queued
                    queued = 0.0
                queued = max(0.0, queued - crowding * profiles[j].backward)
                if dp > 1:
                    sent = sum(self.cluster.collective_time(kind, group, _volume(kind, dp, g))
                               for g in profiles[j].params)
                    queued += sent
                    comm_total += sent
                    reduced += sum(_volume(kind, dp, g) for g in profiles[j].params)
            exposed = queued + (1 - overlap) * comm_total
            params = sum(sum(profiles[j].params) for j in run)
            if dp > 1 and self.cluster.collective_sync(group) > 0:
                # Where the data group's members share a core, each collective
                # also pays the shared-core sync (about 140 us on this
                # project's machines, against microseconds of latency):
                # sbp-bucket-collectives then joins the gradients into one
                # bucket, reduced once the backward ends, its gradients
                # copied in and out. On a tensor-parallel layout too:
                # sbp-infer prices a gradient's reduction as a member of the
                # step's bucket, and lays the gradients out to join it (GPT
                # 2 layers of 64, data 2 x tensor 2 on 4 ranks: composed
                # 10.4 ms against 6.1 simulated when each paid its own call;
                # 5.6 now). With a core each, a gradient's own collective as
                # priced above agrees with the simulator.
                one = self.cluster.collective_time(kind, group, reduced) + 2 * self.cluster.copy_time(params)
                exposed = min(exposed, one)
            drags.append(drag)
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
            # The step's own optimizer, priced per parameter as lowered and
            # simulated on one device (crowded as the layout's ranks are), on
            # each data-parallel device's share in every memory mode: sbp-infer
            # computes the elementwise update of a parameter replicated over
            # the data axis on each device's share and gathers it (1.3B GPT,
            # 8 H100s: replicated simulates at 107.0 ms, ZeRO at 105.2).
            alone = self.cluster.crowding(len(self.ranks)) / self.cluster.crowding(1)
            updated = [(g, e) for j in run for g, e in zip(profiles[j].params, profiles[j].param_types, strict=True)
                       if lg.is_float(e)]
            prices = {e: self.profiler.update_price("step", e) for _, e in updated}
            optimizer = alone * (max((price.per_step for price in prices.values()), default=0.0) + sum(
                prices[e].seconds(g / element_bytes(e) / dp) for g, e in updated))
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
                      recompute: str = "none") -> list[Layout]:
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
                    out.append(by_layers(p, dp, t, m, mode, "1f1b" if p > 1 else "gpipe", recompute))
    return out



def plan_layers(graph: lg.GraphOp, loss: str, cluster: Cluster, device: str, ranks: list[int], batch: int,
                budget: int, modes: Sequence[str], optimizer: str,
                passes: LayerPasses) -> tuple[Candidate, list[Candidate], Profiler, list[Layer]]:
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
    profiler = Profiler(graph, loss, cluster, device, kind, batch, passes)
    composer = Composer(layers, profiler, cluster, ranks, batch, optimizer)
    node = cluster.levels[0].size if cluster.levels else len(ranks)
    estimates = [composer.estimate(layout)
                 for layout in candidate_layouts(len(ranks), node, batch, len(layers), modes)]
    if not estimates:
        raise PassFailedException(
            f"sbp-autoplan: no layout of {len(ranks)} devices divides a batch of {batch} examples")

    def best_fitting() -> float:
        return min((e.step_time for e in estimates if e.fits(budget)), default=math.inf)

    previous = "none"
    for policy in RECOMPUTE_POLICIES:
        over = sorted((e for e in estimates if e.priced and not e.fits(budget) and e.layout.recompute == previous),
                      key=lambda e: e.step_time)
        for e in over:
            if e.step_time >= best_fitting():
                break
            estimates.append(composer.estimate(dataclasses.replace(e.layout, recompute=policy)))
        previous = policy
    best = fastest_fitting(estimates, budget, len(ranks))
    return best, estimates, profiler, layers



def notable(estimates: list[Candidate], budget: int, top: int = 8) -> list[Candidate]:
    """What explain lists: the fastest plans, then the best of each kind
    (data parallel, tensor parallel, pipeline, ZeRO, FSDP, recomputation)
    not among them, then the rejected."""
    priced = sorted((e for e in estimates if e.priced), key=lambda e: (e.peak_memory > budget, e.step_time))
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
    return chosen + [e for e in estimates if not e.priced][:4]
