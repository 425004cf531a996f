"""Where each rank is, for the message of a job that ends abnormally.

A rank killed by a signal (SIGKILL, the out-of-memory killer) cannot say
what it was doing, and mpiexec then kills the others before they can; the
driver was left with `the MPI ranks failed: ` and nothing after the colon.
So each rank keeps a small record in the job's folder (private to the user),
made at the rank's start and written in place as it runs (an int64 store
into a memory-mapped file per actor, a few tens of nanoseconds): its pid,
the step it is in and the index of the actor it last started, with the
actor names written beside it when a plan is loaded. The driver watches each
rank's lifelines (DeathWatch) and knows which rank ended first; when the job fails with
no rank's own report, it says which rank died, of what where mpiexec
reports it, in which step and at which actor, and where every other rank
was.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import resource
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
        for end, fifo in enumerate(lifelines(self.folder, rank)):
            try:  # the driver's DeathWatch made them; none where no driver watches
                line = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
            except OSError:
                return
            os.write(line, b"+")
            _move_to_the_edge(line, first=end == 0)

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


def describe_failure(folder: str | os.PathLike, ranks: int, launcher_output: str, first_dead: int | None = None,
                     elsewhere: Collection[int] = ()) -> str:
    """Which rank ended the job and where every rank was, from the records,
    the rank a DeathWatch saw end first, and mpiexec's report (`PID <pid>
    RUNNING AT ...` / `EXIT CODE: <code>`, where a code that is a signal
    number is how MPICH's launcher reports a rank killed by that signal).
    mpiexec's report alone never names the culprit: it reports one of the
    ranks it then killed with the same SIGKILL as often as the one that died
    (measured: a wrong rank in 5 of 12 jobs). The ranks `elsewhere` run on
    other hosts than the driver's and keep no record in its folder: the
    message says so. Empty when there are no records."""
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
    away = sorted(set(elsewhere) - set(found))
    if away:
        names = ", ".join(map(str, away))
        others += ("; " if others else "") + (
            f"ranks {names} run on other hosts and keep no record here" if len(away) > 1 else
            f"rank {names} runs on another host and keeps no record here") + (
            " (what a rank there printed is in mpiexec's output)")
    return "; ".join(lines + ([others] if others else []))


def lifelines(folder: Path, rank: int) -> tuple[Path, Path]:
    """A rank's two lifelines: FIFOs in the job's folder that the driver's
    DeathWatch reads and the rank holds open for writing, one at its first
    descriptor and one at its last (DeathWatch says why)."""
    return folder / f"rank{rank}.lifeline.first", folder / f"rank{rank}.lifeline.last"


def _move_to_the_edge(fd: int, first: bool) -> None:
    """Moves a descriptor to 0, or above any this process will open: the
    lowest free one from just under the limit of open files (from 1023 where
    the limit is higher, so the descriptor table stays small)."""
    if first:
        os.dup2(fd, 0)
    else:
        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
        try:
            fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, min(soft, 1024) - 1)
        except OSError:  # none free up there: where it is, it is still above MPI's connection
            return
    os.close(fd)


class DeathWatch(threading.Thread):
    """Knows which rank of a job ended first.

    Made before the ranks start: it makes each rank's two lifelines (FIFOs)
    and puts their read ends into one epoll set. Each rank, as it starts
    (Progress), opens their write ends, says hello through each and moves
    one to its first descriptor (0) and one to its last. A process that ends
    closes its descriptors in one pass, in the order of their numbers (Linux
    6.18 releases them from the highest down; the direction is the
    kernel's to choose, and a lifeline at each end covers both), so one of
    the lifelines is released before MPI's own connection to its launcher (an
    inherited descriptor above 2), whose closing is what makes mpiexec kill
    the other ranks. Epoll hands out ready descriptors in the order they
    became ready, so the first lifeline to close belongs to the first rank to
    end, however late this thread looks, once it has read the hellos (a
    lifeline still ready with its hello keeps the hello's place: where
    several ranks ended before this thread read theirs, which one ended
    first is unknown, `_in_order`). (A pidfd turns ready only after all
    the descriptors are closed: mpiexec could kill another rank in between,
    and did, once in about 60 runs of the fault tests; a single lifeline at
    descriptor 0 is released last here, and lost that race once in 9.) A
    rank that ended before every rank said hello leaves the first unknown:
    the watch names none rather than guess."""

    def __init__(self, folder: str | os.PathLike, ranks: int):
        super().__init__(daemon=True, name="sbpc-death-watch")
        self.folder, self.ranks = Path(folder), ranks
        self.first: int | None = None
        self.settled = threading.Event()
        """Set once every rank's hellos are read and out of epoll's ready
        list: from then on the first rank to end is known for sure."""
        self._stop_event = threading.Event()
        self._poller = select.epoll()
        self._lines: dict[int, int] = {}  # read end -> rank
        for rank in range(ranks):
            for path in lifelines(self.folder, rank):
                os.mkfifo(path, 0o600)
                fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
                self._lines[fd] = rank
                self._poller.register(fd, select.EPOLLIN)
        self._wake_read, self._wake_write = os.pipe()  # stop() wakes the epoll wait at once
        self._poller.register(self._wake_read, select.EPOLLIN)

    def run(self) -> None:
        # A watch that fails must not print from its thread into the user's
        # program: it only ever adds detail to a failure message.
        with contextlib.suppress(Exception):
            self._watch()

    def _watch(self) -> None:
        greeted: set[int] = set()  # the lifelines (read ends) a rank said hello through
        recent: set[int] = set()  # the lifelines the last look found ready
        stopping = False
        while True:
            # once stopped, one more look without waiting: a death queued
            # before stop() still counts (the driver stops the watch once it
            # has seen the job fail). Once every hello is read, one look
            # without waiting tells whether epoll's ready list has let go
            # of the hellos (`settled`).
            look_only = stopping or (len(greeted) == len(self._lines) and not self.settled.is_set())
            events = [(fd, mask) for fd, mask in self._poller.poll(0 if look_only else -1) if fd in self._lines]
            fresh = {fd for fd, _ in events if self._hello(fd)}
            greeted |= fresh
            ended = [fd for fd, mask in events if mask & select.EPOLLHUP]
            if ended:
                # every hello sent is in its FIFO by now
                greeted |= {f for f in self._lines if f not in greeted and self._hello(f)}
                known = len(greeted) == len(self._lines) and self._in_order(ended, recent | fresh)
                self.first = self._lines[ended[0]] if known else None
                return
            if look_only and not events and len(greeted) == len(self._lines):
                self.settled.set()
            recent = {fd for fd, _ in events}
            if stopping:
                return
            stopping = self._stop_event.is_set()

    def _in_order(self, ended: list[int], queued_before: set[int]) -> bool:
        """Whether the first of `ended` (in epoll's order) is the first
        rank to end. Epoll keeps a descriptor that stays ready where it was
        in its ready list: a lifeline whose hello this watch had not yet
        read, or read in its last look, holds the place of its hello, not
        of its closing. Among several ranks that ended, such a place says
        nothing of which ended first (a busy machine, where this thread ran
        late); where one rank ended, it is that one."""
        ranks = {self._lines[fd] for fd in ended}
        return len(ranks) == 1 or not queued_before.intersection(ended)

    @staticmethod
    def _hello(fd: int) -> bool:
        try:
            return bool(os.read(fd, 64))
        except BlockingIOError:
            return False

    def stop(self, timeout: float = 5.0) -> int | None:
        """Stops watching; the rank that ended first, if the watch knows."""
        if not self._stop_event.is_set():
            self._stop_event.set()
            os.write(self._wake_write, b"x")
        if self.is_alive() and threading.current_thread() is not self:
            self.join(timeout)
        if not self.is_alive() and self._wake_write >= 0:
            for fd in (*self._lines, self._wake_read, self._wake_write):
                os.close(fd)
            self._poller.close()
            self._wake_read = self._wake_write = -1
        return self.first


def reported_ranks(folder: str | os.PathLike) -> set[int]:
    """The ranks that wrote their own failure report (rank<R>.err)."""
    return {int(p.stem[4:]) for p in Path(folder).glob("rank*.err")}
