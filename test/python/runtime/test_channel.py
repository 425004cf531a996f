"""Only the user's own ranks talk to the driver: the rank pool's channel is a
Unix-domain socket in the job's private folder, and both ends prove the job's
secret before a pickle moves (runtime/channel.py). The attacker of the
front-door issue is played here: a local process that finds whatever the
driver listens on, connects before rank 0 and answers with a pickle that
would run its code in the driver."""

from __future__ import annotations

import contextlib
import os
import pickle
import socket
import stat
import struct
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[3]


class _RunsCode:
    """Unpickling this runs a shell command (what an attacker sends)."""

    def __init__(self, command: str):
        self.command = command

    def __reduce__(self):
        return (os.system, (self.command,))


def _socket_inodes(pid: int) -> set[str]:
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").glob("*"):
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    return inodes


def _listening_tcp(pid: int) -> dict[str, int]:
    """The TCP sockets `pid` listens on (IPv4 and IPv6, state 0A): inode -> port."""
    inodes = _socket_inodes(pid)
    found = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError):
            for line in Path(table).read_text().splitlines()[1:]:
                fields = line.split()
                if fields[3] == "0A" and fields[9] in inodes:
                    found[fields[9]] = int(fields[1].split(":")[1], 16)
    return found


def _listening_tcp_ports(pid: int) -> list[int]:
    return sorted(_listening_tcp(pid).values())


def _unix_sockets(folder: Path) -> list[Path]:
    found = []
    for path in folder.rglob("*"):
        try:
            if stat.S_ISSOCK(path.lstat().st_mode):
                found.append(path)
        except OSError:
            continue
    return found


def _connect_unix(path: Path) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    fd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)  # a deep tmp_path is longer than sun_path
    try:
        sock.connect(f"/proc/self/fd/{fd}/{path.name}")
    finally:
        os.close(fd)
    return sock


def _answer(connect, payload: bytes, found: dict, key: str) -> None:
    try:
        sock = connect()
    except OSError:
        return
    found[key] = "connected"
    with sock:
        sock.settimeout(30)
        try:
            first = sock.recv(1 << 16)  # what the driver says first (a command, a challenge)
            if first:
                sock.sendall(payload)
                found[key] = "answered"
                sock.recv(1 << 16)
        except OSError:
            pass


def attack(driver_pid: int, folder: Path, payload: bytes, found: dict, until: threading.Event) -> None:
    """Connects to everything the driver listens on (each loopback TCP port
    it holds, each Unix socket in its TMPDIR) as soon as it appears, and
    answers whatever the driver says first with `payload`."""
    tried: set = set()
    while not until.is_set():
        with contextlib.suppress(OSError):
            for port in _listening_tcp_ports(driver_pid):
                if port not in tried:
                    tried.add(port)
                    threading.Thread(target=_answer, daemon=True, args=(
                        lambda p=port: socket.create_connection(("127.0.0.1", p)), payload, found, f"tcp:{port}",
                    )).start()
        for path in _unix_sockets(folder):
            if path not in tried:
                tried.add(path)
                threading.Thread(target=_answer, daemon=True, args=(
                    lambda p=path: _connect_unix(p), payload, found, f"unix:{path.name}",
                )).start()
        time.sleep(0.005)


def test_a_process_that_connects_first_is_refused_and_the_job_runs(tmp_path):
    marker = tmp_path / "the-attackers-code-ran"
    evil = pickle.dumps(("ok", _RunsCode(f"touch {marker}")), protocol=pickle.HIGHEST_PROTOCOL)
    payload = struct.pack("!Q", len(evil)) + evil
    script = tmp_path / "driver.py"
    script.write_text(textwrap.dedent(f"""
        import os
        import sys
        sys.path.insert(0, {str(ROOT / "examples")!r})
        import models
        import sbpc

        exe = sbpc.compile(models.mlp("dp", 2))
        print("LOSS:", float(exe.train_step(next(models.mlp_batches()))["loss"]), flush=True)
        sys.path.insert(0, {str(Path(__file__).parent)!r})
        from test_channel import _listening_tcp_ports
        print("TCP:", _listening_tcp_ports(os.getpid()), flush=True)
    """))
    driver = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, env={**os.environ, "TMPDIR": str(tmp_path)})
    found: dict = {}
    done = threading.Event()
    attacker = threading.Thread(target=attack, args=(driver.pid, tmp_path, payload, found, done), daemon=True)
    attacker.start()
    try:
        out, err = driver.communicate(timeout=120)
    finally:
        done.set()
        if driver.poll() is None:
            driver.kill()
    attacker.join(30)
    assert found, "the attacker found nothing to connect to"
    assert not marker.exists(), "the driver unpickled the attacker's answer and ran its code"
    assert driver.returncode == 0, err
    assert "sbpc: refused a connection to the rank pool at " in err, err
    assert "it did not prove it knows the job's secret (nothing it sent was unpickled)" in err, err
    assert np.isfinite(float(next(ln for ln in out.splitlines() if ln.startswith("LOSS:")).split()[1]))
    # and nothing of the driver's listens on TCP (an MPI singleton's process
    # manager did, on every interface, before the driver stopped importing MPI)
    assert "TCP: []" in out, out


