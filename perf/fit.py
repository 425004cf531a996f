"""Fitting a cluster to timed runs (what `sbp-calibrate` measured).

The measurements are plain data, so the fit is tested on synthetic
timings. Every figure is a least-squares fit of a line with non-negative
coefficients (a fixed cost plus a rate) to the timed runs:

- GEMM: seconds = overhead + flops / rate, over a range of shapes;
- elementwise and reduction kernels: seconds = overhead + bytes / bandwidth;
- non-GEMM arithmetic: the flop rate of the kernels that compute more than
  they stream (exp, tanh, GELU);
- each collective kind: seconds = latency_steps(kind, p) * latency + bytes /
  bandwidth, with bytes the per-device volume the IR records;
- the overlap of communication with computation: how much of the shorter
  of a GEMM and an all_reduce disappears when they run together;
- the synchronization cost of a collective whose members arrive apart
  (what it adds to a step beyond its lock-step time: large where ranks
  share cores);
- each kernel inside a training step: seconds = calls * fixed + scale *
  roofline, over the actors of traced probe steps at two sizes; and per
  kernel kind, the median of its probed kernels' figures, which prices
  every kernel of that kind the probe does not run.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from .cluster import COLLECTIVE_KINDS, Cluster, CollectiveFit, DeviceModel, Level, kernel_kind, latency_steps


def fit_line(x: Sequence[float], y: Sequence[float]) -> tuple[float, float]:
    """(intercept, slope) of y = intercept + slope * x, both >= 0, least squares."""
    return tuple(fit_nonnegative([[1.0, xi] for xi in x], y))  # type: ignore[return-value]


def fit_nonnegative(rows: Sequence[Sequence[float]], y: Sequence[float]) -> list[float]:
    """Least squares of y = rows @ c with c >= 0, weighting every point by 1/y
    (relative error: small and large runs count alike). Active-set over the
    few coefficients: drop the negative ones and refit."""
    a = np.asarray(rows, float)
    b = np.asarray(y, float)
    if a.ndim != 2 or len(a) != len(b) or len(b) == 0:
        raise ValueError("fit: need one row of regressors per timing")
    w = 1.0 / np.maximum(b, 1e-12)
    active = list(range(a.shape[1]))
    while True:
        coef = np.zeros(a.shape[1])
        if active:
            sol, *_ = np.linalg.lstsq(a[:, active] * w[:, None], b * w, rcond=None)
            coef[active] = sol
        negative = [i for i in active if coef[i] < 0]
        if not negative:
            return [float(c) for c in coef]
        active.remove(min(negative, key=lambda i: coef[i]))


@dataclass(frozen=True)
class Fitted:
    cluster: Cluster
    figures: dict[str, Any]
    """What was fitted, for printing: name -> value (with units in the name)."""

    def format(self) -> str:
        width = max(len(k) for k in self.figures)
        return "\n".join(f"  {k:<{width}}  {_fmt(v)}" for k, v in self.figures.items())


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


def _relative_error(model, points) -> float:
    errors = [abs(model(*p[:-1]) - p[-1]) / p[-1] for p in points if p[-1] > 0]
    return max(errors, default=0.0)


SEPARABLE_SPREAD = 4.0
"""A kernel's fixed cost and in-step scale are fitted apart only where its
probe actors' rate-bound times span this factor or more, the largest
being at least a tenth of its actor's time (else the arithmetic does not
show: the scale stays 1 and the fixed cost is the median remainder)."""


def fit_kernel_costs(probe: Sequence[Sequence[Any]], rates: Cluster) -> tuple[dict[str, float], dict[str, float]]:
    """(fixed seconds per call, scale on the rate-bound time) per kernel, from
    the probe's traced actors [kernel, flops, bytes, dtype, calls, seconds]
    priced at `rates` (a cluster without kernel costs): seconds = calls *
    fixed + scale * roofline, least squares with both >= 0, where the probe
    has that kernel at sizes far enough apart. A fused chain's
    fixed cost is per step of the chain (its calls)."""
    points: dict[str, list[tuple[float, float, float]]] = {}
    for kernel, flops, nbytes, dtype, calls, seconds in probe:
        core = rates.roofline(kernel, flops, nbytes, dtype)
        points.setdefault(kernel, []).append((float(max(1, calls)), core, float(seconds)))
    overheads, scales = {}, {}
    for kernel, rows in sorted(points.items()):
        per_call = [core / calls for calls, core, _ in rows]
        largest = max(rows, key=lambda r: r[1])
        if (min(per_call) > 0 and max(per_call) >= SEPARABLE_SPREAD * min(per_call)
                and largest[1] >= 0.1 * largest[2]):
            fixed, scale = fit_nonnegative([[calls, core] for calls, core, _ in rows], [t for *_, t in rows])
            if scale > 0:
                overheads[kernel], scales[kernel] = fixed, scale
                continue
        overheads[kernel] = float(np.median([max(t - core, 0.0) / calls for calls, core, t in rows]))
    return overheads, scales


def by_kind(per_kernel: Mapping[str, float]) -> dict[str, float]:
    """Per kernel kind (`kernel_kind`), the median of the figures of its
    kernels in `per_kernel`: what a kernel of that kind with no figure of its
    own is priced with."""
    kinds: dict[str, list[float]] = {}
    for kernel, value in per_kernel.items():
        kind = kernel_kind(kernel)
        if kind is not None:
            kinds.setdefault(kind, []).append(value)
    return {kind: float(np.median(values)) for kind, values in sorted(kinds.items())}


def sync_excess(block: Mapping[str, float]) -> float:
    """What a collective met in a plan adds beyond its lock-step time, from
    one measurement of the calibration's `sync` (runtime.calibrate.measure_sync)."""
    return block["both"] - block["compute"] - block["lockstep"]


