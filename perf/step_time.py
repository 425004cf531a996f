"""The step-time simulator: replays a compiled plan on a cluster model and
predicts its step time, where each device spends it, its peak memory and
the critical path.

It replays what the runtime (`runtime/executor.py`) does, per device:

- one compute thread takes the device's actors in schedule order: a compute
  actor runs its kernel (priced by the cluster's roofline); a communication
  actor is issued and goes on in the background; feeds are written before a
  step and updated parameters copied back after it;
- before any actor, the thread waits for in-flight communication that
  touches the bytes of the register slots it reads or writes (slot
  `step mod slots`), and a collective waits for its own previous issue;
- a collective starts once every member has issued it and every member's
  communication stream is free (one collective at a time per device), and
  takes the cluster's alpha-beta time for its group; a transfer between
  placements starts once both sides have issued it;
- where the device's cores also move the bytes (`comm_overlap` < 1, MPI on
  shared memory), the thread pays the non-overlapped share of every
  collective it issues.

Devices do not wait for each other between steps, so pipeline stages and
micro-batches overlap as they do in the runtime; the prediction is the
steady-state step (the mean of steps after the first).

**Equivalence classes.** Devices of the same placements run the same
actors on pieces of the same size and meet the same collectives, so one
representative per class stands for the rest: its peers issue a shared
collective when it does. The simulator replays the representatives only
when a plan has more devices than `EXACT_LIMIT` (and always for plans that
`sbp-to-plan{representatives=true}` lowered for representatives alone),
and says so in its report.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from xdsl.dialects.builtin import ModuleOp

from sbpc.dialects import lg, plan
from sbpc.dialects.dtypes import numpy_dtype
from sbpc.dialects.pieces import regions_of, staged_elements
from sbpc.dialects.sbp import COLLECTIVES, Mesh, PlacementOp

from .cluster import Cluster

EXACT_LIMIT = 64
"""Plans of more devices replay one representative per equivalence class."""

_DTYPES = {"f64": "f64", "f32": "f32", "bf16": "bf16", "f16": "f16"}


def _compute_op(kernel: str) -> type[lg.LgOp]:
    op = lg.op_class(kernel)
    assert issubclass(op, lg.LgOp)  # a fused chain's steps are elementwise compute ops
    return op


class SimulationError(ValueError):
    """A plan the simulator cannot replay; the message names the device and actor."""


# -- what each actor costs --------------------------------------------------------------


def _dtype_name(elem) -> str:
    return _DTYPES.get(str(elem), "f32")


def _kernel_flops(kernel: str, props, in_shapes, out_type) -> float:
    cls = lg.op_class(kernel)
    assert issubclass(cls, lg.SbpRules)  # compute actors run lg ops with rules
    try:
        params = cls.create(properties=dict(props), result_types=[out_type]).params()
    except Exception:  # noqa: BLE001 - params that read operands: the per-element default is close
        params = {}
    try:
        return float(cls.flops(in_shapes, tuple(out_type.get_shape()), **params))
    except Exception:  # noqa: BLE001
        return cls.FLOPS_PER_ELEMENT * math.prod(out_type.get_shape())


@dataclass(frozen=True)
class Work:
    """What one compute actor does, for pricing."""

    kernel: str
    flops: float
    nbytes: float
    """Bytes its operands and result occupy (what a streaming kernel touches)."""
    dtype: str
    calls: int
    """Kernels it runs (a fused chain runs one per step)."""


def actor_work(actor: plan.ComputeOp, registers: Mapping[str, plan.RegisterOp]) -> Work:
    ins = [registers[r.string_value()] for r in actor.ins.data]
    out = registers[actor.outs.data[0].string_value()]
    in_bytes = [r.bytes.value.data for r in ins]
    kernel = actor.kernel.data
    dtype = _dtype_name(out.type.element_type)
    if kernel == plan.FUSED:
        steps = plan.fused_steps(actor)
        flops = sum(_compute_op(s.kernel).FLOPS_PER_ELEMENT * math.prod(s.type.get_shape())
                    for s in steps)
        return Work(kernel, flops, sum(in_bytes) + out.bytes.value.data, dtype, len(steps))
    nbytes = _compute_op(kernel).bytes_touched(in_bytes, out.bytes.value.data)
    in_shapes = [tuple(r.type.get_shape()) for r in ins]
    return Work(kernel, _kernel_flops(kernel, actor.props.data, in_shapes, out.type), nbytes, dtype, 1)


def compute_time(actor: plan.ComputeOp, registers: Mapping[str, plan.RegisterOp], cluster: Cluster,
                 cache: dict | None = None) -> float:
    """Seconds of one compute actor's kernel on the cluster's device."""
    key = (actor.kernel.data, actor.props, tuple(registers[r.string_value()].type for r in actor.ins.data),
           registers[actor.outs.data[0].string_value()].type)
    if cache is not None and key in cache:
        return cache[key]
    work = actor_work(actor, registers)
    seconds = cluster.work_time(work.kernel, work.flops, work.nbytes, work.dtype, work.calls)
    if cache is not None:
        cache[key] = seconds
    return seconds


# -- the replay ---------------------------------------------------------------------------


@dataclass(eq=False)
class Task:
    """One firing on one device: a kernel, a copy, or the issue of a collective."""

    name: str
    what: str
    """'compute', 'copy', or the collective's kind."""
    duration: float
    ranges: list[tuple[int, int, int, bool]]
    comm: CommSpec | None = None
    blocks: int = 1
    """Parts the runtime runs it in with an MPI call between them (a long
    matmul's column blocks, plan.matmul_blocks); 1: no MPI call inside."""
    kernel: str = ""
    """What `DeviceReport.kernels` counts it under: its kernel, `copy`, or `issue` (a collective's)."""


