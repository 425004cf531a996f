"""Elementwise arithmetic: binary ops in the dtype PyTorch promotes to
(their operands through `_operands`, which `mask`'s comparisons share),
unary ops, activations and powers."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from sbpc import frontend as fe
from sbpc.dialects import lg
from sbpc.frontend import Tensor
from sbpc.torch_import.aten.registry import RULES, rule
from sbpc.torch_import.precision import _HALVES
from sbpc.torch_import.values import _DTYPES, PART_DTYPES, _Const

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
    """The dtype of the node being lowered, as PyTorch traced it; of a
    complex node (a view or a sum run part by part, complex_numbers.PARTWISE)
    its parts'."""
    value = im.node.meta.get("val")
    traced = str(getattr(value, "dtype", None))
    dtype = _DTYPES.get(traced) or PART_DTYPES.get(traced)
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
        def make(known=known) -> Tensor:
            return im.g.constant(_compact(np.asarray(known).astype(fe._numpy_of(fe.element(dtype))), like))

        # a buffer's constant is made once per use's shape and dtype
        out.append(im.constant_of(v, make, tuple(like.shape), dtype) if isinstance(v, _Const) else make())
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
RULES["aten.div.Tensor"] = RULES["aten.div.Scalar"] = _binary(fe.div)


def _unary(fn: Callable[[Tensor], Tensor]):
    return lambda im, x: fn(im.lift(x))


for _name, _fn in (("neg", fe.neg), ("relu", fe.relu), ("tanh", fe.tanh), ("exp", fe.exp), ("sqrt", fe.sqrt),
                   ("rsqrt", fe.rsqrt)):
    RULES[f"aten.{_name}"] = _unary(_fn)


@rule("aten.detach")
def _detach(im: _Importer, x):
    """The value, through which no gradient flows (lg.stop_gradient); an
    integer or boolean tensor has none to stop."""
    x = im.lift(x)
    return fe.stop_gradient(x) if lg.is_float(x.dtype) else x


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


for _name, _fn in (("log", fe.log), ("sin", fe.sin), ("cos", fe.cos), ("atan", fe.atan), ("floor", fe.floor),
                   ("ceil", fe.ceil), ("round", fe.round), ("trunc", fe.trunc)):
    RULES[f"aten.{_name}"] = _unary(_fn)


@rule("aten.log2", "aten.log10")
def _log_base(im: _Importer, x):
    base = 2.0 if im.node.target.name().endswith("log2") else 10.0
    return fe.log(im.lift(x)) * (1.0 / math.log(base))


def _log1p(im: _Importer, x: Tensor) -> Tensor:
    """log(1 + x), accurate for small x: log(u) * x / (u - 1) with u = 1 + x
    rounded (Goldberg's correction), x itself where u rounds to 1."""
    u = x + 1.0
    one = fe.compare("eq", u, im.lift(1.0, x))
    safe = fe.where(one, u + 1.0, u)  # (the branch not taken stays finite, and so does its gradient)
    return fe.where(one, x, fe.log(safe) * (x / (safe - 1.0)))


def _expm1(im: _Importer, x: Tensor) -> Tensor:
    """exp(x) - 1, accurate for small x: (u - 1) * x / log(u) with u = exp(x)
    (Kahan's correction), x itself where u rounds to 1."""
    u = fe.exp(x)
    one = fe.compare("eq", u, im.lift(1.0, x))
    safe = fe.where(one, u + 1.0, u)
    return fe.where(one, x, (safe - 1.0) * (x / fe.log(safe)))


@rule("aten.log1p")
def _log1p_rule(im: _Importer, x):
    return _log1p(im, im.lift(x))


@rule("aten.expm1")
def _expm1_rule(im: _Importer, x):
    return _expm1(im, im.lift(x))


@rule("aten.tan")
def _tan(im: _Importer, x):
    x = im.lift(x)
    return fe.sin(x) / fe.cos(x)


@rule("aten.sinh")
def _sinh(im: _Importer, x):
    x = im.lift(x)
    return (_expm1(im, x) - _expm1(im, -x)) * 0.5


@rule("aten.cosh")
def _cosh(im: _Importer, x):
    x = im.lift(x)
    return (fe.exp(x) + fe.exp(-x)) * 0.5


@rule("aten.asinh")
def _asinh(im: _Importer, x):
    """sign(x) log1p(|x| + x^2 / (1 + sqrt(1 + x^2))): accurate near 0."""
    x = im.lift(x)
    a = fe.relu(x) + fe.relu(-x)
    magnitude = _log1p(im, a + x * x / (fe.sqrt(x * x + 1.0) + 1.0))
    return fe.where(fe.compare("lt", x, im.lift(0.0, x)), -magnitude, magnitude)


@rule("aten.acosh")
def _acosh(im: _Importer, x):
    """log1p(t + sqrt(t (t + 2))) with t = x - 1: accurate near 1."""
    t = im.lift(x) - 1.0
    return _log1p(im, t + fe.sqrt(t * (t + 2.0)))


@rule("aten.atanh")
def _atanh(im: _Importer, x):
    x = im.lift(x)
    return _log1p(im, x * 2.0 / (1.0 - x)) * 0.5


@rule("aten.asin")
def _asin(im: _Importer, x):
    """atan(x / sqrt(1 - x^2)), with +-pi/2 at +-1."""
    x = im.lift(x)
    return fe.atan(x / fe.sqrt((1.0 - x) * (1.0 + x)))


