"""The rule of each ATen op (`RULES`, filled by `@rule` in the op-family
modules) and the axis arguments every family normalizes. It imports neither
a rule nor the importer, so the importer imports it without a cycle."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

RULES: dict[str, Callable[..., Any]] = {}


def rule(*names: str):
    def register(fn):
        for n in names:
            RULES[n] = fn
        return fn

    return register


def _axis(dim: int, rank: int) -> int:
    return dim + rank if dim < 0 else dim


def _dims(dim, rank: int) -> list[int]:
    if dim is None or dim == []:
        return list(range(rank))
    return [_axis(d, rank) for d in ([dim] if isinstance(dim, int) else dim)]
