"""Complex numbers: the FFTs, and the views and arithmetic around them.

lg's tensors are real. The importer carries a complex value as its two real
parts (`values.Complex`) and lowers every op on complex operands to real
ops on the parts: sums and products by their definitions, views and sums
part by part (`registry.PARTWISE`), the parts themselves (`real`, `imag`,
`view_as_real`) as the real values they are. A complex value lives inside
the forward only; what the step returns is real.

The FFTs (`_fft_r2c`, `_fft_c2c`, `_fft_c2r`, into which `torch.fft`'s
functions decompose) are products with the discrete Fourier transform's
cosine and sine matrices, one axis at a time (the transform is separable),
computed at import in float64 and rounded once to the parts' dtype. They
are plain lg matmuls, so every backend, every SBP rule and autodiff take
them as they are, and the gradient is the matmuls' (the transpose
transform). A product costs O(n^2) per axis where an FFT costs O(n log n):
right for the lengths models transform (a sequence, a hidden size, an
image side), not for long signals.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from sbpc import frontend as fe
from sbpc.frontend import Tensor
from sbpc.torch_import.aten.elementwise import _atan2
from sbpc.torch_import.aten.graph import _getitem
from sbpc.torch_import.aten.registry import COMPLEX_RULES, RULES, _dims, complex_rule
from sbpc.torch_import.values import PART_DTYPES, Complex, _map, is_complex_constant, to_numpy

if TYPE_CHECKING:
    # for the annotations only: the importer loads the rules (through their
    # registry) before it defines _Importer
    from sbpc.torch_import.importer import _Importer

_NORMALIZATION = ("none", "by_root_n", "by_n")
"""ATen's fft_norm_mode, by its number: the scale of a transform of n points is 1, 1/sqrt(n) or 1/n."""


def _part_dtype(im: _Importer) -> str:
    """The parts' dtype of the node's complex result (as PyTorch traced it),
    or the dtype of its real one."""
    dtype = str(getattr(im.node.meta.get("val"), "dtype", None))
    if dtype in PART_DTYPES:
        return PART_DTYPES[dtype]
    return {"torch.float32": "f32", "torch.float64": "f64"}.get(dtype, "f32")


def _real(im: _Importer, value, dtype: str) -> Tensor:
    """A real operand (a tensor, a constant, a number) as an lg value of `dtype`."""
    if isinstance(value, bool | int | float):
        return im.g.constant(np.asarray(value, dtype=fe._numpy_of(fe.element(dtype))))
    value = im.lift(value)
    return value if str(value.dtype) == dtype else fe.cast(value, dtype)


def _parts(im: _Importer, value, dtype: str) -> tuple[Tensor, Tensor | None]:
    """An operand's real and imaginary parts in `dtype`; None for the
    imaginary part of a real one. A complex constant's parts are lifted once."""
    if isinstance(value, Complex):
        return _real(im, value.re, dtype), _real(im, value.im, dtype)
    if isinstance(value, complex):
        return _real(im, value.real, dtype), _real(im, value.imag, dtype)
    if is_complex_constant(value):
        import torch

        def part(index: int) -> Tensor:
            return im.constant_of(value, lambda: im.g.constant(
                to_numpy(torch.view_as_real(value.value.resolve_conj())[..., index])), index)

        return _real(im, part(0), dtype), _real(im, part(1), dtype)
    return _real(im, value, dtype), None


def _zeros_like(x: Tensor) -> Tensor:
    """Zeros of `x`'s shape and dtype (not x * 0, which is NaN where x is infinite)."""
    zero = x.graph.constant(np.zeros((), fe._numpy_of(fe.element(str(x.dtype)))))
    return fe.broadcast_to(zero, list(x.shape)) if x.shape else zero


def _both(im: _Importer, z) -> tuple[Tensor, Tensor]:
    """A complex operand's two parts, in the dtype of the node's result."""
    re, imag = _parts(im, z, _part_dtype(im))
    return re, imag if imag is not None else _zeros_like(re)


