"""A pool of MPI ranks that a plain Python process starts once and reuses.

    mpiexec -n N python -m sbpc.runtime.pool JOB_DIR

Rank 0 connects to the driver through the private channel in JOB_DIR (a
Unix-domain socket and the job's secret, runtime/channel.py) and serves its
commands (load a plan, run steps, read or write parameters, stop),
broadcasting each to the other ranks over MPI (a step's large feeds wait in
shared memory, runtime/shared_feeds.py: the command only names them);
results are gathered back to rank 0 and sent to the driver. A failure on any
rank is written to JOB_DIR/rank<R>.err (a file survives the abort, where
output forwarded by mpiexec may be cut off), sent to the driver if the
failing rank is 0, and aborts the job. Each rank keeps its progress record
there from its start (runtime/progress.py). Ranks on other hosts than the
driver's (RankPool(hosts=...)) keep neither: see runtime/hosts.py.
"""

from __future__ import annotations

import contextlib
import gc
import pickle
import shutil
import signal
import sys
import time

from mpi4py import MPI

from sbpc.dialects import verify_module
from sbpc.dialects.op_tree import build_module

from . import checkpoint
from .channel import connect, receive, send
from .cuda_backend import make_executor
from .executor import Backoff, Executor, actor_names, inject, injected_fault, settle_heap
from .hosts import on_driver_node
from .launch import driver_gone
from .program import find_program
from .progress import Progress
from .rank_auth import authenticate_messages
from .shared_feeds import AttachedFeeds
from .worker import fail, gather_pieces


def wait_idle(world: MPI.Intracomm) -> None:
    """Waits until every rank has reached here (rank 0 once it has the
    driver's next command) without spinning (Backoff): MPI's blocking calls
    poll at full speed, so idle ranks waiting in a broadcast took a core
    each (3 of 4 ranks at 60% of a core on 2 cores), starving the driver's
    own work and everything else on the machine between calls."""
    request = world.Ibarrier()
    backoff = Backoff()
    while not request.Test():
        backoff.pause()


def serve(job: str) -> None:
    # Ctrl-C in the driver's terminal reaches every rank too; the driver
    # decides (it stops mpiexec, which ends the ranks), so no rank prints a
    # KeyboardInterrupt traceback.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    world = MPI.COMM_WORLD
    authenticate_messages(world)
    # A rank on another host than the driver's has no JOB_DIR: no progress
    # record or report file (its failure reaches the driver through the
    # output mpiexec forwards), and its feeds arrive inline.
    here = on_driver_node(world)[0]
    progress = Progress(job, world.rank) if here else None
    sock = connect(job) if world.rank == 0 else None
    executor = None
    shared = AttachedFeeds()
    orphaned = False
    # What the rank holds for good (its modules, MPI), out of every later
    # collection's walk, once. A plan is not frozen (thawing it to free it
    # at the next load thawed these too): each load ends with one full
    # collection, which frees the last plan and walks the new one, after
    # which the steps, whose objects die young, do not trigger another.
    # The load's collection walked ~160k objects a time when these were in
    # it (0.11 s a load, 42 s of CPU over `make test`).
    settle_heap()
    while True:
        try:
            command = ("stop",) if orphaned else receive(sock) if sock is not None else None  # rank 0's socket
        except OSError:  # (ConnectionError) the driver closed the channel without a stop: it is gone
            command, orphaned = ("stop",), True
        wait_idle(world)
        command = world.bcast(command, root=0)
        kind = command[0]
        reply: object
        try:
            if kind == "stop":
                fault = injected_fault(world.rank)
                if fault is not None and fault[1] == -1:  # tests: a rank that hangs when told to stop
                    inject(fault[0])
                shared.close()
                break
            if kind == "load":  # each rank rebuilds its own device's plan alone (program.rank_plan_pickles)
                executor = None  # garbage from here: freed by the collection below
                # the pickle came inside the driver's command, which was
                # authenticated before anything of it was unpickled
                module = build_module(pickle.loads(command[1][world.rank]))
                verify_module(module)
                program = find_program(module)
                executor = make_executor(module, program, world, trace=False)
                if progress is not None:
                    executor.progress = progress.start(actor_names(executor))
                executor.initialize(command[2])
                gc.collect()
                reply = "loaded"
            elif kind == "run":
                loaded = _loaded(executor)
                # the driver checked the feeds; the rank's pieces are copied
                # out of shared memory here, before the reply
                loaded.feed(shared.views(command[1]))
                outputs = command[3] if len(command) > 3 else None
                fetched = loaded.run(command[2], outputs)
                # the driver, which holds the whole program, assembles them
                reply = gather_pieces(world, fetched, step=loaded.steps_run - 1)
            elif kind == "save_checkpoint":  # (folder): this rank's pieces; the driver writes the index
                written = checkpoint.save_rank(_loaded(executor), command[1])
                fault = injected_fault(world.rank)
                if fault is not None and fault[1] == SAVE_FAULT_STEP:  # tests: a rank that dies mid-save
                    inject(fault[0])
                reply = world.gather(written, root=0)
            elif kind == "load_checkpoint":  # (folder, pieces of each array, tensor names): each rank reads its own
                checkpoint.load_rank(_loaded(executor), *command[1:])
                reply = "loaded"
            elif kind == "get_param":
                reply = world.gather(_loaded(executor).param_piece(command[1]), root=0)
            elif kind == "set_param":
                _loaded(executor).set_param(command[1], command[2])
                reply = "set"
            else:
                raise ValueError(f"unknown command {kind!r}")
        except Exception as e:  # noqa: BLE001 - reported to the driver, then the job ends
            message = str(e) if str(e).startswith("rank ") else f"rank {world.rank}: {type(e).__name__}: {e}"
            tell = (lambda m: _tell_driver(sock, m)) if world.rank == 0 else None
            fail(world, message, job if here else None, tell=tell)
        if sock is not None:  # rank 0
            try:
                send(sock, ("ok", reply))
            except OSError:  # the driver went while the ranks worked: they stop next
                orphaned = True
    if sock is not None:
        sock.close()
        # A driver killed by a signal left its job folder; the ranks end as
        # if told to stop (MPICH removes its segments as they finalize) and
        # rank 0 removes the folder, once the driver is gone for sure: its
        # channel closes while it exits, a moment before it is a zombie.
        if orphaned and _ends(job, DRIVER_EXIT_S):
            shutil.rmtree(job, ignore_errors=True)


SAVE_FAULT_STEP = -2
"""The step of an injected fault (`SBPC_TEST_FAULT`) that strikes a rank
once it has written its checkpoint pieces, before the others are done."""

DRIVER_EXIT_S = 5.0
"""How long rank 0 waits for a driver whose channel closed to be gone."""


def _ends(job: str, wait: float) -> bool:
    """Whether the job's driver is gone within `wait` seconds."""
    deadline = time.monotonic() + wait
    while not driver_gone(job):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)
    return True


def _loaded(executor: Executor | None) -> Executor:
    """The executor of the loaded plan; a command that needs one before any
    `load` is a driver bug, reported as such."""
    if executor is None:
        raise RuntimeError("no plan is loaded (the driver must send load first)")
    return executor


def _tell_driver(sock, message: str) -> None:
    with contextlib.suppress(OSError):
        send(sock, ("error", message))


if __name__ == "__main__":
    serve(sys.argv[1])
