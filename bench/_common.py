"""Shared helpers for the benchmarks: one BLAS/OpenMP thread per process
(set before numpy is imported), optional peers, timing, tables.

Import this module first in a benchmark script (`import _common` works when
the script is run as `python bench/X.py`, since bench/ is then on sys.path).
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import statistics
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import NoReturn

# Every process of every system gets one thread of BLAS/OpenMP, so sbpc ranks,
# PyTorch processes and the numpy peer are compared on equal terms (sbpc's
# launcher sets the same defaults for its ranks: runtime/launch.py).
THREAD_VARS = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")
for _var in THREAD_VARS:
    os.environ.setdefault(_var, "1")

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
BENCH = ROOT / "bench"


def have(module: str) -> bool:
    """Whether an optional peer can be imported (without importing it)."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def missing_peers(peers: dict[str, str]) -> list[str]:
    """Prints one line per missing peer ({module: what it is for}); returns their names."""
    missing = [name for name in peers if not have(name)]
    for name in missing:
        print(f"peer missing: {name} ({peers[name]}); install the bench extra: pip install -e '.[bench]'")
    return missing


def blas_kernels() -> str:
    """One line on the BLAS kernels every process here runs: the GEMM
    speed of a step depends on them more than on anything else. numpy's
    OpenBLAS picks a kernel set for the CPU when it loads, unless
    OPENBLAS_CORETYPE names one; where it does, this also says which set
    OpenBLAS itself would pick (a child process without the variable), as
    the two can differ twofold in speed (README, Benchmarks). PyTorch's MKL
    is not affected."""
    import subprocess

    from sbpc.runtime.machine import openblas_core

    core = openblas_core()
    if core is None:
        return "BLAS: not an OpenBLAS that names its kernels"
    pinned = os.environ.get("OPENBLAS_CORETYPE")
    if pinned is None:
        return f"BLAS: OpenBLAS kernels {core} (OpenBLAS's choice for this CPU)"
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_CORETYPE"}
    done = subprocess.run([sys.executable, "-c", "from sbpc.runtime.machine import openblas_core; "
                           "print(openblas_core())"], env=env, capture_output=True, text=True)
    own = done.stdout.strip() or "unknown"
    return (f"BLAS: OpenBLAS kernels {core}, pinned by OPENBLAS_CORETYPE={pinned} "
            f"(OpenBLAS's own choice for this CPU: {own}; PyTorch uses its MKL either way)")