def fit_cluster(raw: Mapping[str, Any], name: str | None = None) -> Fitted:
    """A cluster of `raw['ranks']` devices of this machine from the raw
    timings of runtime/calibrate.py."""
    ranks = int(raw["ranks"])
    figures: dict[str, Any] = {"ranks": ranks}

    gemm = [(2.0 * m * k * n, t) for m, k, n, t in raw["gemm"]]
    gemm_overhead, gemm_slope = fit_line([f for f, _ in gemm], [t for _, t in gemm])
    gemm_rate = 1.0 / gemm_slope if gemm_slope > 0 else math.inf
    figures["gemm GFLOP/s"] = gemm_rate / 1e9
    figures["gemm overhead us"] = gemm_overhead * 1e6
    figures["gemm worst fit error"] = _relative_error(lambda f: gemm_overhead + f * gemm_slope, gemm)

    # Streaming kernels run at the cache's rate while their bytes fit in
    # this rank's share of the last-level cache, at memory's beyond it.
    # Memory's rate is the median over the sizes past the share (a line
    # through one or two noisy points swung 2x between runs).
    tiny = float(raw.get("tiny_kernel", 0.0))
    timed = [(b, t) for b, t in raw["elementwise"]]
    ew_overhead, ew_slope = fit_line([b for b, _ in timed], [t for _, t in timed])
    cache_bytes = float(raw.get("cache_bytes", 0.0))
    inside = [(b, t) for b, t in timed if b <= cache_bytes]
    beyond = [b / max(t - tiny, 1e-12) for b, t in timed if b > cache_bytes]
    cache_bandwidth = 0.0
    if inside and beyond:
        bandwidth = float(np.median(beyond))
        _, cache_slope = fit_line([b for b, _ in inside], [t for _, t in inside])
        cache_bandwidth = 1.0 / cache_slope if cache_slope > 0 else bandwidth
        figures["elementwise in cache GB/s"] = cache_bandwidth / 1e9
        figures["cache MiB per rank"] = cache_bytes / 2**20
    else:
        bandwidth = 1.0 / ew_slope if ew_slope > 0 else math.inf
    figures["elementwise GB/s"] = bandwidth / 1e9
    red_overhead, red_slope = fit_line([b for b, _ in raw["reduction"]], [t for _, t in raw["reduction"]])
    figures["reduction GB/s"] = (1.0 / red_slope if red_slope > 0 else math.inf) / 1e9
    kernel_overhead = float(raw.get("tiny_kernel", min(ew_overhead, red_overhead)))
    figures["kernel overhead us"] = kernel_overhead * 1e6

    # the arithmetic rate of kernels that are not bound by their bytes
    rates = []
    for flops, nbytes, t in raw["vector"]:
        compute = t - kernel_overhead
        if compute > 0 and compute > 1.5 * nbytes / bandwidth:
            rates.append(flops / compute)
    vector_flops = float(np.median(rates)) if rates else bandwidth  # memory-bound everywhere: ~1 flop/byte
    figures["vector GFLOP/s"] = vector_flops / 1e9

    # Per kernel, what its actors cost inside the probe steps against the
    # rates fitted above: a fixed cost per call and a factor on the
    # rate-bound time (fit_kernel_costs).
    unit = DeviceModel(kind="cpu", memory=1.0, peak_flops={"f32": gemm_rate}, efficiency=1.0,
                       vector_flops=vector_flops, memory_bandwidth=bandwidth, kernel_overhead=0.0,
                       cache_bytes=cache_bytes if cache_bandwidth else 0.0, cache_bandwidth=cache_bandwidth,
                       timed_ranks_per_cpu=timed_ranks_per_core(raw))
    kernel_overheads, kernel_scales = _probe_costs(raw, unit)
    kind_overheads, kind_scales = by_kind(kernel_overheads), by_kind(kernel_scales)
    _kernel_figures(figures, kernel_overheads, kernel_scales, kind_overheads, kind_scales)

    actor = max(0.0, float(raw.get("actor", 0.0)))
    figures["actor overhead us"] = actor * 1e6

    # On several hosts (raw["ranks_per_host"]), the collectives among each
    # host's ranks make the lower level and those across all ranks the
    # network's, above it.
    per_host = int(raw.get("ranks_per_host", ranks))
    hosts = ranks // per_host
    if hosts * per_host != ranks:
        raise ValueError(f"{ranks} ranks are not {per_host} on each host")
    fits = _fit_collectives(raw.get("collectives", {}), ranks, figures, "" if hosts == 1 else "network ")
    base = fits.get("all_reduce") or next(iter(fits.values()), CollectiveFit(1e-5, 3.5e9))
    if hosts > 1:
        figures["hosts"] = hosts
        host_fits = _fit_collectives(raw.get("host_collectives", {}), per_host, figures, "host ")
        host_base = host_fits.get("all_reduce") or next(iter(host_fits.values()), base)

    overlap = 1.0
    o = raw.get("overlap")
    if o:
        shorter = min(o["compute"], o["comm"])
        hidden = o["compute"] + o["comm"] - o["both"]
        overlap = min(1.0, max(0.0, hidden / shorter)) if shorter > 0 else 1.0
    figures["comm overlap"] = overlap

    # what a collective adds when its members arrive apart, beyond its lock-step time
    sync = 0.0
    apart = raw.get("sync")
    if apart:
        sync = max(0.0, sync_excess(apart))
    # Where these ranks had a core each, sync is only paid where members
    # share one (Level.cores): its figure is measured on more ranks than cores.
    crowded = raw.get("shared_sync")
    if crowded and ranks <= int(raw.get("cores", ranks)):
        sync = max(0.0, sync_excess(crowded["sync"]))
        figures["collective sync us"] = f"{sync * 1e6:.4g} (measured on {crowded['ranks']} ranks sharing " \
                                        f"{crowded['cores']} cores)"
    else:
        figures["collective sync us"] = sync * 1e6

    memory = float(raw.get("memory", 8 * 2**30))
    device = DeviceModel(
        kind="cpu", memory=memory, peak_flops={"f32": gemm_rate, "bf16": gemm_rate}, efficiency=1.0,
        vector_flops=vector_flops, memory_bandwidth=bandwidth, kernel_overhead=kernel_overhead,
        actor_overhead=actor, comm_overlap=overlap, kernel_overheads=kernel_overheads, kernel_scales=kernel_scales,
        kind_overheads=kind_overheads, kind_scales=kind_scales,
        cache_bytes=cache_bytes if cache_bandwidth else 0.0, cache_bandwidth=cache_bandwidth,
        timed_ranks_per_cpu=timed_ranks_per_core(raw),
    )
    # Ranks that outnumber a host's cores are bound to them round robin
    # (runtime/launch.py): the simulator then knows which collectives have
    # members that share a core, and only those pay `sync`.
    cores = int(raw.get("cores", 0))
    figures["cores per host"] = cores
    levels: tuple[Level, ...] = (Level("machine", ranks, bandwidth=base.bandwidth, latency=base.latency,
                                       collectives=fits, sync=sync, cores=cores),)
    machine, when = _machine(raw, cores), _when(raw)
    source = f"sbp-calibrate{when}: {ranks} ranks of {machine}"
    if hosts > 1:
        levels = (Level("host", per_host, bandwidth=host_base.bandwidth, latency=host_base.latency,
                        collectives=host_fits, sync=sync, cores=cores),
                  Level("network", hosts, bandwidth=base.bandwidth, latency=base.latency, collectives=fits,
                        sync=sync))
        source = f"sbp-calibrate{when}: {hosts} hosts of {per_host} ranks, the first {machine}"
    cluster = Cluster(name=name or f"calibrated-cpu-{ranks}", count=ranks, device=device, levels=levels,
                      source=source)
    return Fitted(cluster, figures)


