"""Elementwise arithmetic: binary ops in the dtype PyTorch promotes to
(their operands through `_operands`, which `mask`'s comparisons share),
unary ops, activations and powers."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from sbpc import frontend as fe
from sbpc.frontend import Tensor
from sbpc.torch_import.aten.registry import RULES, rule
from sbpc.torch_import.precision import _HALVES
from sbpc.torch_import.values import _DTYPES, _Const

if TYPE_CHECKING:
    # for the annotations only: the importer loads the rules (through their
    # registry) before it defines _Importer
    from sbpc.torch_import.importer import _Importer


def _binary(fn: Callable[[Tensor, Tensor], Tensor], swap: bool = False):
    def lower(im: _Importer, a, b, alpha=1, rounding_mode=None):
        if rounding_mode is not None:
            raise ValueError(f"rounding_mode={rounding_mode!r}")
        # in the dtype PyTorch computes in (an int mask times 0.5 is float;
        # int / int divides as floats)
        # (a 16-bit result computes in float32, with a Python number at float32
        # precision as PyTorch's opmath has it; _Importer._call rounds it once)
        dtype = _result_dtype(im)
        a, b = _operands(im, a, b, "f32" if dtype in _HALVES else dtype)
        if swap:  # rsub(a, b, alpha) = b - alpha * a
            a, b = b, a
        if alpha != 1:  # add/sub(a, b, alpha) = a +/- alpha * b
            b = b * im.lift(alpha, b)
        return fn(a, b)

    return lower


def _result_dtype(im: _Importer) -> str:
    """The dtype of the node being lowered, as PyTorch traced it."""
    value = im.node.meta.get("val")
    dtype = _DTYPES.get(str(getattr(value, "dtype", None)))
    if dtype is None:
        raise ValueError(f"a result of dtype {getattr(value, 'dtype', 'unknown')}")
    return dtype


def _operands(im: _Importer, a, b, dtype: str) -> tuple[Tensor, Tensor]:
    """Both operands of an elementwise op as lg values of `dtype`: tensors
    cast where PyTorch promotes them, constants compacted (`_compact`)."""
    like = a if isinstance(a, Tensor) else b
    if not isinstance(like, Tensor):
        raise TypeError("an elementwise op of two constants")
    out = []
    for v in (a, b):
        if isinstance(v, Tensor):
            out.append(v if str(v.dtype) == dtype else fe.cast(v, dtype))
            continue
        known = im.known(v)
        if known is None:
            raise TypeError(f"expected a tensor or a number, got {type(v).__name__}")
        key = (id(v), tuple(like.shape), dtype)
        if not isinstance(v, _Const) or key not in im.lifted:  # a buffer's constant is made once per use shape
            value = im.g.constant(_compact(np.asarray(known).astype(fe._numpy_of(fe.element(dtype))), like))
            if not isinstance(v, _Const):
                out.append(value)
                continue
            im.lifted[key] = value
        out.append(im.lifted[key])
    return out[0], out[1]


def _compact(constant: np.ndarray, other: Tensor) -> np.ndarray:
    """A constant operand of an elementwise op with `other`, with each axis it
    only repeats along, and that `other` spans already, cut to 1 (the op
    broadcasts it back): a causal mask expanded over the batch is one mask
    for every example, whose size then no longer follows the batch (which
    micro-batches and batch splits leave alone)."""
    lead = constant.ndim - len(other.shape)
    for axis in range(max(lead, 0), constant.ndim):
        if (constant.shape[axis] > 1 and other.shape[axis - lead] == constant.shape[axis]
                and (constant == constant.take([0], axis=axis)).all()):
            constant = constant.take([0], axis=axis)
    return constant


RULES["aten.add.Tensor"] = RULES["aten.add.Scalar"] = _binary(fe.add)
RULES["aten.sub.Tensor"] = RULES["aten.sub.Scalar"] = _binary(fe.sub)
RULES["aten.rsub.Scalar"] = RULES["aten.rsub.Tensor"] = _binary(fe.sub, swap=True)
RULES["aten.mul.Tensor"] = RULES["aten.mul.Scalar"] = _binary(fe.mul)
RULES["aten.div.Tensor"] = RULES["aten.div.Scalar"] = RULES["aten.div.Tensor_mode"] = _binary(fe.div)


def _unary(fn: Callable[[Tensor], Tensor]):
    return lambda im, x: fn(im.lift(x))


for _name, _fn in (("neg", fe.neg), ("relu", fe.relu), ("tanh", fe.tanh), ("exp", fe.exp), ("sqrt", fe.sqrt),
                   ("rsqrt", fe.rsqrt)):
    RULES[f"aten.{_name}"] = _unary(_fn)


@rule("aten.abs")
def _abs(im: _Importer, x):
    x = im.lift(x)
    return fe.relu(x) + fe.relu(-x)  # its gradient is sign(x), 0 at 0 as PyTorch's


def _sigmoid(x: Tensor) -> Tensor:
    # 1 / (1 + exp(-x)): exp overflows to inf for very negative x, giving 0 as it should
    return 1.0 / (fe.exp(-x) + 1.0)


@rule("aten.sigmoid")
def _sigmoid_rule(im: _Importer, x):
    return _sigmoid(im.lift(x))


@rule("aten.silu")
def _silu(im: _Importer, x):
    x = im.lift(x)
    return x * _sigmoid(x)


@rule("aten.gelu")
def _gelu(im: _Importer, x, approximate="none"):
    x = im.lift(x)
    if approximate == "tanh":
        return fe.gelu(x)
    if approximate != "none":
        raise ValueError(f"approximate={approximate!r}")
    return x * (fe.erf(x * (1.0 / math.sqrt(2.0))) + 1.0) * 0.5


@rule("aten.pow.Tensor_Scalar")
def _pow(im: _Importer, x, exponent):
    x = im.lift(x)
    if exponent == 2:
        return x * x
    if exponent == 3:
        return x * x * x
    if exponent == 0.5:
        return fe.sqrt(x)
    if exponent == -0.5:
        return fe.rsqrt(x)
    if exponent == 1:
        return x
    if exponent == -1:
        return 1.0 / x
    raise ValueError(f"power {exponent} (supported: -1, -0.5, 0.5, 1, 2, 3)")


@rule("aten.square")
def _square(im: _Importer, x):
    x = im.lift(x)
    return x * x


RULES["aten.erf"] = _unary(fe.erf)


@rule("aten.reciprocal")
def _reciprocal(im: _Importer, x):
    return 1.0 / im.lift(x)


def _bound(im: _Importer, value, like: Tensor) -> Tensor:
    """A clamp's bound: a tensor in `like`'s dtype, or a number as a constant of it."""
    bound = im.lift(value, like)
    return bound if str(bound.dtype) == str(like.dtype) else fe.cast(bound, str(like.dtype))


@rule("aten.clamp", "aten.clamp.Tensor")
def _clamp(im: _Importer, x, min=None, max=None):  # noqa: A002 - PyTorch's argument names
    """Bounds where given; the gradient passes where min <= x <= max (both
    ends included, as PyTorch's clamp)."""
    x = im.lift(x)
    if min is not None:
        low = _bound(im, min, x)
        x = fe.where(fe.compare("lt", x, low), low, x)
    if max is not None:
        high = _bound(im, max, x)
        x = fe.where(fe.compare("gt", x, high), high, x)
    return x


@rule("aten.hardtanh")
def _hardtanh(im: _Importer, x, min_val=-1.0, max_val=1.0):
    """clamp with the gradient passing only strictly inside (min_val, max_val), as PyTorch's."""
    x = im.lift(x)
    low, high = _bound(im, min_val, x), _bound(im, max_val, x)
    x = fe.where(fe.compare("le", x, low), low, x)
    return fe.where(fe.compare("ge", x, high), high, x)


@rule("aten.leaky_relu")
def _leaky_relu(im: _Importer, x, negative_slope=0.01):
    x = im.lift(x)
    return fe.where(fe.compare("gt", x, im.lift(0.0, x)), x, x * float(negative_slope))


@rule("aten.elu")
def _elu(im: _Importer, x, alpha=1.0, scale=1.0, input_scale=1.0):
    x = im.lift(x)
    negative = (fe.exp(x * float(input_scale)) - 1.0) * float(alpha * scale)
    return fe.where(fe.compare("gt", x, im.lift(0.0, x)), x * float(scale), negative)


@rule("aten.sign")
def _sign(im: _Importer, x):
    """-1, 0 or 1 (NaN stays NaN); no gradient flows, as in PyTorch."""
    x = im.lift(x)
    zero = im.lift(0.0, x)
    positive = fe.cast(fe.compare("gt", x, zero), str(x.dtype))
    negative = fe.cast(fe.compare("lt", x, zero), str(x.dtype))
    return fe.where(fe.compare("ne", x, x), x, positive - negative)


@rule("aten.maximum", "aten.minimum")
def _extremum(im: _Importer, a, b):
    """The larger (smaller) of two tensors; where they tie, each gets half
    the gradient, as PyTorch's; NaN wins either way."""
    dtype = _result_dtype(im)
    a, b = _operands(im, a, b, dtype)
    first = "gt" if im.node.target.name().endswith("maximum") else "lt"
    last = "lt" if first == "gt" else "gt"
    picked = fe.where(fe.compare(first, a, b), a, fe.where(fe.compare(last, a, b), b, (a + b) * 0.5))
    nan = fe.logical("or", fe.compare("ne", a, a), fe.compare("ne", b, b))
    return fe.where(nan, a + b, picked)


@rule("aten.isnan")
def _isnan(im: _Importer, x):
    x = im.lift(x)
    return fe.compare("ne", x, x)


@rule("aten.isinf")
def _isinf(im: _Importer, x):
    x = im.lift(x)
    return fe.compare("eq", fe.relu(x) + fe.relu(-x), im.lift(math.inf, x))