def load_example(name: str):
    """An examples/*.py file as a module (examples/ is not a package)."""
    path = EXAMPLES / f"{name}.py"
    if str(EXAMPLES) not in sys.path:
        sys.path.insert(0, str(EXAMPLES))  # the examples import examples/models.py
    spec = importlib.util.spec_from_file_location(f"sbpc_example_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def gpt_vocab() -> int:
    """The GPT's vocabulary: the characters of the examples' corpus."""
    return len(load_example("models").corpus()[1])


def gpt(variant: str, ranks: int, cfg: dict, **options):
    """examples/models.py's GPT (`variant`: dp, zero, ...) with a benchmark
    configuration: vocab, batch, seq, dim, heads, layers."""
    return load_example("models").gpt(variant, ranks, cfg["vocab"], batch=cfg["batch"], seq=cfg["seq"],
                                      dim=cfg["dim"], heads=cfg["heads"], layers=cfg["layers"], **options)


def best_of(fn: Callable[[], float], repeats: int) -> float:
    """Runs fn (which returns seconds) `repeats` times: the best value."""
    return min(fn() for _ in range(max(1, repeats)))


def timed(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def median(xs: Sequence[float]) -> float:
    return statistics.median(xs)


def table(header: Sequence[str], rows: Sequence[Sequence[object]], widths: Sequence[int] | None = None) -> None:
    """Prints a left-aligned first column and right-aligned others."""
    widths = widths or [max(len(str(h)), *(len(_fmt(r[i])) for r in rows)) if rows else len(str(h))
                        for i, h in enumerate(header)]
    print("  ".join(f"{h:<{w}}" if i == 0 else f"{h:>{w}}" for i, (h, w) in enumerate(zip(header, widths))))
    for row in rows:
        print(
            "  ".join(f"{_fmt(v):<{w}}" if i == 0 else f"{_fmt(v):>{w}}" for i, (v, w) in enumerate(zip(row, widths)))
        )


def _fmt(v) -> str:
    if isinstance(v, float):
        return f"{v:.3g}" if abs(v) < 1000 else f"{v:.0f}"
    return "-" if v is None else str(v)


def ratio(a: float | None, b: float | None) -> str:
    if a is None or b is None or b == 0:
        return "n/a"
    return f"{a / b:.2f}x"


def take_turns(first: tuple[float, float], mine: Callable[[], float], peer: Callable[[], float],
               rounds: int) -> list[tuple[float, float]]:
    """(sbpc, peer) seconds a step in `rounds` rounds, `first` the first: the
    two take turns (sbpc's ranks wait while the peer's run), so a slow spell
    of the machine falls on both rather than on one side of the ratio."""
    out = [first]
    for _ in range(rounds - 1):
        out.append((mine(), peer()))
    return out


def report_turns(rounds: list[tuple[float, float]], peer: str) -> tuple[float, float, float, float]:
    """Prints each round's times and ratio; returns sbpc's median time, the
    median of the rounds' ratios, and the lowest and highest ratio."""
    ratios = sorted(m / t for m, t in rounds)
    table(["round", "sbpc s/step", f"{peer} s/step", f"sbpc / {peer}"],
          [[str(i + 1), f"{m:.3f}", f"{t:.3f}", ratio(m, t)] for i, (m, t) in enumerate(rounds)])
    return statistics.median(m for m, _ in rounds), statistics.median(ratios), ratios[0], ratios[-1]


def stop_pools() -> None:
    """Stops the MPI rank pools sbpc.compile(...).run started (idle MPI ranks
    poll and would steal the cores from the next measurement)."""
    from sbpc.api import RankPool

    for pool in list(RankPool.pools.values()):
        pool.close()


def python() -> str:
    return sys.executable


# -- PyTorch peers of the Hugging Face benchmarks --------------------------------------


def torch_losses(model, make_opt, batches, loss_of) -> list[float]:
    """PyTorch on one process (one thread) over each whole batch: the loss
    of every step, which sbpc must give; `loss_of(model, batch)`."""
    import torch

    torch.set_num_threads(1)
    opt = make_opt(model)
    losses = []
    for batch in batches:
        opt.zero_grad(set_to_none=True)
        loss = loss_of(model, batch)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


RENDEZVOUS_VARIABLE = "SBPC_BENCH_RENDEZVOUS"
"""The file a PyTorch peer's ranks meet through (`run_on_ranks` makes a
fresh one per job; `torch_peer_group` reads it)."""
PEER_TIMEOUT_S = 300
"""How long a PyTorch peer's collective (its rendezvous included) waits
for the other ranks before it fails, taking the job down."""


def torch_peer_group() -> tuple[int, int]:
    """This rank's place in a PyTorch peer's job (gloo) under `run_on_ranks`:
    (rank, size), the process group started where size > 1. The ranks meet
    through a file, not a TCP port: a port picked free and handed over could
    be taken by another process before rank 0 bound it, and rank 0's store
    listened on every interface. gloo's own connections stay on loopback
    (GLOO_SOCKET_IFNAME), whatever the host name resolves to."""
    import datetime

    import torch.distributed as dist

    rank, size = int(os.environ.get("PMI_RANK", "0")), int(os.environ.get("PMI_SIZE", "1"))
    if size > 1:
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
        dist.init_process_group("gloo", init_method=f"file://{os.environ[RENDEZVOUS_VARIABLE]}", rank=rank,
                                world_size=size, timeout=datetime.timedelta(seconds=PEER_TIMEOUT_S))
    return rank, size


def as_rank_role(role: Callable[[], object]) -> None:
    """Runs a benchmark's rank program (under `run_on_ranks`). A rank that
    fails prints why and ends by a signal: mpiexec takes a rank's exit code
    1 as a normal end and leaves the others waiting for it (a peer's
    rendezvous, a collective), but cleans up the whole job after a rank a
    signal ended."""
    try:
        role()
    except BaseException:  # noqa: BLE001  (every failure must end the job)
        traceback.print_exc()
        sys.stdout.flush()
        sys.stderr.flush()
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)


def leave_torch_peer() -> NoReturn:
    """Ends a PyTorch peer's rank once it has printed its result, without
    tearing its process group down: ProcessGroupGloo's destructor joins its
    worker thread while holding the GIL, and that thread may still be
    releasing the last collective's tensors, which takes the GIL. One
    hf_gpt2.py --quick in nine on a busy 2-core machine hung so (gdb: the
    main thread in ~ProcessGroupGloo's join, pt_gloo_runloop in
    ~AsyncAllgatherWork waiting for the GIL). Every collective has finished
    on every rank by then, and what a rank sent is delivered as its sockets
    close."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def ddp_role(model, make_opt, batches, loss_of, share) -> None:
    """One PyTorch DDP process (gloo) under mpiexec (`run_on_ranks`): its
    share of each batch (`share(batch, rank, size)`), each step timed; rank
    0 prints `RESULT` with its seconds per step and every rank's peak
    resident memory in GiB (ru_maxrss)."""
    import resource

    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    rank, size = torch_peer_group()
    net = torch.nn.parallel.DistributedDataParallel(model)
    opt = make_opt(net)
    times = []
    for batch in batches:
        mine = share(batch, rank, size)
        start = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss_of(net, mine).backward()
        opt.step()
        times.append(time.perf_counter() - start)
    peak = torch.tensor([resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20])
    gathered = [torch.zeros(1) for _ in range(size)]
    dist.all_gather(gathered, peak)
    if rank == 0:
        print("RESULT " + json.dumps({"peaks": sorted(float(p[0]) for p in gathered), "step_s": times}), flush=True)
    leave_torch_peer()


def rank_peaks() -> list[float]:
    """Peak resident memory (GiB) of this process's descendants that run
    Python (the ranks; not mpiexec and its proxies)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    parent = int(f.read().rsplit(")", 1)[1].split()[1])
            except OSError:
                continue
            children.setdefault(parent, []).append(int(entry))
    todo, found = [os.getpid()], []
    while todo:
        for child in children.get(todo.pop(), []):
            todo.append(child)
            try:
                with open(f"/proc/{child}/cmdline", "rb") as f:
                    is_python = b"python" in f.read().split(b"\0")[0]
                with open(f"/proc/{child}/status") as f:
                    peak = next(int(line.split()[1]) for line in f if line.startswith("VmHWM:"))
            except (OSError, StopIteration):
                continue
            if is_python:
                found.append(peak / 2**20)
    return sorted(found)


def rows_of(batch, rank: int, size: int):
    """This rank's rows (axis 0) of a tensor or of each tensor of a tuple."""
    def cut(t):
        local = t.shape[0] // size
        return t[rank * local:(rank + 1) * local]

    return tuple(cut(t) for t in batch) if isinstance(batch, tuple) else cut(batch)


# -- a compiled plan timed inside the ranks ----------------------------------------------


def time_plan_in_ranks(plan_path: str, feeds_path: str, steps: int, repeats: int) -> None:
    """The rank program of a timed run (under mpiexec): loads the plan and its
    feeds, runs one step, then times Executor.run(steps) `repeats` times;
    rank 0 prints `RESULT {"step_s": ...}`, the slowest rank's seconds per
    step of the best repeat. Each run fetches what a training loop reads
    (the loss and other outputs), not the updated parameters (`new.*`),
    which stay on the ranks: copying them out of every run cost the MLP's
    in-rank figure 6-10% (96 MB of weights per run), which the API path does
    not pay."""
    import numpy as np
    from mpi4py import MPI

    import sbpc
    from sbpc.runtime.executor import Executor
    from sbpc.runtime.program import check_feeds, fetch_layouts, find_program

    world = MPI.COMM_WORLD
    with open(plan_path) as f:
        module = sbpc.parse_module(f.read(), plan_path)
    program = find_program(module)
    executor = Executor(module, program, world)
    executor.initialize()
    with np.load(feeds_path) as data:
        executor.feed(check_feeds(program, dict(data)))
    executor.run(1)
    read = [name for name in fetch_layouts(program) if not name.startswith("new.")]

    def once() -> float:
        world.Barrier()
        start = time.perf_counter()
        executor.run(steps, read)
        return world.allreduce((time.perf_counter() - start) / steps, op=MPI.MAX)

    best = min(once() for _ in range(repeats))
    if world.rank == 0:
        print("RESULT " + json.dumps({"step_s": best}), flush=True)


def measure_plan(module, ranks: int, steps: int, repeats: int, timeout: float = 600) -> float:
    """Seconds per step of a compiled plan on `ranks` mpiexec'd ranks, timed
    inside the ranks (the slowest rank, best repeat; time_plan_in_ranks)."""
    import subprocess
    import tempfile

    import numpy as np
    from xdsl.printer import Printer

    from sbpc.runtime.launch import rank_environment, script_command
    from sbpc.runtime.program import find_program
    from sbpc.tools.sbp_run import generated_feeds

    program = find_program(module)
    with tempfile.TemporaryDirectory(prefix="sbpc-bench-") as tmp:
        plan_path, feeds_path = os.path.join(tmp, "plan.mlir"), os.path.join(tmp, "feeds.npz")
        with open(plan_path, "w") as f:
            Printer(stream=f).print_op(module)
        np.savez(feeds_path, **generated_feeds(program, 0))
        cmd = script_command(ranks, str(BENCH / "_common.py"), plan_path, feeds_path, str(steps), str(repeats))
        done = subprocess.run(cmd, env=rank_environment(), capture_output=True, text=True, timeout=timeout)
    for line in done.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])["step_s"]
    raise RuntimeError(f"the run on {ranks} ranks failed (exit {done.returncode}):\n{done.stderr[-3000:]}")


