"""One mechanism by which every backend registers its implementation of an op.

A backend (the reference interpreter, the SBP-local evaluator, the
runtime's numpy kernels, the CUDA code generator) keeps one `Backend` table
in the module that implements it, and registers each op kind there, next to
the implementation, in the manner of xDSL's interpreter `@impl`:

    REFERENCE = Backend("reference numpy")

    @REFERENCE.impl(lg.SoftmaxOp, lg.LogSoftmaxOp)
    def _softmax(op, x): ...

    REFERENCE.register(lg.NegOp, lambda op, x: -x)

`missing(ops)` names the op kinds a backend lacks; test_ops.py asks it of
every backend for every lg op, so a new op without an implementation fails
a test instead of a user's run.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Generic, TypeVar

T = TypeVar("T")


class Backend(Generic[T]):
    """Implementations of type T keyed by op class."""

    def __init__(self, name: str):
        self.name = name
        self._impls: dict[type, T] = {}

    def register(self, op: type, implementation: T) -> T:
        if op in self._impls:
            raise ValueError(f"{self.name}: {getattr(op, 'name', op)} is registered twice")
        self._impls[op] = implementation
        return implementation

    def impl(self, *ops: type) -> Callable[[T], T]:
        """Decorator: registers the decorated implementation for `ops`."""

        def register(implementation: T) -> T:
            for op in ops:
                self.register(op, implementation)
            return implementation

        return register

    def get(self, op: type) -> T | None:
        return self._impls.get(op)

    def __getitem__(self, op: type) -> T:
        found = self._impls.get(op)
        if found is None:
            raise KeyError(f"{self.name} has no implementation of {getattr(op, 'name', op)}")
        return found

    def __contains__(self, op: type) -> bool:
        return op in self._impls

    def ops(self) -> list[type]:
        return list(self._impls)

    def missing(self, ops: Iterable[type]) -> list[type]:
        """The op kinds among `ops` this backend has no implementation of."""
        return [op for op in ops if op not in self._impls]
