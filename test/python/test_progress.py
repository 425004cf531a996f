"""Progress records and the death watch without MPI: plain processes stand
in for ranks, so the order in which they end is the test's to choose."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Iterator

from sbpc.runtime.progress import DeathWatch, Progress, describe_failure, records

RANK = """
import sys, time
from sbpc.runtime.progress import Progress
Progress(sys.argv[1], int(sys.argv[2]))
print("ready", flush=True)
time.sleep(60)
"""


@contextlib.contextmanager
def stand_in_ranks(folder, count: int) -> Iterator[list[subprocess.Popen]]:
    """`count` processes with progress records in `folder`, ended on exit."""
    ranks = [subprocess.Popen([sys.executable, "-c", RANK, str(folder), str(r)], stdout=subprocess.PIPE, text=True)
             for r in range(count)]
    try:
        for rank in ranks:
            assert rank.stdout is not None and rank.stdout.readline().strip() == "ready"
        yield ranks
    finally:
        for rank in ranks:
            rank.kill()
            rank.wait()


def _end(rank: subprocess.Popen) -> None:
    """SIGKILL, and back once the process has ended (not reaped: a rank is
    mpiexec's child, not the driver's)."""
    os.kill(rank.pid, signal.SIGKILL)
    os.waitid(os.P_PID, rank.pid, os.WEXITED | os.WNOWAIT)


def test_a_ranks_lifeline_is_its_descriptor_0(tmp_path):
    # descriptors close in ascending order as a process ends: the lifeline
    # closes before MPI's connection to its launcher, whose closing makes
    # mpiexec kill the other ranks
    watch = DeathWatch(tmp_path, 1)
    watch.start()
    with stand_in_ranks(tmp_path, 1) as ranks:
        assert os.readlink(f"/proc/{ranks[0].pid}/fd/0") == str(tmp_path / "rank0.lifeline")
        _end(ranks[0])
        assert watch.stop() == 0


def test_the_watch_names_the_rank_that_ended_first(tmp_path):
    watch = DeathWatch(tmp_path, 4)  # before the ranks, as the drivers make it
    watch.start()
    with stand_in_ranks(tmp_path, 4) as ranks:
        for r in (2, 0, 3, 1):  # rank 2 dies, then mpiexec ends the others
            _end(ranks[r])
        assert watch.stop() == 2


def test_a_rank_that_never_said_hello_leaves_the_first_unknown(tmp_path):
    watch = DeathWatch(tmp_path, 3)
    watch.start()
    with stand_in_ranks(tmp_path, 2) as ranks:  # rank 2 never started
        _end(ranks[1])
        assert watch.stop() is None
        # and the message names no rank as the one that failed
        line = describe_failure(tmp_path, 3, "")
        assert line.startswith("a rank ended the job without a report; rank 0 was starting"), line


def test_a_record_is_never_seen_without_its_pid(tmp_path):
    progress = Progress(tmp_path, 0)
    assert records(tmp_path, 1) == {0: (os.getpid(), -2, None)}  # no plan loaded yet
    fields = progress.start(["@a.matmul (lg.matmul)", "@b.add (lg.add)"])
    fields[1:] = (3, 1)
    assert records(tmp_path, 1) == {0: (os.getpid(), 3, "@b.add (lg.add)")}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rank0.actors", "rank0.progress"]