# -- traces of real runs (sbp-run --trace) -------------------------------------------


def traced_run(module, ranks: int, steps: int, timeout: float = 300) -> list[dict]:
    """Runs a compiled module on `ranks` MPI ranks with `sbp-run --trace`
    (generated feeds, parameters from their initializers); returns the trace
    events (compute and comm slices, microseconds)."""
    import subprocess
    import tempfile

    from xdsl.printer import Printer

    with tempfile.TemporaryDirectory(prefix="sbpc-bench-") as tmp:
        plan_path, trace_path = Path(tmp) / "plan.mlir", Path(tmp) / "trace.json"
        with open(plan_path, "w") as f:
            Printer(stream=f).print_op(module)
            f.write("\n")
        cmd = [sys.executable, "-m", "sbpc.tools.sbp_run", str(plan_path), "-n", str(ranks), "--steps", str(steps),
               "--trace", str(trace_path), "-o", str(Path(tmp) / "out.npz"), "--timeout", str(timeout)]
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"sbp-run failed: {done.stderr[-2000:]}")
        with open(trace_path) as f:
            return [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X"]


def union_length(intervals: list[tuple[float, float]]) -> float:
    total, end = 0.0, float("-inf")
    for lo, hi in sorted(intervals):
        if hi <= end:
            continue
        total += hi - max(lo, end)
        end = hi
    return total


def overlap_length(a: list[tuple[float, float]], b: list[tuple[float, float]]) -> float:
    """Length of (union of a) intersected with (union of b)."""
    return union_length(a) + union_length(b) - union_length(a + b)


def trace_breakdown(events: list[dict], steps: int) -> dict[int, dict[str, float]]:
    """Per rank, seconds per step: wall (first slice start to last slice end,
    divided by steps), kernels (compute slices), comm (issue to completion),
    comm hidden under kernels, exposed comm, outside both, bytes per step."""
    out = {}
    for rank in sorted({e["pid"] for e in events}):
        mine = [e for e in events if e["pid"] == rank]
        comp = [(e["ts"], e["ts"] + e["dur"]) for e in mine if e["tid"] == 0]
        comm = [(e["ts"], e["ts"] + e["dur"]) for e in mine if e["tid"] == 1]
        lo, hi = min(e["ts"] for e in mine), max(e["ts"] + e["dur"] for e in mine)
        wall = hi - lo
        busy = union_length(comp + comm)
        hidden = overlap_length(comp, comm)
        n = steps * 1e6
        out[rank] = {
            "wall": wall / n, "kernels": sum(b - a for a, b in comp) / n, "comm": union_length(comm) / n,
            "hidden": hidden / n, "exposed": (busy - union_length(comp)) / n, "outside": (wall - busy) / n,
            "bytes": sum(e["args"].get("bytes", 0) for e in mine if e["tid"] == 1) / steps,
            "collectives": sum(1 for e in mine if e["tid"] == 1) / steps,
        }
    return out


if __name__ == "__main__":  # the rank program of measure_plan: PLAN FEEDS STEPS REPEATS
    time_plan_in_ranks(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))