@dataclass(frozen=True, eq=False)
class CommSpec:
    comm_id: int
    kind: str
    group: tuple[int, ...]
    duration: float


@dataclass(eq=False)
class Event:
    """A task or a collective as it happened in the replay."""

    device: int
    step: int
    name: str
    what: str
    start: float
    end: float
    cause: Event | None = None
    """The event whose end decided this one's start (the critical path runs through it)."""


@dataclass(eq=False)
class IssuedCollective:
    """One device's view of one issue of a collective."""

    device: int
    spec: CommSpec
    step: int
    ranges: list[tuple[int, int, int, bool]]
    issued: Event
    at: float
    """When it was issued (after the actor's own overhead; the thread may go on paying for it)."""
    event: Event | None = None
    """Set once its start and end are known."""
    after: list[IssuedCollective] = field(default_factory=list)
    """In-flight collectives whose bytes it touches, where the device
    enqueues it without waiting for them (`DeviceModel.launch_ahead`): its
    stream waits for them instead of the device's compute stream."""


@dataclass
class DeviceReport:
    rank: int
    represents: int
    """Devices this one stands for (itself included)."""
    placements: tuple[str, ...]
    compute: float
    """Seconds per step running kernels and copies (with per-actor overhead)."""
    exposed_comm: float
    """Seconds per step waiting for collectives (and paying for their copies)."""
    bubble: float
    """Seconds per step waiting for activations or gradients from another stage."""
    idle: float
    """The rest of the step (waiting for slower peers)."""
    comm: float
    """Seconds per step of collectives in flight (hidden or not)."""
    memory: int
    """Peak bytes: the persistent region plus the arena."""
    fits: bool
    kernels: dict[str, float] = field(default_factory=dict)
    """Seconds per step of each kernel (feeds and write-backs as 'copy', a
    collective's packing and call as 'issue'), overhead and shared CPUs
    included: where `compute` goes (they add up to it)."""


@dataclass
class PathEntry:
    device: int
    name: str
    what: str
    start: float
    duration: float


@dataclass
class Prediction:
    program: str
    cluster: str
    step_time: float
    devices: list[DeviceReport]
    critical_path: list[PathEntry]
    simulated: int
    total_devices: int
    steps: int
    events: list[Event] = field(default_factory=list, repr=False)

    @property
    def steps_per_second(self) -> float:
        return 1.0 / self.step_time if self.step_time > 0 else math.inf

    @property
    def peak_memory(self) -> int:
        return max((d.memory for d in self.devices), default=0)

    @property
    def fits(self) -> bool:
        return all(d.fits for d in self.devices)

    def path_summary(self) -> dict[str, float]:
        """Seconds of the last step's critical path by what ran."""
        out: dict[str, float] = {}
        for e in self.critical_path:
            key = "compute" if e.what in ("compute", "copy") else e.what
            out[key] = out.get(key, 0.0) + e.duration
        return out

    def format(self, path_entries: int = 12, kernel_lines: int = 4) -> str:
        ms = 1e3
        lines = [
            f"plan @{self.program} on {self.cluster}: predicted step {self.step_time * ms:.3f} ms "
            f"({self.steps_per_second:.2f} steps/s), peak memory {_bytes(self.peak_memory)} per device"
            + ("" if self.fits else " (DOES NOT FIT)"),
        ]
        if self.simulated < self.total_devices:
            lines.append(f"simulated {self.simulated} of {self.total_devices} devices, one per equivalence class "
                         "(devices of the same placements behave alike)")
        lines.append("per step, ms:  rank  devices  compute  exposed-comm  bubble  idle  comm-in-flight  memory")
        for d in self.devices:
            lines.append(f"  {d.rank:>16}  {d.represents:>7}  {d.compute * ms:>7.3f}  {d.exposed_comm * ms:>12.3f}  "
                         f"{d.bubble * ms:>6.3f}  {d.idle * ms:>4.3f}  {d.comm * ms:>14.3f}  {_bytes(d.memory)}"
                         + ("" if d.fits else "  over memory"))
        alike: dict[str, list[int]] = {}  # one line per distinct breakdown, with the ranks that have it
        for d in self.devices:
            top = list(d.kernels.items())
            shown = ", ".join(f"{k} {v * ms:.3f}" for k, v in top[:6])
            rest = sum(v for _, v in top[6:])
            alike.setdefault(shown + (f", other {rest * ms:.3f}" if rest else ""), []).append(d.rank)
        for shown, ranks in list(alike.items())[:kernel_lines]:
            if len(ranks) == 1:
                who = f"rank {ranks[0]}"
            elif ranks == list(range(ranks[0], ranks[-1] + 1)):
                who = f"ranks {ranks[0]}..{ranks[-1]}"
            else:
                who = "ranks " + ",".join(map(str, ranks[:4])) + (",..." if len(ranks) > 4 else "")
            lines.append(f"  compute by kernel (ms), {who}: {shown}")
        summary = ", ".join(f"{k} {v * ms:.3f}" for k, v in sorted(self.path_summary().items(), key=lambda kv: -kv[1]))
        lines.append(f"critical path of the last step (ms): {summary}")
        longest = sorted(self.critical_path, key=lambda e: -e.duration)[:path_entries]
        for e in sorted(longest, key=lambda e: e.start):
            lines.append(f"  rank {e.device:>4}  {e.what:<14}  {e.duration * ms:9.3f}  @{e.name}")
        return "\n".join(lines)

    def trace(self) -> dict[str, Any]:
        """The replay as Chrome trace events (one track per device and stream), like `sbp-run --trace`."""
        events = []
        for e in self.events:
            tid = 0 if e.what in ("compute", "copy") else 1
            events.append({"name": e.name, "ph": "X", "pid": e.device, "tid": tid, "ts": e.start * 1e6,
                           "dur": (e.end - e.start) * 1e6, "args": {"step": e.step, "what": e.what}})
        return {"traceEvents": events, "displayTimeUnit": "ms"}