def _joined(re: Tensor, imag: Tensor | None) -> Complex:
    """A complex value from parts that may differ in shape by broadcasting
    (a real operand's missing imaginary part is zero)."""
    if imag is None:
        imag = _zeros_like(re)
    shape = tuple(np.broadcast_shapes(re.shape, imag.shape))
    return Complex(re if re.shape == shape else fe.broadcast_to(re, list(shape)),
                   imag if imag.shape == shape else fe.broadcast_to(imag, list(shape)))


# -- made from real values ------------------------------------------------------


@complex_rule("aten.complex")
def _complex(im: _Importer, re, imag):
    dtype = _part_dtype(im)
    return _joined(_real(im, re, dtype), _real(im, imag, dtype))


@complex_rule("aten.polar")
def _polar(im: _Importer, magnitude, angle):
    dtype = _part_dtype(im)
    magnitude, angle = _real(im, magnitude, dtype), _real(im, angle, dtype)
    return _joined(magnitude * fe.cos(angle), magnitude * fe.sin(angle))


@complex_rule("aten.view_as_complex")
def _view_as_complex(im: _Importer, x):
    x = im.lift(x)
    if not x.shape or x.shape[-1] != 2:
        raise ValueError(f"view_as_complex of {list(x.shape)}: the last axis must hold 2 (real, imaginary)")
    rank = len(x.shape)
    parts = [fe.reshape(fe.slice(x, [0] * (rank - 1) + [i], [*x.shape[:-1], i + 1]), list(x.shape[:-1]))
             for i in (0, 1)]
    return Complex(parts[0], parts[1])


# -- their parts ----------------------------------------------------------------


@complex_rule("aten.real")
def _real_part(im: _Importer, z):
    return _parts(im, z, _part_dtype(im))[0]


@complex_rule("aten.imag")
def _imaginary_part(im: _Importer, z):
    return _both(im, z)[1]


@complex_rule("aten.view_as_real")
def _view_as_real(im: _Importer, z):
    re, imag = _both(im, z)
    shape = [*re.shape, 1]
    return fe.concat([fe.reshape(re, shape), fe.reshape(imag, shape)], len(re.shape))


@complex_rule("aten.abs")
def _abs(im: _Importer, z):
    """The magnitude, whose gradient at zero is zero as in PyTorch (the
    square root is taken of 1 there, so its own gradient stays finite)."""
    re, imag = _both(im, z)
    squared = re * re + imag * imag
    zero = im.lift(0.0, squared)
    nonzero = fe.compare("gt", squared, zero)
    return fe.where(nonzero, fe.sqrt(fe.where(nonzero, squared, im.lift(1.0, squared))), zero)


@complex_rule("aten.angle")
def _angle(im: _Importer, z):
    re, imag = _both(im, z)
    return _atan2(im, imag, re)


# -- arithmetic -----------------------------------------------------------------


@complex_rule("aten._conj", "aten.conj", "aten.conj_physical")
def _conj(im: _Importer, z):
    re, imag = _parts(im, z, _part_dtype(im))
    return _joined(re, None if imag is None else -imag)


@complex_rule("aten.resolve_conj", "aten.resolve_neg")
def _resolved(im: _Importer, z):
    return z


@complex_rule("aten.neg", "aten._neg_view")
def _neg(im: _Importer, z):
    re, imag = _parts(im, z, _part_dtype(im))
    return _joined(-re, None if imag is None else -imag)


def _sum(sign: int):
    def lower(im: _Importer, a, b, alpha=1):
        """a + alpha b (sign 1) or a - alpha b (sign -1), part by part."""
        dtype = _part_dtype(im)
        (a_re, a_im), (b_re, b_im) = _parts(im, a, dtype), _parts(im, b, dtype)
        if sign * alpha != 1:
            b_re, b_im = b_re * float(sign * alpha), None if b_im is None else b_im * float(sign * alpha)
        imag = a_im if b_im is None else b_im if a_im is None else a_im + b_im
        return _joined(a_re + b_re, imag)

    return lower


