"""The Python API's arguments checked at the door: each public function
and method of the frontend is wrapped by `checked`, which checks every
argument against the function's own annotations (a Tensor where a Tensor
is meant, integers within int64 where integers are, tensors of one graph)
and turns what the IR refuses (an op's shape rule, a verifier) into a
ValueError naming the function. A user's mistake is then a ValueError or a
TypeError that says which argument, never an AttributeError from deep in
the IR (the API fuzzer, test/fuzz/fuzz_api.py, holds us to it)."""

from __future__ import annotations

import functools
import inspect
import types
import typing
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import numpy as np
from xdsl.utils.exceptions import DiagnosticException

from sbpc.dialects.lg import ShapeError

F = TypeVar("F", bound=Callable[..., Any])

INT64 = (-(2**63), 2**63)


def conforms(value: Any, hint: Any) -> bool:
    """Whether `value` is of the annotated type `hint` (the forms the
    frontend uses: classes, int/float/bool/str, unions, Sequence[...] and
    tuple[...]); any other form is not checked."""
    if hint is Any or hint is typing.Any:
        return True
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        return any(conforms(value, a) for a in args)
    if hint is None or hint is type(None):
        return value is None
    if hint is bool:
        return isinstance(value, bool | np.bool_)
    if hint is int:
        return isinstance(value, int | np.integer) and not isinstance(value, bool | np.bool_) and \
            INT64[0] <= int(value) < INT64[1]
    if hint is float:
        return isinstance(value, int | float | np.integer | np.floating) and not isinstance(value, bool | np.bool_)
    if hint is str:
        return isinstance(value, str)
    if origin in (Sequence, list, tuple, typing.Sequence):
        if isinstance(value, str | bytes) or not isinstance(value, list | tuple):
            return False
        if origin is tuple and args and args[-1] is not Ellipsis:
            return len(value) == len(args) and all(conforms(v, a) for v, a in zip(value, args, strict=True))
        return all(conforms(v, args[0]) for v in value) if args else True
    if isinstance(hint, type):
        return isinstance(value, hint)
    return True


def describe(hint: Any) -> str:
    """An annotation as a person reads it."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(describe(a) for a in args)
    if hint is None or hint is type(None):
        return "None"
    if origin in (Sequence, list, tuple, typing.Sequence):
        return f"a list of {describe(args[0])}" if args else "a list"
    if hint is int:  # conforms() takes integers that fit int64, as the IR stores them
        return "a 64-bit integer"
    if isinstance(hint, type):
        name = hint.__name__
        return f"an {name}" if name[0].lower() in "aeiou" else f"a {name}"
    return str(hint)


class GraphValue:
    """A value of one graph under construction (the frontend's Tensor)."""

    graph: Any


def _graphs(value: Any) -> list:
    if isinstance(value, GraphValue):
        return [value.graph]
    if isinstance(value, list | tuple):
        return [g for v in value for g in _graphs(v)]
    if isinstance(value, dict):
        return [g for v in value.values() for g in _graphs(v)]
    return []


def checked(fn: F) -> F:
    """`fn` with its arguments checked against its annotations, and the
    IR's refusals as ValueErrors naming it (see the module docstring)."""
    signature = inspect.signature(fn)
    where = fn.__qualname__ if "." in fn.__qualname__ else f"sbpc.{fn.__name__}"
    hints: dict[str, Any] | None = None

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        nonlocal hints
        if hints is None:
            hints = typing.get_type_hints(fn)
        try:
            bound = signature.bind(*args, **kwargs)
        except TypeError as e:
            raise TypeError(f"{where}: {e}") from None
        graphs: list = []
        for name, value in bound.arguments.items():
            hint = hints.get(name)
            kind = signature.parameters[name].kind
            values = list(value.values()) if kind is inspect.Parameter.VAR_KEYWORD else \
                list(value) if kind is inspect.Parameter.VAR_POSITIONAL else [value]
            for each in values:
                if hint is not None and not conforms(each, hint):
                    shown = repr(each) if len(repr(each)) <= 40 else f"{repr(each)[:37]}..."
                    raise TypeError(f"{where}: {name} must be {describe(hint)}, got {type(each).__name__} {shown}")
            if name != "self":
                graphs += _graphs(value)
        if len({id(g) for g in graphs}) > 1:
            raise ValueError(f"{where}: its tensors belong to different graphs")
        try:
            return fn(*args, **kwargs)
        except (ShapeError, DiagnosticException) as e:
            raise ValueError(f"{where}: {e}") from e

    return typing.cast(F, wrapper)
