"""Progress records and the death watch without MPI: plain processes stand
in for ranks, so the order in which they end is the test's to choose."""

from __future__ import annotations

import contextlib
import os
import select
import signal
import subprocess
import sys
from collections.abc import Iterator

from sbpc.runtime.progress import DeathWatch, Progress, describe_failure, lifelines, records

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


def test_a_rank_holds_its_lifelines_at_its_first_and_last_descriptors(tmp_path):
    watch = DeathWatch(tmp_path, 1)
    watch.start()
    with stand_in_ranks(tmp_path, 1) as ranks:
        held = {int(fd): os.readlink(f"/proc/{ranks[0].pid}/fd/{fd}") for fd in os.listdir(f"/proc/{ranks[0].pid}/fd")}
        first, last = lifelines(tmp_path, 0)
        assert held[0] == str(first)
        assert held[max(held)] == str(last)
        _end(ranks[0])
        assert watch.stop() == 0


def test_a_killed_process_releases_a_lifeline_before_its_other_descriptors(tmp_path):
    # What the watch relies on: mpiexec kills the other ranks when a rank's
    # connection to it (an inherited descriptor above 2) closes; one of the
    # rank's lifelines must close before that, whichever way the kernel
    # orders a dying process's descriptors.
    with contextlib.ExitStack() as stack:
        poller = stack.enter_context(select.epoll())
        names = {}
        for path in lifelines(tmp_path, 0):
            os.mkfifo(path, 0o600)
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
            stack.callback(os.close, fd)
            names[fd] = path.name
            poller.register(fd, select.EPOLLIN)
        for _ in range(10):
            connection, held = os.pipe()  # stands in for MPI's connection to mpiexec
            stack.callback(os.close, connection)
            try:
                rank = subprocess.Popen([sys.executable, "-c", RANK, str(tmp_path), "0"], stdout=subprocess.PIPE,
                                        text=True, pass_fds=(held,))
            finally:
                os.close(held)
            with rank:
                assert rank.stdout is not None and rank.stdout.readline().strip() == "ready"
                for fd in names:
                    os.read(fd, 64)  # the hellos
                poller.register(connection, select.EPOLLIN)
                # epoll keeps a descriptor it reported ready (the hellos) in
                # its queue until a poll finds it is not: empty the queue
                assert poller.poll(0) == []
                _end(rank)
                order = [names.get(fd, "connection") for fd, _ in poller.poll(0)]
                poller.unregister(connection)
            assert len(order) == 3 and order[0] != "connection", order


def test_the_watch_names_the_rank_that_ended_first(tmp_path):
    watch = DeathWatch(tmp_path, 4)  # before the ranks, as the drivers make it
    watch.start()
    with stand_in_ranks(tmp_path, 4) as ranks:
        assert watch.settled.wait(10)  # real ranks run a while before one fails
        for r in (2, 0, 3, 1):  # rank 2 dies, then mpiexec ends the others
            _end(ranks[r])
        assert watch.stop() == 2


def test_ranks_that_end_before_the_watch_read_their_hellos_leave_the_first_unknown(tmp_path):
    """The watch thread ran late (a busy machine): every lifeline still held
    its hello's place in epoll's ready list when the ranks ended, so the
    list's order is the hellos', not the deaths'. It names none rather than
    rank 0, whose hello came first."""
    watch = DeathWatch(tmp_path, 4)
    with stand_in_ranks(tmp_path, 4) as ranks:
        for r in (2, 0, 3, 1):
            _end(ranks[r])
        watch.start()
        assert watch.stop() is None


def test_one_rank_that_ends_before_the_watch_read_the_hellos_is_named(tmp_path):
    watch = DeathWatch(tmp_path, 3)
    with stand_in_ranks(tmp_path, 3) as ranks:
        _end(ranks[1])
        watch.start()
        assert watch.stop() == 1


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