def run_job(command: Sequence[str], env: dict[str, str], timeout: float):
    """Runs a command (mpiexec and its ranks, a benchmark) in a process group
    of its own and returns its CompletedProcess (text stdout and stderr). On
    timeout the whole group is killed, not the first process alone (killing
    mpiexec by SIGKILL leaves its ranks running), and TimeoutExpired carries
    what it printed."""
    import subprocess

    job = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           start_new_session=True)
    try:
        out, err = job.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(job.pid, signal.SIGKILL)
        out, err = job.communicate()
        raise subprocess.TimeoutExpired(job.args, timeout, out, err) from None
    except BaseException:
        os.killpg(job.pid, signal.SIGKILL)
        job.wait()
        raise
    return subprocess.CompletedProcess(job.args, job.returncode, out, err)


def run_on_ranks(script: str, ranks: int, *args: str, timeout: int = 1800) -> dict:
    """Runs `script` with `args` on `ranks` processes (mpiexec, as sbpc's
    ranks run) and returns the JSON its rank 0 printed after `RESULT `: a
    peer such as PyTorch DDP measured beside sbpc. Its ranks find a fresh
    rendezvous file in their environment (`torch_peer_group`), in a folder
    only this user can read."""

    from sbpc.runtime.launch import rank_environment, script_command

    print(f"({Path(script).name} {' '.join(args)}: on {ranks} processes)", file=sys.stderr, flush=True)
    with tempfile.TemporaryDirectory(prefix="sbpc-bench-") as folder:
        env = rank_environment()
        env[RENDEZVOUS_VARIABLE] = os.path.join(folder, "rendezvous")
        done = run_job(script_command(ranks, script, *args), env, timeout)
    for line in done.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    raise RuntimeError(f"{Path(script).name} {' '.join(args)} on {ranks} processes failed (exit "
                       f"{done.returncode}):\n{done.stderr[-3000:]}")