COMPLEX_RULES["aten.add.Tensor"] = COMPLEX_RULES["aten.add.Scalar"] = _sum(1)
COMPLEX_RULES["aten.sub.Tensor"] = COMPLEX_RULES["aten.sub.Scalar"] = _sum(-1)


def _times(a: tuple[Tensor, Tensor | None], b: tuple[Tensor, Tensor | None]) -> tuple[Tensor, Tensor | None]:
    """(a + bi)(c + di) = (ac - bd) + (ad + bc)i, skipping missing (zero) imaginary parts."""
    (a_re, a_im), (b_re, b_im) = a, b
    if a_im is None and b_im is None:
        return a_re * b_re, None
    if b_im is None:
        return a_re * b_re, a_im * b_re
    if a_im is None:
        return a_re * b_re, a_re * b_im
    return a_re * b_re - a_im * b_im, a_re * b_im + a_im * b_re


@complex_rule("aten.mul.Tensor", "aten.mul.Scalar")
def _mul(im: _Importer, a, b):
    dtype = _part_dtype(im)
    return _joined(*_times(_parts(im, a, dtype), _parts(im, b, dtype)))


@complex_rule("aten.div.Tensor", "aten.div.Scalar")
def _div(im: _Importer, a, b):
    dtype = _part_dtype(im)
    top, (b_re, b_im) = _parts(im, a, dtype), _parts(im, b, dtype)
    if b_im is None:
        return _joined(top[0] / b_re, None if top[1] is None else top[1] / b_re)
    re, imag = _times(top, (b_re, -b_im))  # a / b = a conj(b) / |b|^2
    size = b_re * b_re + b_im * b_im
    return _joined(re / size, None if imag is None else imag / size)


@complex_rule("aten.exp")
def _exp(im: _Importer, z):
    re, imag = _parts(im, z, _part_dtype(im))
    scale = fe.exp(re)
    return _joined(scale, None) if imag is None else _joined(scale * fe.cos(imag), scale * fe.sin(imag))


@complex_rule("aten.matmul", "aten.mm", "aten.bmm")
def _matmul(im: _Importer, a, b):
    """(A + Bi)(C + Di) = (AC - BD) + (AD + BC)i: four real products, or
    two where one operand is real."""
    dtype = _part_dtype(im)
    (a_re, a_im), (b_re, b_im) = _parts(im, a, dtype), _parts(im, b, dtype)
    re = fe.matmul(a_re, b_re)
    if b_im is None:
        return _joined(re, fe.matmul(a_im, b_re) if a_im is not None else None)
    if a_im is None:
        return _joined(re, fe.matmul(a_re, b_im))
    return _joined(re - fe.matmul(a_im, b_im), fe.matmul(a_re, b_im) + fe.matmul(a_im, b_re))


@complex_rule("aten._to_copy")
def _to_copy(im: _Importer, z, dtype=None, **placement):
    """A copy, a change of precision (complex64 <-> complex128), or a real
    value made complex (a zero imaginary part); a complex value converted
    to a real dtype is refused, as PyTorch warns that it drops the
    imaginary part."""
    wanted = _part_dtype(im)
    if dtype is not None and str(dtype) not in PART_DTYPES:
        raise ValueError(f"a complex value converted to {dtype} (take .real or .abs() first)")
    re, imag = _parts(im, z, wanted)
    return _joined(re, imag)


# -- the discrete Fourier transforms --------------------------------------------


