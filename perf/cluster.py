"""The cluster model: what a cluster's devices compute and how fast they talk.

A cluster is `count` devices of one kind, connected either by a hierarchy
of levels or by a full link matrix:

- **levels**: level 0 groups `size` devices (a node), level 1 groups `size`
  level-0 units (a rack or the whole cluster), and so on; the product of
  the sizes is the device count. A level's `bandwidth` is what one device
  sends per second (and receives) to devices outside its level-below unit
  when every device of a collective does so at once, and `latency` the
  fixed seconds of one step across it. Ranks are numbered node-major, as
  launchers place them: ranks 0-7 are node 0.
- **links**: an N x N matrix of `bandwidth` and `latency` for arbitrary
  topologies; a collective runs at its slowest ring link.

Collectives follow the alpha-beta model that Alpa and PyTorch's
autoparallel use: `steps(kind, p) * latency + bytes / bandwidth`, with
`bytes` the textbook volume a device receives (what the IR records on every
collective: 2(p-1)/p |T| for all_reduce and so on) and the level the group
spans giving latency and bandwidth. A level may carry calibrated figures
per collective kind (`collectives`), which then replace its generic ones.

Compute follows the roofline with a launch floor: a GEMM takes
`overhead + flops / (peak[dtype] * efficiency)`; any other kernel
`overhead + max(flops / vector_flops, bytes / bandwidth)`, where the
bandwidth is the cache's for kernels that touch at most `cache_bytes`
(CPUs stream several times faster from their last-level cache) and the
memory's otherwise; a GEMM is any kernel of the GEMM kind (matmuls, and
convolutions, which run as im2col and a GEMM). A calibrated device also
carries, per kernel name, a fixed cost (`kernel_overheads`) and a factor on
the rate-bound time (`kernel_scales`): what the kernel costs inside a
training step, where operands arrive cold and ranks share caches, against
the isolated timings the rates come from. The same per kernel kind
(`kind_overheads`, `kind_scales`; `lg.KERNEL_KINDS`, and `fused` for the
generated elementwise chains) prices every kernel the calibration did not
time by name.

The file format is JSON with exactly the fields of `Cluster`,
`DeviceModel`, `Level`, `Links` and `CollectiveFit` below (`docs/CLUSTER.md`
shows one); `load_cluster` validates it and names the field at fault.
"""

from __future__ import annotations

import bisect
import functools
import itertools
import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import MISSING, asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from sbpc.dialects import lg

COLLECTIVE_KINDS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "transfer")
"""What the runtime sends over the network (the COLLECTIVES rows that
communicate, and point-to-point transfers between placements)."""

DTYPES = ("f64", "f32", "tf32", "bf16", "f16")


class ClusterError(ValueError):
    """A cluster file or preset that cannot describe a cluster; the message names the field."""


FUSED_KIND = "fused"
"""The kind of the generated elementwise chains (`plan.fused`)."""


@functools.cache
def kernel_kind(kernel: str) -> str | None:
    """How kernel `kernel` spends its time: an lg op's `KERNEL_KIND`,
    `fused` for a generated elementwise chain; None for any other name (the
    runtime's copies, which the device prices by their bytes)."""
    if kernel == Cluster.FUSED_KERNEL:
        return FUSED_KIND
    try:
        op = lg.op_class(kernel)
    except KeyError:
        return None
    return op.KERNEL_KIND if issubclass(op, lg.SbpRules) else None


def latency_steps(kind: str, p: int) -> float:
    """Latency terms of one collective over p devices: recursive doubling
    and halving for the reductions and gathers (log2 p rounds; all_reduce
    is a reduce_scatter then an all_gather), pairwise exchange for
    all_to_all (p - 1 rounds), one message for a transfer."""
    if p <= 1:
        return 0.0
    rounds = math.ceil(math.log2(p))
    return {"all_reduce": 2.0 * rounds, "all_to_all": float(p - 1), "transfer": 1.0}.get(kind, float(rounds))


def alpha_beta(kind: str, p: int, latency: float, bandwidth: float, nbytes: float) -> float:
    """Seconds of one collective of `kind` over p devices moving `nbytes`
    per device on a link of `latency` per step and `bandwidth`: the latency
    steps, then the bytes. Over one device nothing crosses a link (what the
    library does there is a copy: `Cluster.collective_time`)."""
    if p <= 1:
        return 0.0
    return latency_steps(kind, p) * latency + nbytes / bandwidth


