"""16-bit floats and `torch.autocast`: the casts the importer puts around
a rule so that each op computes in the precision PyTorch's CPU kernels do
(_Importer._call applies them)."""

from __future__ import annotations

from sbpc import frontend as fe
from sbpc.frontend import Tensor
from sbpc.torch_import.values import _map

_FLOATS = ("f32", "f64", "f16", "bf16")
_HALVES = ("f16", "bf16")


def _widen(v):
    """A 16-bit float tensor in float32 (exact); anything else as it is."""
    return fe.cast(v, "f32") if isinstance(v, Tensor) and str(v.dtype) in _HALVES else v


AUTOCAST_LOWER = frozenset(f"aten.{op}" for op in (
    "conv1d", "conv2d", "conv3d", "bmm", "mm", "linalg_vecdot", "baddbmm", "addmm", "addbmm", "linear", "matmul",
    "conv_transpose1d", "conv_transpose2d", "conv_transpose3d", "prelu", "scaled_dot_product_attention"))
"""The ops CPU autocast runs in its lower precision (PyTorch's
autocast_mode.cpp, `lower_precision_fp` for CPU): their float inputs are
cast to it."""


def _autocast_args(name: str, dtype: str, args, kwargs):
    """The arguments of an op inside an autocast region as autocast casts
    them: a matmul's, linear's or convolution's float inputs to its lower
    precision. (Those of the ops it runs in float32 are widened as any
    16-bit input of an op traced wider is: _Importer._call.)"""
    base = name.rsplit(".", 1)[0] if name.count(".") > 1 else name
    if base not in AUTOCAST_LOWER:
        return args, kwargs

    def cast(v):
        return fe.cast(v, dtype) if isinstance(v, Tensor) and str(v.dtype) in ("f32", "f64") else v

    return _map(args, cast), {k: _map(v, cast) for k, v in kwargs.items()}
