"""The numpy dtype of each IR element type, and how ops compute on the
16-bit float types.

Kept apart from the IR's own modules so that loading the dialects (every
`sbp-opt` run) does not import numpy: only what computes values (the
interpreters, the runtime, the frontends) needs these.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
from xdsl.dialects.builtin import BFloat16Type, Float16Type, Float32Type, Float64Type, IntegerType
from xdsl.ir import Attribute

HALF_DTYPES = (np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16))
"""The 16-bit float storage types. An op on them computes in float32 and
rounds its result once (what PyTorch's CPU kernels do for half and
bfloat16: elementwise ops, GEMMs accumulating in float32, reductions
with a float32 accumulator)."""


def is_half(dtype) -> bool:
    return np.dtype(dtype) in HALF_DTYPES


def is_float_dtype(dtype) -> bool:
    """Floating point, the 16-bit storage types included (numpy does not
    count ml_dtypes' bfloat16 as floating)."""
    dtype = np.dtype(dtype)
    return dtype.kind == "f" or dtype in HALF_DTYPES


def compute_dtype(dtype) -> np.dtype:
    """The dtype an op on `dtype` values computes in: float32 for the half types."""
    return np.dtype(np.float32) if is_half(dtype) else np.dtype(dtype)


def numpy_dtype(elem: Attribute) -> np.dtype:
    """The numpy dtype of an IR element type (bf16: ml_dtypes' bfloat16)."""
    if isinstance(elem, Float16Type):
        return np.dtype(np.float16)
    if isinstance(elem, BFloat16Type):
        return np.dtype(ml_dtypes.bfloat16)
    if isinstance(elem, Float32Type):
        return np.dtype(np.float32)
    if isinstance(elem, Float64Type):
        return np.dtype(np.float64)
    if isinstance(elem, IntegerType):
        return np.dtype(np.bool_) if elem.width.data == 1 else np.dtype(f"int{elem.width.data}")
    raise ValueError(f"no numpy dtype for element type {elem}")