def _fit_collectives(measured: Mapping[str, Any], ranks: int, figures: dict[str, Any], label: str
                     ) -> dict[str, CollectiveFit]:
    """Per kind, latency and bandwidth fitted to runtime.calibrate's
    measure_collectives points of `ranks` members, and the points themselves
    (their figures into `figures`, named with `label`)."""
    fits: dict[str, CollectiveFit] = {}
    for kind in COLLECTIVE_KINDS:
        points = measured.get(kind)
        if not points:
            continue
        p = ranks if kind != "transfer" else 2
        steps = latency_steps(kind, p)
        latency, slope = fit_nonnegative([[steps, b] for b, _ in points], [t for _, t in points])
        # the points too: a collective of their size is priced on them (CollectiveFit.measured)
        curve = sorted((float(b), float(t)) for b, t in points if b > 0 and t > 0)
        curve = [pt for i, pt in enumerate(curve) if i == 0 or pt[0] > curve[i - 1][0]]
        fits[kind] = CollectiveFit(latency=latency, bandwidth=1.0 / slope if slope > 0 else 1e18,
                                   measured=[list(pt) for pt in curve] if len(curve) > 1 else [],
                                   members=p if len(curve) > 1 else 0)
        figures[f"{label}{kind} latency us"] = latency * 1e6
        figures[f"{label}{kind} GB/s"] = fits[kind].bandwidth / 1e9
    return fits


