"""Progress records and the death watch without MPI: plain processes stand
in for ranks, so the order in which they end is the test's to choose."""

from __future__ import annotations

import contextlib
import os
import select
import signal
import subprocess
import sys
import time
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


def test_epoll_hands_out_ended_processes_in_the_order_they_ended(tmp_path):
    # what the watch relies on: looking once, late, after all of them ended
    with stand_in_ranks(tmp_path, 4) as ranks:
        fds = {os.pidfd_open(rank.pid): r for r, rank in enumerate(ranks)}
        try:
            with select.epoll() as poller:
                for fd in fds:
                    poller.register(fd, select.EPOLLIN)
                for r in (2, 0, 3, 1):
                    _end(ranks[r])
                assert [fds[fd] for fd, _ in poller.poll(0)] == [2, 0, 3, 1]
        finally:
            for fd in fds:
                os.close(fd)


def test_the_watch_names_the_rank_that_ended_first(tmp_path):
    with stand_in_ranks(tmp_path, 4) as ranks:
        watch = DeathWatch(tmp_path, 4)
        watch.start()
        time.sleep(0.3)  # the watch has every rank's pidfd (records are made at each rank's start)
        for r in (2, 0, 3, 1):  # rank 2 dies, then mpiexec ends the others
            _end(ranks[r])
        assert watch.stop() == 2


def test_two_ranks_gone_before_the_watch_saw_them_leave_the_first_unknown(tmp_path):
    with stand_in_ranks(tmp_path, 3) as ranks:
        for r in (1, 0):
            _end(ranks[r])
            ranks[r].wait()  # reaped: no pidfd can be opened on it
        watch = DeathWatch(tmp_path, 3)
        watch.start()
        time.sleep(0.3)
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