@rule("aten.acos")
def _acos(im: _Importer, x):
    """2 atan(sqrt((1 - x) / (1 + x))): accurate near 1."""
    x = im.lift(x)
    return fe.atan(fe.sqrt((1.0 - x) / (1.0 + x))) * 2.0


@rule("aten.atan2", "aten.atan2.out")
def _atan2(im: _Importer, y, x, out=None):
    """The angle of (x, y) in (-pi, pi]: atan(y / x) moved by pi where x < 0."""
    dtype = _result_dtype(im)
    y, x = _operands(im, y, x, dtype)
    zero = im.lift(0.0, x)
    base = fe.atan(y / fe.where(fe.compare("eq", x, zero), im.lift(1.0, x), x))
    negative_x = fe.compare("lt", x, zero)
    lower = fe.compare("lt", y, zero)
    turned = fe.where(lower, base - math.pi, base + math.pi)
    on_axis = fe.where(fe.compare("gt", y, zero), im.lift(math.pi / 2, x),
                       fe.where(lower, im.lift(-math.pi / 2, x), y * 0.0))
    return fe.where(fe.compare("eq", x, zero), on_axis, fe.where(negative_x, turned, base))


@rule("aten.pow.Tensor_Tensor", "aten.pow.Scalar")
def _pow_general(im: _Importer, base, exponent):
    """exp(exponent * log(base)) for a positive base; a negative base
    raised to an integer exponent keeps its sign (odd) or drops it (even),
    as PyTorch's pow; 0 to a positive power is 0."""
    dtype = _result_dtype(im)
    base, exponent = _operands(im, base, exponent, dtype)
    zero = im.lift(0.0, base)
    magnitude = fe.relu(base) + fe.relu(-base)
    tiny = fe.compare("eq", magnitude, zero)
    value = fe.exp(exponent * fe.log(fe.where(tiny, im.lift(1.0, base), magnitude)))
    value = fe.where(tiny, fe.where(fe.compare("gt", exponent, zero), zero, fe.where(
        fe.compare("eq", exponent, zero), im.lift(1.0, base), im.lift(math.inf, base))), value)
    odd = fe.compare("ne", fe.floor(exponent * 0.5) * 2.0, exponent)
    whole = fe.compare("eq", fe.floor(exponent), exponent)
    negative = fe.compare("lt", base, zero)
    signed = fe.where(odd, -value, value)
    nan = im.lift(math.nan, base)
    return fe.where(negative, fe.where(whole, signed, nan), value)


def _rounded_division(a: Tensor, b: Tensor, mode: str | None) -> Tensor:
    quotient = a / b
    if mode is None:
        return quotient
    if mode == "trunc":
        return fe.trunc(quotient)
    if mode == "floor":
        return fe.floor(quotient)
    raise ValueError(f"rounding_mode={mode!r}")


def _integer_division(im: _Importer, a: Tensor, b: Tensor, mode: str) -> Tensor:
    """Integers divided and rounded down (lg.floordiv) or toward zero: the
    floor, one up where the division is inexact and the signs differ."""
    quotient = fe.floordiv(a, b)
    if mode == "floor":
        return quotient
    if mode != "trunc":
        raise ValueError(f"rounding_mode={mode!r}")
    zero = im.lift(0, a)
    inexact = fe.compare("ne", quotient * b, a)
    signs_differ = fe.logical("xor", fe.compare("lt", a, zero), fe.compare("lt", b, zero))
    return fe.where(fe.logical("and", inexact, signs_differ), quotient + im.lift(1, a), quotient)


@rule("aten.div.Tensor_mode", "aten.div.Scalar_mode")
def _div_mode(im: _Importer, a, b, *, rounding_mode=None):
    """a / b, rounded toward zero ("trunc") or down ("floor") where asked;
    integers divide exactly as integers (a zero divisor gives 0 where
    PyTorch raises)."""
    dtype = _result_dtype(im)
    if dtype not in ("f32", "f64", "f16", "bf16") and rounding_mode is not None:
        if dtype not in ("i32", "i64"):
            raise ValueError(f"integer division of {dtype} values (supported: int32, int64)")
        a, b = _operands(im, a, b, dtype)
        return _integer_division(im, a, b, rounding_mode)
    a, b = _operands(im, a, b, "f32" if dtype in _HALVES else dtype)
    return _rounded_division(a, b, rounding_mode)


@rule("aten.fmod.Tensor", "aten.fmod.Scalar", "aten.remainder.Tensor", "aten.remainder.Scalar")
def _modulo(im: _Importer, a, b):
    """a - b * q, q = a / b rounded toward zero (fmod: the sign of a) or
    down (remainder: the sign of b), as PyTorch's; integers exactly (a zero
    divisor leaves a, where PyTorch raises)."""
    dtype = _result_dtype(im)
    if dtype not in ("f32", "f64", "i32", "i64"):
        raise ValueError(f"{im.node.target.name()} of {dtype} values (supported: float32, float64, int32, int64)")
    a, b = _operands(im, a, b, dtype)
    mode = "trunc" if "fmod" in im.node.target.name() else "floor"
    if dtype in ("i32", "i64"):
        return a - b * _integer_division(im, a, b, mode)
    return a - b * _rounded_division(a, b, mode)