def _along(x: Tensor, axis: int, matrix: np.ndarray) -> Tensor:
    """`x` times `matrix` [n, m] along `axis` (of length n, then m)."""
    rank = len(x.shape)
    matrix_value = x.graph.constant(matrix.astype(fe._numpy_of(fe.element(str(x.dtype)))))
    if rank == 1:
        return fe.reshape(fe.matmul(fe.reshape(x, [1, x.shape[0]]), matrix_value), [matrix.shape[1]])
    if axis == rank - 1:
        return fe.matmul(x, matrix_value)
    swap = list(range(rank))
    swap[axis], swap[-1] = swap[-1], swap[axis]
    return fe.transpose(fe.matmul(fe.transpose(x, swap), matrix_value), swap)


def _unit_circle(rows: int, columns: int, n: int) -> tuple[np.ndarray, np.ndarray]:
    """cos and sin of 2 pi j k / n for j < rows, k < columns: j k reduced
    mod n in integers before the float64 product, and the quarter turns
    exact (sin 0 = sin pi = cos pi/2 = 0), so a real signal's constant and
    Nyquist frequencies have exactly no imaginary part, as in PyTorch, and
    their angle is 0 or pi, never -pi by a rounding's sign."""
    turns = (np.arange(rows)[:, None] * np.arange(columns)[None, :]) % n
    angles = 2.0 * math.pi * turns / n
    cosines, sines = np.cos(angles), np.sin(angles)
    sines[(2 * turns) % n == 0] = 0.0
    cosines[((4 * turns) % n == 0) & ((2 * turns) % n != 0)] = 0.0
    return cosines, sines


def _scale(n: int, normalization: int) -> float:
    mode = _NORMALIZATION[normalization]
    return 1.0 if mode == "none" else 1.0 / math.sqrt(n) if mode == "by_root_n" else 1.0 / n


def _transform(z: tuple[Tensor, Tensor | None], axis: int, sign: int, scale: float,
               bins: int | None = None) -> tuple[Tensor, Tensor]:
    """The DFT of `z` along `axis`: sum_j z_j exp(sign 2 pi i j k / n), k <
    `bins` (n where None). With W = C + i sign S, (a + bi) W = (aC - sign
    bS) + (bC + sign aS) i."""
    re, imag = z
    n = re.shape[axis]
    cosines, sines = _unit_circle(n, bins if bins is not None else n, n)
    cosines, sines = cosines * scale, sines * (sign * scale)
    out_re, out_im = _along(re, axis, cosines), _along(re, axis, sines)
    if imag is not None:
        out_re = out_re - _along(imag, axis, sines)
        out_im = out_im + _along(imag, axis, cosines)
    return out_re, out_im