def _bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n}"


def staged_bytes(actor: plan.CommOp, rank: int, meshes: Mapping[str, Mesh], cache: dict) -> tuple[int, int]:
    """Bytes `rank` copies into send buffers before `actor`'s call and out of
    receive buffers after it (pieces.staged_elements). Remembered in `cache`
    (one replay's): a plan's layers repeat the same few communications, and
    a mesh of hundreds of ranks makes each answer cost as many pieces."""
    src, dst = actor.source, actor.dest
    group = tuple(actor.group.get_values())
    key = ("staged", actor.kind.data, src, dst, group, rank)
    found = cache.get(key)
    if found is None:
        packed, unpacked = staged_elements(actor.kind.data, regions_of(src, meshes[src.placement_name]),
                                           regions_of(dst, meshes[dst.placement_name]), group, rank)
        itemsize = numpy_dtype(src.element_type).itemsize
        found = cache[key] = (packed * itemsize, unpacked * itemsize)
    return found


class _Device:
    def __init__(self, device: plan.DeviceOp, cluster: Cluster, steps: int, cache: dict,
                 meshes: Mapping[str, Mesh]):
        self.rank = device.rank.value.data
        self.name = device.sym_name.data
        registers = {r.sym_name.data: r for r in device.registers()}
        self.memory = (device.arena.value.data if device.arena else 0) + (
            device.persistent.value.data if device.persistent else 0)
        if device.arena is None:
            raise SimulationError(f"'plan.device' @{self.name}: not allocated; run plan-allocate-memory")
        spans = {}
        slots = {}
        for name, reg in registers.items():
            if reg.offset is None:
                raise SimulationError(f"'plan.device' @{self.name}: register @{name} has no offset")
            spans[name] = (1 if reg.is_persistent is not None else 0, reg.offset.value.data, reg.bytes.value.data)
            slots[name] = reg.slots.value.data

        def ranges(names: Sequence[str], step: int, writes: int = 0) -> list[tuple[int, int, int, bool]]:
            """The bytes of `names` at `step`; the last `writes` of them are written."""
            out = []
            for i, n in enumerate(names):
                buf, offset, nbytes = spans[n]
                lo = offset + (step % slots[n]) * nbytes
                out.append((buf, lo, lo + nbytes, i >= len(names) - writes))
            return out

        overhead = cluster.device.actor_overhead
        self.actors: list[tuple[str, str, float, list[str], int, CommSpec | None, int]] = []
        """(name, what, seconds, registers read then written, how many are written, spec, index);
        for a matmul, `what` is its column blocks (plan.matmul_blocks) as 'gemm:N'."""
        self.labels: dict[str, str] = {}
        """Each actor's kernel (compute), or its kind (a copy's)."""
        for index, actor in enumerate(device.actors()):
            names = [r.string_value() for r in (*actor.ins.data, *actor.outs.data)]
            written = len(actor.outs.data)
            if isinstance(actor, plan.ComputeOp):
                # a reshape written over its input: the runtime skips it
                seconds = 0.0 if plan.does_nothing(actor) else compute_time(actor, registers, cluster, cache) + overhead
                what = "compute"
                if actor.kernel.data in cluster.GEMM_KERNELS:
                    out = registers[actor.outs.data[0].string_value()]
                    columns = out.type.get_shape()[-1] if out.type.get_shape() else 1
                    what = f"gemm:{plan.matmul_blocks(actor_work(actor, registers).flops, columns)}"
                self.actors.append((actor.sym_name.data, what, seconds, names, written, None, index))
                self.labels[actor.sym_name.data] = actor.kernel.data
                continue
            kind = actor.kind.data
            nbytes = actor.bytes.value.data if actor.bytes is not None else 0
            if kind in COLLECTIVES and not COLLECTIVES[kind].communicates:
                out = registers[actor.outs.data[0].string_value()]
                seconds = cluster.copy_time(out.bytes.value.data) + overhead
                self.actors.append((actor.sym_name.data, "copy", seconds, names, written, None, index))
                self.labels[actor.sym_name.data] = kind
                continue
            group = tuple(actor.group.get_values())
            # The runtime packs what MPI needs contiguous before the call (on
            # the thread) and unpacks it when the collective retires (where a
            # rank waits for it); a 2 MB all_gather along columns spent as
            # long unpacking as in MPI.
            packed, unpacked = staged_bytes(actor, self.rank, meshes, cache)
            piece = registers[actor.outs.data[0].string_value()].bytes.value.data if actor.outs.data else 0
            seconds = (cluster.collective_time(kind, group, nbytes, piece)
                       + (cluster.copy_time(unpacked) if unpacked else 0.0))
            spec = CommSpec(actor.comm_id.value.data, kind, group, seconds)
            issue = overhead + (cluster.copy_time(packed) if packed else 0.0)
            self.actors.append((actor.sym_name.data, kind, issue, names, written, spec, index))
        self.feeds = [n for n, r in registers.items() if r.feed is not None]
        self.updates = plan.update_pairs(device)
        self.ranges = ranges
        self.tasks = self._tasks(steps, cluster, registers)
        self.pc = 0
        self.t = 0.0
        self.last: Event | None = None
        self.pending = InFlight(self.memory)
        self.comm_queue: dict[str, list[IssuedCollective]] = {}
        """Per lane (lane_of), issued collectives whose start is not known yet, in issue order."""
        self.stream_free: dict[str, float] = {}
        self.stream_last: dict[str, Event | None] = {}
        self.step_end: list[float] = []
        self.run_end = 0.0
        self.busy = [0.0] * steps
        self.spent: list[dict[str, float]] = [{} for _ in range(steps)]
        """Per step, the thread's seconds by what it ran (Task.kernel)."""
        self.waited_comm = [0.0] * steps
        self.waited_transfer = [0.0] * steps
        self.in_flight = [0.0] * steps
        self.issued: dict[tuple[int, int], IssuedCollective] = {}
        self.outside_starts: list[float] = []
        self.thread_events: dict[int, Event] = {}
        """The event of each kernel or copy task, by its index in `tasks`."""
        self.outside: list[Event] = []
        """The thread's stretches without an MPI call, in time order: kernels,
        copies, and each column block of a long matmul."""

    def next_mpi_call(self, t: float) -> tuple[float, Event | None]:
        """When the thread is next inside MPI at or after `t` (it is whenever
        it is not inside one of `outside`), and the event it ends."""
        i = bisect.bisect_right(self.outside_starts, t) - 1
        if i >= 0 and self.outside[i].end > t:
            return self.outside[i].end, self.outside[i]
        return t, None

    def _tasks(self, steps: int, cluster: Cluster, registers) -> list[tuple[int, Task]]:
        tasks = []
        for step in range(steps):
            for name in self.feeds:
                nbytes = registers[name].bytes.value.data
                tasks.append((step, Task(f"{name}.feed", "copy", cluster.copy_time(nbytes),
                                         self.ranges([name], step, 1), kernel="copy")))
            for name, what, seconds, names, written, spec, index in self.actors:
                ranges = self.ranges(names, step, written)
                if spec is not None:
                    ranges.append((2 + index, 0, 1, True))  # its own pack buffers: waits for its previous issue
                label = self.labels.get(name, "issue")
                if what.startswith("gemm:"):
                    tasks.append((step, Task(name, "compute", seconds, ranges, blocks=int(what[5:]), kernel=label)))
                    continue
                tasks.append((step, Task(name, what, seconds, ranges, spec, kernel=label)))
            for new, param in self.updates:
                nbytes = registers[param].bytes.value.data
                # as the runtime: any access waits
                tasks.append((step, Task(f"{param}.write_back", "copy", cluster.copy_time(nbytes),
                                         self.ranges([new], step, 1), kernel="copy")))
            tasks.append((step, Task("", "end", 0.0, [])))
        return tasks


