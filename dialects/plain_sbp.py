"""SBP as plain data: the passes that search (sbp-infer, boxing), the
interpreters, the simulator and the runtime work on `Sbp` values, not on the
sbp dialect's attributes (dialects/sbp.py converts between the two). An
nd-SBP is a tuple of them, one per mesh axis."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import ClassVar


class Sbp(str):
    """One mesh axis' distribution as plain data: "S0", "S1", ... (split),
    "B", "P" (partial sum), "Pmax" (partial max), "G" (rows grouped by
    expert at run time: GroupedAttr) or "I16", ... (rows gathered from a
    split table of 16 rows by an index: IndexedAttr). It is a str, so it
    hashes, compares, sorts and prints as that text at str speed (sbp-infer
    handles millions); it is built only by `Sbp.of`, `Sbp.S` and the
    constants, and read through its attributes (kind, axis, is_split,
    is_partial), so no other code parses the text."""

    kind: str
    """"S", "B", "P" (either partial), "G" or "I"."""
    axis: int | None
    """The tensor axis of a split, else None (grouped or indexed rows are stored whole)."""
    is_split: bool
    is_partial: bool
    is_grouped: bool
    is_indexed: bool
    rows: int | None
    """The table rows of indexed rows (I), else None."""

    B: ClassVar[Sbp]
    P: ClassVar[Sbp]
    PMAX: ClassVar[Sbp]
    G: ClassVar[Sbp]

    def __new__(cls, text: str) -> Sbp:
        # The properties are plain attributes, set once per (interned)
        # value: sbp-infer's cost model reads them millions of times.
        self = super().__new__(cls, text)
        self.kind = text[0]
        self.is_split = text[0] == "S"
        self.is_partial = text[0] == "P"
        self.is_grouped = text == "G"
        self.is_indexed = text[0] == "I"
        self.rows = int(text[1:]) if self.is_indexed else None
        self.axis = int(text[1:]) if self.is_split else None
        return self

    @staticmethod
    @functools.cache
    def of(text: str) -> Sbp:
        """The (shared) value of a text form; a ValueError if it is none."""
        if text in ("B", "P", "Pmax", "G"):
            return Sbp(text)
        if text[:1] in "SI" and text[1:].isdigit():
            canonical = f"{text[0]}{int(text[1:])}"  # one spelling per axis: S01 is S1
            return Sbp(text) if canonical == text else Sbp.of(canonical)
        raise ValueError(f"'{text}' is not an SBP (S<axis> as S0, S1, ..., B, P, Pmax, G or I<rows> as I16)")

    @staticmethod
    def S(axis: int) -> Sbp:
        """The split of tensor axis `axis` (OneFlow writes it S(axis))."""
        return Sbp.of(f"S{axis}")


Sbp.B, Sbp.P, Sbp.PMAX, Sbp.G = Sbp.of("B"), Sbp.of("P"), Sbp.of("Pmax"), Sbp.of("G")

PlainSbp = Sbp
PlainNd = tuple[Sbp, ...]


def plain_nd(texts: Sequence[str]) -> PlainNd:
    """An nd-SBP from text forms: ("S0", "B") -> (Sbp, Sbp)."""
    return tuple(Sbp.of(t) for t in texts)


def hierarchy_violation(src: PlainNd, dst: PlainNd, axes: Sequence[int]) -> tuple[int, int, int] | None:
    """Pieces nest outer mesh axis first, so a step on mesh axis `a` may add
    or remove a split of tensor axis k only while no inner mesh axis outside
    the step splits k. Returns (a, k, b) for the first violation, or None."""
    for a in axes:
        touched = {k for x in (src[a], dst[a]) if (k := x.axis) is not None} if src[a] != dst[a] else set()
        for k in touched:
            for b in range(a + 1, len(src)):
                if b not in axes and k in (src[b].axis, dst[b].axis):
                    return a, k, b
    return None


@functools.lru_cache(maxsize=4096)
def format_plain(nd: PlainNd) -> str:
    """The short text of a plain nd-SBP (`S<0>`, `[S<0>, B]`, `P<max>`)."""

    def one(s: Sbp) -> str:
        if s.is_split:
            return f"S<{s.axis}>"
        if s.is_indexed:
            return f"I<{s.rows}>"
        return "P<max>" if s == Sbp.PMAX else str(s)

    return one(nd[0]) if len(nd) == 1 else "[" + ", ".join(one(s) for s in nd) + "]"
