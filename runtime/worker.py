"""The program every MPI rank runs for `sbp-run`:

    mpiexec -n N python -m sbpc.runtime.worker PLAN FEEDS OUT [--steps K] [--trace FILE] [--params FILE]
        [--errors DIR]

Each rank loads its plan (`{rank}` in PLAN is replaced by the rank: sbp-run
writes each rank's own device alone, program.rank_plans), takes its pieces
of the feeds (sbp-run checked them against the whole program), runs its
device's actors, and sends its pieces of the fetched outputs to rank 0,
which writes them to OUT (.npz, `rank<R>/<name>`) for sbp-run, which holds
the whole program, to assemble. Any exception ends every rank: the failing
rank prints where it happened and aborts the MPI job. On several hosts
(sbp-run --hosts) the files are on rank 0's host alone: rank 0 sends each
rank its plan and the feeds over MPI (runtime/hosts.py).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import sys
from typing import NoReturn

import numpy as np
from mpi4py import MPI

from sbpc.dialects import parse_module

from .cuda_backend import make_executor
from .executor import STREAMS, actor_names, rendezvous, settle_heap
from .hosts import on_driver_node
from .program import assemble_outputs, find_program
from .progress import Progress
from .rank_auth import authenticate_messages


def gather_pieces(world: MPI.Comm, fetched: dict, step: int | None = None) -> list | None:
    """Every rank's pieces of its fetched outputs, on rank 0 (None
    elsewhere): [(rank, {name: (index, piece)})]. `step`, the last one run,
    names the place if a rank never arrives."""
    rendezvous(world, f"step {step}: gathering the outputs" if step is not None else "gathering the outputs")
    mine = {name: (rank_piece[1], rank_piece[2]) for name, rank_piece in fetched.items()}
    return world.gather((world.rank, mine), root=0)


def gather_outputs(world: MPI.Comm, program, fetched: dict, outputs=None, step: int | None = None
                   ) -> dict[str, np.ndarray] | None:
    """The fetched outputs (those named in `outputs`, when given) assembled
    on rank 0 (None elsewhere), which holds the whole program."""
    gathered = gather_pieces(world, fetched, step)
    return None if gathered is None else assemble_outputs(program, gathered, outputs)


def fail(world: MPI.Comm, message: str, errors: str | None = None, tell=None) -> NoReturn:
    """Reports and ends the whole job. The message also goes to
    errors/rank<R>.err when the driver gave a directory (the abort can cut
    off the stderr that mpiexec forwards), and to `tell` (a driver waiting
    on a socket) before the abort."""
    sys.stderr.write(f"sbpc: {message}\n")
    sys.stderr.flush()
    if errors:
        # not there for a rank on another host than the driver's
        with contextlib.suppress(OSError), open(os.path.join(errors, f"rank{world.rank}.err"), "w") as f:
            f.write(message)
            f.flush()
            os.fsync(f.fileno())
    if tell is not None:
        tell(message)
    world.Abort(1)
    raise SystemExit(1)  # not reached: Abort ends the process


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="sbpc.runtime.worker")
    parser.add_argument("plan")
    parser.add_argument("feeds")
    parser.add_argument("out")
    parser.add_argument("--steps", type=int, default=1)
    parser.add_argument("--trace")
    parser.add_argument("--params")
    parser.add_argument("--errors", help="directory for a failing rank's message")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the driver decides on Ctrl-C (see pool.serve)
    world = MPI.COMM_WORLD
    errors = args.errors
    try:
        authenticate_messages(world)
        here, several = on_driver_node(world)
    except Exception as e:  # noqa: BLE001 - as below, before any rank has a record
        fail(world, f"rank {world.rank}: {e}", errors)
    if not here:  # JOB_DIR is on the driver's host: this rank reports through mpiexec's output
        errors = None
    progress = Progress(errors, world.rank) if errors else None
    try:
        plan_path = args.plan.replace("{rank}", str(world.rank))
        plan_text, feeds, params = _inputs(world, args, several)
        module = parse_module(plan_text, plan_path)
        program = find_program(module)
        executor = make_executor(module, program, world, trace=bool(args.trace))
        if progress is not None:
            executor.progress = progress.start(actor_names(executor))
        executor.initialize(params)
        settle_heap()
        executor.feed(feeds)
        fetched = executor.run(args.steps)
        gathered = gather_pieces(world, fetched, step=executor.steps_run - 1)
        if args.trace:
            events = world.gather(executor.events, root=0)
            origins = world.gather((MPI.Get_processor_name(), executor.t0), root=0)
        if world.rank == 0:
            assert gathered is not None  # gathered on rank 0
            pieces = {f"rank{rank}/{name}": piece for rank, got in gathered for name, (_, piece) in got.items()}
            np.savez(args.out, **pieces)
            if args.trace:
                assert events is not None and origins is not None  # gathered on rank 0
                write_trace(args.trace, [e for rank_events in on_host_clocks(events, origins) for e in rank_events],
                            world.size)
    except Exception as e:  # noqa: BLE001 - every failure ends the whole job, with its place
        message = str(e) if str(e).startswith("rank ") else f"rank {world.rank}: {type(e).__name__}: {e}"
        fail(world, message, errors)


def _inputs(world: MPI.Comm, args, several: bool) -> tuple[str, dict, dict | None]:
    """This rank's plan text, the feeds and the parameter values (or None),
    from the files sbp-run wrote. Those are on the driver's host: on
    several hosts rank 0 reads them and sends each rank its share."""
    def read(rank: int) -> str:
        with open(args.plan.replace("{rank}", str(rank))) as f:
            return f.read()

    def arrays(path: str | None) -> dict | None:
        if not path:
            return None
        with np.load(path) as data:
            return dict(data)

    if not several:
        return read(world.rank), arrays(args.feeds) or {}, arrays(args.params)
    root = world.rank == 0
    plan_text = world.scatter([read(r) for r in range(world.size)] if root else None, root=0)
    feeds = world.bcast(arrays(args.feeds) if root else None, root=0)
    params = world.bcast(arrays(args.params) if root else None, root=0)
    return plan_text, feeds or {}, params


def on_host_clocks(events: list[list[dict]], origins: list[tuple[str, float]]) -> list[list[dict]]:
    """Each rank's events (times from its own executor's start) on the
    clock of its host's earliest rank: ranks on one host read one monotonic
    clock (perf_counter), so their slices line up in the trace, and a rank
    waiting on a collective shows beside the peer it waits for (each rank
    at its own origin, a late-started rank looked milliseconds ahead).
    Hosts' clocks are not one another's: ranks of each host keep that
    host's origin."""
    first: dict[str, float] = {}
    for host, t0 in origins:
        first[host] = min(t0, first.get(host, t0))
    return [[{**e, "ts": e["ts"] + (t0 - first[host]) * 1e6} for e in mine]
            for mine, (host, t0) in zip(events, origins, strict=True)]


def write_trace(path: str, events: list[dict], ranks: int) -> None:
    """Chrome/Perfetto trace: one process per rank, one thread per stream."""
    meta = []
    for rank in range(ranks):
        meta.append({"name": "process_name", "ph": "M", "pid": rank, "args": {"name": f"rank {rank}"}})
        for stream, tid in STREAMS.items():
            meta.append({"name": "thread_name", "ph": "M", "pid": rank, "tid": tid, "args": {"name": stream}})
    with open(path, "w") as f:
        json.dump({"traceEvents": meta + events, "displayTimeUnit": "ms"}, f)


if __name__ == "__main__":
    main()
