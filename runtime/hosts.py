"""Ranks on several hosts: the host list a user gives (`sbp-run --hosts
a:2,b:2`, `--hostfile`, `sbpc.compile(..., hosts=...)`), how ranks are placed
on it, the mpiexec options that say so, and what a rank learns of where it
runs.

Ranks are placed node-major, as the cluster model numbers them
(perf/cluster.py): with `a:2,b:2`, ranks 0 and 1 run on a, 2 and 3 on b.
mpiexec is always given each host's count, so the placement does not depend
on the launcher's default (hydra cycles over hosts one rank at a time).

The driver (sbp-run, or the Python process of sbpc.compile) talks to rank 0
through a Unix-domain socket and, on one machine, hands feeds over in shared
memory: rank 0 runs on the first host, which must be the driver's own.
Ranks on other hosts get their plans and feeds over MPI from rank 0, and
every pickle the ranks exchange is authenticated with the job's secret
(runtime/rank_auth.py), since ranks on several hosts talk over a network.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

LAUNCHERS = ("ssh", "rsh", "fork", "slurm", "lsf", "sge", "ll")
"""What hydra's `-launcher` takes (besides its default, ssh, or the
resource manager it finds: under Slurm it starts its proxies with srun).
`fork` starts every host's ranks on this machine: how a host list is tried
on one machine."""


class HostsError(ValueError):
    """A host list that cannot place the ranks."""


@dataclass(frozen=True)
class Hosts:
    """Hosts to run ranks on, in rank order, each with the ranks it takes
    (None: an even share of the rest)."""

    names: tuple[str, ...]
    slots: tuple[int | None, ...]
    launcher: str | None = None

    def __post_init__(self) -> None:
        if not self.names:
            raise HostsError("the host list is empty")
        if len(self.slots) != len(self.names):
            raise HostsError("each host needs its slot count (or None)")
        for name, slots in zip(self.names, self.slots, strict=True):
            if not name or any(c.isspace() or c in ",:" for c in name):
                raise HostsError(f"{name!r} is not a host name")
            if slots is not None and slots < 1:
                raise HostsError(f"host {name} takes {slots} ranks: give at least 1")
        if self.launcher is not None and self.launcher not in LAUNCHERS:
            raise HostsError(f"unknown launcher {self.launcher!r} (one of {', '.join(LAUNCHERS)})")

    @staticmethod
    def parse(text: str, launcher: str | None = None) -> Hosts:
        """`a,b` or `a:2,b:2` (hydra's `-hosts` syntax)."""
        entries = [e.strip() for e in text.split(",")]
        if not text.strip() or not all(entries):
            raise HostsError(f"{text!r} is not a host list (write host[:ranks],host[:ranks],...)")
        return Hosts(*_entries(entries, text), launcher=launcher)

    @staticmethod
    def from_file(path: str | os.PathLike, launcher: str | None = None) -> Hosts:
        """A hostfile as hydra reads one: a `host[:ranks]` per line, `#` comments."""
        try:
            text = Path(path).read_text()
        except OSError as e:
            raise HostsError(f"cannot read the hostfile {path}: {e.strerror}") from None
        entries = [line.split("#", 1)[0].strip() for line in text.splitlines()]
        entries = [e for e in entries if e]
        if not entries:
            raise HostsError(f"the hostfile {path} names no host")
        return Hosts(*_entries(entries, str(path)), launcher=launcher)

    @staticmethod
    def of(value: Hosts | str | Sequence[str] | None, launcher: str | None = None) -> Hosts | None:
        """What a `hosts=` argument gives: a Hosts, a `a:2,b:2` list, or host names."""
        if value is None or isinstance(value, Hosts):
            return value
        if isinstance(value, str):
            return Hosts.parse(value, launcher)
        if isinstance(value, list | tuple) and all(isinstance(v, str) for v in value):
            return Hosts.parse(",".join(value), launcher)
        raise HostsError(f"hosts must be 'host[:ranks],...', a list of host names or a sbpc.Hosts, got {value!r}")

    @property
    def several(self) -> bool:
        """Whether the ranks run on more than one host (as MPI sees it: the
        fork launcher runs "hosts" that are all this machine)."""
        return len(self.names) > 1

    def all_here(self) -> bool:
        """Whether every host is this machine (a list tried here with the
        fork launcher): then nothing of the job needs more than loopback
        (runtime/launch.py, confine_to_loopback)."""
        return all(is_this_machine(name) for name in self.names)

    def ranks_per_host(self, ranks: int) -> list[int]:
        """How many of `ranks` each host runs, node-major."""
        fixed = sum(s for s in self.slots if s is not None)
        free = [i for i, s in enumerate(self.slots) if s is None]
        if fixed > ranks or (fixed < ranks and not free) or (free and ranks - fixed < len(free)):
            raise HostsError(f"{self} cannot place {ranks} ranks: "
                             + (f"its counts add up to {fixed}" if not free else
                                f"{ranks - fixed} ranks left for {len(free)} hosts without a count"))
        counts = [s or 0 for s in self.slots]
        share, extra = divmod(ranks - fixed, len(free)) if free else (0, 0)
        for k, i in enumerate(free):
            counts[i] = share + (k < extra)
        return counts

    def host_of_rank(self, ranks: int) -> list[int]:
        """The host index of each rank."""
        return [h for h, n in enumerate(self.ranks_per_host(ranks)) for _ in range(n)]

    def elsewhere(self, ranks: int) -> list[int]:
        """The ranks that run on other hosts than the first (the driver's)."""
        return [r for r, h in enumerate(self.host_of_rank(ranks)) if h != 0]

    def mpiexec_options(self, ranks: int) -> list[str]:
        """hydra's options that place `ranks` ranks on these hosts."""
        counts = self.ranks_per_host(ranks)
        used = [f"{name}:{n}" for name, n in zip(self.names, counts, strict=True) if n]
        return ["-hosts", ",".join(used), *(["-launcher", self.launcher] if self.launcher else [])]

    def check_driver_host(self) -> None:
        """Rank 0 runs on the first host, which must be this machine."""
        if not is_this_machine(self.names[0]):
            raise HostsError(f"the first host, {self.names[0]}, must be this machine ({socket.gethostname()}): "
                             "rank 0 talks to this process through a local socket; put this machine first")

    def __str__(self) -> str:
        return ",".join(n if s is None else f"{n}:{s}" for n, s in zip(self.names, self.slots, strict=True))


def _entries(entries: list[str], where: str) -> tuple[tuple[str, ...], tuple[int | None, ...]]:
    names: list[str] = []
    slots: list[int | None] = []
    for entry in entries:
        name, colon, count = entry.partition(":")
        if colon and not count.strip().isdigit():
            raise HostsError(f"{entry!r} in {where}: the rank count after ':' must be a whole number")
        names.append(name.strip())
        slots.append(int(count) if colon else None)
    return tuple(names), tuple(slots)


def is_this_machine(name: str) -> bool:
    """Whether `name` is this machine: its name, localhost, or an address
    that resolves to a loopback or one of this machine's own addresses."""
    if name in ("localhost", socket.gethostname(), socket.getfqdn()):
        return True
    try:
        address = socket.gethostbyname(name)
    except OSError:
        return False
    if address.startswith("127."):
        return True
    try:
        own = {info[4][0] for info in socket.getaddrinfo(socket.gethostname(), None)}
    except OSError:
        own = set()
    return address in own


def on_driver_node(world) -> tuple[bool, bool]:
    """(whether this rank runs on rank 0's machine, whether the job spans
    several machines), as MPI places the ranks: a rank that does not share
    a node with rank 0 cannot reach the driver's folder or shared memory."""
    import numpy as np
    from mpi4py import MPI

    node = world.Split_type(MPI.COMM_TYPE_SHARED)
    leader = np.array([world.rank], np.int64)  # the node's lowest world rank
    node.Bcast(leader, root=0)
    several = node.Get_size() < world.Get_size()
    node.Free()
    return int(leader[0]) == 0, several
