"""The numpy backend's kernels over windows: convolutions (and their
gradients) and max pooling, which numpy_kernels registers with the rest.
Like every numpy kernel, each writes into its output register and binds
its scratch once."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from sbpc.dialects import lg
from sbpc.semantics.reference import add_windows, windows_of

from . import winograd_kernels
from .numpy_binding import Fire, scratch

# -- convolutions -------------------------------------------------------------------------
# Each as GEMMs over the windows the convolution reads, copied once per
# firing into scratch laid out for the GEMM (im2col); the padded images are
# scratch too, their border zero from binding on. Two kinds need no copy of
# their windows: a 3x3 stride-1 convolution with channels and tiles enough
# goes by Winograd's F(2x2, 3x3) (winograd_kernels: 16 multiplies per 2x2
# output tile where im2col takes 36), and a 1x1 one over images as they lie.


class _Windows:
    """Padded images as scratch (the border `fill`, from binding on) and the
    view of the windows a convolution or pooling reads of them, (N, groups,
    C/groups, Ho, Wo, kh, kw), made once: each firing copies the images in."""

    def __init__(self, image_shape, kernel, stride, padding, dilation, groups: int, dtype, fill: float = 0.0,
                 flipped: bool = False):
        n, c, h, w = image_shape
        self.stride, self.dilation, self.padding = stride, dilation, padding
        self.image_shape, self.kernel, self.groups, self.flipped = image_shape, kernel, groups, flipped
        self.padded = np.full((n, c, h + 2 * padding[0], w + 2 * padding[1]), fill, dtype)
        self.inside = self.padded[:, :, padding[0]:padding[0] + h, padding[1]:padding[1] + w]
        self.view = self.windows(self.padded)

    def windows(self, images: np.ndarray) -> np.ndarray:
        """The window view of `images` shaped as the padded images (flipped:
        each window's taps in reverse order, a transposed convolution's)."""
        view = windows_of(images, self.image_shape, self.kernel, self.stride, self.padding, self.dilation,
                          self.groups)
        return view[..., ::-1, ::-1] if self.flipped else view

    @classmethod
    def of_conv(cls, op, image_shape, kernel, dtype) -> _Windows:
        p = op.params()
        return cls(image_shape, kernel, p["stride"], p["padding"], p["dilation"], p["groups"], dtype)


ONE_GEMM_BELOW = 128
"""Output positions per image below which a convolution's GEMM runs over
every image's windows at once. Per image it is a GEMM of Ho*Wo columns, and
one of a few columns runs at a fraction of the rate: ResNet's 3x3 layer of
256 channels on 2x2 images, batch 8, took 0.85 ms as 8 GEMMs of 4 columns
against 0.38 ms as one of 32 (one core, 2026-11-30, AMD EPYC Zen 5,
OpenBLAS SkylakeX). From 16x16 images up the GEMMs per image win: each
image's windows are copied and multiplied while they are in cache, where
the whole batch's windows (58 MB for ResNet-50's first 3x3 layer, batch 8)
went to memory and back (that layer: 13.7 -> 11.1 ms forward, 18.2 -> 14.8
ms for the weight's gradient), and the one GEMM also pays a transposing
copy of its product."""


GATHER_ROWS_UP_TO = 4
"""Output rows this short or shorter are copied into the windows' layout by
one gather of precomputed positions (np.take) rather than a strided copy,
which pays numpy's per-row overhead for rows of 2-4 elements: ResNet's
3x3 layers of 256 channels on 2x2 images, batch 8, 233 -> 74 us, of 128 on
4x4 images 240 -> 118 us; on 8x8 images the copy was the faster (one core
of a 2-core Intel Xeon, 2026-11-30)."""


def _columns(at: _Windows, dtype) -> tuple[np.ndarray, Callable[[], None]]:
    """Scratch for the windows laid out (G, K, N*Ho*Wo), each output row
    contiguous, and the copy that fills it from `at`'s padded images."""
    n, g, cg, ho, wo, kh, kw = at.view.shape
    cols = scratch((g, cg, kh, kw, n, ho, wo), dtype)
    if wo <= GATHER_ROWS_UP_TO:
        positions = np.arange(at.padded.size, dtype=np.intp).reshape(at.padded.shape)
        taken = np.ascontiguousarray(at.windows(positions).transpose(1, 2, 5, 6, 0, 3, 4)).reshape(-1)
        images, flat = at.padded.reshape(-1), cols.reshape(-1)

        def gather() -> None:  # ("clip": unbuffered; every position is in range)
            np.take(images, taken, out=flat, mode="clip")

        return cols.reshape(g, cg * kh * kw, n * ho * wo), gather
    return cols.reshape(g, cg * kh * kw, n * ho * wo), lambda: np.copyto(cols, at.view.transpose(1, 2, 5, 6, 0, 3, 4))


def _image_columns(at: _Windows, dtype) -> tuple[np.ndarray, Callable[[int], None]]:
    """Scratch for one image's windows laid out (G, K, Ho*Wo), and the copy
    that fills it with image i's from `at`'s padded images."""
    n, g, cg, ho, wo, kh, kw = at.view.shape
    cols = scratch((g, cg, kh, kw, ho, wo), dtype)
    return (cols.reshape(g, cg * kh * kw, ho * wo),
            lambda i: np.copyto(cols, at.view[i].transpose(0, 1, 4, 5, 2, 3)))


def _window_gemm(at: _Windows, rows: int, dtype) -> Callable[[np.ndarray, np.ndarray, np.ndarray], None]:
    """o (N, G*rows, Ho, Wo) = filters (G, rows, K) times each window (K)
    of the images copied into `at`: image by image where an image has
    ONE_GEMM_BELOW output positions or more, else as one GEMM over every
    image's windows and its product transposed into place."""
    n, g, cg, ho, wo, kh, kw = at.view.shape
    positions = ho * wo
    if positions >= ONE_GEMM_BELOW:
        image_cols, copy_image = _image_columns(at, dtype)

        def fire(images, filters, o):
            np.copyto(at.inside, images)
            for i in range(n):
                copy_image(i)
                np.matmul(filters, image_cols, out=o[i].reshape(g, rows, positions))

        return fire
    cols, copy_windows = _columns(at, dtype)
    product = scratch((g, rows, n, positions), dtype)

    def fire_once(images, filters, o):
        np.copyto(at.inside, images)
        copy_windows()
        np.matmul(filters, cols, out=product.reshape(g, rows, n * positions))
        np.copyto(o.reshape(n, g, rows, positions), product.transpose(2, 0, 1, 3))

    return fire_once


def _winograd(op, image_shape, filter_shape, dtype) -> bool:
    """Whether the convolution `op` of images of `image_shape` by filters
    of `filter_shape` (or its gradient) runs by Winograd's F(2x2, 3x3)."""
    p = op.params()
    return winograd_kernels.applies(image_shape, filter_shape, p["groups"], p["stride"], p["padding"],
                                    p["dilation"], dtype)


def _pointwise(op, kernel) -> bool:
    """Whether the convolution `op` reads each output position's own input
    position only (1x1, stride 1, unpadded): its images are the GEMM's
    windows as they lie, with nothing to copy."""
    p = op.params()
    return tuple(kernel) == (1, 1) and p["stride"] == (1, 1) and p["padding"] == (0, 0)


def bind_conv2d(op: lg.Conv2dOp, local, ins, out) -> Fire:
    x, w = ins
    g, kernel = op.params()["groups"], w.shape[2:]
    if _winograd(op, x.shape, w.shape, out.dtype):
        return winograd_kernels.conv2d(x.shape, w.shape, g, op.params()["padding"], out.dtype)
    n, c, h, width = x.shape
    if _pointwise(op, kernel) and h * width >= ONE_GEMM_BELOW:
        def pointwise(xs, o):  # (a GEMM per image, as BLAS reads the images)
            np.matmul(xs[1].reshape(g, -1, c // g), xs[0].reshape(n, g, c // g, h * width),
                      out=o.reshape(n, g, -1, h * width))

        return pointwise
    gemm = _window_gemm(_Windows.of_conv(op, x.shape, kernel, out.dtype), w.shape[0] // g, out.dtype)
    k = math.prod(w.shape[1:])

    def fire(xs, o):
        gemm(xs[0], xs[1].reshape(g, -1, k), o)

    return fire


def bind_conv2d_grad_weight(op: lg.Conv2dGradWeightOp, local, ins, out) -> Fire:
    x, grad = ins
    g, kernel = op.params()["groups"], op.params()["kernel"]
    if _winograd(op, x.shape, out.shape, out.dtype):
        return winograd_kernels.conv2d_grad_weight(x.shape, grad.shape, g, op.params()["padding"], out.dtype)
    if _pointwise(op, kernel) and math.prod(x.shape[2:]) >= ONE_GEMM_BELOW:
        return _pointwise_grad_weight(x.shape, grad.shape, g, out.dtype)
    at = _Windows.of_conv(op, x.shape, kernel, out.dtype)
    n, o_channels, ho, wo = grad.shape
    og, k, positions = o_channels // g, math.prod(out.shape[1:]), ho * wo
    # The windows copied with each output row contiguous (as the forward
    # copies them); laid out with K last the copy gathers K at the image's
    # strides, 2-3x the GEMM's own time on ResNet's 3x3 layers. The product
    # is formed transposed, windows (K, Ho*Wo) times gradients (Ho*Wo, O),
    # and transposed into place once: OpenBLAS runs that product at 220
    # GFLOP/s where the gradients times the windows transposed ran at 153
    # (ResNet-50's first 3x3 layer). Image by image (the products summed),
    # or all at once, as the forward (ONE_GEMM_BELOW).
    if positions >= ONE_GEMM_BELOW:
        image_cols, copy_image = _image_columns(at, out.dtype)
        total, share = scratch((g, k, og), out.dtype), scratch((g, k, og), out.dtype)  # (the gradient transposed)

        def fire(xs, o):
            total.fill(0)  # (a piece of no images has no share)
            np.copyto(at.inside, xs[0])
            for i in range(n):
                copy_image(i)
                np.matmul(image_cols, xs[1][i].reshape(g, og, positions).swapaxes(1, 2), out=share)
                np.add(total, share, out=total)
            np.copyto(o.reshape(g, og, k), total.swapaxes(1, 2))

        return fire
    cols, copy_windows = _columns(at, out.dtype)
    grads = scratch((g, og, n, positions), out.dtype)  # (G, O/G, N*Ho*Wo)

    def fire_once(xs, o):  # (the gradients times the windows transposed: faster on these small images)
        np.copyto(at.inside, xs[0])
        copy_windows()
        np.copyto(grads, xs[1].reshape(n, g, og, positions).transpose(1, 2, 0, 3))
        np.matmul(grads.reshape(g, og, n * positions), cols.swapaxes(1, 2), out=o.reshape(g, og, k))

    return fire_once


def _pointwise_grad_weight(x_shape, grad_shape, g: int, dtype) -> Fire:
    """A 1x1 convolution's weight gradient: each image's gradients times
    its images transposed (BLAS reads them so), summed: ResNet-50's 256 ->
    128 channel layer on 28x28 images, batch 8, 3.6 ms where copying both
    into one GEMM's layout took 4.5 (one core of a 2-core Intel Xeon,
    2026-12-01)."""
    n, c, h, w = x_shape
    k, positions = grad_shape[1], h * w
    share = scratch((g, k // g, c // g), dtype)

    def fire(xs, o):
        total = o.reshape(g, k // g, c // g)
        total.fill(0)  # (a piece of no images has no share)
        images, grads = xs[0].reshape(n, g, c // g, positions), xs[1].reshape(n, g, k // g, positions)
        for i in range(n):
            np.matmul(grads[i], images[i].swapaxes(1, 2), out=share)
            np.add(total, share, out=total)

    return fire


def _grad_input_as_convolution(op: lg.Conv2dGradInputOp, grad_shape, w_shape, out) -> Fire | None:
    """At stride 1 (dilation 1, padding at most the kernel's reach), the
    input's gradient is the forward convolution of the gradient, padded by
    k - 1 - p, with each group's filters transposed (out and in channels)
    and flipped: the windows copied once with their rows contiguous and
    one GEMM, instead of the GEMM's window shares added back offset by
    offset (a pass over the image per kernel tap). The flip is the
    windows' (their taps copied in reverse order, at no cost), so the
    filters' copy moves each filter's taps as one block: a copy of records
    of kh*kw elements, 280 us where transposing and flipping element by
    element took 463 (ResNet's 256 x 256 3x3 filters, one core of a 2-core
    Intel Xeon, 2026-11-30). None where it does not apply."""
    p = op.params()
    kernel = tuple(w_shape[2:])
    if p["stride"] != (1, 1) or p["dilation"] != (1, 1) or any(
            pad > k - 1 for pad, k in zip(p["padding"], kernel)):
        return None
    g = p["groups"]
    n, o_channels, ho, wo = grad_shape
    og, cg = o_channels // g, w_shape[1]
    reach = tuple(k - 1 - pad for k, pad in zip(kernel, p["padding"]))
    gemm = _window_gemm(_Windows(grad_shape, kernel, (1, 1), reach, (1, 1), g, out.dtype, flipped=True), cg,
                        out.dtype)
    taps = math.prod(kernel)
    filters = scratch((g, cg, og, taps), out.dtype)  # each group's filters, transposed
    block = np.dtype((np.void, taps * out.dtype.itemsize))  # a filter's taps, moved as one
    blocks = filters.reshape(g, cg, og * taps).view(block)

    def fire(xs, o):
        np.copyto(blocks, xs[1].reshape(g, og, cg * taps).view(block).swapaxes(1, 2))
        gemm(xs[0], filters.reshape(g, cg, og * taps), o)

    return fire


def bind_conv2d_grad_input(op: lg.Conv2dGradInputOp, local, ins, out) -> Fire:
    grad, w = ins
    if _winograd(op, out.shape, w.shape, out.dtype):
        winograd = winograd_kernels.conv2d_grad_input(grad.shape, w.shape, op.params()["groups"],
                                                      op.params()["padding"], out.dtype)
        if winograd is not None:
            return winograd
    # A 1x1 layer at any image size: ResNet-50's 2048 -> 512 one on 7x7
    # images, batch 8, took 8.5 ms as a GEMM per image and 11.2 through the
    # windows as one GEMM over the batch (one core of a 2-core Intel Xeon,
    # 2026-12-01).
    if _pointwise(op, w.shape[2:]):
        g = op.params()["groups"]
        n, k, h, width = grad.shape
        c = out.shape[1]

        def pointwise(xs, o):  # (the filters transposed as BLAS reads them; a GEMM per image)
            np.matmul(xs[1].reshape(g, k // g, c // g).swapaxes(1, 2), xs[0].reshape(n, g, k // g, h * width),
                      out=o.reshape(n, g, c // g, h * width))

        return pointwise
    as_convolution = _grad_input_as_convolution(op, grad.shape, w.shape, out)
    if as_convolution is not None:
        return as_convolution
    g, kernel = op.params()["groups"], w.shape[2:]
    at = _Windows.of_conv(op, out.shape, kernel, out.dtype)
    n, o_channels, ho, wo = grad.shape
    og, cg, positions = o_channels // g, w.shape[1], ho * wo
    k = cg * math.prod(kernel)
    offset = scratch((n, g, cg, ho, wo), out.dtype)  # one kernel offset's sums
    # The filters enter the GEMM transposed as they are (BLAS reads them so):
    # a transposing copy first took half the kernel (ResNet's 128 -> 256
    # channel 3x3 stride-2 layer on 4x4 images, batch 8: 911 -> 479 us).
    if positions >= ONE_GEMM_BELOW:  # a GEMM per image
        shares = scratch((n, g, cg, *kernel, ho, wo), out.dtype)  # (N, G, K, Ho*Wo)
        pieces = shares.transpose(0, 1, 2, 5, 6, 3, 4)

        def gemm(grads, weights):
            np.matmul(weights, grads.reshape(n, g, og, positions), out=shares.reshape(n, g, k, positions))
    else:  # one over every image (ONE_GEMM_BELOW)
        shares = scratch((g, cg, *kernel, n, ho, wo), out.dtype)  # (G, K, N*Ho*Wo)
        pieces = shares.transpose(4, 0, 1, 5, 6, 2, 3)
        columns = scratch((g, og, n, positions), out.dtype)

        def gemm(grads, weights):
            np.copyto(columns, grads.reshape(n, g, og, positions).transpose(1, 2, 0, 3))
            np.matmul(weights, columns.reshape(g, og, n * positions), out=shares.reshape(g, k, n * positions))

    def fire(xs, o):
        gemm(xs[0], xs[1].reshape(g, og, k).swapaxes(1, 2))
        at.padded.fill(0)
        add_windows(at.padded, pieces, at.stride, at.dilation, g, offset)
        np.copyto(o, at.inside)

    return fire


class _PoolScratch(_Windows):
    """The padded images (-inf at the border: never a maximum) and each
    kernel tap's view of them, (N, C, Ho, Wo) strided, in the order of a
    window's row-major elements. Pooling goes tap by tap, a pass over the
    pooled image each: a reduction over a window's few elements copied
    contiguous ran a row at a time (ResNet's 3x3 stride-2 pooling of 32
    channels of 32x32, batch 8: 3.7 ms forward, 2.8 ms backward)."""

    def __init__(self, op, image_shape, dtype):
        p = op.params()
        self.kernel = p["kernel"]
        super().__init__(image_shape, p["kernel"], p["stride"], p["padding"], (1, 1), 1, dtype, -np.inf)
        self.taps = [self.view[:, 0, :, :, :, i, j] for i in range(self.kernel[0]) for j in range(self.kernel[1])]

    def maximum(self, x, o) -> None:
        """o = each window's maximum of images x (NaN where a window has one)."""
        np.copyto(self.inside, x)
        np.copyto(o, self.taps[0])
        for tap in self.taps[1:]:
            np.maximum(o, tap, out=o)


def bind_max_pool2d(op: lg.MaxPool2dOp, local, ins, out) -> Fire:
    at = _PoolScratch(op, ins[0].shape, out.dtype)

    def fire(xs, o):
        at.maximum(xs[0], o)

    return fire


def bind_max_pool2d_grad(op: lg.MaxPool2dGradOp, local, ins, out) -> Fire:
    # each window's gradient to its first maximum (reference._max_pool2d_grad):
    # tap by tap, to the windows whose maximum it is and no earlier tap was
    at = _PoolScratch(op, ins[0].shape, out.dtype)
    pooled = ins[1].shape
    top, share, total = (scratch(pooled, out.dtype) for _ in range(3))
    hit, taken, nan = (scratch(pooled, np.bool_) for _ in range(3))
    padded = np.zeros(at.padded.shape, out.dtype)
    inside = padded[:, :, at.padding[0]:at.padding[0] + ins[0].shape[2], at.padding[1]:at.padding[1] + ins[0].shape[3]]
    sh, sw = at.stride
    targets = [padded[:, :, i:i + sh * (pooled[2] - 1) + 1:sh, j:j + sw * (pooled[3] - 1) + 1:sw]
               for i in range(at.kernel[0]) for j in range(at.kernel[1])]

    def fire(xs, o):
        at.maximum(xs[0], top)
        with_nan = bool(np.isnan(top, out=nan).any())  # a NaN window's first NaN is its maximum (argmax's)
        finite = bool(np.isfinite(xs[1], out=hit).all())
        taken.fill(False)
        padded.fill(0)
        for tap, target in zip(at.taps, targets):
            np.equal(tap, top, out=hit)
            if with_nan:
                np.logical_or(hit, np.isnan(tap, out=nan), out=hit)
            np.greater(hit, taken, out=hit)  # not an earlier tap's
            np.logical_or(taken, hit, out=taken)
            if finite:  # a product with the mask (adding `where=hit` branches: 5x slower)
                np.multiply(xs[1], hit, out=share)
            else:  # (where a NaN or infinity times 0 would be NaN)
                share.fill(0)
                np.copyto(share, xs[1], where=hit)
            np.copyto(total, target)  # (numpy adds into a strided view through buffers it allocates)
            np.add(total, share, out=total)
            np.copyto(target, total)
        np.copyto(o, inside)

    return fire
