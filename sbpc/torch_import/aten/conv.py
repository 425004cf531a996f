"""2-D convolution and pooling of batched NCHW images, 3-D pooling of NCDHW volumes."""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from sbpc import frontend as fe
from sbpc.dialects import lg
from sbpc.frontend import Tensor
from sbpc.torch_import.aten.registry import rule

if TYPE_CHECKING:
    # for the annotations only: the importer loads the rules (through their
    # registry) before it defines _Importer
    from sbpc.torch_import.importer import _Importer


def _pair(v) -> tuple[int, int]:
    """PyTorch's int-or-pair argument of 2-D convolutions and pooling."""
    if isinstance(v, int):
        return v, v
    if len(v) == 1:
        return int(v[0]), int(v[0])
    return int(v[0]), int(v[1])


def _images(im: _Importer, x, what: str) -> Tensor:
    x = im.lift(x)
    if len(x.shape) != 4:
        raise ValueError(f"{what} of a {len(x.shape)}-D input (sbpc takes batched NCHW images)")
    return x


@rule("aten.conv2d", "aten.conv2d.padding")
def _conv2d(im: _Importer, x, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
    x, weight = _images(im, x, "conv2d"), im.lift(weight)
    pair = _pair
    dilation = pair(dilation)
    if padding == "valid":
        padding = 0
    elif padding == "same":
        total = [dilation[a] * (weight.shape[2 + a] - 1) for a in range(2)]
        if any(t % 2 for t in total):
            raise ValueError("conv2d padding='same' with an even kernel extent (PyTorch pads one side more)")
        padding = [t // 2 for t in total]
    y = fe.conv2d(x, weight, pair(stride), pair(padding), dilation, groups)
    return y if bias is None else y + fe.reshape(im.lift(bias), [weight.shape[0], 1, 1])


@rule("aten.max_pool2d")
def _max_pool2d(im: _Importer, x, kernel_size, stride=(), padding=0, dilation=1, ceil_mode=False):
    if _pair(dilation) != (1, 1) or ceil_mode:
        raise ValueError("max_pool2d with dilation or ceil_mode")
    kernel = _pair(kernel_size)
    x = _images(im, x, "max_pool2d")
    return x.graph.add(lg.MaxPool2dOp(x.value, kernel, _pair(stride) if stride else kernel, _pair(padding)))


@rule("aten.max_pool2d_with_indices")
def _max_pool2d_with_indices(im: _Importer, x, kernel_size, stride=(), padding=0, dilation=1, ceil_mode=False):
    """(the maxima, the index of each in its image's plane, h * W + w): the
    maxima as max_pool2d, the indices as _first_maxima finds them."""
    values = _max_pool2d(im, x, kernel_size, stride, padding, dilation, ceil_mode)
    x = _images(im, x, "max_pool2d_with_indices")
    kernel = _pair(kernel_size)
    _, _, indices = _first_maxima(im, x, kernel, _pair(stride) if stride else kernel, _pair(padding))
    return [values, indices]


def _triple(v) -> tuple[int, int, int]:
    """PyTorch's int-or-triple argument of 3-D pooling."""
    if isinstance(v, int):
        return v, v, v
    return (int(v[0]),) * 3 if len(v) == 1 else (int(v[0]), int(v[1]), int(v[2]))


def _volumes(im: _Importer, x, what: str) -> Tensor:
    x = im.lift(x)
    if len(x.shape) != 5:
        raise ValueError(f"{what} of a {len(x.shape)}-D input (takes batched NCDHW volumes)")
    return x


def _windows(x: Tensor, kernel: Sequence[int], stride: Sequence[int], padding: Sequence[int],
             fill: float) -> Tensor:
    """(N, C, *out, K): each pooling window's K elements of `x` (N, C, *spatial)
    on a last axis, in row-major order of the window, the padding `fill`:
    one strided slice per place in the window."""
    n, c, *spatial = x.shape
    out = [(size + 2 * p - k) // s + 1 for size, k, s, p in zip(spatial, kernel, stride, padding)]
    padded = fe.pad(x, [0, 0, *padding], [0, 0, *padding], fill)

    def at(place):  # the window's element at `place`, for every window
        limits = [n, c, *(o + s * (m - 1) + 1 for o, s, m in zip(place, stride, out))]
        return fe.reshape(fe.slice(padded, [0, 0, *place], limits, [1, 1, *stride]), [n, c, *out, 1])

    return fe.concat([at(place) for place in itertools.product(*(range(k) for k in kernel))], len(x.shape))


def _first_maxima(im: _Importer, x: Tensor, kernel, stride, padding) -> tuple[Tensor, Tensor, Tensor]:
    """(_windows of `x`, the place in each of its first largest element in
    row-major order (PyTorch's choice, lg.argmax), and that element's index
    in the flattened image: h * W + w, or d * H * W + h * W + w)."""
    windows = _windows(x, kernel, stride, padding, -np.inf)
    first = fe.argmax(windows, len(windows.shape) - 1)
    spatial, out = x.shape[2:], first.shape[2:]
    strides = [math.prod(spatial[a + 1:]) for a in range(len(spatial))]  # of the flattened image
    corner = sum(np.reshape((np.arange(o) * s - p) * step, [o if b == a else 1 for b in range(len(out))])
                 for a, (o, s, p, step) in enumerate(zip(out, stride, padding, strides)))
    index = im.g.constant(np.asarray(corner, np.int64))
    rest = first
    for a in range(len(kernel)):  # the place in the window, axis by axis
        inner = math.prod(kernel[a + 1:])
        place = fe.floordiv(rest, inner)
        rest = rest - place * inner
        index = index + place * strides[a]
    return windows, first, index


@rule("aten.max_pool3d_with_indices")
def _max_pool3d_with_indices(im: _Importer, x, kernel_size, stride=(), padding=0, dilation=1, ceil_mode=False):
    """(the maxima, the index of each in its volume, d * H * W + h * W + w):
    each maximum is the element _first_maxima picks, so its gradient goes
    there alone, as PyTorch routes it."""
    if _triple(dilation) != (1, 1, 1) or ceil_mode:
        raise ValueError("max_pool3d_with_indices with dilation or ceil_mode")
    x = _volumes(im, x, "max_pool3d_with_indices")
    kernel = _triple(kernel_size)
    windows, first, indices = _first_maxima(im, x, kernel, _triple(stride) if stride else kernel, _triple(padding))
    last = len(windows.shape) - 1
    picked = fe.compare("eq", fe.reshape(first, [*first.shape, 1]),
                        im.g.constant(np.arange(windows.shape[last], dtype=np.int64)))
    values = fe.reduce_sum(fe.where(picked, windows, im.g.constant(np.zeros((), fe._numpy_of(x.dtype)))), [last])
    return [values, indices]


@rule("aten.avg_pool3d")
def _avg_pool3d(im: _Importer, x, kernel_size, stride=(), padding=0, ceil_mode=False, count_include_pad=True,
                divisor_override=None):
    """The mean of each window, the padding counted (PyTorch's default)."""
    if ceil_mode or divisor_override is not None or (not count_include_pad and _triple(padding) != (0, 0, 0)):
        raise ValueError("avg_pool3d with ceil_mode, divisor_override or count_include_pad=False over padding")
    x = _volumes(im, x, "avg_pool3d")
    kernel = _triple(kernel_size)
    windows = _windows(x, kernel, _triple(stride) if stride else kernel, _triple(padding), 0.0)
    return fe.reduce_mean(windows, [len(windows.shape) - 1])


@rule("aten._adaptive_avg_pool3d")
def _adaptive_avg_pool3d(im: _Importer, x, output_size):
    """The mean of each of the windows that tile the volume."""
    x = _volumes(im, x, "_adaptive_avg_pool3d")
    out = tuple(x.shape[2 + a] if s is None else int(s) for a, s in enumerate(output_size))
    if any(x.shape[2 + a] % out[a] for a in range(3)):
        raise ValueError(f"_adaptive_avg_pool3d from {list(x.shape[2:])} to {list(out)}, which is not a whole "
                         "number of planes, rows and columns per output")
    kernel = tuple(x.shape[2 + a] // out[a] for a in range(3))
    windows = _windows(x, kernel, kernel, (0, 0, 0), 0.0)
    return fe.reduce_mean(windows, [len(windows.shape) - 1])


@rule("aten.max_pool2d_with_indices_backward")
def _max_pool2d_with_indices_backward(im: _Importer, grad, x, kernel_size, stride, padding, dilation, ceil_mode,
                                      indices):
    """Each window's gradient to its first largest element: where the
    indices point, as they come from the same images (lg.max_pool2d_grad)."""
    if _pair(dilation) != (1, 1) or ceil_mode:
        raise ValueError("max_pool2d_with_indices_backward with dilation or ceil_mode")
    x, grad = _images(im, x, "max_pool2d_with_indices_backward"), im.lift(grad)
    kernel = _pair(kernel_size)
    return x.graph.add(lg.MaxPool2dGradOp(x.value, grad.value, kernel, _pair(stride) if stride else kernel,
                                          _pair(padding)))


@rule("aten.avg_pool2d")
def _avg_pool2d(im: _Importer, x, kernel_size, stride=(), padding=0, ceil_mode=False, count_include_pad=True,
                divisor_override=None):
    """A depthwise convolution by a constant 1 / (kh * kw): PyTorch's average
    with the padding counted (its default)."""
    if ceil_mode or divisor_override is not None or (not count_include_pad and _pair(padding) != (0, 0)):
        raise ValueError("avg_pool2d with ceil_mode, divisor_override or count_include_pad=False over padding")
    x = _images(im, x, "avg_pool2d")
    kernel = _pair(kernel_size)
    return _average(im, x, kernel, _pair(stride) if stride else kernel, _pair(padding))


def _averaging(im: _Importer, x: Tensor, kernel) -> Tensor:
    """The depthwise weight that averages a window: 1 / (kh * kw) per channel."""
    return im.g.constant(np.full((x.shape[1], 1, *kernel), 1.0 / (kernel[0] * kernel[1]), fe._numpy_of(x.dtype)))


def _average(im: _Importer, x: Tensor, kernel, stride, padding) -> Tensor:
    return fe.conv2d(x, _averaging(im, x, kernel), stride, padding, 1, x.shape[1])


def _average_gradient(im: _Importer, grad, x: Tensor, kernel, stride, padding) -> Tensor:
    """The gradient of _average: its transposed convolution."""
    grad = im.lift(grad)
    return x.graph.add(lg.Conv2dGradInputOp(grad.value, _averaging(im, x, kernel).value, x.shape[2:], stride,
                                            padding, (1, 1), x.shape[1]))


@rule("aten.avg_pool2d_backward")
def _avg_pool2d_backward(im: _Importer, grad, x, kernel_size, stride, padding, ceil_mode, count_include_pad,
                         divisor_override):
    """avg_pool2d's gradient (its depthwise convolution's, transposed)."""
    if ceil_mode or divisor_override is not None or (not count_include_pad and _pair(padding) != (0, 0)):
        raise ValueError("avg_pool2d_backward with ceil_mode, divisor_override or count_include_pad=False over "
                         "padding")
    x = _images(im, x, "avg_pool2d_backward")
    kernel = _pair(kernel_size)
    return _average_gradient(im, grad, x, kernel, _pair(stride) if stride else kernel, _pair(padding))


@rule("aten._adaptive_avg_pool2d_backward")
def _adaptive_avg_pool2d_backward(im: _Importer, grad, x):
    """_adaptive_avg_pool2d's gradient, where its windows tile the image."""
    x, grad = _images(im, x, "_adaptive_avg_pool2d_backward"), im.lift(grad)
    out = tuple(grad.shape[2:])
    if any(x.shape[2 + a] % out[a] for a in range(2)):
        raise ValueError(f"_adaptive_avg_pool2d_backward from {list(out)} to {list(x.shape[2:])}, which is not a "
                         "whole number of rows and columns per output")
    kernel = (x.shape[2] // out[0], x.shape[3] // out[1])
    return _average_gradient(im, grad, x, kernel, kernel, (0, 0))


@rule("aten.adaptive_avg_pool2d", "aten._adaptive_avg_pool2d")
def _adaptive_avg_pool2d(im: _Importer, x, output_size):
    x = _images(im, x, "adaptive_avg_pool2d")
    sizes = [output_size] * 2 if isinstance(output_size, int) else list(output_size) * (3 - len(output_size))
    out = tuple(x.shape[2 + a] if s is None else int(s) for a, s in enumerate(sizes[:2]))
    if out == (1, 1):  # ResNet's global average: a mean over the image
        return fe.reduce_mean(x, [2, 3], keepdims=True)
    if any(x.shape[2 + a] % out[a] for a in range(2)):
        raise ValueError(f"adaptive_avg_pool2d from {list(x.shape[2:])} to {list(out)}, which is not a whole "
                         "number of rows and columns per output")
    kernel = (x.shape[2] // out[0], x.shape[3] // out[1])
    return _average(im, x, kernel, kernel, (0, 0))


@rule("aten.convolution")
def _convolution(im: _Importer, x, weight, bias, stride, padding, dilation, transposed, output_padding, groups):
    """The generic convolution, for the 2-D, not transposed case (`conv2d`)."""
    if transposed:
        raise ValueError("a transposed convolution")
    rank = len(im.lift(x).shape)
    if rank == 3:
        return _conv1d(im, x, weight, bias, stride, padding, dilation, groups)
    if rank != 4:
        raise ValueError(f"a {rank - 2}-D convolution (supported: 1-D and 2-D)")
    return _conv2d(im, x, weight, bias, stride, padding, dilation, groups)


@rule("aten.col2im")
def _col2im(im: _Importer, x, output_size, kernel_size, dilation, padding, stride):
    """Each column's patch summed back into its image (`fold`, the inverse
    of `unfold`): the transposed convolution, in C groups, of the columns
    (N, C * kh * kw, L) by a weight that puts each of a patch's kh * kw
    elements in its place."""
    x = im.lift(x)
    if len(x.shape) != 3:
        raise ValueError(f"col2im of a {len(x.shape)}-D input (takes (N, C * kh * kw, L) columns)")
    (kh, kw), size = _pair(kernel_size), _pair(output_size)
    dilation, padding, stride = _pair(dilation), _pair(padding), _pair(stride)
    n, rows, length = x.shape
    if rows % (kh * kw):
        raise ValueError(f"col2im of {rows} rows, not a whole number of {kh}x{kw} patches")
    channels = rows // (kh * kw)
    out = [(size[a] + 2 * padding[a] - dilation[a] * ((kh, kw)[a] - 1) - 1) // stride[a] + 1 for a in range(2)]
    if out[0] * out[1] != length:
        raise ValueError(f"col2im of {length} columns into {list(size)}: the patches make {out[0]}x{out[1]}")
    weight = np.zeros((rows, 1, kh, kw), fe._numpy_of(x.dtype))
    place = np.arange(rows) % (kh * kw)  # row c * kh * kw + k holds element k of channel c's patch
    weight[np.arange(rows), 0, place // kw, place % kw] = 1.0
    cols = fe.reshape(x, [n, rows, *out])
    return x.graph.add(lg.Conv2dGradInputOp(cols.value, im.g.constant(weight).value, size, stride, padding, dilation,
                                            channels))


@rule("aten.grid_sampler_2d")
def _grid_sampler_2d(im: _Importer, x, grid, interpolation_mode, padding_mode, align_corners):
    """Images sampled at the grid's points (`F.grid_sample`): (N, C, H, W)
    at (N, Ho, Wo, 2) points (x, y) in [-1, 1] -> (N, C, Ho, Wo), bilinear
    (mode 0) or nearest (mode 1), outside the image zero (padding 0) or its
    border (padding 1). Each corner a point reads is gathered from the
    flattened image by its computed index; bilinear weights are the
    point's distances to the corners, so the grid takes a gradient too."""
    mode, padding = int(interpolation_mode), int(padding_mode)
    if mode not in (0, 1) or padding not in (0, 1):
        raise ValueError(f"grid_sampler_2d with interpolation mode {mode} and padding mode {padding} (bilinear and "
                         "nearest, with zeros and border padding, are imported)")
    x, grid = _images(im, x, "grid_sampler_2d"), im.lift(grid)
    n, c, h, w = x.shape
    _, oh, ow, _ = grid.shape
    points = oh * ow

    def pixel(axis: int, size: int) -> Tensor:  # the grid's coordinate on `axis` in pixels, (N, Ho * Wo)
        v = fe.reshape(fe.slice(grid, [0, 0, 0, axis], [n, oh, ow, axis + 1]), [n, points])
        v = (v + 1.0) * ((size - 1) / 2.0) if align_corners else ((v + 1.0) * size - 1.0) * 0.5
        if padding == 1:  # clamped to the border
            low, high = im.lift(0.0, v), im.lift(float(size - 1), v)
            v = fe.where(fe.compare("lt", v, low), low, v)
            v = fe.where(fe.compare("gt", v, high), high, v)
        return v

    px, py = pixel(0, w), pixel(1, h)
    flat = fe.reshape(x, [n, c, h * w])

    def read(cx: Tensor, cy: Tensor) -> tuple[Tensor, Tensor]:
        """(the images at whole pixel coordinates, (N, C, Ho * Wo); 1 where
        the pixel is inside the image, else 0, (N, 1, Ho * Wo))."""
        zero = im.lift(0.0, cx)

        def within(v: Tensor, size: int) -> Tensor:
            return fe.logical("and", fe.compare("ge", v, zero), fe.compare("le", v, im.lift(float(size - 1), v)))

        inside = fe.logical("and", within(cx, w), within(cy, h))
        safe_x, safe_y = fe.where(inside, cx, zero), fe.where(inside, cy, zero)
        index = fe.cast(safe_y * float(w) + safe_x, "i64")
        picked = fe.gather(flat, fe.broadcast_to(fe.reshape(index, [n, 1, points]), [n, c, points]), 2)
        return picked, fe.reshape(fe.cast(inside, str(x.dtype)), [n, 1, points])

    if mode == 1:  # nearest: the pixel the point rounds to (half to even, as PyTorch)
        picked, inside = read(fe.round(px), fe.round(py))
        return fe.reshape(picked * inside, [n, c, oh, ow])
    x0, y0 = fe.floor(px), fe.floor(py)
    fx, fy = px - x0, py - y0
    total = None
    for dx, dy, weight in ((0, 0, (1.0 - fx) * (1.0 - fy)), (1, 0, fx * (1.0 - fy)),
                           (0, 1, (1.0 - fx) * fy), (1, 1, fx * fy)):
        picked, inside = read(x0 + float(dx), y0 + float(dy))
        term = picked * (inside * fe.reshape(weight, [n, 1, points]))
        total = term if total is None else total + term
    assert total is not None
    return fe.reshape(total, [n, c, oh, ow])


@rule("aten.convolution_backward")
def _convolution_backward(im: _Importer, grad, x, weight, bias_sizes, stride, padding, dilation, transposed,
                          output_padding, groups, output_mask):
    """(the images' gradient, the weight's, the bias's) of a 2-D convolution,
    each where `output_mask` asks for it (None elsewhere): lg's gradients of
    lg.conv2d, and the bias's a sum over the batch and the image."""
    if transposed:
        raise ValueError("convolution_backward of a transposed convolution")
    x, weight, grad = im.lift(x), im.lift(weight), im.lift(grad)
    if len(x.shape) != 4:
        raise ValueError(f"convolution_backward of a {len(x.shape) - 2}-D convolution (supported: 2-D)")
    conv = (_pair(stride), _pair(padding), _pair(dilation), int(groups))
    wants = list(output_mask)
    return [x.graph.add(lg.Conv2dGradInputOp(grad.value, weight.value, x.shape[2:], *conv)) if wants[0] else None,
            x.graph.add(lg.Conv2dGradWeightOp(x.value, grad.value, weight.shape[2:], *conv)) if wants[1] else None,
            fe.reduce_sum(grad, [0, 2, 3]) if wants[2] else None]


def _single(value) -> int:
    return int(value[0] if isinstance(value, list | tuple) else value)


@rule("aten.conv1d", "aten.conv1d.padding")
def _conv1d(im: _Importer, x, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
    """A 1-D convolution over (N, C, L) (Whisper's front end) as a 2-D one
    over images one row high."""
    x, weight = im.lift(x), im.lift(weight)
    if len(x.shape) != 3:
        raise ValueError(f"conv1d of a {len(x.shape)}-D input (takes (N, C, L))")
    n, c, length = x.shape
    rows = fe.reshape(x, [n, c, 1, length])
    kernel = fe.reshape(weight, [weight.shape[0], weight.shape[1], 1, weight.shape[2]])
    pad = padding if isinstance(padding, str) else (0, _single(padding))
    y = _conv2d(im, rows, kernel, bias, (1, _single(stride)), pad, (1, _single(dilation)), groups)
    return fe.reshape(y, [n, y.shape[1], y.shape[3]])


@rule("aten.upsample_nearest2d.vec")
def _upsample_nearest2d(im: _Importer, x, output_size, scale_factors):
    """Nearest upsampling by whole factors: each pixel repeated in a block."""
    x = _images(im, x, "upsample_nearest2d")
    n, c, h, w = x.shape
    if output_size is not None:
        if output_size[0] % h or output_size[1] % w:
            raise ValueError(f"upsampling {h}x{w} to {list(output_size)} (supported: whole factors)")
        sh, sw = output_size[0] // h, output_size[1] // w
    else:
        if any(f != int(f) for f in scale_factors):
            raise ValueError(f"scale factors {list(scale_factors)} (supported: whole numbers)")
        sh, sw = int(scale_factors[0]), int(scale_factors[1])
    blocks = fe.broadcast_to(fe.reshape(x, [n, c, h, 1, w, 1]), [n, c, h, sh, w, sw])
    return fe.reshape(blocks, [n, c, h * sh, w * sw])


def _rows(x: Tensor) -> Tensor:
    """(N, C, L) as images one row high, (N, C, 1, L)."""
    return fe.reshape(x, [x.shape[0], x.shape[1], 1, x.shape[2]])


@rule("aten.avg_pool1d")
def _avg_pool1d(im: _Importer, x, kernel_size, stride=(), padding=0, ceil_mode=False, count_include_pad=True):
    x = im.lift(x)
    if len(x.shape) != 3:
        raise ValueError(f"avg_pool1d of a {len(x.shape)}-D input (takes (N, C, L))")
    k = _single(kernel_size)
    s = _single(stride) if stride else k
    y = _avg_pool2d(im, _rows(x), (1, k), (1, s), (0, _single(padding)), ceil_mode, count_include_pad)
    return fe.reshape(y, [y.shape[0], y.shape[1], y.shape[3]])


@rule("aten.adaptive_avg_pool1d")
def _adaptive_avg_pool1d(im: _Importer, x, output_size):
    x = im.lift(x)
    if len(x.shape) != 3:
        raise ValueError(f"adaptive_avg_pool1d of a {len(x.shape)}-D input (takes (N, C, L))")
    y = _adaptive_avg_pool2d(im, _rows(x), (1, _single(output_size)))
    return fe.reshape(y, [y.shape[0], y.shape[1], y.shape[3]])