def lane_of(spec: CommSpec, cluster: Cluster) -> str:
    """The lane a device runs `spec` in; each lane carries one at a time.

    Point-to-point transfers between pipeline stages have their own lane:
    a transfer waiting for its sender does not hold up the device's
    collectives (the runtime's MPI requests, and NCCL's separate pipeline
    and data-parallel communicators, progress independently). Collectives
    share one lane, in issue order, unless the device runs each group's
    on a stream of its own (`DeviceModel.stream_per_group`, NCCL): then a
    tensor-parallel all-reduce does not queue behind a data-parallel
    gradient reduction issued before it."""
    if spec.kind == "transfer":
        return "transfer"
    if cluster.device.stream_per_group:
        return "collective " + ",".join(map(str, spec.group))
    return "collective"


def _overlaps(a: list[tuple[int, int, int, bool]], b: list[tuple[int, int, int, bool]]) -> bool:
    """Whether two sets of byte ranges conflict: they share bytes and one
    writes them (reading what a send reads needs no wait, as in the runtime)."""
    return any(b1 == b2 and lo1 < hi2 and lo2 < hi1 and (w1 or w2) for b1, lo1, hi1, w1 in a for b2, lo2, hi2, w2 in b)


class InFlight:
    """A device's issued collectives not yet waited for, in issue order,
    indexed by the pages of memory they touch: an actor finds the ones its
    registers overlap without scanning all of them (a data-parallel backward
    pass keeps hundreds in flight, and scanning them per actor made the
    replay quadratic)."""

    def __init__(self, memory: int):
        self.page = max(1 << 16, memory // 4096)
        self.items: dict[int, IssuedCollective] = {}
        self.index: dict[tuple[int, int], set[int]] = {}
        self.next = 0

    def _pages(self, ranges: list[tuple[int, int, int, bool]]):
        page = self.page
        for buf, lo, hi, _ in ranges:
            for k in range(lo // page, max(hi, lo + 1) // page + 1):
                yield buf, k

    def add(self, c: IssuedCollective) -> None:
        seq = self.next
        self.next += 1
        self.items[seq] = c
        for key in self._pages(c.ranges):
            self.index.setdefault(key, set()).add(seq)

    def remove(self, seq: int) -> None:
        c = self.items.pop(seq)
        for key in self._pages(c.ranges):
            self.index[key].discard(seq)

    def touching(self, ranges: list[tuple[int, int, int, bool]]) -> list[tuple[int, IssuedCollective]]:
        """The in-flight collectives whose registers overlap `ranges`, in issue order."""
        seqs: set[int] = set()
        for key in self._pages(ranges):
            found = self.index.get(key)
            if found:
                seqs |= found
        return [(q, self.items[q]) for q in sorted(seqs) if _overlaps(ranges, self.items[q].ranges)]

    def __bool__(self) -> bool:
        return bool(self.items)

    def in_order(self) -> list[tuple[int, IssuedCollective]]:
        return list(self.items.items())


def _head(queue: list[IssuedCollective]) -> IssuedCollective | None:
    """The collective a lane runs next: of those issued whose inputs are
    known (`IssuedCollective.after`: made by collectives already placed in
    time), the one whose inputs exist first, then the first issued. A
    collective enqueued before the collective making its input finished
    does not hold up those issued after it: the runtime hands a collective
    to its communicator once its input exists, as PyTorch's reducer
    launches a bucket's all-reduce when the bucket is ready. Without such
    dependencies this is issue order."""
    best, best_key = None, (math.inf, 0)
    for i, c in enumerate(queue):
        if any(dep.event is None for dep in c.after):
            continue
        key = (max([c.at, *(dep.event.end for dep in c.after if dep.event is not None)]), i)
        if key < best_key:
            best, best_key = c, key
    return best


class Replay:
    def __init__(self, program: plan.ProgramOp, cluster: Cluster, placements: Sequence[PlacementOp], steps: int,
                 exact: bool | None = None, scales: Mapping[tuple[int, int], float] | None = None):
        self.cluster = cluster
        self.steps = steps
        devices = program.devices()
        if not devices:
            raise SimulationError(f"'plan.program' @{program.sym_name.data}: no devices")
        reps_only = plan.REPRESENTATIVES in program.attributes
        ranks = sorted({r for p in placements for r in p.mesh().ranks} | {d.rank.value.data for d in devices})
        self.total = len(ranks)
        if ranks[-1] >= cluster.count:
            raise SimulationError(
                f"the plan uses rank {ranks[-1]} but cluster {cluster.name} has {cluster.count} devices "
                f"(give a larger cluster, or -n {ranks[-1] + 1})")
        self.rep = plan.equivalence_classes(placements, [d.rank.value.data for d in devices])
        if exact is None:
            exact = not reps_only and len(devices) <= EXACT_LIMIT
        if exact and not reps_only:
            self.rep = {r: r for r in self.rep}
        chosen = [d for d in devices if self.rep.get(d.rank.value.data) == d.rank.value.data]
        missing = sorted(set(self.rep.values()) - {d.rank.value.data for d in chosen})
        if missing:
            raise SimulationError(f"'plan.program' @{program.sym_name.data}: no plan.device for rank {missing[0]}, "
                                  "the representative of its class")
        cache: dict = {}
        meshes = {p.sym_name.data: p.mesh() for p in placements}
        self.devices = {d.rank.value.data: _Device(d, cluster, steps, cache, meshes) for d in chosen}
        for rank, dev in self.devices.items():  # thread tasks slowed or sped by shared CPUs
            for pc, (_, task) in enumerate(dev.tasks):
                factor = scales.get((rank, pc)) if scales else None
                if factor is not None:
                    task.duration *= factor
        self.overlap = cluster.device.comm_overlap
        self.enqueue = cluster.device.launch_ahead
        self.eager = False
        """Start an enqueued collective although a member's thread has not
        reached the time its input exists (see _start)."""
        self.events: list[Event] = []
        self.represents = {r: sum(1 for x in self.rep.values() if x == r) for r in self.devices}

    # -- devices --------------------------------------------------------------------

    def _wait(self, dev: _Device, ranges, step: int) -> bool:
        """Completes the device's in-flight collectives touching `ranges`;
        False if one of them has no known end yet."""
        for seq, c in dev.pending.touching(ranges):
            if c.event is None:
                return False
            if c.event.end > dev.t:
                waited = c.event.end - dev.t
                if c.spec.kind == "transfer":
                    dev.waited_transfer[step] += waited
                else:
                    dev.waited_comm[step] += waited
                dev.t = c.event.end
                dev.last = c.event
            dev.pending.remove(seq)
        return True

    def advance(self, dev: _Device) -> bool:
        moved = False
        while dev.pc < len(dev.tasks):
            step, task = dev.tasks[dev.pc]
            if task.what == "end":
                if step == self.steps - 1:  # the run ends: everything in flight completes
                    # (a step ends where the next would start, before this wait)
                    dev.step_end.append(dev.t)
                    for seq, c in dev.pending.in_order():
                        if c.event is None:
                            return moved
                        if c.event.end > dev.t:
                            dev.t, dev.last = c.event.end, c.event
                        dev.pending.remove(seq)
                    dev.run_end = dev.t
                else:
                    dev.step_end.append(dev.t)
                dev.pc += 1
                moved = True
                continue
            after: list[IssuedCollective] = []
            if dev.pending:
                if task.comm is not None and self.enqueue:
                    after = [c for _, c in dev.pending.touching(task.ranges)]
                elif not self._wait(dev, task.ranges, step):
                    return moved
            start = dev.t
            if task.comm is None:
                event = Event(dev.rank, step, task.name, task.what, start, start + task.duration, dev.last)
                dev.busy[step] += task.duration
                dev.spent[step][task.kernel] = dev.spent[step].get(task.kernel, 0.0) + task.duration
                dev.t = event.end
                dev.last = event
                self.events.append(event)
                dev.thread_events[dev.pc] = event
                if event.end > event.start:  # MPI is called only between its blocks
                    part = task.duration / task.blocks
                    for b in range(task.blocks):
                        block = event if task.blocks == 1 else Event(
                            dev.rank, step, task.name, task.what, start + b * part, start + (b + 1) * part, dev.last)
                        dev.outside_starts.append(block.start)
                        dev.outside.append(block)
            else:
                spec = task.comm
                cost = task.duration + (1.0 - self.overlap) * spec.duration
                issued = Event(dev.rank, step, task.name, "issue", start, start + cost, dev.last)
                dev.busy[step] += task.duration
                dev.spent[step][task.kernel] = dev.spent[step].get(task.kernel, 0.0) + task.duration
                dev.waited_comm[step] += cost - task.duration
                dev.t = issued.end
                dev.last = issued
                c = IssuedCollective(dev.rank, spec, step, task.ranges, issued, start + task.duration, after=after)
                dev.pending.add(c)
                dev.comm_queue.setdefault(lane_of(spec, self.cluster), []).append(c)
                dev.issued[(spec.comm_id, step)] = c
            dev.pc += 1
            moved = True
        return moved

    # -- collectives ------------------------------------------------------------------

    def resolve(self) -> bool:
        """Starts every collective whose members have all issued it and whose
        members' streams are free (it is the oldest unstarted collective of
        each); True if any started."""
        moved = True
        any_moved = False
        while moved:
            moved = False
            for dev, lane in ((d, lane) for d in self.devices.values() for lane in list(d.comm_queue)):
                queue = dev.comm_queue[lane]
                if lane == "transfer":
                    # Transfers match by id (their tag), so one may start
                    # before another issued earlier (1F1B stages post them in
                    # different orders); the lane still carries one at a time.
                    for c in list(queue):
                        if c.event is None and self._start(c, lane):
                            moved = any_moved = True
                    continue
                # Collectives start in issue order on every member, among
                # those whose inputs are complete (`_head`).
                while queue and (head := _head(queue)) is not None and self._start(head, lane):
                    moved = any_moved = True
        return any_moved

    def _start(self, c: IssuedCollective, lane: str) -> bool:
        """Starts `c` if every member has issued it and, for a collective,
        it is the oldest unstarted one of every member's lane."""
        key = (c.spec.comm_id, c.step)
        copies = []
        for r in sorted({self.rep[m] for m in c.spec.group}):
            peer = self.devices[r]
            other = peer.issued.get(key)
            waiting = peer.comm_queue.get(lane)
            if other is None or other.event is not None or not waiting:
                return False
            if lane != "transfer" and _head(waiting) is not other:
                return False
            if any(dep.event is None for dep in other.after):
                return False
            if other.after and not self.eager:
                # Its input exists at `ready`; a member whose thread is
                # still before then may yet issue a collective that is
                # ready sooner and should go first in this lane.
                ready = max(dep.event.end for dep in other.after if dep.event is not None)
                if ready > peer.t:
                    return False
            copies.append((peer, other))
        start, cause = 0.0, None
        for peer, other in copies:
            if other.at >= start:
                start, cause = other.at, other.issued
            if peer.stream_free.get(lane, 0.0) > start:
                start, cause = peer.stream_free[lane], peer.stream_last[lane]
            for dep in other.after:
                assert dep.event is not None
                if dep.event.end > start:
                    start, cause = dep.event.end, dep.event
        # Without asynchronous progress (comm_overlap 0) a collective moves
        # only inside MPI calls: it waits for every member to leave the
        # kernel (or the matmul's column block) it is in (the first time all
        # of them are: each member's kernel may end inside another's next one).
        if self.overlap < 1.0:
            ready, moved_by = start, None
            while True:
                later, by = ready, None
                for peer, _ in copies:
                    t, kernel = peer.next_mpi_call(ready)
                    if t > later:
                        later, by = t, kernel
                if by is None:
                    break
                ready, moved_by = later, by
            if moved_by is not None:
                start, cause = start + (1.0 - self.overlap) * (ready - start), moved_by
        for peer, other in copies:
            other.event = Event(peer.rank, other.step, other.issued.name, other.spec.kind, start,
                                start + other.spec.duration, cause)
            self.events.append(other.event)
            peer.comm_queue[lane].remove(other)
            peer.stream_free[lane] = other.event.end
            peer.stream_last[lane] = other.event
            peer.in_flight[other.step] += other.spec.duration
        return True

    def run(self) -> None:
        while not all(d.pc == len(d.tasks) for d in self.devices.values()):
            moved = False
            for dev in self.devices.values():
                moved |= self.advance(dev)
            moved |= self.resolve()
            if not moved and not self.eager:
                self.eager = True  # nothing moves: start what waits for a thread to catch up
                moved = self.resolve()
            self.eager = False
            if not moved:
                stuck = next(d for d in self.devices.values() if d.pc < len(d.tasks))
                step, task = stuck.tasks[stuck.pc]
                raise SimulationError(
                    f"the plan deadlocks: rank {stuck.rank}, step {step}, actor @{task.name} waits for a collective "
                    "that a member never issues")


def simulate_plan(module: ModuleOp, cluster: Cluster, steps: int = 4, program: str | None = None,
                  exact: bool | None = None) -> Prediction:
    """Predicts the step time of the (allocated) plan in `module` on `cluster`."""
    programs = plan.programs(module)
    if program is not None:
        programs = [p for p in programs if p.sym_name.data == program]
    if len(programs) != 1:
        raise SimulationError("the module holds no plan.program; compile it first" if not programs
                              else "the module holds several plan.programs; name one")
    prog = programs[0]
    placements = [op for op in module.ops if isinstance(op, PlacementOp)]
    replay = Replay(prog, cluster, placements, max(1, steps), exact)
    replay.run()
    if cluster.ranks_per_cpu() > 1:
        if all(r == d for r, d in replay.rep.items()):
            replay = _shared_processors(prog, cluster, placements, max(1, steps), exact, replay)
        elif (crowding := cluster.crowding(replay.total)) != 1.0:
            # One device per class of ranks that do the same work: they
            # compute at once, so each computes at the share of its CPU
            # that the others on it leave (Cluster.crowding).
            scales = {(rank, pc): crowding for rank, dev in replay.devices.items() for pc in range(len(dev.tasks))
                      if dev.tasks[pc][1].comm is None}
            replay = Replay(prog, cluster, placements, max(1, steps), exact, scales)
            replay.run()
    return _report(prog, cluster, replay, placements)


SHARING_ROUNDS = 4
"""Replays that settle how fast each rank computes where ranks share CPUs."""


def _shared_processors(prog: plan.ProgramOp, cluster: Cluster, placements: Sequence[PlacementOp], steps: int,
                       exact: bool | None, replay: Replay) -> Replay:
    """Where ranks outnumber the CPUs they are bound to (cluster.cpu_of), a
    rank computes as fast as the CPU's other ranks let it: the calibrated
    rates were timed with every rank of a CPU computing, and a rank that
    waits for MPI gives its CPU away (executor.give_way), so a pipeline
    stage computing while the other stage on its CPU waits runs up to that
    many times faster (GPT 2 layers, pipelined on 4 ranks bound to 2 CPUs:
    199 steps/s, priced at 122 as if both always computed). Each thread
    task takes its calibrated time times (1 + the other ranks of its CPU
    computing meanwhile, on average) / ranks per CPU, read off the last
    replay; a few replays, each step halfway to the next estimate, settle it.
    Rates timed with fewer ranks on a CPU (`DeviceModel.timed_ranks_per_cpu`:
    the cpu preset, one rank per core) slow a task by the same measure: a
    rank whose CPU mate computes beside it runs at half the rate timed."""
    share = cluster.device.timed_ranks_per_cpu or cluster.ranks_per_cpu()
    mates: dict[int, list[int]] = {}
    for rank in replay.devices:
        cpu = cluster.cpu_of(rank)
        mates[rank] = [r for r in replay.devices if r != rank and cpu is not None and cluster.cpu_of(r) == cpu]
    if not any(mates.values()):
        return replay
    scales: dict[tuple[int, int], float] = {}
    for _ in range(SHARING_ROUNDS):
        busy = {rank: sorted((e.start, e.end) for e in dev.thread_events.values())
                for rank, dev in replay.devices.items()}
        starts = {rank: [s for s, _ in spans] for rank, spans in busy.items()}
        for rank, dev in replay.devices.items():
            for pc, event in dev.thread_events.items():
                length = event.end - event.start
                if length <= 0:
                    continue
                others = sum(_overlap(busy[m], starts[m], event.start, event.end) for m in mates[rank]) / length
                estimate = (1.0 + others) / share
                key = (rank, pc)
                scales[key] = 0.5 * (scales.get(key, 1.0) + estimate)
        replay = Replay(prog, cluster, placements, steps, exact, scales)
        replay.run()
    return replay


def _by_kernel(dev: _Device, counted: range) -> dict[str, float]:
    """Seconds per step the device's thread ran each kernel (and copies, and
    collectives' issues), as replayed: slowed where ranks share a CPU, so
    they add up to `DeviceReport.compute`."""
    total: dict[str, float] = {}
    for step in counted:
        for kernel, seconds in dev.spent[step].items():
            if seconds > 0:
                total[kernel] = total.get(kernel, 0.0) + seconds / len(counted)
    return dict(sorted(total.items(), key=lambda kv: -kv[1]))


def _overlap(spans: list[tuple[float, float]], starts: list[float], lo: float, hi: float) -> float:
    """Seconds of [lo, hi) that the sorted, disjoint `spans` cover."""
    total = 0.0
    i = max(0, bisect.bisect_right(starts, lo) - 1)
    while i < len(spans) and spans[i][0] < hi:
        s, e = spans[i]
        total += max(0.0, min(e, hi) - max(s, lo))
        i += 1
    return total


def _report(prog: plan.ProgramOp, cluster: Cluster, replay: Replay, placements: Sequence[PlacementOp]) -> Prediction:
    steps = replay.steps
    ends = {r: d.step_end for r, d in replay.devices.items()}
    if steps > 1:
        step_time = max((e[-1] - e[0]) / (steps - 1) for e in ends.values())
        counted = range(1, steps)
    else:  # one step: it ends when its last collective completes
        step_time = max(d.run_end for d in replay.devices.values())
        counted = range(steps)
    n = len(counted)
    on: dict[int, list[str]] = {}
    for p in placements:
        for r in p.mesh().ranks:
            on.setdefault(r, []).append(p.sym_name.data)
    reports = []
    for r, d in sorted(replay.devices.items()):
        compute = sum(d.busy[s] for s in counted) / n
        exposed = sum(d.waited_comm[s] for s in counted) / n
        bubble = sum(d.waited_transfer[s] for s in counted) / n
        reports.append(DeviceReport(
            rank=r, represents=replay.represents[r], placements=tuple(on.get(r, ())), compute=compute,
            exposed_comm=exposed, bubble=bubble, idle=max(0.0, step_time - compute - exposed - bubble),
            comm=sum(d.in_flight[s] for s in counted) / n, memory=d.memory, fits=d.memory <= cluster.device.memory,
            kernels=_by_kernel(d, counted)))
    # the critical path of the last step: back from the event that ended last
    last = max((d.last for d in replay.devices.values() if d.last is not None), key=lambda e: e.end, default=None)
    path = []
    e = last
    while e is not None and e.step >= steps - 1:
        if e.end > e.start:
            path.append(PathEntry(e.device, e.name, e.what, e.start, e.end - e.start))
        e = e.cause
    path.reverse()
    return Prediction(program=prog.sym_name.data, cluster=cluster.name, step_time=step_time, devices=reports,
                      critical_path=path, simulated=len(replay.devices), total_devices=replay.total, steps=steps,
                      events=replay.events)
