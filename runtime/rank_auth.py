"""The job's secret on the ranks' own messages.

mpi4py pickles what its lowercase calls (bcast, gather, allreduce of Python
objects) send, and unpickles what arrives: unpickling runs code. On one
machine the ranks talk through shared memory alone (UCX_TLS=self,sm,
runtime/launch.py), which no other user can reach. Ranks on several hosts
talk over the network, where MPI's transports accept connections from
anyone who can reach their ports. So wherever a job has a secret (every
launch of ours gives one, on one host or several), every pickle carries an
HMAC-SHA256 of it and is unpickled only once it is proved (mpi4py's
`MPI.pickle` hook, so every lowercase call is covered, the runtime's and
any that comes later). Tensors move through MPI's buffer calls
(Allreduce and the like), which unpickle nothing.

The secret reaches the ranks in their environment (SBPC_JOB_SECRET, set by
whoever launches them: sbp-run, the rank pool, sbp-calibrate), as the rest
of their environment does: never on a command line, which every user can
read. A launch of the user's own (mpiexec or srun of a script that calls
sbpc.compile) across hosts must export one; on one machine none is needed.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import pickle
import secrets

SECRET_VARIABLE = "SBPC_JOB_SECRET"
TAG_BYTES = 32


class UnauthenticatedMessage(ValueError):
    """A message whose tag is not the job's: nothing of it was unpickled."""


def new_secret() -> str:
    """A job's secret, as SECRET_VARIABLE carries it (hex)."""
    return secrets.token_hex(32)


def _tag(secret: bytes, data) -> bytes:
    return hmac.new(secret, data, hashlib.sha256).digest()


def sealed_pickles(secret: bytes):
    """(dumps, loads) for MPI.pickle: each message is its tag, then the pickle."""
    def dumps(obj, protocol: int | None = None) -> bytes:
        data = pickle.dumps(obj, pickle.HIGHEST_PROTOCOL if protocol is None else protocol)
        return _tag(secret, data) + data

    def loads(buffer):
        message = memoryview(buffer)
        data = message[TAG_BYTES:]
        if len(message) < TAG_BYTES or not hmac.compare_digest(bytes(message[:TAG_BYTES]), _tag(secret, data)):
            raise UnauthenticatedMessage(
                "an MPI message without the job's secret was refused (nothing of it was unpickled): "
                "a process outside the job wrote to a rank's connection, or the ranks were given different secrets")
        return pickle.loads(data)

    return dumps, loads


_installed: bytes | None = None


def authenticate_messages(world) -> None:
    """Seals this rank's pickled MPI messages with the job's secret (from
    SECRET_VARIABLE). Without one, a job on one machine goes on as before;
    a job across machines is refused, since its pickles would cross the
    network unproved."""
    global _installed
    text = os.environ.get(SECRET_VARIABLE, "")
    if not text:
        from .hosts import on_driver_node

        if on_driver_node(world)[1]:
            raise RuntimeError(
                f"the ranks run on several hosts and {SECRET_VARIABLE} is not set: every rank must have the same "
                f"secret to prove its messages; export {SECRET_VARIABLE}=$(python -c 'import secrets; "
                "print(secrets.token_hex(32))') before mpiexec or srun (sbp-run and sbpc.compile's rank pools "
                "set one themselves)")
        return
    try:
        secret = bytes.fromhex(text)
    except ValueError:
        raise RuntimeError(f"{SECRET_VARIABLE} must be hex digits (secrets.token_hex(32))") from None
    if len(secret) < 16:
        raise RuntimeError(f"{SECRET_VARIABLE} is {len(secret)} bytes: give at least 16 (secrets.token_hex(32))")
    if secret == _installed:
        return
    from mpi4py import MPI

    type(MPI.pickle).__init__(MPI.pickle, *sealed_pickles(secret))  # mpi4py's hook for every lowercase call
    _installed = secret
