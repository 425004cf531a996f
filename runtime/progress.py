"""Where each rank is, for the message of a job that ends abnormally.

A rank killed by a signal (SIGKILL, the out-of-memory killer) cannot say
what it was doing, and mpiexec then kills the others before they can; the
driver was left with `the MPI ranks failed: ` and nothing after the colon.
So each rank keeps a small record in the job's folder (private to the user),
made at the rank's start and written in place as it runs (an int64 store
into a memory-mapped file per actor, a few tens of nanoseconds): its pid,
the step it is in and the index of the actor it last started, with the
actor names written beside it when a plan is loaded. The driver watches the
pids (DeathWatch) and knows which rank ended first; when the job fails with
no rank's own report, it says which rank died, of what where mpiexec
reports it, in which step and at which actor, and where every other rank
was.
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
    """One rank's record, written by that rank. Made whole before it has its
    name (written aside, then renamed): a reader never sees a record without
    its pid."""

    def __init__(self, folder: str | os.PathLike, rank: int):
        self.folder, self.rank = Path(folder), rank
        path = self.folder / f"rank{rank}.progress"
        aside = self.folder / f".rank{rank}.progress.new"
        with open(aside, "wb") as f:
            np.save(f, np.array([os.getpid(), -1, -1], dtype=np.int64))
        os.replace(aside, path)
        self.fields = np.load(path, mmap_mode="r+")

    def start(self, actors: list[str]) -> np.ndarray:
        """A plan is loaded: its actor names beside the record, the record at
        before-the-first-step; the fields for the executor to write."""
        aside = self.folder / f".rank{self.rank}.actors.new"
        aside.write_text("\n".join(actors))
        os.replace(aside, self.folder / f"rank{self.rank}.actors")
        self.fields[STEP:] = -1
        return self.fields


def _read(folder: Path, rank: int) -> tuple[int, int, str | None] | None:
    try:
        fields = np.load(folder / f"rank{rank}.progress", mmap_mode="r")
    except (OSError, ValueError, EOFError):  # not there yet
        return None
    if fields.shape != (3,) or fields[PID] <= 0:
        return None
    pid, step, actor = (int(v) for v in fields)
    try:
        actors = (folder / f"rank{rank}.actors").read_text().split("\n")
    except OSError:  # no plan loaded yet
        return pid, LOADING, None
    return pid, step, actors[actor] if 0 <= actor < len(actors) else None


LOADING = -2
"""The step of a record whose rank has not loaded its plan yet."""


def _where(step: int, actor: str | None) -> str:
    if step == LOADING:
        return "starting (its plan not loaded yet)"
    if step < 0:
        return "before its first step"
    return f"in step {step}, at {actor}" if actor else f"in step {step}, before its first actor"


def _signal_name(code: int) -> str:
    try:
        return f"signal {code} ({signal.Signals(code).name})"
    except ValueError:
        return f"exit code {code}"


def records(folder: str | os.PathLike, ranks: int) -> dict[int, tuple[int, int, str | None]]:
    """Each rank's record that is there: its pid, step and actor name."""
    folder = Path(folder)
    return {r: rec for r in range(ranks) if (rec := _read(folder, r)) is not None}


def describe_progress(folder: str | os.PathLike, ranks: int, skip: Collection[int] = ()) -> str:
    """Where each rank (but those in `skip`) was, from the records."""
    found = records(folder, ranks)
    return "; ".join(f"rank {r} was {_where(step, actor)}" for r, (_, step, actor) in sorted(found.items())
                     if r not in skip)