@dataclass(frozen=True)
class CollectiveFit:
    """Calibrated figures of one collective kind on one level."""

    latency: float
    """Seconds per latency step (latency_steps)."""
    bandwidth: float
    """Bytes per second of the recorded per-device volume."""
    measured: Sequence[Sequence[float]] = ()
    """The calibration's own [volume, seconds] points, smallest volume
    first, timed over `members` ranks. A collective of that many members
    and a volume within their range is priced on the measured curve, not the
    line: the line fitted over 1 KB to 16 MB priced the 16-256 KB
    collectives of a tensor-parallel GPT at half what they measured (Zen 4:
    an all_gather of 16 KB at 29 us, measured 61)."""
    members: int = 0
    """Ranks the `measured` points were timed over (0: no points)."""

    def __post_init__(self) -> None:  # as read from a file or given: one form, compared alike
        if isinstance(self.measured, list | tuple):
            object.__setattr__(self, "measured", tuple(
                tuple(p) if isinstance(p, list | tuple) else p for p in self.measured))

    def on_curve(self, members: int, nbytes: float) -> float | None:
        """Seconds of a collective of `members` ranks moving `nbytes`, read
        off the measured points (log-log between the two around it; a
        volume below the smallest measured costs what that one did, since a
        collective has a floor its bytes do not lower); None outside them
        or for another member count, where the line prices it."""
        if not self.measured or members != self.members or nbytes > self.measured[-1][0]:
            return None
        volumes, seconds = self._curve
        if nbytes <= volumes[0]:
            return seconds[0]
        i = bisect.bisect_left(volumes, nbytes)
        share = math.log(nbytes / volumes[i - 1]) / math.log(volumes[i] / volumes[i - 1])
        return seconds[i - 1] * (seconds[i] / seconds[i - 1]) ** share

    @functools.cached_property
    def _curve(self) -> tuple[list[float], list[float]]:
        """The points as (volumes, seconds), each time at least those of the
        smaller volumes: more bytes never cost less (a dip between two sizes
        is the machine's noise). Made once, on the first collective priced."""
        volumes = [float(v) for v, _ in self.measured]
        seconds = list(itertools.accumulate((float(t) for _, t in self.measured), max))
        return volumes, seconds


@dataclass(frozen=True)
class Level:
    name: str
    size: int
    """Units of the level below (devices for level 0) in one unit of this level."""
    bandwidth: float
    """Bytes/s one device sends across this level with all devices sending."""
    latency: float
    """Seconds of one message across this level."""
    collectives: Mapping[str, CollectiveFit] = field(default_factory=dict)
    """Calibrated per-kind figures, replacing bandwidth and latency for that kind."""
    sync: float = 0.0
    """Seconds a collective across this level costs on top of its alpha-beta
    time when members of it share a core (`cores`): they reach it at
    different moments and must all be running to complete it, so the OS has
    to run each of them in turn (0 where every rank has its own core or
    engine; `sbp-calibrate` measures it)."""
    cores: int = 0
    """Cores (logical CPUs) one unit's devices run on, where they outnumber
    them: the launcher binds device i of the unit to CPU i mod `cores`
    (runtime/launch.py), and only a collective with two members on one CPU
    pays `sync`. 0: not known, every collective pays it."""


@dataclass(frozen=True)
class Links:
    """A full link matrix: bandwidth[i][j] bytes/s and latency[i][j] seconds from device i to j."""

    bandwidth: Sequence[Sequence[float]]
    latency: Sequence[Sequence[float]]


@dataclass(frozen=True)
class DeviceModel:
    kind: str
    """'cpu' or 'cuda' (what a placement names)."""
    memory: float
    """Bytes of memory per device."""
    peak_flops: Mapping[str, float]
    """Peak GEMM flop/s per element type (f32, bf16, ...)."""
    efficiency: float
    """Fraction of peak a GEMM sustains."""
    vector_flops: float
    """Flop/s of non-GEMM arithmetic (elementwise, reductions)."""
    memory_bandwidth: float
    """Bytes/s a non-GEMM kernel streams."""
    kernel_overhead: float
    """Seconds every kernel costs however small (launch, Python call)."""
    actor_overhead: float = 0.0
    """Seconds the executor spends per actor besides the kernel."""
    kernel_overheads: Mapping[str, float] = field(default_factory=dict)
    """Seconds of fixed cost per kernel name where it differs from
    `kernel_overhead` (numpy kernels that make several calls); for
    `plan.fused`, per fused step."""
    kernel_scales: Mapping[str, float] = field(default_factory=dict)
    """Per kernel name, how much longer (above 1) or shorter the kernel's
    rate-bound time runs inside a training step than the rates above
    predict (1 where absent). The rates are timed on warm, isolated calls;
    inside a step a kernel's operands arrive from other kernels, the ranks
    share the caches and the memory bus, and shapes are thinner. For
    `plan.fused`, the generated chains' speed against the fused roofline.
    `sbp-calibrate` reads both this and `kernel_overheads` off traced
    probe steps."""
    kind_overheads: Mapping[str, float] = field(default_factory=dict)
    """Per kernel kind (`kernel_kind`), the fixed cost of a kernel with none
    of its own in `kernel_overheads`: the median of its kind's there."""
    kind_scales: Mapping[str, float] = field(default_factory=dict)
    """Per kernel kind, the scale of a kernel with none of its own in
    `kernel_scales`: the median of its kind's there."""
    cache_bytes: float = 0.0
    """Bytes a kernel may touch and still stream at `cache_bandwidth` (0: no cache tier)."""
    cache_bandwidth: float = 0.0
    """Bytes/s of a kernel whose operands fit in `cache_bytes`."""
    comm_overlap: float = 1.0
    """Fraction of a collective that proceeds while the device computes (1:
    a separate engine, as NCCL on GPUs; lower where the same cores move
    the bytes, as MPI on shared memory)."""
    stream_per_group: bool = False
    """Collectives of different device groups run at once, each group's in
    issue order (NCCL: a communicator per group on a stream of its own, as
    Megatron-LM's tensor- and data-parallel groups). False: one collective
    at a time per device, in issue order (the MPI runtime on CPU, whose
    rank progresses them on its one thread)."""
    timed_ranks_per_cpu: int = 0
    """How many ranks shared each CPU while the rates above were timed
    (`sbp-calibrate`: its ranks over the host's cores, at least 1); 0: as
    many as the cluster binds to one. Where a plan puts more ranks on a CPU
    than that, the simulator slows each rank's kernels by the others that
    compute on its CPU meanwhile (step_time._shared_processors)."""
    launch_ahead: bool = False
    """The host queues kernels ahead of the device (a GPU stream): a kernel
    costs max(its fixed cost, its roofline), the fixed cost being the floor
    of a tiny kernel. False where the host dispatches each kernel before its
    arithmetic runs (numpy): the fixed cost adds to the roofline."""

    def gemm_rate(self, dtype: str) -> float:
        peak = self.peak_flops.get(dtype) or self.peak_flops.get("f32") or max(self.peak_flops.values())
        return peak * self.efficiency


