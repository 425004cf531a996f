"""Starting MPI ranks: the `mpiexec` that the mpich wheel installs next to
the Python interpreter, one thread of BLAS per rank (ranks share cores),
and, when every rank runs on this machine, nothing of the job reachable
from the network (confine_to_loopback)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
import warnings
from collections.abc import Collection
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .hosts import Hosts


def mpiexec() -> str:
    here = Path(sys.executable).parent / "mpiexec"
    if here.exists():
        return str(here)
    found = shutil.which("mpiexec")
    if found is None:
        raise RuntimeError("no mpiexec: install the mpich wheel (pip install mpich) into this environment")
    return found


def rank_environment(hosts: Hosts | None = None, secret: str | None = None) -> dict[str, str]:
    """The ranks' environment: one BLAS thread each, the job's secret
    (runtime/rank_auth.py: a new one unless given), and, on one machine, UCX
    (the mpich wheel's network module) on shared memory alone: MPICH moves
    messages through shared memory there anyway, and UCX's default
    transports also opened TCP listeners on every interface in every rank.
    Across hosts UCX picks the network it finds (set UCX_TLS and
    UCX_NET_DEVICES to confine it to the cluster's interconnect). It is
    also mpiexec's environment: where every host is this machine, the
    launcher and the ranks listen on loopback alone (confine_to_loopback)."""
    from .rank_auth import SECRET_VARIABLE, new_secret

    env = dict(os.environ)
    for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        env.setdefault(var, "1")
    if hosts is None or not hosts.several:
        env.setdefault("UCX_TLS", "self,sm")
    if hosts is None or hosts.all_here():
        confine_to_loopback(env)
    env[SECRET_VARIABLE] = secret or new_secret()
    return env


LOOPBACK_INTERFACE = "lo"
RANK_INTERFACE_VARIABLES = ("UCX_NET_DEVICES", "FI_TCP_IFACE", "FI_SOCKETS_IFACE")
"""Where the ranks' network modules listen: UCX (the wheel's default) and
libfabric's tcp and sockets providers (MPIR_CVAR_CH4_NETMOD=ofi). Unset,
each listened on this machine's external address in every rank (UCX when
UCX_TLS is not self,sm; libfabric always), even with every rank here."""
OTHER_PRELOAD_VARIABLE = "SBPC_OTHER_LD_PRELOAD"
"""The LD_PRELOAD the user gave, which the loopback shim puts back for the
processes mpiexec starts (LOOPBACK_SHIM names it too)."""


def confine_to_loopback(env: dict[str, str]) -> None:
    """Makes a job whose every rank runs on this machine listen on loopback
    alone, in `env` (mpiexec's and the ranks'). hydra's mpiexec listens for
    its proxies on every interface (0.0.0.0: MPICH's HYDU_sock_listen binds
    INADDR_ANY whatever the options; -iface and -localhost only change the
    address it tells the proxies), and its proxies and ranks inherit that
    socket: anyone who reached the port could talk hydra's protocol to it.
    So mpiexec runs with a shim (LOOPBACK_SHIM) that binds its sockets to
    loopback instead, and HYDRA_IFACE=lo tells the proxies that address
    (forced: another interface's address would not reach the shim's
    socket). The ranks' network modules are confined to loopback too (a
    user's own setting of theirs is kept). Where the shim cannot be built
    (no C compiler) mpiexec still listens on every interface, and a warning
    says so once."""
    env["HYDRA_IFACE"] = LOOPBACK_INTERFACE
    for var in RANK_INTERFACE_VARIABLES:
        env.setdefault(var, LOOPBACK_INTERFACE)
    shim = loopback_shim()
    if shim is None:
        return
    others = env.get("LD_PRELOAD", "")
    env[OTHER_PRELOAD_VARIABLE] = others
    env["LD_PRELOAD"] = f"{shim} {others}".strip()


LOOPBACK_SHIM = r"""
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <dlfcn.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

/* Loaded into mpiexec (LD_PRELOAD): a socket bound to every interface is
   bound to loopback instead (hydra listens on INADDR_ANY, whatever its options). */

static int (*next_bind)(int, const struct sockaddr *, socklen_t);

