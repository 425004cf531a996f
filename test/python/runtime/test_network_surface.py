"""What a job whose every rank runs on this machine exposes to the network
(runtime/launch.py, confine_to_loopback): nothing but loopback. hydra's
mpiexec listened on 0.0.0.0 for its proxies (and its proxies and ranks
inherit that socket); the ranks' network modules listened on the
machine's external address. Read from /proc: every listening TCP socket
and unconnected UDP socket of the pool's process tree."""

from __future__ import annotations

import ipaddress
import os
import socket
import time
from pathlib import Path

import pytest

from sbpc.runtime.host_kernels import compiler
from sbpc.runtime.hosts import Hosts
from sbpc.runtime.launch import OTHER_PRELOAD_VARIABLE, RANK_INTERFACE_VARIABLES, loopback_shim, rank_environment
from sbpc.runtime.pool_client import RankPool

pytestmark = pytest.mark.skipif(compiler() is None, reason="no C compiler to build the loopback shim with: "
                                "here mpiexec listens on every interface (launch.confine_to_loopback)")

TCP_LISTEN = "0A"
UDP_UNCONNECTED = "07"
"""The states in /proc/net/{tcp,udp}[6] of a socket that takes connections
or datagrams from anyone (include/net/tcp_states.h: TCP_LISTEN, TCP_CLOSE)."""


def _process_tree(root: int) -> dict[int, str]:
    """`root` and every process under it, with its start time (pids are
    reused: a pid with another start time is another process)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        fields = _stat_fields(stat)
        if fields is not None:
            children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    tree: dict[int, str] = {}
    waiting = [root]
    while waiting:
        pid = waiting.pop()
        fields = _stat_fields(Path(f"/proc/{pid}/stat"))
        if fields is not None:
            tree[pid] = fields[19]
            waiting += children.get(pid, [])
    return tree


def _stat_fields(stat: Path) -> list[str] | None:
    """The fields of /proc/PID/stat after the command's name (state, ppid,
    ...; field 22, the start time, is [19]), or None for a process gone."""
    try:
        text = stat.read_text()
    except OSError:
        return None
    return text[text.rfind(")") + 2:].split()


def _name(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return "?"


def _socket_inodes(pid: int) -> set[str]:
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:  # closed meanwhile
            continue
        if target.startswith("socket:["):
            inodes.add(target[len("socket:["):-1])
    return inodes


def _address(hex_address: str) -> str:
    """An address as /proc/net/* writes it: 32-bit words in the host's order (little-endian here)."""
    raw = bytes.fromhex(hex_address)
    words = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
    return socket.inet_ntop(socket.AF_INET if len(raw) == 4 else socket.AF_INET6, words)


def listening_sockets(pid: int) -> list[tuple[str, str, int]]:
    """(protocol, address, port) of each socket process `pid` holds that
    listens: TCP in LISTEN, UDP not connected to a peer."""
    inodes = _socket_inodes(pid)
    found = []
    for protocol, listening in (("tcp", TCP_LISTEN), ("tcp6", TCP_LISTEN), ("udp", UDP_UNCONNECTED),
                                ("udp6", UDP_UNCONNECTED)):
        try:
            lines = Path(f"/proc/{pid}/net/{protocol}").read_text().splitlines()[1:]
        except OSError:  # no IPv6 here
            continue
        for line in lines:
            fields = line.split()
            local, state, inode = fields[1], fields[3], fields[9]
            if inode in inodes and state == listening:
                address, port = local.split(":")
                found.append((protocol, _address(address), int(port, 16)))
    return found


def test_a_pool_on_this_machine_listens_on_loopback_alone():
    assert loopback_shim() is not None
    pool = RankPool(2)
    try:
        tree = _process_tree(pool.process.pid)
        names = {pid: _name(pid) for pid in tree}
        sockets = {pid: listening_sockets(pid) for pid in tree}
        environments = {pid: Path(f"/proc/{pid}/environ").read_bytes().split(b"\0") for pid in tree
                        if pid != pool.process.pid}
    finally:
        pool.close()
    described = "; ".join(f"{names.get(pid, '?')} (pid {pid}): {found}" for pid, found in sockets.items())
    assert len(tree) == 4, f"mpiexec, its proxy and 2 ranks: {described}"
    # hydra always listens (its proxies connect back to mpiexec): no socket found would mean the test saw nothing
    assert sockets[pool.process.pid], f"mpiexec holds no listening socket: {described}"
    exposed = [(pid, s) for pid, found in sockets.items() for s in found
               if not ipaddress.ip_address(s[1]).is_loopback]
    assert not exposed, f"listening beyond loopback: {described}"
    # the shim is mpiexec's alone: the proxies and ranks get the user's LD_PRELOAD back
    shim = str(loopback_shim()).encode()
    for pid, environment in environments.items():
        assert not any(shim in v or v.startswith(OTHER_PRELOAD_VARIABLE.encode()) for v in environment), \
            f"{names[pid]} (pid {pid}) runs with the shim"
    _assert_gone(tree)


def _assert_gone(tree: dict[int, str]) -> None:
    """No process of the job is left (a pid alive with the same start time)."""
    deadline = time.monotonic() + 10
    while True:
        left = {pid for pid, started in tree.items()
                if (fields := _stat_fields(Path(f"/proc/{pid}/stat"))) is not None and fields[19] == started
                and fields[0] != "Z"}
        if not left or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert not left, f"processes of the job left: {sorted(left)}"


def test_only_a_job_on_this_machine_is_confined_to_loopback(monkeypatch):
    monkeypatch.setenv("LD_PRELOAD", "libuser.so")
    monkeypatch.setenv("HYDRA_IFACE", "eth7")
    monkeypatch.setenv("UCX_NET_DEVICES", "mlx5_0:1")
    here = rank_environment()
    assert here["HYDRA_IFACE"] == "lo", "the proxies must be told the address the shim binds"
    assert here["UCX_NET_DEVICES"] == "mlx5_0:1", "a user's own choice for the ranks is kept"
    assert here["FI_TCP_IFACE"] == here["FI_SOCKETS_IFACE"] == "lo"
    assert here["LD_PRELOAD"] == f"{loopback_shim()} libuser.so" and here[OTHER_PRELOAD_VARIABLE] == "libuser.so"
    tried_here = rank_environment(Hosts.parse("localhost:1,127.0.0.1:1", launcher="fork"))
    assert tried_here["HYDRA_IFACE"] == "lo" and tried_here["LD_PRELOAD"] == here["LD_PRELOAD"]
    # ranks on other machines need the real interfaces: the environment is the user's
    cluster = rank_environment(Hosts.parse("localhost:1,node9.invalid:1"))
    assert cluster["HYDRA_IFACE"] == "eth7" and cluster["LD_PRELOAD"] == "libuser.so"
    assert OTHER_PRELOAD_VARIABLE not in cluster
    assert all(cluster.get(var) == os.environ.get(var) for var in RANK_INTERFACE_VARIABLES)