@dataclass(frozen=True)
class Rates:
    """What sbp-infer's cost model reads of a cluster for the devices of one
    placement (`Cluster.rates`): the GEMM rate, the all_reduce figures of
    the level the placement spans, and the cluster's own prices of a
    kernel, a collective and a copy, which the simulator charges too."""

    name: str
    flops: float
    """Sustained arithmetic rate of one device, flop/s."""
    bandwidth: float
    """Bytes per second one device sends (and receives) in a collective."""
    latency: float = 0.0
    """Fixed seconds per collective step."""
    core_time: Callable[[str, float, float, str], float] | None = field(default=None, compare=False, repr=False)
    """The device's time for a kernel's arithmetic and bytes (`Cluster.core_time`:
    the roofline of GEMMs, vector arithmetic and memory streams, with the
    in-step scales): sbp-infer prices each op's local work as the step-time
    simulator does. None: every op at the GEMM rate."""
    collective: Callable[[str, Sequence[int], float, float], float] | None = field(
        default=None, compare=False, repr=False)
    """The seconds of one collective of a kind over the given ranks moving
    the given bytes per device into a result of the given bytes
    (`Cluster.collective_time`: its per-kind figures, latency steps, the
    copy of a collective over one rank and the sync of ranks sharing a
    core), as the simulator and bucketing price it. None: `alpha_beta` on
    this object's latency and bandwidth."""

    bucketed: Callable[[str, Sequence[int], float, float, float, int], float] | None = field(
        default=None, compare=False, repr=False)
    """The seconds a gradient's reduction adds to a step as one of a number
    of members of a bucket (`Cluster.bucket_member_time`). None: as a
    collective of its own."""
    copy: Callable[[float], float] | None = field(default=None, compare=False, repr=False)
    """Seconds of copying the given bytes on one device (`Cluster.copy_time`),
    what a local boxing step (a slice, a partial's zeros) costs. None: nothing."""
    actor_overhead: float = 0.0
    """Seconds the executor spends on each actor it fires, a boxing step's included."""

    def copy_time(self, nbytes: float) -> float:
        """Seconds of copying `nbytes` on one device."""
        return self.copy(nbytes) if self.copy is not None else 0.0

    def collective_time(self, kind: str, ranks: Sequence[int], nbytes: float, piece: float = 0.0) -> float:
        """Seconds of one collective of `kind` over `ranks` moving `nbytes`
        per device into a result of `piece` bytes."""
        if self.collective is not None:
            return self.collective(kind, ranks, nbytes, piece)
        return alpha_beta(kind, len(ranks), self.latency, self.bandwidth, nbytes)

    def bucket_member_time(self, kind: str, ranks: Sequence[int], nbytes: float, piece_in: float,
                           piece_out: float, members: int) -> float:
        """Seconds a reduction of `kind` moving `nbytes` per device from a
        `piece_in` into a `piece_out` adds to a step as one of `members` in
        a bucket: as a collective of its own (and its actor) where nothing
        says how to price a bucket."""
        if self.bucketed is not None:
            return self.bucketed(kind, ranks, nbytes, piece_in, piece_out, members)
        return self.collective_time(kind, ranks, nbytes, piece_out) + self.actor_overhead

    def op_time(self, kernel: str, flops: float, nbytes: float, dtype: str = "f32") -> float:
        """Seconds of an op's rate-bound work on one device."""
        if self.core_time is None:
            return flops / self.flops
        return self.core_time(kernel, flops, nbytes, dtype)

    def memory_cost(self, nbytes: float) -> float:
        """Seconds charged per byte held: 1% of sending it, so that of two
        otherwise equal plans the leaner wins."""
        return nbytes * 0.01 / self.bandwidth


