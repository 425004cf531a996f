"""The random numbers of lg.dropout: Philox4x32-10 (Salmon, Moraes, Dror
and Shaw, "Parallel random numbers: as easy as 1, 2, 3", SC 2011; the
Random123 library), a counter-based generator: each output is a function
of a key and a counter alone, so any element of a tensor can be drawn
without the others, on any device, in any order.

lg.dropout's element e (its index in the whole tensor, row-major) keeps
its value when

    philox((e / 4 as two 32-bit words, stream, step mod 2^32), seed)[e mod 4] >> 8
        >= round(rate * 2^24)

so the mask depends on (seed, step, stream, e) and not on the plan.
lg.uniform's element e is that same 24-bit draw times 2^-24. The
numpy form here is the definition (the reference interpreter, the local
kernels and the numpy backend use it); sbpc.codegen.render.PHILOX_C is the same
function in C and CUDA, checked against it.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from sbpc.dialects.lg import DROPOUT_BITS, dropout_threshold

MULTIPLIERS = (0xD2511F53, 0xCD9E8D57)
WEYL = (0x9E3779B9, 0xBB67AE85)
ROUNDS = 10
_LOW = np.uint64(0xFFFFFFFF)
_32 = np.uint64(32)


class Philox:
    """Philox4x32-10 over `n` counters at once, in preallocated uint64
    arrays (each word in the low 32 bits): no allocation per call."""

    def __init__(self, n: int):
        self.words = np.empty((4, n), np.uint64)
        self._products = np.empty((2, n), np.uint64)

    def __call__(self, counter: Sequence[np.ndarray | int], key: tuple[int, int]) -> np.ndarray:
        """The four output words (4, n) for counters (c0, c1, c2, c3) (arrays
        or scalars, 32-bit values) under the 64-bit key (k0, k1)."""
        c = self.words
        for i, word in enumerate(counter):
            c[i] = word
        p0, p1 = self._products
        k0, k1 = (int(k) & 0xFFFFFFFF for k in key)
        m0, m1 = (np.uint64(m) for m in MULTIPLIERS)
        for _ in range(ROUNDS):
            np.multiply(c[0], m0, out=p0)  # exact: two 32-bit factors fit 64 bits
            np.multiply(c[2], m1, out=p1)
            np.right_shift(p1, _32, out=c[0])
            np.bitwise_xor(c[0], c[1], out=c[0])
            np.bitwise_xor(c[0], np.uint64(k0), out=c[0])
            np.right_shift(p0, _32, out=c[2])
            np.bitwise_xor(c[2], c[3], out=c[2])
            np.bitwise_xor(c[2], np.uint64(k1), out=c[2])
            np.bitwise_and(p1, _LOW, out=c[1])
            np.bitwise_and(p0, _LOW, out=c[3])
            k0 = (k0 + WEYL[0]) & 0xFFFFFFFF
            k1 = (k1 + WEYL[1]) & 0xFFFFFFFF
        return c


def global_indices(shape: Sequence[int], piece: Sequence[slice], micro_batch: Sequence[int]) -> np.ndarray:
    """Each element's index in the whole tensor, for the elements of `piece`
    (slices of the global `shape`) in row-major order: axis 0 of a
    micro-batch copy (count K, index k, R rows per example) maps row r to
    the batch's row ((r / R) * K + k) * R + r mod R."""
    count, index, rows = micro_batch
    full = [shape[0] * count, *shape[1:]] if shape else []
    strides = [int(np.prod(full[d + 1:], dtype=np.int64)) for d in range(len(full))]
    flat = np.zeros([s.stop - s.start for s in piece], np.int64)
    for d, s in enumerate(piece):
        at = np.arange(s.start, s.stop, dtype=np.int64)
        if d == 0:
            at = ((at // rows) * count + index) * rows + at % rows
        flat += (at * strides[d]).reshape([-1 if a == d else 1 for a in range(len(piece))])
    return flat.reshape(-1)


class Draws:
    """The 24-bit draws of one random op's piece (lg.dropout's keep
    decisions, lg.uniform's values), drawn per call for a (seed, step): the
    piece's global indices are fixed, so the distinct counters (four
    elements share one) and where each element picks its word are found
    once."""

    def __init__(self, shape: Sequence[int], piece: Sequence[slice], stream: int,
                 micro_batch: Sequence[int] = (1, 0, 1)):
        flat = global_indices(shape, piece, micro_batch)
        groups = flat >> 2
        first = np.ones(groups.size, bool)
        np.not_equal(groups[1:], groups[:-1], out=first[1:])  # indices increase in row-major order
        counters = groups[first].astype(np.uint64)
        self.low, self.high = counters & _LOW, counters >> _32
        self.philox = Philox(counters.size)
        # the word of element i: row (i mod 4) of philox's (4, counters) output
        self.pick = (flat & 3) * counters.size + (np.cumsum(first) - 1)
        self.stream = stream
        self._draws = np.empty(flat.size, np.uint64)
        self.shape = tuple(s.stop - s.start for s in piece)

    def draws(self, seed: int, step: int) -> np.ndarray:
        """Each element's 24-bit draw (uint64, flat; overwritten by the next call)."""
        seed &= 0xFFFFFFFFFFFFFFFF
        words = self.philox((self.low, self.high, self.stream, step & 0xFFFFFFFF), (seed, seed >> 32))
        # (mode="clip": the picks are in range, and "raise", the default, buffers the output)
        np.take(words.reshape(-1), self.pick, out=self._draws, mode="clip")
        np.right_shift(self._draws, np.uint64(32 - DROPOUT_BITS), out=self._draws)
        return self._draws


class DropoutMask(Draws):
    """The keep decisions of one lg.dropout on one piece of its input."""

    def __init__(self, shape: Sequence[int], piece: Sequence[slice], rate: float, stream: int,
                 micro_batch: Sequence[int] = (1, 0, 1)):
        super().__init__(shape, piece, stream, micro_batch)
        self.threshold = np.uint64(dropout_threshold(rate))
        self.scale = 1.0 / (1.0 - rate)

    def keep(self, seed: int, step: int, out: np.ndarray | None = None) -> np.ndarray:
        """Whether each element of the piece is kept (bool, the piece's shape)."""
        draws = self.draws(seed, step)
        kept = np.empty(draws.size, bool) if out is None else out.reshape(-1)
        np.greater_equal(draws, self.threshold, out=kept)
        return kept.reshape(self.shape)

    def factors(self, seed: int, step: int, dtype, out: np.ndarray | None = None,
                kept: np.ndarray | None = None) -> np.ndarray:
        """0 where dropped, 1 / (1 - rate) in `dtype` where kept."""
        keep = self.keep(seed, step, kept)
        factors = np.empty(self.shape, dtype) if out is None else out
        np.multiply(keep, np.asarray(self.scale, dtype), out=factors)
        return factors


class UniformDraws(Draws):
    """The values of one lg.uniform on one piece of its result: each
    element's 24-bit draw times 2^-24, in [0, 1) and exact in float32."""

    def values(self, seed: int, step: int, dtype, out: np.ndarray | None = None) -> np.ndarray:
        values = np.empty(self.shape, dtype) if out is None else out
        # cast, then scale in place: one multiply of the integers by a float would buffer its casts
        np.copyto(values, self.draws(seed, step).reshape(self.shape), casting="unsafe")
        np.multiply(values, np.asarray(2.0 ** -DROPOUT_BITS, dtype), out=values)
        return values


def dropout_piece(x: np.ndarray, seed, step, shape: Sequence[int], piece: Sequence[slice], rate: float, stream: int,
                  micro_batch: Sequence[int]) -> np.ndarray:
    """lg.dropout of `x`, the piece `piece` of a tensor of global `shape`."""
    mask = DropoutMask(shape, piece, rate, stream, micro_batch)
    return x * mask.factors(int(seed), int(step), x.dtype)