@complex_rule("aten._fft_r2c")
def _fft_r2c(im: _Importer, x, dim, normalization, onesided):
    """The forward DFT of a real tensor over `dim`: along its last axis the
    first n // 2 + 1 frequencies where `onesided` (the others are their
    conjugates), then along the others in full."""
    x = im.lift(x)
    axes = _dims(dim, len(x.shape))
    total = math.prod(x.shape[a] for a in axes)
    last = axes[-1]
    n = x.shape[last]
    z = _transform((x, None), last, -1, _scale(total, normalization), n // 2 + 1 if onesided else n)
    for axis in axes[:-1]:
        z = _transform(z, axis, -1, 1.0)
    return Complex(*z)


@complex_rule("aten._fft_c2c")
def _fft_c2c(im: _Importer, z, dim, normalization, forward):
    z = _parts(im, z, _part_dtype(im))
    axes = _dims(dim, len(z[0].shape))
    scale = _scale(math.prod(z[0].shape[a] for a in axes), normalization)
    for i, axis in enumerate(axes):
        z = _transform(z, axis, -1 if forward else 1, scale if i == 0 else 1.0)
    return _joined(*z)


@complex_rule("aten._fft_c2r")
def _fft_c2r(im: _Importer, z, dim, normalization, last_dim_size):
    """The inverse DFT to a real tensor of `last_dim_size` points along the
    last axis of `dim`, from its first n // 2 + 1 frequencies (the others
    are their conjugates): x_t = sum_k w_k (Re X_k cos - Im X_k sin)(2 pi k
    t / n), with w_k = 2 for the frequencies that stand for a conjugate
    pair and 1 for the constant term and (n even) the Nyquist one, whose
    imaginary parts drop out (sin 0 = sin pi t = 0), as in PyTorch."""
    parts = _parts(im, z, _part_dtype(im))
    axes = _dims(dim, len(parts[0].shape))
    last, n = axes[-1], int(last_dim_size)
    if parts[0].shape[last] != n // 2 + 1:
        raise ValueError(f"an inverse real FFT of {n} points from {parts[0].shape[last]} frequencies "
                         f"(it takes n // 2 + 1 = {n // 2 + 1})")
    total = math.prod(parts[0].shape[a] for a in axes[:-1]) * n
    for axis in axes[:-1]:
        parts = _transform(parts, axis, 1, 1.0)
    re, imag = parts
    bins = n // 2 + 1
    weights = np.full(bins, 2.0)
    weights[0] = 1.0
    if n % 2 == 0:
        weights[-1] = 1.0
    cosines, sines = _unit_circle(bins, n, n)
    scale = _scale(total, normalization) * weights[:, None]
    out = _along(re, last, cosines * scale)
    if imag is not None:
        out = out - _along(imag, last, sines * scale)
    return out


# -- ops that act on each part alone --------------------------------------------


PARTWISE = frozenset({
    "aten.view", "aten.reshape", "aten._unsafe_view", "aten.flatten.using_ints", "aten.unsqueeze", "aten.squeeze",
    "aten.squeeze.dim", "aten.squeeze.dims", "aten.transpose.int", "aten.t", "aten.permute", "aten.expand",
    "aten.contiguous", "aten.clone", "aten.alias", "aten.lift_fresh_copy", "aten.chunk", "aten.split.Tensor",
    "aten.split_with_sizes", "aten.slice.Tensor", "aten.narrow", "aten.select.int", "aten.cat", "aten.repeat",
    "aten.flip", "aten.index_select", "aten.index.Tensor", "aten.gather", "aten.diagonal", "aten.sum",
    "aten.sum.dim_IntList", "aten.mean", "aten.mean.dim", "aten.detach",
})
"""Ops that act on a complex tensor as on each of its parts alone (views,
moves, copies and sums: real-linear, and blind to how the numbers
multiply): a complex operand runs through the op's real rule once per
part (`_partwise`)."""


def _partwise(im: _Importer, name: str, args, kwargs):
    """A `PARTWISE` op on complex operands: its real rule once on
    the real parts and once on the imaginary ones (a real float tensor
    among them, beside a complex one in `cat`, has a zero imaginary part;
    integer tensors, indices, are the same for both)."""
    dtype = _part_dtype(im)

    def part(index: int):
        def pick(value):
            if isinstance(value, Complex) or is_complex_constant(value):
                return _parts(im, value, dtype)[index]
            if isinstance(value, Tensor) and str(value.dtype) in ("f32", "f64", "f16", "bf16"):
                return value if index == 0 else _zeros_like(value)
            return value

        return pick

    rule_of = RULES[name]
    re = rule_of(im, *_map(args, part(0)), **{k: _map(v, part(0)) for k, v in kwargs.items()})
    imag = rule_of(im, *_map(args, part(1)), **{k: _map(v, part(1)) for k, v in kwargs.items()})
    if isinstance(re, list | tuple):
        return type(re)(Complex(r, i) for r, i in zip(re, imag, strict=True))
    return Complex(re, imag)


COMPLEX_RULES["getitem"] = _getitem  # one of an op's several results (a split's pieces)


def _part_by_part(name: str):
    return lambda im, *args, **kwargs: _partwise(im, name, args, kwargs)


for _name in PARTWISE:
    COMPLEX_RULES[_name] = _part_by_part(_name)