@dataclass(frozen=True)
class Cluster:
    name: str
    count: int
    device: DeviceModel
    levels: Sequence[Level] = ()
    links: Links | None = None
    source: str = ""
    """Where the figures come from (vendor specifications, a calibration run)."""

    def __post_init__(self) -> None:
        validate(self)

    # -- topology ---------------------------------------------------------------

    def level_of(self, ranks: Sequence[int]) -> int:
        """The lowest level whose one unit holds all of `ranks`."""
        unit = 1
        for i, level in enumerate(self.levels):
            unit *= level.size
            if len({r // unit for r in ranks}) == 1:
                return i
        return len(self.levels) - 1

    def members_per_unit(self, ranks: Sequence[int], level: int) -> int:
        """How many of `ranks` share one unit below `level` (they share its links)."""
        if level == 0:
            return 1
        unit = math.prod(lv.size for lv in self.levels[:level])
        counts: dict[int, int] = {}
        for r in ranks:
            counts[r // unit] = counts.get(r // unit, 0) + 1
        return max(counts.values())

    def rates(self, ranks: Sequence[int] = ()) -> Rates:
        """The rates of the devices `ranks` (default: two devices of one unit)."""
        group = list(ranks) or list(range(min(2, self.count)))
        latency, bandwidth = self.figures("all_reduce", group)
        return Rates(self.name, flops=self.device.gemm_rate("f32"), bandwidth=bandwidth, latency=latency,
                     core_time=self.core_time, collective=self.collective_time, copy=self.copy_time,
                     bucketed=self.bucket_member_time, actor_overhead=self.device.actor_overhead)

    def figures(self, kind: str, ranks: Sequence[int]) -> tuple[float, float]:
        """(latency per step, bandwidth) of collective `kind` over `ranks`."""
        if self.links is not None:
            ring = list(ranks)
            pairs = list(zip(ring, ring[1:] + ring[:1])) if len(ring) > 1 else []
            if not pairs:
                return 0.0, math.inf
            return (max(self.links.latency[a][b] for a, b in pairs),
                    min(self.links.bandwidth[a][b] for a, b in pairs))
        top = self.level_of(ranks)
        fit = self.levels[top].collectives.get(kind)
        if fit is not None:
            return fit.latency, fit.bandwidth
        bandwidth = min(level.bandwidth for level in self.levels[: top + 1])
        return self.levels[top].latency, bandwidth

    def collective_time(self, kind: str, ranks: Sequence[int], nbytes: float, piece: float = 0.0) -> float:
        """Seconds of one collective of `kind` over `ranks` moving `nbytes`
        per device (the volume the IR records) into a result of `piece`
        bytes on each: over one rank the library copies the input into the
        result (MPI's send buffer into its receive buffer), nothing else."""
        if len(ranks) > 1 and self.links is None:
            fit = self.levels[self.level_of(ranks)].collectives.get(kind)
            measured = fit.on_curve(len(ranks), nbytes) if fit is not None else None
            if measured is not None:
                return measured + self.collective_sync(ranks)
        latency, bandwidth = self.figures(kind, ranks)
        alone = self.copy_time(piece) if len(ranks) <= 1 and piece else 0.0
        return alpha_beta(kind, len(ranks), latency, bandwidth, nbytes) + alone + self.collective_sync(ranks)

    def collective_sync(self, ranks: Sequence[int]) -> float:
        """What a collective among `ranks` adds to a step beyond its
        lock-step time where two of them share a core (the level's `sync`):
        the OS must run every member before it completes."""
        if len(ranks) <= 1 or self.links is not None or not self.share_a_core(ranks):
            return 0.0
        return self.levels[self.level_of(ranks)].sync

    def _bound_host(self) -> Level | None:
        """The host level where its ranks outnumber its cores and are bound
        to them (Level.cores); None where each has a CPU or it is not known."""
        host = self.levels[0] if self.links is None else None
        if host is None or host.cores <= 0 or host.size <= host.cores:
            return None
        return host

    def cpu_of(self, rank: int) -> tuple[int, int] | None:
        """(host, CPU) that `rank` is bound to: device i of a host on its
        CPU i mod cores (runtime/launch.py); None where ranks are not bound."""
        host = self._bound_host()
        if host is None:
            return None
        return rank // host.size, (rank % host.size) % host.cores

    def crowding(self, ranks: int) -> float:
        """How many times its timed time a kernel takes on each of ranks
        0..`ranks`-1 when all of them compute at once, as the simulator
        prices ranks sharing a CPU (step_time._shared_processors): 1 where
        no two share one; else the ranks on a CPU over those the rates were
        timed with."""
        host = self._bound_host()
        if host is None:
            return 1.0
        per_cpu = -(-min(ranks, host.size) // host.cores)
        if per_cpu <= 1:
            return 1.0
        return per_cpu / (self.device.timed_ranks_per_cpu or self.ranks_per_cpu())

    def ranks_per_cpu(self) -> int:
        """How many bound ranks share a CPU (1 where ranks are not bound):
        the calibration timed kernels with that many running on each."""
        host = self._bound_host()
        return 1 if host is None else -(-host.size // host.cores)

    def share_a_core(self, ranks: Sequence[int]) -> bool:
        """Whether two of `ranks` run on one CPU of a host; true where the
        cores are not known (Level.cores 0), false with a CPU each."""
        if self.links is not None:
            return False
        if self.levels[0].cores <= 0:
            return True
        cpus = [self.cpu_of(r) for r in ranks]
        return None not in cpus and len(set(cpus)) < len(cpus)

    # -- compute ----------------------------------------------------------------

    GEMM_KERNELS = ("lg.matmul",)
    """The kernels the runtime runs in column blocks, calling MPI between them."""
    FUSED_KERNEL = "plan.fused"

    def kernel_overhead(self, kernel: str) -> float:
        """The fixed seconds of one call of `kernel`: its own, its kind's, or the device's."""
        d = self.device
        own = d.kernel_overheads.get(kernel)
        if own is None:
            own = d.kind_overheads.get(kernel_kind(kernel) or "", d.kernel_overhead)
        return own

    def kernel_scale(self, kernel: str) -> float:
        """The in-step factor on `kernel`'s rate-bound time: its own, its kind's, or 1."""
        d = self.device
        own = d.kernel_scales.get(kernel)
        if own is None:
            own = d.kind_scales.get(kernel_kind(kernel) or "", 1.0)
        return own

    def work_time(self, kernel: str, flops: float, nbytes: float, dtype: str = "f32", calls: int = 1) -> float:
        """Seconds of kernel `kernel` doing `flops` over `nbytes`; a fused chain of `calls` steps is `calls`
        host calls on a CPU (numpy runs each step) and one kernel on a launch-ahead device."""
        d = self.device
        core = self.core_time(kernel, flops, nbytes, dtype)
        if d.launch_ahead:  # a fused chain is one generated kernel: one launch
            return max(self.kernel_overhead(kernel), core)
        return self.kernel_overhead(kernel) * calls + core

    def core_time(self, kernel: str, flops: float, nbytes: float, dtype: str = "f32") -> float:
        """The rate-bound part of a kernel's time (no fixed cost)."""
        return self.roofline(kernel, flops, nbytes, dtype) * self.kernel_scale(kernel)

    def roofline(self, kernel: str, flops: float, nbytes: float, dtype: str = "f32") -> float:
        """A kernel's time at the device's rates, before its in-step scale."""
        d = self.device
        if kernel_kind(kernel) in lg.GEMM_RATE_KINDS:
            return flops / d.gemm_rate(dtype)
        bandwidth = d.cache_bandwidth if 0 < nbytes <= d.cache_bytes and d.cache_bandwidth else d.memory_bandwidth
        rate = d.vector_flops
        if kernel == self.FUSED_KERNEL:
            # A fused chain's steps are simple arithmetic over blocks that stay
            # in cache: a flop per element runs at least as fast as the cache
            # streams an add's 12 bytes (vector_flops is measured on exp, tanh,
            # GELU and softmax, which are slower per flop).
            rate = max(rate, (d.cache_bandwidth or d.memory_bandwidth) / 12.0)
        return max(flops / rate, nbytes / bandwidth)

    def gemm_time(self, flops: float, dtype: str = "f32") -> float:
        return self.work_time("lg.matmul", flops, 0.0, dtype)

    def kernel_time(self, flops: float, nbytes: float) -> float:
        return self.work_time("", flops, nbytes)

    def bucket_pack_time(self, nbytes: float) -> float:
        """Seconds of copying `nbytes` of gradients into one bucket: one concat."""
        return self.work_time("lg.concat", 0.0, 2.0 * nbytes)

    def bucket_unpack_time(self, members: int, nbytes: float) -> float:
        """Seconds of copying a bucket of `members` gradients, `nbytes` in
        all, back out: a slice each."""
        return members * self.work_time("lg.slice", 0.0, 0.0) + self.core_time("lg.slice", 0.0, 2.0 * nbytes)

    def bucket_member_time(self, kind: str, ranks: Sequence[int], nbytes: float, piece_in: float,
                           piece_out: float, members: int) -> float:
        """Seconds one gradient's reduction of `kind` moving `nbytes` per
        device from a `piece_in` into a `piece_out` adds to a step as one of
        `members` alike that sbp-bucket-collectives joins into a bucket: the
        bucket's price (its collective, its concat and slices, and an actor
        each) shared among them. (The pass itself prices a bucket's slices
        on the bytes that went in: for a reduce_scatter p times what they
        copy.)"""
        call = self.collective_time(kind, ranks, 0.0)
        data = self.collective_time(kind, ranks, members * nbytes) - call
        copies = self.bucket_pack_time(members * piece_in) + self.bucket_unpack_time(members, members * piece_out)
        actors = (2 + members) * self.device.actor_overhead  # the concat, the collective, a slice each
        return (call + data + copies + actors) / max(1, members)

    def copy_time(self, nbytes: float) -> float:
        """Seconds of copying `nbytes` on one device (read once, written once)."""
        return self.kernel_time(0.0, 2.0 * nbytes)

    # -- files ------------------------------------------------------------------

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        if self.links is None:
            del data["links"]
        for level in data["levels"]:
            if not level["collectives"]:
                del level["collectives"]
        return data

    def save(self, path: str) -> None:
        with open(path, "w") as f:
            json.dump(self.to_json(), f, indent=2)
            f.write("\n")

    def resized(self, count: int) -> Cluster:
        """The same kind of cluster with `count` devices: the top level grows or
        shrinks (a node count), lower levels keep their size."""
        if count == self.count:
            return self
        if self.links is not None:
            raise ClusterError(f"cluster {self.name}: a link matrix describes exactly {self.count} devices")
        below = math.prod(level.size for level in self.levels[:-1])
        if count % below and count > below:
            raise ClusterError(f"cluster {self.name}: {count} devices is not a whole number of {below}-device units")
        levels = list(self.levels)
        if count <= below:  # fewer devices than one unit: cut the hierarchy
            kept, unit = [], 1
            for level in levels:
                if unit * level.size >= count:
                    if count % unit:
                        raise ClusterError(
                            f"cluster {self.name}: {count} devices is not a whole number of {unit}-device units")
                    kept.append(replace(level, size=count // unit))
                    break
                kept.append(level)
                unit *= level.size
            levels = kept
        else:
            levels[-1] = replace(levels[-1], size=count // below)
        return replace(self, name=f"{self.name}/{count}", count=count, levels=tuple(levels))


# -- validation ---------------------------------------------------------------------------


def _positive(where: str, value: Any, zero_ok: bool = False) -> None:
    ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or value < 0 or (value == 0 and not zero_ok):
        raise ClusterError(f"{where}: must be a {'non-negative' if zero_ok else 'positive'} number, got {value!r}")


KINDS = (*lg.KERNEL_KINDS, FUSED_KIND)
"""The kernel kinds a device may price."""


def _kernel_kind_name(where: str, kind: str) -> None:
    if kind not in KINDS:
        raise ClusterError(f"{where}: not a kernel kind (the kinds are {', '.join(KINDS)})")


def validate(c: Cluster) -> None:
    if not isinstance(c.count, int) or isinstance(c.count, bool) or c.count < 1:
        raise ClusterError(f"count: must be a positive integer, got {c.count!r}")
    d = c.device
    if d.kind not in ("cpu", "cuda"):
        raise ClusterError(f"device.kind: must be 'cpu' or 'cuda', got {d.kind!r}")
    _positive("device.memory", d.memory)
    if not d.peak_flops:
        raise ClusterError("device.peak_flops: needs at least one element type")
    for dtype, rate in d.peak_flops.items():
        if dtype not in DTYPES:
            raise ClusterError(f"device.peak_flops.{dtype}: unknown element type (known: {', '.join(DTYPES)})")
        _positive(f"device.peak_flops.{dtype}", rate)
    _positive("device.efficiency", d.efficiency)
    if d.efficiency > 1:
        raise ClusterError(f"device.efficiency: a fraction of peak, at most 1, got {d.efficiency}")
    _positive("device.vector_flops", d.vector_flops)
    _positive("device.memory_bandwidth", d.memory_bandwidth)
    _positive("device.kernel_overhead", d.kernel_overhead, zero_ok=True)
    _positive("device.actor_overhead", d.actor_overhead, zero_ok=True)
    if not isinstance(d.timed_ranks_per_cpu, int) or d.timed_ranks_per_cpu < 0:
        raise ClusterError(f"device.timed_ranks_per_cpu: a whole number, 0 or more, got {d.timed_ranks_per_cpu!r}")
    _positive("device.comm_overlap", d.comm_overlap, zero_ok=True)
    for kernel, seconds in d.kernel_overheads.items():
        _positive(f"device.kernel_overheads.{kernel}", seconds, zero_ok=True)
    for kernel, scale in d.kernel_scales.items():
        _positive(f"device.kernel_scales.{kernel}", scale)
    for kind, seconds in d.kind_overheads.items():
        _kernel_kind_name(f"device.kind_overheads.{kind}", kind)
        _positive(f"device.kind_overheads.{kind}", seconds, zero_ok=True)
    for kind, scale in d.kind_scales.items():
        _kernel_kind_name(f"device.kind_scales.{kind}", kind)
        _positive(f"device.kind_scales.{kind}", scale)
    _positive("device.cache_bytes", d.cache_bytes, zero_ok=True)
    _positive("device.cache_bandwidth", d.cache_bandwidth, zero_ok=True)
    for flag in ("launch_ahead", "stream_per_group"):
        if not isinstance(getattr(d, flag), bool):
            raise ClusterError(f"device.{flag}: must be true or false, got {getattr(d, flag)!r}")
    if d.comm_overlap > 1:
        raise ClusterError(f"device.comm_overlap: a fraction, at most 1, got {d.comm_overlap}")
    if (c.links is None) == (not c.levels):
        raise ClusterError("levels, links: give exactly one of them (a hierarchy of levels or a link matrix)")
    if c.links is not None:
        for name in ("bandwidth", "latency"):
            matrix = getattr(c.links, name)
            if len(matrix) != c.count or any(len(row) != c.count for row in matrix):
                raise ClusterError(f"links.{name}: must be a {c.count} x {c.count} matrix (count is {c.count})")
            for i, row in enumerate(matrix):
                for j, value in enumerate(row):
                    if i != j:
                        _positive(f"links.{name}[{i}][{j}]", value, zero_ok=name == "latency")
        return
    for i, level in enumerate(c.levels):
        where = f"levels[{i}]"
        if not isinstance(level.size, int) or isinstance(level.size, bool) or level.size < 1:
            raise ClusterError(f"{where}.size: must be a positive integer, got {level.size!r}")
        _positive(f"{where}.bandwidth", level.bandwidth)
        _positive(f"{where}.latency", level.latency, zero_ok=True)
        _positive(f"{where}.sync", level.sync, zero_ok=True)
        if not isinstance(level.cores, int) or isinstance(level.cores, bool) or level.cores < 0:
            raise ClusterError(f"{where}.cores: must be a non-negative integer, got {level.cores!r}")
        for kind, fit in level.collectives.items():
            if kind not in COLLECTIVE_KINDS:
                raise ClusterError(f"{where}.collectives.{kind}: unknown kind (known: {', '.join(COLLECTIVE_KINDS)})")
            _positive(f"{where}.collectives.{kind}.latency", fit.latency, zero_ok=True)
            _positive(f"{where}.collectives.{kind}.bandwidth", fit.bandwidth)
            _check_measured(f"{where}.collectives.{kind}", fit)
    total = math.prod(level.size for level in c.levels)
    if total != c.count:
        sizes = " x ".join(str(level.size) for level in c.levels)
        raise ClusterError(f"levels: the sizes multiply to {total} ({sizes}) but count is {c.count}")


def _check_measured(where: str, fit: CollectiveFit) -> None:
    points = fit.measured
    if not isinstance(points, list | tuple):
        raise ClusterError(f"{where}.measured: must be a list of [volume, seconds] pairs")
    if not points:
        return
    if not isinstance(fit.members, int) or isinstance(fit.members, bool) or fit.members < 2:
        raise ClusterError(f"{where}.members: the ranks its measured points were timed over, at least 2, "
                           f"got {fit.members!r}")
    last = 0.0
    for i, point in enumerate(points):
        if (not isinstance(point, list | tuple) or len(point) != 2
                or not all(isinstance(x, int | float) and not isinstance(x, bool) and x > 0 for x in point)):
            raise ClusterError(f"{where}.measured[{i}]: must be [volume, seconds], both positive, got {point!r}")
        if point[0] <= last:
            raise ClusterError(f"{where}.measured[{i}]: volumes must grow, got {point[0]!r} after {last!r}")
        last = point[0]


# -- reading ------------------------------------------------------------------------------


def _build(cls, data: Any, where: str, nested: Mapping[str, Any] | None = None):
    """A dataclass from a JSON object, naming unknown and missing fields."""
    if not isinstance(data, dict):
        raise ClusterError(f"{where or 'the file'}: must be a JSON object, got {type(data).__name__}")
    prefix = f"{where}." if where else ""
    known = {f.name: f for f in fields(cls)}
    unknown = sorted(set(data) - set(known))
    if unknown:
        raise ClusterError(f"{prefix}{unknown[0]}: unknown field (the fields are {', '.join(known)})")
    values = {}
    for name, f in known.items():
        if name not in data:
            if f.default is MISSING and f.default_factory is MISSING:
                raise ClusterError(f"{prefix}{name}: missing")
            continue
        value = data[name]
        if nested and name in nested:
            value = nested[name](value, f"{prefix}{name}")
        values[name] = value
    return cls(**values)


def _level(data: Any, where: str) -> Level:
    def fits(value: Any, at: str) -> dict[str, CollectiveFit]:
        if not isinstance(value, dict):
            raise ClusterError(f"{at}: must be an object of collective kinds")
        return {kind: _build(CollectiveFit, fit, f"{at}.{kind}") for kind, fit in value.items()}

    return _build(Level, data, where, {"collectives": fits})


def _levels(data: Any, where: str) -> tuple[Level, ...]:
    if not isinstance(data, list | tuple):
        raise ClusterError(f"{where}: must be a list of levels")
    return tuple(_level(level, f"{where}[{i}]") for i, level in enumerate(data))


def _device(data: Any, where: str) -> DeviceModel:
    def mapping(what: str):
        def read(value: Any, at: str) -> dict[str, float]:
            if not isinstance(value, dict):
                raise ClusterError(f"{at}: must be an object of {what}")
            return dict(value)

        return read

    return _build(DeviceModel, data, where, {"peak_flops": mapping("element type -> flop/s"),
                                            "kernel_overheads": mapping("kernel name -> seconds"),
                                            "kernel_scales": mapping("kernel name -> factor"),
                                            "kind_overheads": mapping("kernel kind -> seconds"),
                                            "kind_scales": mapping("kernel kind -> factor")})


def _links(data: Any, where: str) -> Links | None:
    if data is None:
        return None
    links = _build(Links, data, where)
    for name in ("bandwidth", "latency"):
        matrix = getattr(links, name)
        if not isinstance(matrix, list) or not all(isinstance(row, list) for row in matrix):
            raise ClusterError(f"{where}.{name}: must be a list of lists")
    return links


def cluster_from_json(data: Any, origin: str = "") -> Cluster:
    try:
        return _build(Cluster, data, "", {"device": _device, "levels": _levels, "links": _links})
    except ClusterError as e:
        raise ClusterError(f"{origin}: {e}" if origin else str(e)) from None
    except TypeError as e:  # a field of the wrong JSON type met arithmetic
        raise ClusterError(f"{origin}: {e}" if origin else str(e)) from None


def load_cluster(spec: str | Cluster, devices: int | None = None) -> Cluster:
    """A preset name (`presets()`) or a cluster JSON file; with `devices`,
    resized to that many devices."""
    if isinstance(spec, Cluster):
        cluster = spec
    elif spec in PRESETS or _family(spec) is not None:
        cluster = preset(spec, devices)
    else:
        try:
            with open(spec) as f:
                data = json.load(f)
        except OSError as e:
            raise ClusterError(
                f"cluster '{spec}' is neither a preset ({', '.join(presets())}) nor a readable file: {e.strerror}"
            ) from None
        except json.JSONDecodeError as e:
            raise ClusterError(f"{spec}: not valid JSON: {e}") from None
        cluster = cluster_from_json(data, spec)
    return cluster.resized(devices) if devices is not None else cluster


# -- presets ------------------------------------------------------------------------------

CPU_PRESET_FILE = Path(__file__).with_name("cpu.json")
"""The `cpu` preset: this project's CPU machines (2 cores, one rank on each),
as `sbp-calibrate` measured one of them, its collectives' cost on more
ranks than cores included (`make cpu-preset` measures it again; the file's
`source` names the date, the CPU, its cores and the BLAS kernels). Plans
that the default device prices are priced with what the machine does,
per kernel and per kernel kind, rather than with round constants."""


def _cpu_preset() -> Cluster:
    try:
        return cluster_from_json(json.loads(CPU_PRESET_FILE.read_text()), str(CPU_PRESET_FILE))
    except (OSError, json.JSONDecodeError) as e:
        raise ClusterError(f"the cpu preset {CPU_PRESET_FILE} cannot be read: {e}") from None


CPU = _cpu_preset()

# One NVIDIA H100 SXM5 80GB (NVIDIA H100 Tensor Core GPU datasheet, 2023):
# dense tensor-core peaks FP64 67 TFLOP/s, TF32 495, BF16/FP16 989; FP32 (CUDA
# cores, what non-GEMM arithmetic runs on) 67 TFLOP/s; HBM3 3.35 TB/s; 80 GB.
# efficiency 0.7 and the 7 us floor per kernel are PyTorch autoparallel's
# compute model (a floor, not an addition: the host queues kernels ahead of
# the stream); actors cost no host time on a GPU stream.
H100 = DeviceModel(
    kind="cuda", memory=80e9, peak_flops={"f64": 67e12, "f32": 67e12, "tf32": 495e12, "bf16": 989e12, "f16": 989e12},
    efficiency=0.7, vector_flops=67e12, memory_bandwidth=3.35e12 * 0.7, kernel_overhead=7e-6, actor_overhead=0.0,
    comm_overlap=1.0, launch_ahead=True, stream_per_group=True,
)

# NVLink 4 through NVSwitch in a DGX/HGX H100: 900 GB/s per GPU both ways, so
# 450 GB/s each way (NVIDIA DGX H100 user guide); NCCL sustains about 80% of it
# (bus bandwidth ~360 GB/s in nccl-tests all_reduce on 8 H100s). Latency per
# step ~3 us.
NVLINK = Level("node", 8, bandwidth=360e9, latency=3e-6)

# Between nodes: one ConnectX-7 NDR InfiniBand NIC per GPU, 400 Gb/s = 50 GB/s
# each way (DGX H100: 8 x 400 Gb/s compute fabric); NCCL reaches about 90% of it
# (~45 GB/s bus bandwidth per GPU across nodes). Latency per step ~6 us.
INFINIBAND = Level("cluster", 1, bandwidth=45e9, latency=6e-6)


def h100_cluster(nodes: int) -> Cluster:
    if nodes == 1:
        return Cluster(name="h100-node", count=8, device=H100, levels=(NVLINK,),
                       source="NVIDIA H100 SXM5 datasheet; DGX H100 user guide (NVLink 4)")
    return Cluster(name=f"h100-{nodes}nodes", count=8 * nodes, device=H100,
                   levels=(NVLINK, replace(INFINIBAND, size=nodes)),
                   source="NVIDIA H100 SXM5 datasheet; DGX H100 user guide (NVLink 4, 8 x 400 Gb/s NDR InfiniBand)")


PRESETS: dict[str, Cluster] = {"cpu": CPU, "h100-node": h100_cluster(1)}
for _nodes in (2, 4, 8, 16, 32, 64, 128):
    PRESETS[f"h100-{_nodes}nodes"] = h100_cluster(_nodes)


def _family(name: str) -> str | None:
    """'h100' names the H100 family: as many 8-GPU nodes as the devices need."""
    return name if name == "h100" else None


def presets() -> list[str]:
    return [*PRESETS, "h100"]


def preset(name: str, devices: int | None = None) -> Cluster:
    if name == "h100":
        n = devices or 8
        return h100_cluster(1).resized(n) if n <= 8 else h100_cluster(math.ceil(n / 8)).resized(n)
    if name not in PRESETS:
        raise ClusterError(f"no cluster preset '{name}' (presets: {', '.join(presets())})")
    return PRESETS[name]
