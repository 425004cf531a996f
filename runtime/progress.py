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

import os
import re
import signal
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
    except (OSError, ValueError):
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


def describe_failure(folder: str | os.PathLike, ranks: int, launcher_output: str) -> str:
    """Which rank ended the job and where every rank was, from the records
    and mpiexec's report (`PID <pid> RUNNING AT ...` / `EXIT CODE: <code>`,
    where a code that is a signal number is how MPICH's launcher reports a
    rank killed by that signal). Empty when there are no records."""
    records = _records(Path(folder), ranks)
    if not records:
        return ""
    dead: dict[int, int] = {}
    for pid, code in re.findall(r"PID (\d+) RUNNING AT .*?\n.*?EXIT CODE: (\d+)", launcher_output, re.S):
        for r, (rank_pid, _, _) in records.items():
            if rank_pid == int(pid):
                dead[r] = int(code)
    lines = [f"rank {r} (pid {records[r][0]}) died of {_signal_name(code)} {_where(*records[r][1:])}"
             for r, code in sorted(dead.items())]
    if not lines:
        lines.append("a rank ended the job without a report")
    others = describe_progress(folder, ranks, skip=dead)
    return "; ".join(lines + ([others] if others else []))


def reported_ranks(folder: str | os.PathLike) -> set[int]:
    """The ranks that wrote their own failure report (rank<R>.err)."""
    return {int(p.stem[4:]) for p in Path(folder).glob("rank*.err")}