int bind(int fd, const struct sockaddr *address, socklen_t length)
{
    if (next_bind == NULL) {
        errno = ENOSYS;
        return -1;
    }
    if (address != NULL && address->sa_family == AF_INET && length >= sizeof(struct sockaddr_in)) {
        struct sockaddr_in v4;
        memcpy(&v4, address, sizeof v4);
        if (v4.sin_addr.s_addr == htonl(INADDR_ANY)) {
            v4.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
            return next_bind(fd, (const struct sockaddr *) &v4, sizeof v4);
        }
    } else if (address != NULL && address->sa_family == AF_INET6 && length >= sizeof(struct sockaddr_in6)) {
        struct sockaddr_in6 v6;
        memcpy(&v6, address, sizeof v6);
        if (IN6_IS_ADDR_UNSPECIFIED(&v6.sin6_addr)) {
            v6.sin6_addr = in6addr_loopback;
            return next_bind(fd, (const struct sockaddr *) &v6, sizeof v6);
        }
    }
    return next_bind(fd, address, length);
}

/* mpiexec alone: hydra reads the environment it passes to its proxies and
   ranks after this runs, so they get the user's LD_PRELOAD back, not this
   (a proxy listens on nothing; the ranks' network modules are confined by
   their own settings, and a socket a user's code binds in a rank stays as bound). */
