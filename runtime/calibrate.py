"""The timed runs behind `sbp-calibrate`: this machine measured on N MPI
ranks, with the runtime's own kernels and MPI calls. Collectives run on all
ranks at once, as a plan runs them. Kernels run on one rank of each core at
once (sharing caches and memory bandwidth as a plan's ranks do); where ranks
outnumber cores, the rest sleep meanwhile, and the simulator prices ranks
that share a core (perf/step_time.py).

    mpiexec -n N python -m sbpc.runtime.calibrate RAW.json [--quick]

Rank 0 writes the raw timings (seconds, the best of a few repeats, the
slowest rank's); `sbpc.perf.fit.fit_cluster` turns them into a cluster, of
two levels where the ranks run on several hosts (hosts and the network).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
from mpi4py import MPI
from xdsl.dialects.builtin import IntegerAttr, TensorType, f32, i64

from sbpc.dialects import lg, parse_module, plan
from sbpc.dialects.sbp import Sbp
from sbpc.perf.fit import sync_excess
from sbpc.semantics.local_eval import LocalContext

from . import host_kernels, numpy_kernels
from .launch import usable_cpus
from .machine import blas_kernels_named, cpu_model
from .rank_auth import authenticate_messages

GEMM_SHAPES = [(64, 64, 64), (128, 128, 128), (256, 256, 256), (512, 512, 512), (128, 1024, 1024),
               (1024, 256, 1024), (256, 1024, 4096), (1024, 1024, 1024)]
VECTOR_KERNELS = [("lg.gelu", {}), ("lg.exp", {}), ("lg.tanh", {}), ("lg.softmax", {"axis": 1})]


def _repeat(fn: Callable[..., object], count: int, *args: object) -> Callable[[], None]:
    """A run of `count` calls fn(*args)."""
    def run() -> None:
        for _ in range(count):
            fn(*args)

    return run


def _runs(world: MPI.Comm, fn: Callable[[], object], repeats: int) -> list[float]:
    """Every rank runs `fn` together, `repeats` times: each from the first
    rank's start to the last rank's end (the monotonic clock is the
    machine's, so ranks that share a core and start late are charged for it)."""
    out = []
    for _ in range(repeats):
        world.Barrier()
        start = time.perf_counter()
        fn()
        end = time.perf_counter()
        first, last = world.allreduce(start, op=MPI.MIN), world.allreduce(end, op=MPI.MAX)
        out.append(last - first)
    return out


def _best(world: MPI.Comm, fn: Callable[[], object], repeats: int) -> float:
    """The best of _runs: a kernel's rate without the noise."""
    return min(_runs(world, fn, repeats))


def _typical(world: MPI.Comm, fn: Callable[[], object], repeats: int) -> float:
    """The median of _runs: what a collective usually costs. Its best run is
    one where every member happened to be on a core at once, which ranks
    sharing cores rarely are in a plan."""
    runs = sorted(_runs(world, fn, repeats))
    return runs[len(runs) // 2]


def _loop_time(fn: Callable[[], object], count: int) -> float:
    start = time.perf_counter()
    for _ in range(count):
        fn()
    return (time.perf_counter() - start) / count


def measure_compute(world: MPI.Comm, quick: bool) -> dict:
    repeats = 2 if quick else 5
    rng = np.random.default_rng(world.rank)
    gemm = []
    for m, k, n in GEMM_SHAPES[: 5 if quick else None]:
        a = rng.standard_normal((m, k), np.float32)
        b = rng.standard_normal((k, n), np.float32)
        c = np.empty((m, n), np.float32)
        inner = max(1, int(2e8 // (2 * m * k * n)))
        t = _best(world, _repeat(lambda a, b, c: np.matmul(a, b, out=c), inner, a, b, c), repeats)
        gemm.append([m, k, n, t / inner])
    # Every power of two, up to four times past the largest cache: the
    # bandwidth from memory is fitted to the sizes beyond this rank's share
    # of it, so it needs several of them (one point made it swing 2x).
    sizes = [2**e for e in range(10, 22 if quick else 25)]
    elementwise, reduction = [], []
    for count in sizes:
        x = rng.standard_normal(count, np.float32)
        y = rng.standard_normal(count, np.float32)
        z = np.empty(count, np.float32)
        inner = max(1, 2**20 // count)
        t = _best(world, _repeat(lambda x, y, z: np.add(x, y, out=z), inner, x, y, z), repeats)
        elementwise.append([3 * 4 * count, t / inner])
        rows = x.reshape(-1, 1024) if count >= 1024 else x.reshape(1, -1)
        out = np.empty(rows.shape[0], np.float32)
        t = _best(world, _repeat(lambda r, o: np.sum(r, axis=1, out=o), inner, rows, out), repeats)
        reduction.append([4 * count + 4 * rows.shape[0], t / inner])
    vector = []
    shape = (256, 1024)
    x = rng.standard_normal(shape, np.float32)
    out = np.empty(shape, np.float32)
    t32 = TensorType(f32, list(shape))
    whole = tuple(slice(0, d) for d in shape)
    local = LocalContext((shape,), shape, (whole,), whole, (Sbp.B,))
    for name, props in VECTOR_KERNELS:
        cls = lg.op_class(name)
        assert issubclass(cls, lg.LgOp)  # VECTOR_KERNELS names compute ops
        properties = {k: IntegerAttr(v, i64) for k, v in props.items()}
        op = cls.create(properties=properties, result_types=[t32])
        # what the executor runs: the generated C where it would (host_kernels)
        fire = host_kernels.bind_kernel(op, local, [x], out) or numpy_kernels.bind(op, local, [x], out)
        t = _best(world, _repeat(fire, 1, [x], out), repeats)
        flops = cls.flops([shape], shape, **op.params())
        vector.append([float(flops), 8.0 * x.size, t])
    one = np.ones(1, np.float32)
    tiny = min(_loop_time(lambda: np.add(one, one, out=one), 2000) for _ in range(3))
    return {"gemm": gemm, "elementwise": elementwise, "reduction": reduction, "vector": vector,
            "tiny_kernel": tiny, "actor": measure_actor_overhead(world, tiny, quick)}


def measure_actor_overhead(world: MPI.Comm, tiny: float, quick: bool) -> float:
    """Seconds the executor adds per actor: a plan of a chain of tiny adds,
    run on this rank alone, less the kernels."""
    from xdsl.context import Context

    from sbpc.lowering.compile import CompilePass

    from .executor import Executor

    count = 200
    lines = ["sbp.placement @one cpu ranks [0] mesh [1]", "lg.graph @chain on @one {",
             '  %v0 = lg.input "x" : tensor<1xf32>']
    lines += [f"  %v{i + 1} = lg.add %v{i}, %v0 : (tensor<1xf32>, tensor<1xf32>) -> tensor<1xf32>"
              for i in range(count)]
    lines += [f'  lg.output ["y"] %v{count} : tensor<1xf32>', "}"]
    module = parse_module("\n".join(lines), "chain")
    CompilePass(fuse=False).apply(Context(), module)
    executor = Executor(module, plan.programs(module)[0], MPI.COMM_SELF, write_back=False)
    executor.initialize()
    executor.feed({"x": np.ones(1, np.float32)})
    steps = 5 if quick else 20
    executor.run(2)
    per_actor = _best(world, lambda: executor.run(steps), 3) / (steps * count)
    return max(0.0, per_actor - tiny)


def measure_probe(world: MPI.Comm, path: str, feeds_path: str, quick: bool) -> list:
    """Every compute actor of a training plan on one device (run on each
    rank at once), traced: [kernel, flops, bytes, dtype, calls, mean seconds].
    What kernels cost beyond their arithmetic and bytes is read off these."""
    from sbpc.perf.step_time import actor_work

    from .executor import Executor
    from .program import check_feeds

    with open(path) as f:
        module = parse_module(f.read(), path)
    program = plan.programs(module)[0]
    executor = Executor(module, program, MPI.COMM_SELF, trace=True, write_back=False)
    executor.initialize()
    with np.load(feeds_path) as data:
        executor.feed(check_feeds(program, dict(data)))
    executor.run(2)
    executor.events.clear()
    world.Barrier()
    executor.run(5 if quick else 20)
    # The mean over the timed steps, not the best: a step takes the sum of
    # its actors' usual times (the best of each was 4-8% below that).
    runs: dict[str, list[float]] = {}
    for e in executor.events:
        if e["tid"] == 0:
            runs.setdefault(e["name"], []).append(e["dur"] / 1e6)
    mean = {name: sum(times) / len(times) for name, times in runs.items()}
    device = program.devices()[0]
    registers = {r.sym_name.data: r for r in device.registers()}
    out = []
    for actor in device.actors():
        if isinstance(actor, plan.ComputeOp) and actor.sym_name.data in mean:
            w = actor_work(actor, registers)
            out.append([w.kernel, w.flops, w.nbytes, w.dtype, w.calls, mean[actor.sym_name.data]])
    return out


def _collective_issues(world: MPI.Comm, count: int, stride: int = 1
                       ) -> dict[str, tuple[float, Callable[[], list[MPI.Request]]]]:
    """Each kind on `count` float32 elements per rank, issued as the runtime
    issues it (non-blocking): the per-device volume the IR records for it,
    and a call that issues it and returns its requests. A transfer (a stage
    boundary) goes from each rank of an even group of `stride` ranks to the
    same rank of the next group: the next rank, or with `stride` ranks per
    host, the next host."""
    p = world.size
    nbytes = 4.0 * count
    send = np.ones(count, np.float32)
    recv = np.empty(count, np.float32)
    gathered = np.empty(count * p, np.float32)
    scattered = np.empty(count // p, np.float32)
    group = world.rank // stride
    peer = (group ^ 1) * stride + world.rank % stride

    def transfer() -> list[MPI.Request]:
        if peer >= p:
            return []
        if group % 2 == 0:
            return [world.Isend(send, peer, tag=7)]
        return [world.Irecv(recv, peer, tag=7)]

    return {
        "all_reduce": (2 * (p - 1) / p * nbytes, lambda: [world.Iallreduce(send, recv, op=MPI.SUM)]),
        "all_gather": ((p - 1) * nbytes, lambda: [world.Iallgather(send, gathered)]),
        "reduce_scatter": ((p - 1) / p * nbytes,
                           lambda: [world.Ireduce_scatter_block(send, scattered, op=MPI.SUM)]),
        "all_to_all": ((p - 1) / p * nbytes, lambda: [world.Ialltoall(send, recv)]),
        "transfer": (nbytes, transfer),
    }


class _Streaming:
    """A kernel that makes no MPI call, as most of a plan's actors: an add
    over operands larger than the cache's share of a rank."""

    def __init__(self, count: int = 2**18):
        self.x = np.ones(count, np.float32)
        self.y = np.ones(count, np.float32)
        self.z = np.empty(count, np.float32)

    def __call__(self) -> None:
        np.add(self.x, self.y, out=self.z)


def measure_collectives(world: MPI.Comm, quick: bool, stride: int = 1) -> dict:
    """Per kind and size, [volume, seconds]: what the collective adds to a
    step as the executor meets it. It is issued, the thread goes on with
    kernels that make no MPI call and tests it after each (as the executor
    does after every actor), then waits for it; the seconds are the median,
    over alternating runs, of that less the same kernels alone, and at least
    the collective's lock-step time (issued by all and waited for at once).
    Where MPI moves bytes only inside MPI calls, a message past the eager
    limit needs both sides in MPI at once for each handshake, so in a plan
    it costs more than in lock-step (up to twice, on this machine)."""
    p = world.size
    repeats = 3 if quick else 9
    sizes = [2**e for e in range(8, 20 if quick else 23, 2)]  # float32 elements per rank
    work = _Streaming()
    between = 4

    def alone() -> None:
        for _ in range(between):
            work()

    out: dict[str, list] = {k: [] for k in ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "transfer")}
    for count in sizes:
        count -= count % p
        for kind, (volume, issue) in _collective_issues(world, count, stride).items():
            def in_plan(issue: Callable[[], list[MPI.Request]] = issue) -> None:
                requests = issue()
                for _ in range(between):
                    work()
                    MPI.Request.Testall(requests)
                MPI.Request.Waitall(requests)

            def together(issue: Callable[[], list[MPI.Request]] = issue) -> None:
                MPI.Request.Waitall(issue())

            lockstep = _typical(world, together, repeats)
            extra = []
            for _ in range(repeats):
                extra.append(_runs(world, in_plan, 1)[0] - _runs(world, alone, 1)[0])
            out[kind].append([volume, max(lockstep, float(np.median(extra)))])
    return out


def measure_sync(world: MPI.Comm, quick: bool) -> dict:
    """What a collective adds to a step as a plan meets it, against the same
    collective issued in lock-step: members issue it at different moments
    (each rank computes a different while first), go on with kernels that
    make no MPI call, testing it between them as the executor does after
    every actor, and wait for it. A rendezvous-sized message moves only
    while both sides are inside MPI, and where ranks share cores the OS must
    run every member before it completes: per-collective costs no lock-step
    timing sees. Runs with and without the collective alternate, so both
    meet the same load; the medians are taken."""
    rng = np.random.default_rng(world.rank)
    a = rng.standard_normal((128, 128), np.float32)
    c = np.empty_like(a)
    count = 2**16  # 256 KiB: past MPICH's eager limit, like most gradients
    send = np.ones(count, np.float32)
    recv = np.empty(count, np.float32)

    def gemm() -> None:
        np.matmul(a, a, out=c)

    def alone() -> None:
        for _ in range(2 * world.rank + 8):
            gemm()

    def with_collective() -> None:
        for _ in range(2 * world.rank):  # arrivals about 0.1 ms apart per rank
            gemm()
        request = world.Iallreduce(send, recv, op=MPI.SUM)
        for _ in range(8):
            gemm()
            request.Test()
        request.Wait()

    # Cheap (a millisecond a run) but noisy where ranks share cores: the
    # median of five blocks' estimates.
    repeats = 9 if quick else 25
    blocks = []
    for _ in range(1 if quick else 5):
        times: dict[str, list[float]] = {"compute": [], "both": []}
        for _ in range(repeats):
            times["compute"] += _runs(world, alone, 1)
            times["both"] += _runs(world, with_collective, 1)
        lockstep = _typical(world, lambda: world.Iallreduce(send, recv, op=MPI.SUM).Wait(), repeats)
        blocks.append({"compute": float(np.median(times["compute"])), "both": float(np.median(times["both"])),
                       "lockstep": lockstep})
    return sorted(blocks, key=sync_excess)[len(blocks) // 2]


def measure_overlap(world: MPI.Comm, quick: bool) -> dict:
    """A GEMM (in the executor's column blocks, MPI progressing between them)
    and an all_reduce of about the same duration: alone, then together."""
    rng = np.random.default_rng(0)
    n = 512 if quick else 1024
    a = rng.standard_normal((n, n), np.float32)
    b = rng.standard_normal((n, n), np.float32)
    c = np.empty((n, n), np.float32)
    width = 64
    count = (2**21 if quick else 2**23) // world.size * world.size
    send = np.ones(count, np.float32)
    recv = np.empty(count, np.float32)

    def compute(request: MPI.Request | None = None) -> None:
        for j in range(0, n, width):
            np.matmul(a, b[:, j : j + width], out=c[:, j : j + width])
            if request is not None:
                request.Test()

    def both() -> None:
        request = world.Iallreduce(send, recv, op=MPI.SUM)
        compute(request)
        request.Wait()

    return {"compute": _best(world, compute, 3), "comm": _best(world, lambda: world.Iallreduce(send, recv).Wait(), 3),
            "both": _best(world, both, 3)}


def last_level_cache() -> float:
    """Bytes of the largest CPU cache (shared by the ranks), from sysfs; 0 if unknown."""
    sizes = []
    for index in sorted(Path("/sys/devices/system/cpu/cpu0/cache").glob("index*")):
        try:
            text = (index / "size").read_text().strip()
        except OSError:
            continue
        scale = {"K": 2**10, "M": 2**20, "G": 2**30}.get(text[-1:], 1)
        digits = text.rstrip("KMG")
        if digits.isdigit():
            sizes.append(int(digits) * scale)
    return float(max(sizes, default=0))


def one_rank_per_core(world: MPI.Comm, node: MPI.Comm, cores: int) -> MPI.Comm:
    """The ranks that time kernels: the first `cores` of each host, each on a
    core of its own (the launcher binds a host's rank i to core i mod cores,
    runtime/launch.py), world's rank 0 among them; COMM_NULL on the others,
    which sit_out meanwhile. Timed with two ranks on each core, a kernel took
    up to 3x its time alone, not 2x (4 ranks on 2 cores: 512^3 GEMMs at 47
    GFLOP/s against 147), where a plan's ranks mostly take turns on a core
    (each yields as it waits), as the simulator prices them: its 4-rank
    predictions were 14-34% too slow."""
    return world.Split(0 if node.rank < cores else MPI.UNDEFINED, world.rank)


def sit_out(world: MPI.Comm) -> None:
    """Waits for every rank to get here, asleep between polls (a rank that
    spun, as MPICH's barrier does, or only yielded would take its core from
    the timing rank beside it), under the runtime's watchdog."""
    from .executor import rendezvous

    rendezvous(world, "waiting for the ranks that time kernels", pause=lambda: time.sleep(1e-3))


def host_cores(node: MPI.Comm) -> int:
    """The cores this host's ranks (`node`) run on: each rank's own is one
    where the launcher bound them (runtime/launch.py), so their union."""
    return len(set().union(*node.allgather(usable_cpus())))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="sbpc.runtime.calibrate")
    parser.add_argument("output")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--probe", nargs=2, action="append", default=[], metavar=("PLAN", "FEEDS"),
                        help="a training plan on one device and its feeds (repeatable)")
    parser.add_argument("--sync-only", action="store_true",
                        help="measure only what a collective adds as a plan meets it (the sync figure)")
    parser.add_argument("--probes-only", action="store_true",
                        help="measure only the probe steps' kernels (sbp-calibrate --add-kernels-to)")
    options = parser.parse_args(argv)
    world = MPI.COMM_WORLD
    authenticate_messages(world)
    if options.sync_only:
        least = min(measure_sync(world, options.quick), measure_sync(world, options.quick), key=sync_excess)
        cores = host_cores(world.Split_type(MPI.COMM_TYPE_SHARED))
        if world.rank == 0:
            with open(options.output, "w") as f:
                json.dump({"ranks": world.size, "cores": cores, "sync": least}, f, indent=1)
        return 0
    raw: dict = {"ranks": world.size, "host": platform.node(), "cpu": cpu_model(), "blas": blas_kernels_named(),
                 "date": time.strftime("%Y-%m-%d"), "quick": options.quick}
    if options.probes_only:
        node = world.Split_type(MPI.COMM_TYPE_SHARED)
        raw["cores"] = host_cores(node)
        timing = one_rank_per_core(world, node, raw["cores"])
        if timing != MPI.COMM_NULL:
            raw["probe"] = [row for plan_path, feeds_path in options.probe
                            for row in measure_probe(timing, plan_path, feeds_path, options.quick)]
        sit_out(world)
        raw["timed_ranks_per_core"] = 1
        if world.rank == 0:
            with open(options.output, "w") as f:
                json.dump(raw, f, indent=1)
        return 0
    # On several hosts the collectives are measured twice: among the ranks
    # of each host (every host at once, as a plan's groups inside hosts run)
    # and across all ranks, which is what crosses the network; the fit makes
    # a level of each (perf/fit.py).
    node = world.Split_type(MPI.COMM_TYPE_SHARED)
    per_host = world.allgather(node.size)
    if node.size < world.size:
        if len(set(per_host)) != 1:
            raise SystemExit(f"sbpc.runtime.calibrate: the hosts run {sorted(set(per_host))} ranks: give each "
                             "host the same count")
        raw["ranks_per_host"] = node.size
        raw["host_collectives"] = measure_collectives(node, options.quick) if node.size > 1 else {}
    # The sync figure is tens of microseconds read off millisecond runs: a
    # disturbed second (other load; 4 ranks on 2 cores) tripled it, and a
    # plan with a hundred collectives a step inherits that whole. It is
    # measured at the start and at the end, and the less disturbed kept (a
    # disturbance only adds time), as the benchmarks keep their fastest run.
    sync = measure_sync(world, options.quick) if world.size > 1 else None
    cores = host_cores(node)
    timing = one_rank_per_core(world, node, cores)
    if timing != MPI.COMM_NULL:
        raw.update(measure_compute(timing, options.quick))
        raw["probe"] = [row for plan_path, feeds_path in options.probe
                        for row in measure_probe(timing, plan_path, feeds_path, options.quick)]
    sit_out(world)
    raw["timed_ranks_per_core"] = 1
    raw["collectives"] = measure_collectives(world, options.quick, raw.get("ranks_per_host", 1)) \
        if world.size > 1 else {}
    raw["overlap"] = measure_overlap(world, options.quick) if world.size > 1 else None
    if sync is not None:
        sync = min(sync, measure_sync(world, options.quick), key=sync_excess)
    raw["sync"] = sync
    try:
        raw["memory"] = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / world.size
    except (ValueError, OSError, AttributeError):
        raw["memory"] = 8 * 2**30
    raw["cache_bytes"] = last_level_cache() / min(node.size, cores)  # a timing rank's share
    raw["cores"] = cores
    if world.rank == 0:
        with open(options.output, "w") as f:
            json.dump(raw, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