def _private(tmp_path: Path, name: str = "job") -> Path:
    folder = tmp_path / name
    folder.mkdir(mode=0o700)
    return folder


def _wait_for(condition, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_the_driver_serves_only_a_peer_that_proves_the_secret(tmp_path, monkeypatch):
    from sbpc.runtime import channel

    monkeypatch.setattr(channel, "HANDSHAKE_S", 0.5)
    job = _private(tmp_path)
    listener = channel.Listener(job)
    assert stat.S_IMODE((job / channel.SECRET_NAME).stat().st_mode) == 0o600
    assert stat.S_IMODE((job / channel.SOCKET_NAME).stat().st_mode) == 0o600
    served: dict = {}
    driver = threading.Thread(target=lambda: served.update(sock=listener.accept(timeout=30)))
    driver.start()
    # a peer that says nothing is dropped after HANDSHAKE_S
    silent = _connect_unix(job / channel.SOCKET_NAME)
    _wait_for(lambda: listener.refused == 1)
    silent.close()
    # one that answers with the wrong secret is refused
    impostor = _private(tmp_path, "impostor")
    (impostor / channel.SECRET_NAME).write_bytes(b"x" * channel.NONCE_BYTES)
    os.symlink(job / channel.SOCKET_NAME, impostor / channel.SOCKET_NAME)
    with pytest.raises(ConnectionError):
        channel.connect(impostor)
    _wait_for(lambda: listener.refused == 2)
    # the rank that knows it is served
    rank = channel.connect(job)
    driver.join(30)
    channel.send(rank, ("hello", 1))
    assert channel.receive(served["sock"]) == ("hello", 1)
    listener.close()
    assert not (job / channel.SOCKET_NAME).exists()
    rank.close()
    served["sock"].close()


def test_a_rank_refuses_a_driver_that_cannot_prove_the_secret(tmp_path):
    from sbpc.runtime import channel

    job = _private(tmp_path)
    (job / channel.SECRET_NAME).write_bytes(b"s" * channel.NONCE_BYTES)
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    fd = os.open(job, os.O_RDONLY | os.O_DIRECTORY)
    try:
        server.bind(f"/proc/self/fd/{fd}/{channel.SOCKET_NAME}")
    finally:
        os.close(fd)
    server.listen(1)

    def fake_driver():  # challenges, takes any answer, and proves nothing
        sock, _ = server.accept()
        with sock:
            sock.sendall(os.urandom(channel.NONCE_BYTES))
            channel.exactly(sock, 2 * channel.NONCE_BYTES)
            sock.sendall(os.urandom(channel.NONCE_BYTES))
            time.sleep(0.5)

    thread = threading.Thread(target=fake_driver)
    thread.start()
    with pytest.raises(channel.ChannelRefused, match="did not prove it is this job's driver"):
        channel.connect(job)
    thread.join(10)
    server.close()


def test_a_channel_is_made_only_in_a_private_folder(tmp_path):
    from sbpc.runtime import channel

    folder = tmp_path / "shared"
    folder.mkdir(mode=0o755)
    folder.chmod(0o755)
    with pytest.raises(PermissionError, match="readable by other users"):
        channel.Listener(folder)


def test_the_pools_files_are_the_users_alone():
    # The rank pool's folder, its records and a step's shared-memory feeds
    # can be read by the user alone, and the driver listens on no TCP port.
    import sbpc
    from sbpc.api import RankPool
    from sbpc.runtime import channel

    sys.path.insert(0, str(ROOT / "examples"))
    import models

    exe = sbpc.compile(models.mlp("dp", 2, batch=1024))
    feeds = next(models.mlp_batches(batch=1024))
    exe.train_step(feeds)
    pool = RankPool.pools[(2, None)]
    job = Path(pool.errors.name)
    assert stat.S_IMODE(job.stat().st_mode) == 0o700
    assert stat.S_IMODE((job / channel.SECRET_NAME).stat().st_mode) == 0o600
    assert not (job / channel.SOCKET_NAME).exists()  # removed once rank 0 is in
    assert sorted(p.name for p in job.glob("rank*.progress")) == ["rank0.progress", "rank1.progress"]
    for block in pool.feeds.blocks.values():
        assert stat.S_IMODE(os.stat(f"/dev/shm/{block.name.lstrip('/')}").st_mode) == 0o600
    assert pool.feeds.blocks, "the test's feeds are large enough to travel in shared memory"


def test_the_ranks_listen_on_no_tcp_port_of_their_own():
    # MPICH's network module (UCX) listened on every interface in every
    # rank; only the launcher's own control socket (mpiexec's, which its
    # ranks inherit) is left
    import sbpc
    from sbpc.api import RankPool
    from sbpc.runtime.progress import records

    sys.path.insert(0, str(ROOT / "examples"))
    import models

    sbpc.compile(models.mlp("dp", 2)).train_step(next(models.mlp_batches()))
    pool = RankPool.pools[(2, None)]
    launcher = set(_listening_tcp(pool.process.pid))
    ranks = records(pool.errors.name, 2)
    assert len(ranks) == 2
    for pid, _, _ in ranks.values():
        assert set(_listening_tcp(pid)) <= launcher, _listening_tcp(pid)