__attribute__((constructor)) static void mpiexec_alone(void)
{
    next_bind = (int (*)(int, const struct sockaddr *, socklen_t)) dlsym(RTLD_NEXT, "bind");
    const char *others = getenv("SBPC_OTHER_LD_PRELOAD");
    if (others != NULL && *others != '\0')
        setenv("LD_PRELOAD", others, 1);
    else
        unsetenv("LD_PRELOAD");
    unsetenv("SBPC_OTHER_LD_PRELOAD");
}
"""


@cache
def loopback_shim() -> str | None:
    """The shared library of LOOPBACK_SHIM, built once per machine with the
    C compiler that builds the host kernels (and cached with them), or None,
    with a warning, where it cannot be built or preloaded."""
    from .host_kernels import BuildError, build

    try:
        path = str(build(LOOPBACK_SHIM, ("-ldl",)))
    except (BuildError, OSError) as e:
        why = str(e).splitlines()[0] if str(e) else type(e).__name__
    else:
        if not any(c.isspace() or c == ":" for c in path):
            return path
        why = f"its path, {path}, has a space or colon, which LD_PRELOAD cannot hold"
    warnings.warn(f"sbpc: mpiexec listens on every network interface: the loopback shim is not available ({why})",
                  RuntimeWarning, stacklevel=2)
    return None


def command(n: int, module: str, *args: str, hosts: Hosts | None = None) -> list[str]:
    """mpiexec running `python -m module args` on n ranks (on `hosts`, rank 0
    on the first, which must be this machine)."""
    return [*launcher(n, hosts), sys.executable, "-m", module, *args]


def script_command(n: int, script: str, *args: str, hosts: Hosts | None = None) -> list[str]:
    """mpiexec running `python script args` on n ranks."""
    return [*launcher(n, hosts), sys.executable, script, *args]


def launcher(n: int, hosts: Hosts | None) -> list[str]:
    """mpiexec and its options for n ranks: on this machine, or placed on `hosts`."""
    if hosts is None:
        return [mpiexec(), *binding(n), "-n", str(n)]
    hosts.check_driver_host()
    return [mpiexec(), *hosts.mpiexec_options(n), "-n", str(n)]


def usable_cpus() -> list[int]:
    """The logical CPUs (cores, or hardware threads where a core has
    several) this process, and the ranks it starts, may run on."""
    if hasattr(os, "sched_getaffinity"):
        return sorted(os.sched_getaffinity(0))
    return list(range(os.cpu_count() or 1))


def binding(n: int) -> list[str]:
    """mpiexec's binding options for n ranks on this machine. Where they
    outnumber the CPUs this process may use, each rank is bound to one of
    them, round robin (rank i on the (i mod CPUs)-th), as Open MPI binds by
    default: left to the OS, which ranks share a CPU changed from job to job,
    and with it what every collective costs (the calibrated cost of a
    collective among 4 ranks on 2 cores came out 65 us in one job and 250 us
    in the next; bound, 165-190 us in every job, and the simulator knows
    which members share a CPU: perf/cluster.py, Level.cores). The CPUs are
    named (hydra's `user:` binding): its `-bind-to hwthread` counts from the
    machine's first CPU, outside a `taskset` the user gave. With a CPU each
    the ranks are left unbound: binding would put another job's ranks on the
    same CPUs as ours."""
    cpus = usable_cpus()
    if n <= len(cpus):
        return []
    return ["-bind-to", "user:" + ",".join(str(cpus[i % len(cpus)]) for i in range(n))]


def stop(process: subprocess.Popen, before: Leftovers) -> None:
    """Ends an mpiexec now: SIGTERM, on which it ends every rank (they
    ignore the terminal's SIGINT: the driver decides), and at worst SIGKILL;
    then removes what the job left (`before`: taken before it started),
    waiting a moment for ranks that still map their segments as they exit."""
    process.terminate()
    try:
        process.wait(timeout=20)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
    before.remove_new()


@dataclass(frozen=True)
class Leftovers:
    """What MPICH leaves on this machine when a job does not end normally (a
    rank killed by a signal, MPI_Abort), as it was before a job started: its
    shared-memory segments and hydra's topology files. `remove_new` removes
    what the job left, once it ended."""

    segments: frozenset[str]
    topology_files: frozenset[str]

    @staticmethod
    def now() -> Leftovers:
        return Leftovers(frozenset(segments()), frozenset(hydra_topology_files()))

    def remove_new(self, wait: float = 3.0) -> None:
        remove_orphaned_segments(before=self.segments, wait=wait)
        remove_hydra_topology_files(self.topology_files)


JOB_FOLDER_PREFIX = "sbpc-pool-"
"""A rank pool's job folder (its channel, the ranks' progress records and
failure reports) in the temporary directory: `tempfile`'s, made by the
driver (runtime/pool_client.py)."""
DRIVER_FILE = "driver"
"""In a job folder: its driver's `process_identity`, so that what a dead
driver left can be told from a live job's."""


def process_identity(pid: int) -> str | None:
    """'pid start-time' of a live process (its start in clock ticks since
    boot tells a reused pid apart), None once it is gone: ended, or a
    zombie its parent has not reaped yet."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    if fields[0] in ("Z", "X"):  # field 3, the state
        return None
    return f"{pid} {fields[19]}"  # field 22 of proc(5), the 20th after the command's ")"


def mark_job_folder(folder: str | os.PathLike) -> None:
    """Records this process as the driver of the job folder `folder`."""
    identity = process_identity(os.getpid())
    if identity is not None:
        (Path(folder) / DRIVER_FILE).write_text(identity)


def driver_gone(folder: str | os.PathLike) -> bool:
    """Whether the driver a job folder records has ended (a folder with no
    record, or one that cannot be read, is not judged: False)."""
    try:
        recorded = (Path(folder) / DRIVER_FILE).read_text().strip()
        pid = int(recorded.split()[0])
    except (OSError, ValueError, IndexError):
        return False
    return process_identity(pid) != recorded


def remove_dead_jobs(directory: str | os.PathLike | None = None) -> list[str]:
    """Removes this user's job folders in `directory` (the temporary
    directory) whose driver has ended, and returns their names: a driver
    killed by SIGKILL or SIGTERM (the OOM killer, a scheduler's preemption)
    cleans up nothing, and a job whose ranks were killed with it cannot
    either (its rank 0 removes the folder when it outlives the driver,
    runtime/pool.py)."""
    import tempfile

    removed = []
    for folder in Path(directory or tempfile.gettempdir()).glob(JOB_FOLDER_PREFIX + "*"):
        try:
            if folder.stat().st_uid != os.getuid():
                continue
        except OSError:
            continue
        if driver_gone(folder):
            shutil.rmtree(folder, ignore_errors=True)
            removed.append(folder.name)
    return removed


HYDRA_TOPOLOGY_DIR = Path("/tmp")
HYDRA_TOPOLOGY_PREFIX = "hydra_hwloc_xmlfile_"
"""hydra's proxy writes the node's hwloc topology to
/tmp/hydra_hwloc_xmlfile_XXXXXX (a fixed path in MPICH's topo_hwloc.c: no
TMPDIR) for its ranks to read in MPI_Init, and removes it when it ends
normally. A job ended by MPI_Abort or a signal leaves it: 1,432 of them on a
developer's machine after some days of test runs."""


def hydra_topology_files(directory: Path = HYDRA_TOPOLOGY_DIR) -> set[str]:
    """The names of this user's hydra topology files in `directory`."""
    found = set()
    try:
        for path in directory.glob(HYDRA_TOPOLOGY_PREFIX + "*"):
            try:
                if path.stat().st_uid == os.getuid():
                    found.add(path.name)
            except OSError:
                continue
    except OSError:
        pass
    return found


def remove_hydra_topology_files(before: Collection[str], directory: Path = HYDRA_TOPOLOGY_DIR) -> list[str]:
    """Removes this user's hydra topology files that were not there `before`
    (a job that ended leaves at most one per host) and returns their names.
    One that another job of this user started meanwhile may go too: its
    ranks, if they have not read it yet, find the topology themselves (MPICH
    falls back to hwloc's own discovery when the file cannot be read,
    mpir_pmi.c), so nothing fails."""
    removed = []
    for name in sorted(hydra_topology_files(directory) - set(before)):
        try:
            (directory / name).unlink()
        except OSError:
            continue
        removed.append(name)
    return removed


SEGMENT_DIR = Path("/dev/shm")
SEGMENT_GRACE_S = 0.1
"""A segment written this recently may be a starting job's, created and not
yet mapped (microseconds): it is left alone."""


def segments(directory: Path = SEGMENT_DIR) -> set[str]:
    """The names of MPICH's shared-memory segments in `directory`."""
    try:
        return {p.name for p in directory.glob("mpich_shm_*")}
    except OSError:
        return set()


def remove_orphaned_segments(directory: Path = SEGMENT_DIR, before: Collection[str] | None = None,
                             wait: float = 3.0) -> list[str]:
    """Unlinks MPICH's shared-memory segments (`mpich_shm_*`) that no process
    maps any more, and returns their names. MPICH removes its segments when a
    job ends normally, but a rank killed by a signal or MPI_Abort cannot: each
    failed job left a few MiB in /dev/shm until it filled (187 segments, 513
    MB, on a developer's machine). A segment some live process maps (a job of
    this user or another) is kept. Given `before` (the segments that existed
    before a job that failed started), the job's own segments, which its
    ranks may still map while they exit, are waited for, up to `wait` seconds."""
    job = set() if before is None else segments(directory) - set(before)
    removed: list[str] = []
    deadline = time.monotonic() + wait
    while True:
        kept = _sweep(directory, removed)
        if not kept & job or time.monotonic() >= deadline:
            return removed
        time.sleep(0.05)


def orphaned_segments(directory: Path = SEGMENT_DIR) -> set[str]:
    """This user's MPICH segments in `directory` that no live process maps
    and that are older than SEGMENT_GRACE_S."""
    names = segments(directory)
    if not names:
        return set()
    mapped = _mapped_segments(directory)
    now = time.time()
    found = set()
    for name in names - mapped:
        try:
            info = (directory / name).stat()
        except OSError:
            continue
        if now - info.st_mtime >= SEGMENT_GRACE_S and info.st_uid == os.getuid():
            found.add(name)
    return found


def _mapped_segments(directory: Path) -> set[str]:
    """The names of MPICH segments in `directory` that some live process maps."""
    prefix = str(directory / "mpich_shm_")
    mapped: set[str] = set()
    for maps in Path("/proc").glob("[0-9]*/maps"):
        try:
            text = maps.read_text()
        except OSError:  # gone, or another user's (it cannot map our 0600 segments)
            continue
        if "mpich_shm_" in text:
            for line in text.splitlines():
                at = line.find(prefix)
                if at >= 0:
                    mapped.add(Path(line[at:].split(" (deleted)")[0].strip()).name)
    return mapped


def _sweep(directory: Path, removed: list[str]) -> set[str]:
    """One pass of remove_orphaned_segments; the names it kept."""
    orphans = orphaned_segments(directory)
    for name in sorted(orphans):
        try:
            (directory / name).unlink()
        except OSError:
            continue
        removed.append(name)
    return segments(directory) - orphans
