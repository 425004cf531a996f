"""Where each rank is, for the message of a job that ends abnormally.

A rank killed by a signal (SIGKILL, the out-of-memory killer) cannot say
what it was doing, and mpiexec then kills the others before they can; the
driver was left with `the MPI ranks failed: ` and nothing after the colon.
So each rank keeps a small record in the job's errors folder, written in
place as it runs (an int64 store into a memory-mapped file per actor, a few
tens of nanoseconds): its pid, the step it is in and the index of the actor
it last started, with the actor names written once beside it. When the job
fails with no rank's own report, the driver reads the records and mpiexec's
`PID ... EXIT CODE` lines and says which rank died, of what, in which step
and at which actor, and where every other rank was.
"""

from __future__ import annotations

import contextlib
import os
import re
import select
import signal
import threading
from collections.abc import Collection
from pathlib import Path

import numpy as np

PID, STEP, ACTOR = 0, 1, 2
"""The fields of a record (int64 each). ACTOR is -1 before a step's first actor."""


class Progress:
    """One rank's record, written by that rank."""

    def __init__(self, folder: str | os.PathLike, rank: int, actors: list[str]):
        folder = Path(folder)
        (folder / f"rank{rank}.actors").write_text("\n".join(actors))
        self.fields = np.lib.format.open_memmap(folder / f"rank{rank}.progress", mode="w+", dtype=np.int64, shape=(3,))
        self.fields[:] = (os.getpid(), -1, -1)


def _read(folder: Path, rank: int) -> tuple[int, int, str | None] | None:
    try:
        fields = np.load(folder / f"rank{rank}.progress", mmap_mode="r")
        actors = (folder / f"rank{rank}.actors").read_text().split("\n")
    except (OSError, ValueError, EOFError):  # not there yet, or being created
        return None
    if fields.shape != (3,):
        return None
    pid, step, actor = (int(v) for v in fields)
    return pid, step, actors[actor] if 0 <= actor < len(actors) else None


def _where(step: int, actor: str | None) -> str:
    if step < 0:
        return "before its first step"
    return f"in step {step}, at {actor}" if actor else f"in step {step}, before its first actor"


def _signal_name(code: int) -> str:
    try:
        return f"signal {code} ({signal.Signals(code).name})"
    except ValueError:
        return f"exit code {code}"


def _records(folder: Path, ranks: int) -> dict[int, tuple[int, int, str | None]]:
    return {r: rec for r in range(ranks) if (rec := _read(folder, r)) is not None}


def describe_progress(folder: str | os.PathLike, ranks: int, skip: Collection[int] = ()) -> str:
    """Where each rank (but those in `skip`) was, from the records."""
    records = _records(Path(folder), ranks)
    return "; ".join(f"rank {r} was {_where(step, actor)}" for r, (_, step, actor) in sorted(records.items())
                     if r not in skip)


def describe_failure(folder: str | os.PathLike, ranks: int, launcher_output: str, first_dead: int | None = None
                     ) -> str:
    """Which rank ended the job and where every rank was, from the records,
    mpiexec's report (`PID <pid> RUNNING AT ...` / `EXIT CODE: <code>`,
    where a code that is a signal number is how MPICH's launcher reports a
    rank killed by that signal) and, when a DeathWatch saw it, the rank
    that ended first (mpiexec reports one rank, not always the first: it
    kills the others with the same signal). Empty when there are no records."""
    records = _records(Path(folder), ranks)
    if not records:
        return ""
    reported = re.search(r"PID (\d+) RUNNING AT .*?\n.*?EXIT CODE: (\d+)", launcher_output, re.S)
    codes = {r: int(reported[2]) for r, rec in records.items() if reported and rec[0] == int(reported[1])}
    culprit = first_dead if first_dead in records else next(iter(codes), None)
    if culprit is None:
        lines = ["a rank ended the job without a report"]
    else:
        pid, step, actor = records[culprit]
        if culprit in codes:
            how = f"died of {_signal_name(codes[culprit])}"
        elif codes:  # mpiexec named a rank it killed after the culprit
            other, code = next(iter(codes.items()))
            how = f"died first (mpiexec reports {_signal_name(code)} for rank {other}, which it then ended)"
        else:
            how = "died first, without a report"
        lines = [f"rank {culprit} (pid {pid}) {how} {_where(step, actor)}"]
    others = describe_progress(folder, ranks, skip=() if culprit is None else {culprit})
    return "; ".join(lines + ([others] if others else []))


def _gone(pid: int) -> bool:
    """Whether a process has ended (a zombie not yet reaped counts)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True
    except OSError:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        except PermissionError:
            return False
        return False


class DeathWatch(threading.Thread):
    """Watches the ranks' pids (from their records; read while `active` is
    set) and keeps the rank seen gone first. mpiexec reports one dead rank, not
    always the first (it kills the others with the same signal a moment
    later); where the watch saw several go in one look it knows no better
    and keeps none."""

    def __init__(self, folder: str | os.PathLike, ranks: int, interval: float = 0.01):
        super().__init__(daemon=True, name="sbpc-death-watch")
        self.folder, self.ranks, self.interval = Path(folder), ranks, interval
        self.first: int | None = None
        self.active = threading.Event()
        self._stop_event = threading.Event()

    def run(self) -> None:
        # A watch that fails must not print from its thread into the user's
        # program: it only ever adds detail to a failure message.
        with contextlib.suppress(Exception):
            self._watch()

    def _watch(self) -> None:
        pids: dict[int, int] = {}
        while not self._stop_event.is_set() and len(pids) < self.ranks:
            # records appear as the ranks load a plan
            if self.active.wait(0.5):
                pids.update({r: rec[0] for r, rec in _records(self.folder, self.ranks).items() if r not in pids})
                self._stop_event.wait(self.interval)
        if self._stop_event.is_set():
            return
        try:
            fds = {os.pidfd_open(pid): rank for rank, pid in pids.items()}
        except (AttributeError, OSError):  # no pidfds (before Linux 5.3): look every interval
            fds = {}
        try:
            while not self._stop_event.is_set():
                if fds:
                    # A pidfd turns readable the moment its process ends, before
                    # mpiexec has noticed and ended the others.
                    ready, _, _ = select.select(list(fds), [], [], 0.5)
                    gone = sorted(fds[fd] for fd in ready)
                else:
                    gone = [rank for rank, pid in pids.items() if _gone(pid)]
                    self._stop_event.wait(self.interval)
                if gone:
                    self.first = gone[0] if len(gone) == 1 else None
                    return
        finally:
            for fd in fds:
                os.close(fd)

    def stop(self) -> int | None:
        self._stop_event.set()
        return self.first


def reported_ranks(folder: str | os.PathLike) -> set[int]:
    """The ranks that wrote their own failure report (rank<R>.err)."""
    return {int(p.stem[4:]) for p in Path(folder).glob("rank*.err")}
