"""What every part of the importer shares: the error it raises, the dtypes
PyTorch and lg share, a value known at import time (`_Const`), and helpers
over PyTorch's nested arguments and ATen op names."""

from __future__ import annotations

import operator
from collections.abc import Callable

import numpy as np


class TorchImportError(ValueError):
    """A PyTorch module that sbpc cannot import, and why."""


_DTYPES = {"torch.float32": "f32", "torch.float64": "f64", "torch.float16": "f16", "torch.bfloat16": "bf16",
           "torch.int64": "i64", "torch.int32": "i32", "torch.bool": "i1"}


class _Const:
    """A value known at import time (a buffer, a constant, or folded from them)."""

    def __init__(self, value):
        self.value = value


PART_DTYPES = {"torch.complex64": "f32", "torch.complex128": "f64"}
"""The lg dtype of each part of PyTorch's complex dtypes."""


class Complex:
    """A complex tensor, which lg does not hold, as the importer carries it:
    its real and imaginary parts, two real lg values of one shape and
    dtype (f32 for PyTorch's complex64, f64 for complex128). Only the
    importer sees it: every op on it lowers to real ops on the parts
    (`aten/complex_numbers.py`), and a forward's outputs must be real."""

    def __init__(self, re, im):
        if tuple(re.shape) != tuple(im.shape) or str(re.dtype) != str(im.dtype):
            raise ValueError(f"complex parts of {list(re.shape)} {re.dtype} and {list(im.shape)} {im.dtype}")
        self.re, self.im = re, im

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.re.shape)

    @property
    def part_dtype(self) -> str:
        return str(self.re.dtype)


def is_complex_constant(value) -> bool:
    """Whether a value known at import time is a complex tensor or number."""
    if isinstance(value, complex):
        return True
    return isinstance(value, _Const) and bool(getattr(value.value, "is_complex", lambda: False)())


def to_numpy(tensor) -> np.ndarray:
    """A CPU torch tensor as a numpy array; bfloat16 (which numpy lacks) as
    ml_dtypes' bfloat16, exactly (every bfloat16 is a float32)."""
    import torch

    tensor = tensor.detach()
    if tensor.dtype == torch.bfloat16:
        import ml_dtypes

        return tensor.float().numpy().astype(ml_dtypes.bfloat16)
    return tensor.numpy()


def _unwrap(a):
    return a.value if isinstance(a, _Const) else a


def _map(value, fn: Callable):
    if isinstance(value, list | tuple):
        return type(value)(_map(v, fn) for v in value)
    if isinstance(value, dict):
        return {k: _map(v, fn) for k, v in value.items()}
    return fn(value)


def _flat(value) -> list:
    if isinstance(value, list | tuple):
        return [x for v in value for x in _flat(v)]
    if isinstance(value, dict):
        return _flat(list(value.values()))
    return [value]


def _op_name(target) -> str:
    if target is operator.getitem:
        return "getitem"
    name = getattr(target, "name", None)
    text = name() if callable(name) else str(target)
    return text.replace("::", ".").removesuffix(".default")
