"""The whole-graph search: every layout of a training graph is lowered and
simulated whole (exact, seconds per layout on small graphs). What it tries
and in what order is here; how one layout is lowered and predicted is
sbp-autoplan's (lowering/sbp_autoplan.py), handed in as `evaluate`."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

from sbpc.dialects.lg_analysis import SCHEDULES

from .candidates import RECOMPUTE_POLICIES, Candidate, Layout, fastest_fitting, mesh_shapes

INPUTS = ("free", "split", "replicated")
"""The starts of the inputs sbp-infer's search is run from (Layout.inputs)."""
RECOMPUTE_TRIES = 3
"""Layouts over the budget tried with each recomputation policy: the
fastest ones and the smallest ones (each policy costs a planning pass per
layout; the budget test that rejects everything took 3x as long)."""


def layouts(devices: int, modes: Sequence[str], batch: int | None, forward_ops: int,
            experts: bool = False) -> list[Layout]:
    """Every layout to try: each mesh of all devices from each start of the
    inputs (Layout.inputs) in each memory mode; with a batch to cut
    (the graph is planned before autodiff), also every stage count that
    divides the devices (at most one stage per 4 forward ops) with 2 or 4
    micro-batches that divide the batch in GPipe and in 1F1B order, each
    stage on every mesh of its devices with the batch split over its first
    axis (replicated or ZeRO: FSDP's per-use gathers repeat per
    micro-batch). With `experts` (the graph has a mixture of experts), also
    expert parallelism over every device, the batch split."""
    out = [Layout(mesh, mode, inputs=inputs) for mesh in mesh_shapes(devices) for inputs in INPUTS
           for mode in modes]
    # plain data parallelism over every device, replicated or with ZeRO
    # (FSDP shards the weights the start replicates)
    out += [Layout((devices,), mode, inputs="data") for mode in modes if mode != "fsdp"]
    if experts and devices > 1:
        out += [Layout((devices,), mode, inputs=inputs, experts=True) for mode in modes if mode != "fsdp"
                for inputs in ("split", "data")]
    if batch is None:
        return out
    for stages in range(2, devices + 1):
        if devices % stages or stages * 4 > forward_ops:
            continue
        for micro in (2, 4):
            if batch % micro == 0:
                out += [Layout(mesh, mode, stages, micro, schedule, inputs="split")
                        for mesh in mesh_shapes(devices // stages)
                        for mode in modes if mode != "fsdp" for schedule in SCHEDULES]
    return out


def worth_recomputing(over: list[Candidate]) -> list[Candidate]:
    """Of the candidates over the budget, those recomputation could make
    win: the fastest and the smallest."""
    fastest = sorted(over, key=lambda c: c.step_time)[:RECOMPUTE_TRIES]
    smallest = sorted(over, key=lambda c: c.peak_memory)[:RECOMPUTE_TRIES]
    return list({id(c): c for c in [*fastest, *smallest]}.values())


def search(tries: list[Layout], evaluate: Callable[[Layout], Candidate], budget: int, devices: int,
           recompute: bool) -> tuple[Candidate, list[Candidate]]:
    """The fastest of `tries` within `budget`, and every candidate priced.
    Recomputation costs time, so with `recompute` (the step has a backward
    pass) it is tried only where a layout does not fit without it
    (selective first, full where that is not enough), and on the few such
    layouts that could win. Raises PassFailedException when nothing fits."""
    candidates = [evaluate(layout) for layout in tries]
    over = [c for c in candidates if c.priced and not c.fits(budget)]
    for policy in RECOMPUTE_POLICIES if recompute else ():
        over = [evaluate(dataclasses.replace(c.layout, recompute=policy)) for c in worth_recomputing(over)]
        candidates += over
        over = [c for c in over if c.priced and not c.fits(budget)]
    return fastest_fitting(candidates, budget, devices), candidates