def _probe_costs(raw: Mapping[str, Any], rates: DeviceModel) -> tuple[dict[str, float], dict[str, float]]:
    """fit_kernel_costs of raw['probe'] against the rates of `rates` (a
    device without kernel costs). A probe actor times a core of its own:
    where ranks outnumber cores, the OS switches ranks between actors (the
    executor yields where it waits). Rates timed with more ranks than that
    on each core (`timed_ranks_per_cpu`: a calibration before they were
    timed a rank a core) take each actor's time that many times over, its
    time at their crowding; fitted as measured against such rates, the
    narrow MLP's fused chains on 4 ranks of 2 cores were priced at 10x
    their in-step time, and a cross-entropy's 85 us fixed cost read as 240."""
    isolated = Cluster(name="rates", count=1, device=rates, levels=(Level("one", 1, 1.0, 0.0),))
    share = rates.timed_ranks_per_cpu or 1
    probe = [[*row[:5], share * float(row[5])] for row in raw.get("probe", [])]
    return fit_kernel_costs(probe, isolated)


def timed_ranks_per_core(raw: Mapping[str, Any]) -> int:
    """How many of a host's ranks computed on each core while the kernels
    were timed: one (runtime/calibrate.py times a rank a core), or, in raw
    timings from before that, every rank of the host (0 where the cores are
    not known)."""
    if "timed_ranks_per_core" in raw:
        return int(raw["timed_ranks_per_core"])
    if not raw.get("cores"):
        return 0
    per_host = int(raw.get("ranks_per_host", raw["ranks"]))
    return max(1, -(-per_host // int(raw["cores"])))


def _kernel_figures(figures: dict[str, Any], overheads: Mapping[str, float], scales: Mapping[str, float],
                    kind_overheads: Mapping[str, float], kind_scales: Mapping[str, float]) -> None:
    """The per-kernel and per-kind figures into `figures`, for printing."""
    for k, v in overheads.items():
        figures[f"overhead {k} us"] = v * 1e6
    for k, v in scales.items():
        figures[f"in-step scale {k}"] = v
    for k, v in kind_overheads.items():
        figures[f"overhead of kind {k} us"] = v * 1e6
    for k, v in kind_scales.items():
        figures[f"in-step scale of kind {k}"] = v


def _machine(raw: Mapping[str, Any], cores: int | None = None) -> str:
    """The measured machine, as a cluster's source names it: the CPU, its
    cores where given, the BLAS kernels (or the host's name)."""
    machine = raw.get("cpu") or raw.get("host", "this machine")
    if raw.get("cpu"):
        machine += (f", {cores} cores" if cores is not None else "") + f", {raw.get('blas') or 'BLAS kernels unknown'}"
    return machine


def _when(raw: Mapping[str, Any]) -> str:
    return f" on {raw['date']}" if raw.get("date") else ""


def add_kernel_costs(cluster: Cluster, raw: Mapping[str, Any]) -> Fitted:
    """`cluster` with figures for the kernels of raw['probe'] (the traced
    probe steps of `sbp-calibrate --add-kernels-to`) that it has none of its
    own for, and for the kinds it has none for (the median of its new
    kernels of that kind), fitted against its own rates: every figure it
    has stays as it is, so the plans it prices stay as they were except
    where the new kernels run. What a calibration that predates a probe
    (a convolutional network's, say) lacks is measured without measuring
    the rest again."""
    d = cluster.device
    overheads, scales = _probe_costs(raw, replace(d, kernel_overhead=0.0, kernel_overheads={}, kernel_scales={},
                                                  kind_overheads={}, kind_scales={}))
    new = sorted(k for k in overheads if k not in d.kernel_overheads and k not in d.kernel_scales)
    new_overheads = {k: overheads[k] for k in new}
    new_scales = {k: scales[k] for k in new if k in scales}
    kind_overheads = {k: v for k, v in by_kind(new_overheads).items() if k not in d.kind_overheads}
    kind_scales = {k: v for k, v in by_kind(new_scales).items() if k not in d.kind_scales}
    figures: dict[str, Any] = {"ranks": int(raw["ranks"])}
    _kernel_figures(figures, new_overheads, new_scales, kind_overheads, kind_scales)
    if not new:
        return Fitted(cluster, figures)
    device = replace(d, kernel_overheads=dict(sorted({**d.kernel_overheads, **new_overheads}.items())),
                     kernel_scales=dict(sorted({**d.kernel_scales, **new_scales}.items())),
                     kind_overheads=dict(sorted({**d.kind_overheads, **kind_overheads}.items())),
                     kind_scales=dict(sorted({**d.kind_scales, **kind_scales}.items())))
    added = (f"{', '.join(new)} added by sbp-calibrate --add-kernels-to{_when(raw)} "
             f"({raw['ranks']} ranks of {_machine(raw)})")
    return Fitted(replace(cluster, device=device, source=f"{cluster.source}; {added}" if cluster.source else added),
                  figures)
