"""The private channel between a driver and rank 0 of its rank pool.

Commands and replies are pickles, and unpickling runs code, so nothing is
unpickled from a peer that has not proved it belongs to the job. Two locks:

- The channel is a Unix-domain socket inside the job's own directory, which
  `tempfile` makes 0700: another user cannot reach it (the loopback TCP port
  it replaced was open to every local process, and whoever connected first
  was served).
- A secret of the job (32 random bytes, in a 0600 file of that directory;
  never on a command line, which every user can read in /proc) is proved
  both ways before any pickle moves, with HMAC-SHA256 over a fresh
  challenge from each side, as `multiprocessing.connection` checks an
  authkey. A process of the same user that connects first is refused with a
  message and the driver goes on waiting for its own rank 0.

Messages are length-prefixed pickles.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import os
import pickle
import secrets
import socket
import struct
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

SOCKET_NAME = "pool.sock"
SECRET_NAME = "secret"
NONCE_BYTES = 32
HANDSHAKE_S = 10.0
"""Seconds a peer has to answer the challenge: one that connects and says
nothing cannot hold the driver for longer."""
MAX_UNIX_PATH = 100
"""Below sun_path's 108 bytes, with room for the terminating NUL."""


class ChannelRefused(ConnectionError):
    """A peer that did not prove it knows the job's secret."""


def send(sock: socket.socket, obj) -> None:
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    sock.sendall(struct.pack("!Q", len(data)) + data)


def receive(sock: socket.socket):
    """The next message. Call only on an authenticated socket."""
    header = exactly(sock, 8)
    return pickle.loads(exactly(sock, struct.unpack("!Q", header)[0]))


def exactly(sock: socket.socket, n: int) -> bytes:
    chunks = []
    while n:
        chunk = sock.recv(min(n, 1 << 20))
        if not chunk:
            raise ConnectionError("the other side closed the connection")
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


def _proof(secret: bytes, role: bytes, nonce: bytes) -> bytes:
    return hmac.new(secret, role + nonce, hashlib.sha256).digest()


@contextlib.contextmanager
def _address(directory: Path) -> Iterator[str]:
    """The socket's path, short enough for sun_path: a long directory (a
    deep TMPDIR) is reached through this process's descriptor of it."""
    path = str(directory / SOCKET_NAME)
    if len(path.encode()) <= MAX_UNIX_PATH:
        yield path
        return
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        yield f"/proc/self/fd/{fd}/{SOCKET_NAME}"
    finally:
        os.close(fd)


class Listener:
    """The driver's end: the socket and the secret in `directory` (which
    must be private to the user: a `tempfile` directory is)."""

    def __init__(self, directory: str | os.PathLike):
        self.directory = Path(directory)
        if self.directory.stat().st_mode & 0o077:
            raise PermissionError(f"{self.directory} is readable by other users: not a place for a job's secret")
        self.secret = secrets.token_bytes(NONCE_BYTES)
        fd = os.open(self.directory / SECRET_NAME, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(self.secret)
        self.server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        with _address(self.directory) as address:
            self.server.bind(address)
        os.chmod(self.directory / SOCKET_NAME, 0o600)
        self.server.listen(4)
        self.refused = 0

    def accept(self, timeout: float, waiting: Callable[[], bool] = lambda: True) -> socket.socket:
        """The first connection that proves it knows the secret, within
        `timeout` seconds and while `waiting()` holds (TimeoutError
        otherwise: the ranks' launcher ended, say). Each connection that does
        not prove it is closed, and said so on stderr."""
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not waiting():
                raise TimeoutError("no rank connected")
            self.server.settimeout(min(left, 0.25))
            try:
                sock, _ = self.server.accept()
            except TimeoutError:
                continue
            try:
                self._challenge(sock)
            except (ChannelRefused, OSError) as e:
                sock.close()
                self.refused += 1
                print(f"sbpc: refused a connection to the rank pool at {self.directory / SOCKET_NAME}: {e}; "
                      "still waiting for the job's own rank 0", file=sys.stderr, flush=True)
                continue
            sock.settimeout(None)
            return sock

    def _challenge(self, sock: socket.socket) -> None:
        sock.settimeout(HANDSHAKE_S)
        nonce = secrets.token_bytes(NONCE_BYTES)
        sock.sendall(nonce)
        answer = exactly(sock, 2 * NONCE_BYTES)
        if not hmac.compare_digest(answer[:NONCE_BYTES], _proof(self.secret, b"rank", nonce)):
            raise ChannelRefused("it did not prove it knows the job's secret (nothing it sent was unpickled)")
        sock.sendall(_proof(self.secret, b"driver", answer[NONCE_BYTES:]))

    def close(self) -> None:
        """No more connections: the socket's file goes too."""
        self.server.close()
        with contextlib.suppress(OSError):
            (self.directory / SOCKET_NAME).unlink()


def connect(directory: str | os.PathLike) -> socket.socket:
    """Rank 0's end: connects to the driver's socket in `directory` and
    proves the secret both ways (ChannelRefused if the driver cannot)."""
    directory = Path(directory)
    secret = (directory / SECRET_NAME).read_bytes()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.settimeout(HANDSHAKE_S)
        with _address(directory) as address:
            sock.connect(address)
        challenge = exactly(sock, NONCE_BYTES)
        nonce = secrets.token_bytes(NONCE_BYTES)
        sock.sendall(_proof(secret, b"rank", challenge) + nonce)
        if not hmac.compare_digest(exactly(sock, NONCE_BYTES), _proof(secret, b"driver", nonce)):
            raise ChannelRefused(f"the process at {directory / SOCKET_NAME} did not prove it is this job's driver")
        sock.settimeout(None)
        return sock
    except BaseException:
        sock.close()
        raise
