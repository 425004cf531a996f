"""What a numpy kernel is bound as (numpy_kernels.py, numpy_window_kernels.py):
the fire function `bind` returns and the scratch it preallocates."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from sbpc.semantics.local_eval import LocalContext

Fire = Callable[[Sequence[np.ndarray], np.ndarray], None]
"""A bound kernel: fire(inputs, out) writes its result into `out`."""

Binder = Callable[[Any, LocalContext, Sequence[np.ndarray], np.ndarray], Fire]
"""Binds a kernel to an op (of the class it is registered for: the registry
cannot pair the two types, so the op is Any), its local context and example registers
(their shapes and dtypes), preallocating scratch."""


def scratch(shape, dtype) -> np.ndarray:
    """Uninitialized scratch a kernel binds once and writes before it reads."""
    return np.empty(tuple(shape), dtype)
