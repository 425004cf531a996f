"""A step's feeds from the driver to the ranks of a RankPool through shared
memory, not through the driver's socket.

Without it every `train_step` pickled each feed on the driver, sent it to
rank 0 over the socket, and rank 0 broadcast the pickled command to every
rank (the whole array to each): 138 ms per step for a 32 MB batch on 2
ranks. Here the driver copies each large feed once into a shared-memory
block it owns (one per feed, kept across steps), the command carries only
the block's name, shape and dtype, and each rank reads its own piece from
the block (Executor.feed copies the piece, so the next step may overwrite
the block: the driver writes it only after the previous command's reply).

Where every rank of a pool runs on the driver's machine (RankPool's
default), every rank can open the block. A pool on several hosts sends
every feed inline (rank 0 broadcasts it over MPI). Feeds under
SHARED_MIN_BYTES, and any feed when no block can be made (no /dev/shm, or
not enough room in it), still travel inline.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Mapping
from dataclasses import dataclass
from multiprocessing import resource_tracker, shared_memory

import numpy as np

SHARED_MIN_BYTES = 1 << 16
"""Feeds smaller than this go inline: pickling them costs less than a block."""


@dataclass(frozen=True)
class SharedArray:
    """A feed in shared memory, as a command names it."""

    block: str
    shape: tuple[int, ...]
    dtype: str


def _room_for(nbytes: int) -> bool:
    """Whether /dev/shm (where Linux keeps the blocks) has room for nbytes
    and as much again; True where it cannot be asked (the block's creation
    then says whether it fits)."""
    try:
        return shutil.disk_usage("/dev/shm").free >= 2 * nbytes
    except OSError:
        return True


class SharedFeeds:
    """The driver's side: one block per feed name, grown when a feed grows."""

    def __init__(self, shared: bool = True) -> None:
        self.blocks: dict[str, shared_memory.SharedMemory] = {}
        self.shared = shared
        """False where some rank runs on another host: every feed goes inline."""

    def put(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray | SharedArray]:
        """The feeds as a command carries them: large arrays copied into
        their blocks and named, the others as they are."""
        out: dict[str, np.ndarray | SharedArray] = {}
        for name, value in feeds.items():
            block = self._block(name, value.nbytes) if self.shared and value.nbytes >= SHARED_MIN_BYTES else None
            if block is None:
                out[name] = value
                continue
            np.ndarray(value.shape, value.dtype, buffer=block.buf)[...] = value
            out[name] = SharedArray(block.name, tuple(value.shape), value.dtype.str)
        return out

    def _block(self, name: str, nbytes: int) -> shared_memory.SharedMemory | None:
        block = self.blocks.get(name)
        if block is not None and block.size >= nbytes:
            return block
        self._release(name)
        if not _room_for(nbytes):
            return None
        try:
            block = shared_memory.SharedMemory(create=True, size=nbytes)
        except OSError:
            return None
        fd = getattr(block, "_fd", -1)
        if fd >= 0:
            # Reserve the pages now: a tmpfs that fills up later would
            # otherwise kill the writer with SIGBUS instead of an error.
            try:
                os.posix_fallocate(fd, 0, nbytes)
            except OSError:
                block.close()
                block.unlink()
                return None
        self.blocks[name] = block
        return block

    def _release(self, name: str) -> None:
        block = self.blocks.pop(name, None)
        if block is not None:
            block.close()
            block.unlink()

    def close(self) -> None:
        for name in list(self.blocks):
            self._release(name)


class AttachedFeeds:
    """A rank's side: the driver's blocks, opened once and kept while the
    driver keeps them."""

    def __init__(self) -> None:
        self.blocks: dict[str, shared_memory.SharedMemory] = {}

    def views(self, feeds: Mapping[str, np.ndarray | SharedArray]) -> dict[str, np.ndarray]:
        """The feeds as arrays (those in shared memory as views of their
        blocks: read them before the next command)."""
        out = {}
        for name, value in feeds.items():
            if isinstance(value, SharedArray):
                block = self.blocks.get(value.block) or self._attach(value.block)
                out[name] = np.ndarray(value.shape, np.dtype(value.dtype), buffer=block.buf)
            else:
                out[name] = value
        named = {v.block for v in feeds.values() if isinstance(v, SharedArray)}
        for stale in [b for b in self.blocks if b not in named]:  # the driver replaced or dropped it
            self._detach(stale)
        return out

    def _attach(self, block_name: str) -> shared_memory.SharedMemory:
        block = shared_memory.SharedMemory(name=block_name)
        # The driver owns the block: this process's resource tracker must
        # not unlink it when the rank exits (Python < 3.13 registers every
        # attach; 3.13 has track=False for this).
        with contextlib.suppress(Exception):
            resource_tracker.unregister(block._name, "shared_memory")  # type: ignore[attr-defined]
        self.blocks[block_name] = block
        return block

    def _detach(self, block_name: str) -> None:
        block = self.blocks.pop(block_name)
        with contextlib.suppress(BufferError):  # a view is still alive: the mapping goes when the rank ends
            block.close()

    def close(self) -> None:
        for name in list(self.blocks):
            self._detach(name)
