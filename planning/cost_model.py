"""The cost model that sbp-infer (and boxing) minimize, in seconds.

- compute: the flops of an op's local piece over the device's rate;
- boxing: each step priced as the step-time simulator prices the actor it
  becomes (`boxing_planner.boxing_cost` over `Rates.collective_time`, that
  is `Cluster.collective_time`), with the standard collective volumes per
  mesh axis of p devices (`axis_volume`): all_reduce 2(p-1)/p |T|,
  all_gather and reduce_scatter (p-1)/p |T|, all_to_all (p-1)/p^2 |T|,
  local slice 0;
- memory: bytes a device holds for a result, times a small weight, so that
  of two otherwise equal plans the leaner one wins.

Rates come from a cluster (`sbpc.perf.cluster`): a preset (`cpu`, a
measurement of this project's machines; `h100-node`, `h100-16nodes`, ...) or a cluster file written by
`sbp-calibrate`, chosen by `sbp-infer{device=...}`. A collective is priced
with the figures of the level its placement spans (the slowest link among
the placement's devices), so a plan across nodes pays for InfiniBand. `cuda`
names the H100 preset. The cluster is the one device model: what the cost
model reads of it is `Cluster.rates`.
"""

from __future__ import annotations

from collections.abc import Sequence

from xdsl.dialects.builtin import StringAttr
from xdsl.ir import Operation

from sbpc.dialects.sbp import PlainNd, PlainSbp, Sbp
from sbpc.perf.cluster import ClusterError, Rates, load_cluster, preset, presets

PLANNED_FOR_ATTR = "sbp.autoplan.cluster"
"""On a graph sbp-autoplan planned: the cluster it planned for (its `cluster` option)."""
DEFAULT_DEVICE = "cpu"
"""The cluster sbp-infer and sbp-bucket-collectives price with unless told."""


def device_for(graph: Operation, device: str) -> str:
    """The cluster a pass pricing `graph` uses: `device`, or where that is
    the default and sbp-autoplan planned the graph, the cluster it planned
    for. The planner predicted its choice with buckets (and sbp-infer's
    remaining choices) priced there; priced for another machine, `compile`
    lowered another plan than the one chosen (GPT 4 layers on 4 calibrated
    ranks: buckets cut for the cpu preset, predicted 18% slower)."""
    planned = graph.attributes.get(PLANNED_FOR_ATTR)
    if device == DEFAULT_DEVICE and isinstance(planned, StringAttr):
        return planned.data
    return device


ALIASES = {"cuda": "h100", "gpu": "h100"}
"""Device names plans may give for a cluster preset: a CUDA device is an H100 node's."""


def load_device(spec: str, ranks: Sequence[int] = ()) -> Rates:
    """The rates of a cluster preset (sized for `ranks`) or a cluster file
    (`sbp-calibrate`'s) for a placement on `ranks`; `cuda` names the H100 preset."""
    name = ALIASES.get(spec, spec)
    try:
        cluster = preset(name, max(ranks, default=-1) + 1 or None) if name in presets() else load_cluster(name)
    except ClusterError as e:
        raise ValueError(str(e)) from None
    return cluster.rates(ranks)


def local_fraction(nd: PlainNd, mesh: Sequence[int], shape: Sequence[int] | None = None) -> float:
    """The share of a tensor one device holds (partials hold full size).
    Given the tensor's shape, an axis split over more devices than it has
    elements counts as the one element the fullest device holds: 3 rows on
    4 devices is a third each, not a quarter (some devices hold nothing)."""
    frac = 1.0
    devices: dict[int, int] = {}
    for sbp, p in zip(nd, mesh):
        if sbp.axis is not None:
            devices[sbp.axis] = devices.get(sbp.axis, 1) * p
    for axis, p in devices.items():
        frac /= min(p, shape[axis]) if shape is not None and shape[axis] > 0 else p
    return frac


def axis_volume(src: PlainSbp, dst: PlainSbp, p: int) -> tuple[float, int]:
    """Fraction of the tensor piece one device sends to change `src` into
    `dst` on one mesh axis of p devices, and the number of collectives."""
    if src == dst or p == 1:
        return 0.0, 0
    if src.is_grouped or dst.is_grouped or src.is_indexed or dst.is_indexed:
        # rows owned at run time (grouped by expert, gathered by an index),
        # priced as their even split (the load even): G <-> S(0) or I moves
        # what an all_to_all of the rows moves; B -> G or I and G or I -> P
        # are local
        src, dst = (Sbp.S(0) if s.is_grouped or s.is_indexed else s for s in (src, dst))
        if src == dst:
            return (1 - 1 / p) / p, 1  # S(0) or I <-> G: each row to its owner, a (p-1)/p^2 share
    s_split, d_split = src.is_split, dst.is_split
    s_partial, d_partial = src.is_partial, dst.is_partial
    if src == Sbp.B or (s_split and d_partial) or (not s_partial and dst == Sbp.PMAX):
        return 0.0, 0  # local: slice, or keep own piece as a summand/candidate
    if s_partial and dst == Sbp.B:
        return 2 * (p - 1) / p, 1  # all_reduce
    if s_partial and d_split:
        return (p - 1) / p, 1  # reduce_scatter
    if s_split and dst == Sbp.B:
        return (p - 1) / p, 1  # all_gather
    if s_split and d_split:
        return (p - 1) / p**2, 1  # all_to_all
    if s_partial and d_partial:
        return 2 * (p - 1) / p, 1  # P <-> Pmax: all_reduce, then keep as partial
    # B -> P: one device keeps the value, the others zeros
    return 0.0, 0


def transfer_cost(nbytes: float, device: Rates, src_ranks: Sequence[int], dst_ranks: Sequence[int]) -> float:
    """Moving a tensor between two placements (every byte crosses once),
    priced as the simulator prices the transfer: over the ranks of both."""
    return device.collective_time("transfer", list(dict.fromkeys([*src_ranks, *dst_ranks])), nbytes)