def describe_failure(folder: str | os.PathLike, ranks: int, launcher_output: str, first_dead: int | None = None
                     ) -> str:
    """Which rank ended the job and where every rank was, from the records,
    the rank a DeathWatch saw end first, and mpiexec's report (`PID <pid>
    RUNNING AT ...` / `EXIT CODE: <code>`, where a code that is a signal
    number is how MPICH's launcher reports a rank killed by that signal).
    mpiexec's report alone never names the culprit: it reports one of the
    ranks it then killed with the same SIGKILL as often as the one that died
    (measured: a wrong rank in 5 of 12 jobs). Empty when there are no records."""
    found = records(folder, ranks)
    if not found:
        return ""
    reported = re.search(r"PID (\d+) RUNNING AT .*?\n.*?EXIT CODE: (\d+)", launcher_output, re.S)
    codes = {r: int(reported[2]) for r, rec in found.items() if reported and rec[0] == int(reported[1])}
    mpiexec = next((f"mpiexec reports {_signal_name(code)} for rank {r}" for r, code in codes.items()), None)
    if first_dead in found:
        pid, step, actor = found[first_dead]
        if first_dead in codes:
            how = f"died of {_signal_name(codes[first_dead])}"
        else:
            how = "died first" + (f" ({mpiexec}, which it ended after rank {first_dead})" if mpiexec else "")
        lines = [f"rank {first_dead} (pid {pid}) {how} {_where(step, actor)}"]
    else:
        lines = ["a rank ended the job without a report" + (
            f" ({mpiexec}: the first it saw end, not always the first to end)" if mpiexec else "")]
    others = describe_progress(folder, ranks, skip=() if first_dead not in found else {first_dead})
    return "; ".join(lines + ([others] if others else []))


class DeathWatch(threading.Thread):
    """Watches the ranks' processes and keeps the rank that ended first.

    Each rank's pid comes from its record, made at the rank's start (long
    before its first step), and gets a pidfd. Once every rank has one, they
    all go into one epoll set, which hands out ready descriptors in the order
    they became ready (the kernel queues each when it is woken, and a pidfd
    is woken when its process exits): the first event is the first rank to
    die, even when this thread runs late and finds the ranks mpiexec killed
    after it dead too. A rank that ended before every pidfd was in the set
    is first only if it is the only one found ended then; with two or more,
    the order is not known and the watch names none rather than guess."""

    def __init__(self, folder: str | os.PathLike, ranks: int, interval: float = 0.01):
        super().__init__(daemon=True, name="sbpc-death-watch")
        self.folder, self.ranks, self.interval = Path(folder), ranks, interval
        self.first: int | None = None
        self._stop_event = threading.Event()
        self._wake_read, self._wake_write = os.pipe()  # stop() wakes the epoll wait at once

    def run(self) -> None:
        # A watch that fails must not print from its thread into the user's
        # program: it only ever adds detail to a failure message.
        with contextlib.suppress(Exception):
            self._watch()

    def _watch(self) -> None:
        fds: dict[int, int] = {}  # pidfd -> rank
        ended: list[int] = []  # ranks that had ended (and been reaped) before their pidfd was opened
        try:
            while len(fds) + len(ended) < self.ranks:  # records appear as the ranks start
                for rank, (pid, _, _) in records(self.folder, self.ranks).items():
                    if rank not in fds.values() and rank not in ended:
                        try:
                            fds[os.pidfd_open(pid)] = rank
                        except ProcessLookupError:
                            ended.append(rank)
                if self._stop_event.wait(self.interval):
                    return
            with select.epoll() as poller:
                for fd in fds:
                    poller.register(fd, select.EPOLLIN)
                ended += [fds[fd] for fd, _ in poller.poll(0)]
                if ended:
                    self.first = ended[0] if len(ended) == 1 else None
                    return
                poller.register(self._wake_read, select.EPOLLIN)
                while True:
                    # a death queued before stop() woke the wait still counts:
                    # the driver stops the watch once it has seen the job fail
                    events = poller.poll()
                    deaths = [fds[fd] for fd, _ in events if fd in fds]
                    if deaths or self._stop_event.is_set():
                        self.first = deaths[0] if deaths else None
                        return
        finally:
            for fd in fds:
                os.close(fd)

    def stop(self, timeout: float = 5.0) -> int | None:
        """Stops watching; the rank that ended first, if the watch knows."""
        if not self._stop_event.is_set():
            self._stop_event.set()
            os.write(self._wake_write, b"x")
        if self.is_alive() and threading.current_thread() is not self:
            self.join(timeout)
        if not self.is_alive() and self._wake_write >= 0:
            os.close(self._wake_read)
            os.close(self._wake_write)
            self._wake_read = self._wake_write = -1
        return self.first


def reported_ranks(folder: str | os.PathLike) -> set[int]:
    """The ranks that wrote their own failure report (rank<R>.err)."""
    return {int(p.stem[4:]) for p in Path(folder).glob("rank*.err")}
