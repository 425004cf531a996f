"""The driver's half of a rank pool (runtime/pool.py is the ranks'): N MPI
ranks that a plain Python process starts once, under mpiexec, and keeps
for later runs; commands go to rank 0 over the job's private channel
(runtime/channel.py) and large feeds through shared memory
(runtime/shared_feeds.py). A failure of any rank comes back as a
RuntimeFailure naming the rank, step and actor."""

from __future__ import annotations

import atexit
import pathlib
import re
import subprocess
import sys
import tempfile
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .hosts import Hosts


STOP_WAIT_S = 10.0
"""Seconds `close` gives the ranks to stop before it ends the job itself."""


class RankPool:
    """N MPI ranks started once by this process and kept for later runs."""

    pools: dict[tuple[int, Hosts | None], RankPool] = {}
    """The running pools by rank count and hosts (None: this machine)."""

    @classmethod
    def get(cls, ranks: int, hosts: Hosts | None = None) -> RankPool:
        pool = cls.pools.get((ranks, hosts))
        if pool is None or pool.process.poll() is not None:
            pool = cls.pools[(ranks, hosts)] = RankPool(ranks, hosts)
        return pool

    def __init__(self, ranks: int, hosts: Hosts | None = None):
        from .channel import Listener
        from .launch import (
            JOB_FOLDER_PREFIX,
            Leftovers,
            command,
            mark_job_folder,
            rank_environment,
            remove_dead_jobs,
            remove_orphaned_segments,
        )
        from .progress import DeathWatch
        from .shared_feeds import SharedFeeds

        self.ranks = ranks
        self.hosts = hosts
        self.key = (ranks, hosts)
        self.loaded: Any = None
        """A weak reference to the Executable whose plan the ranks hold
        (None: none yet, or a load that failed)."""
        self.feeds = SharedFeeds(shared=hosts is None or not hosts.several)
        """Where a step's large feeds wait for the ranks (copied once, not
        pickled; inline where ranks on other hosts cannot open the blocks)."""
        # The job's own folder (0700): the channel to rank 0 with the job's
        # secret, the ranks' progress records and failure reports.
        # What killed jobs left (their folders, segments no process maps)
        # goes before this one starts: nothing else would remove it.
        remove_dead_jobs()
        remove_orphaned_segments(wait=0)
        self.errors = tempfile.TemporaryDirectory(prefix=JOB_FOLDER_PREFIX)
        mark_job_folder(self.errors.name)
        listener = Listener(self.errors.name)
        # mpiexec reports a rank that died (its pid and exit code) on stdout:
        # kept in a file for the failure message, read only after a failure.
        self.launcher_out = open(pathlib.Path(self.errors.name) / "launcher.out", "w+")  # noqa: SIM115
        self.leftovers = Leftovers.now()  # what MPICH left before this job
        self.watch = DeathWatch(self.errors.name, ranks)  # before the ranks: their lifelines
        self.watch.start()
        self.process = subprocess.Popen(
            command(ranks, "sbpc.runtime.pool", self.errors.name, hosts=hosts),
            env=rank_environment(hosts, listener.secret.hex()), stdout=self.launcher_out, stderr=subprocess.PIPE,
            text=True,
        )
        try:
            self.sock = listener.accept(timeout=60, waiting=lambda: self.process.poll() is None)
        except TimeoutError:
            self.process.kill()
            raise RuntimeError(f"the {ranks} MPI ranks did not start: {self._stderr()}") from None
        finally:
            listener.close()
        atexit.register(self.close)

    def _forget(self) -> None:
        """Takes this pool out of the running pools: not another pool of the
        same ranks and hosts that was started meanwhile (RankPool(...) rather
        than RankPool.get), which would then run on unseen by `get`."""
        if RankPool.pools.get(self.key) is self:
            del RankPool.pools[self.key]

    def _stderr(self) -> str:
        """Why the ranks failed: the messages failing ranks wrote to their
        error files, else what mpiexec forwarded."""
        try:
            forwarded = self.process.communicate(timeout=10)[1].strip()
        except subprocess.TimeoutExpired:
            self.process.kill()
            forwarded = ""
        reports = sorted(pathlib.Path(self.errors.name).glob("rank*.err"))
        if reports:
            return "; ".join(r.read_text() for r in reports)
        from .progress import describe_failure

        self.launcher_out.seek(0)
        launcher = self.launcher_out.read()
        first = self.watch.stop()
        elsewhere = self.hosts.elsewhere(self.ranks) if self.hosts is not None else ()
        described = describe_failure(self.errors.name, self.ranks, launcher + forwarded, first, elsewhere)
        return described or forwarded or launcher.strip()

    def request(self, *command):
        from .channel import receive, send
        from .program import RuntimeFailure

        try:
            send(self.sock, command)
            status, reply = receive(self.sock)
        except KeyboardInterrupt:
            # The ranks are mid-command: stop them (mpiexec ends them on
            # SIGTERM) and say where they were; the next run starts a pool.
            from .progress import describe_progress

            self.stop()
            where = describe_progress(self.errors.name, self.ranks)
            print(f"sbpc: interrupted; the {self.ranks} MPI ranks were stopped" + (f": {where}" if where else ""),
                  file=sys.stderr)
            raise
        except (ConnectionError, OSError):
            self.process.wait(timeout=30)
            self._forget()
            self.leftovers.remove_new()
            raise RuntimeFailure(f"the MPI ranks failed: {self._stderr()}") from None
        if status == "error":
            self.process.wait(timeout=30)
            self._forget()
            self.leftovers.remove_new()  # an aborted rank cannot remove MPICH's segments and files
            # where the ranks that did not report were (a stuck one, say)
            from .progress import describe_progress

            reporter = re.match(r"rank (\d+):", reply)
            others = describe_progress(self.errors.name, self.ranks, skip={int(reporter[1])} if reporter else ())
            raise RuntimeFailure(reply + (f"; {others}" if others else ""))
        return reply

    def stop(self) -> None:
        """Ends the ranks now, wherever they are."""
        from .launch import stop

        self.watch.stop()
        stop(self.process, self.leftovers)
        self.feeds.close()
        self._forget()

    def close(self) -> None:
        if self.process.poll() is None:
            try:
                from .channel import send

                send(self.sock, ("stop",))
                self.process.wait(timeout=STOP_WAIT_S)
            except (OSError, subprocess.TimeoutExpired):
                # A rank that does not stop: end the job as an interrupt does
                # (SIGTERM, on which mpiexec ends every rank), then remove what
                # its ranks leave. SIGKILL to mpiexec alone let its proxies
                # kill the ranks after the sweep had run, and their segments
                # stayed in /dev/shm.
                from .launch import stop

                stop(self.process, self.leftovers)
        self.launcher_out.close()
        self.watch.stop()
        self.feeds.close()
        self._forget()
