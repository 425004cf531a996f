"""The rule of each ATen op (`RULES`, filled by `@rule` in the op-family
modules; `COMPLEX_RULES` for complex values) and the axis arguments every family normalizes. It imports neither
a rule nor the importer, so the importer imports it without a cycle."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

RULES: dict[str, Callable[..., Any]] = {}
"""The rule of each ATen op on real operands, filled by `@rule`."""

COMPLEX_RULES: dict[str, Callable[..., Any]] = {}
"""The rule of each ATen op with a complex operand or result (a
`values.Complex`, or a complex constant), filled by `@complex_rule`
(`aten/complex_numbers.py`)."""


def _registrar(table: dict[str, Callable[..., Any]]):
    def decorator(*names: str):
        def register(fn):
            for n in names:
                table[n] = fn
            return fn

        return register

    return decorator


rule = _registrar(RULES)
complex_rule = _registrar(COMPLEX_RULES)


def _axis(dim: int, rank: int) -> int:
    return dim + rank if dim < 0 else dim


def _dims(dim, rank: int) -> list[int]:
    if dim is None or dim == []:
        return list(range(rank))
    return [_axis(d, rank) for d in ([dim] if isinstance(dim, int) else dim)]
