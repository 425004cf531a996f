"""3x3 stride-1 convolutions and their gradients by Winograd's F(2x2, 3x3)
on the host: the transforms in generated C (codegen/winograd.py), the 16
products between them BLAS's (np.matmul, here). numpy_window_kernels binds
a convolution here where this applies (`applies`) and generated C can run;
elsewhere, and with SBPC_HOST_KERNELS=0, it copies the windows into GEMMs'
layout (im2col: image by image, or over the batch for small images).

Against im2col the products take 16 multiplies per output tile of 2x2
and channel pair where im2col takes 36, and the windows are never copied
9 times over: ResNet-50's 3x3 layers, batch 8, one core of a 2-core Intel
Xeon (AVX-512, OpenBLAS SkylakeX), 2026-12-01, are in `bench/conv.py`.
The rounding differs from the direct sum's: the transforms add and halve
(exact but for the additions' rounding), and each output is a sum over
16 transformed products. Lavin and Gray measure F(2x2, 3x3)'s float32
error as the direct convolution's order; the kernels' test bounds it. An
infinite input gives NaN where the direct sum gives an infinity (the
transforms subtract it from itself), as every Winograd convolution does."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from functools import cache, partial

import numpy as np

from sbpc.codegen.winograd import kernels

from . import host_kernels
from .numpy_binding import Fire, scratch

TILES_PER_IMAGE = 64
"""Images with this many output tiles or more are transformed and
multiplied one at a time (their transforms stay in cache and the GEMMs
are wide enough); smaller ones all at once, one GEMM of every image's
tiles: ResNet's 3x3 layer of 64 channels on 16x16 images, batch 8, took
0.43 ms image by image and 0.64 at once, that of 256 on 14x14 (49 tiles)
8.5 ms image by image and 5.9 at once, its 16 filter matrices of 256 x
256 read again per image (one core of a 2-core Intel Xeon, 2026-12-01)."""

MIN_CHANNELS = 8
"""Fewer input or output channels per group than this convolve by im2col:
their 16 GEMMs are too thin to gain (a depthwise convolution's are 1 x 1)."""

MIN_TILES = 64
"""Batches of fewer output tiles than this convolve by im2col: the
filters' transforms (and the weight gradient's) cost as much as the
products save. ResNet's 3x3 layer of 256 channels on 2x2 images, batch
8 (8 tiles): forward 0.83 ms against im2col's 0.45, the input's gradient
2.0 against 0.75; 128 channels of 4x4 (32 tiles): 0.60 against 0.52 for
the input's gradient; 64 channels of 8x8, batch 4 (64 tiles), every
kernel faster: 0.14 against 0.28 forward (one core of a 2-core Intel
Xeon, 2026-12-01)."""

DTYPES = {np.dtype(np.float32): "float", np.dtype(np.float64): "double"}


def applies(image_shape, filter_shape, groups: int, stride, padding, dilation, dtype) -> bool:
    """Whether a convolution of images (N, C, H, W) by filters (K, C/G, kh,
    kw) runs by Winograd here (its gradients too): 3x3, stride 1,
    undilated, float32 or float64, MIN_CHANNELS, MIN_TILES, and generated
    C available."""
    n, _, h, w = image_shape
    k, cg, *kernel = filter_shape
    ho, wo, th, tw = _tiling(h, w, padding)
    tiles = n * th * tw if min(ho, wo) > 0 else 0
    return (tuple(kernel) == (3, 3) and tuple(stride) == (1, 1) and tuple(dilation) == (1, 1)
            and min(cg, k // groups) >= MIN_CHANNELS and tiles >= MIN_TILES and np.dtype(dtype) in DTYPES
            and host_kernels.enabled() and host_kernels.unavailable() is None
            and _library(DTYPES[np.dtype(dtype)]) is not None)


def _tiling(h: int, w: int, padding) -> tuple[int, int, int, int]:
    """A 3x3 stride-1 convolution's output rows and columns over images
    of h x w padded by `padding`, and its 2x2 tiles' rows and columns."""
    ho, wo = h + 2 * padding[0] - 2, w + 2 * padding[1] - 2
    return ho, wo, -(-ho // 2), -(-wo // 2)


@cache
def _library(t: str) -> dict[str, Callable[[], Fire]] | None:
    """The transforms for C type `t`, built (once) and ready to bind; None
    where the library cannot be written or loaded (no room, no permission:
    im2col runs instead, as the executor runs numpy's kernels then). C that
    does not compile is a bug and raises."""
    made = kernels(t)
    try:
        library = host_kernels.Library(list(made.values()))
    except OSError as e:
        print(f"sbpc: Winograd's convolution kernels unavailable ({e}); convolving by im2col", file=sys.stderr)
        return None
    # each use binds afresh, so each convolution keeps its own arrays'
    # pointers (Library.bind caches them per bound function)
    return {role: partial(library.bind, kernel) for role, kernel in made.items()}


class _Sixteen:
    """16 matrices of (rows, cols) in one buffer, each starting an odd
    number of cache lines after the one before: a transform writes (or
    reads) the 16 at once, and where they lay a multiple of 4 KiB apart
    (ResNet-50's 64 channels of 28x28 tiles: 49 pages) every one of the 16
    fell in the same cache set, and the transform ran 5-10x slower.
    `buffer` is what the C takes (flat), `matrices` what the GEMMs do."""

    LINE = 64

    def __init__(self, rows: int, cols: int, dtype):
        per_line = max(self.LINE // np.dtype(dtype).itemsize, 1)
        apart = -(-max(rows * cols, 1) // per_line) * per_line
        if apart // per_line % 2 == 0:
            apart += per_line
        self.apart = apart
        self.buffer = scratch((16 * apart,), dtype)
        self.matrices = self.buffer.reshape(16, apart)[:, :rows * cols].reshape(16, rows, cols)


class _Tiles:
    """A convolution's tiling: images (N, C, H, W) padded by `padding`, an
    output of (N, K, Ho, Wo) in tiles of 2x2, GEMMs over `batch` images at
    a time, and the transforms' scratch."""

    def __init__(self, image_shape, out_channels: int, padding, dtype):
        n, c, h, w = image_shape
        self.n, self.c, self.k = n, c, out_channels
        self.ho, self.wo, self.th, self.tw = _tiling(h, w, padding)
        tiles = self.th * self.tw
        self.batch = 1 if tiles >= TILES_PER_IMAGE else max(n, 1)  # (every batch whole)
        self.cols = self.batch * tiles
        transforms = _library(DTYPES[np.dtype(dtype)])
        assert transforms is not None  # (applies() said so)
        self.transforms = transforms
        self.v = _Sixteen(c, self.cols, dtype)
        self.input_dims = np.array([0, 0, c, h, w, padding[0], padding[1], self.th, self.tw, self.v.apart], np.int64)
        ty, tx = np.divmod(np.arange(tiles, dtype=np.int32), np.int32(max(self.tw, 1)))
        # each tile's first element in a padded input plane, and in a plane of whole output tiles
        self.padded = (scratch((2 * self.th + 2, 2 * self.tw + 2), dtype), 2 * ty * (2 * self.tw + 2) + 2 * tx)
        self.whole = (scratch((2 * self.th, 2 * self.tw), dtype), 2 * ty * (2 * self.tw) + 2 * tx)

    def out_dims(self, out: _Sixteen) -> np.ndarray:
        """The dims of the output's and the gradient's transforms, to and from `out`."""
        return np.array([0, 0, self.k, self.ho, self.wo, self.th, self.tw, out.apart], np.int64)

    def batches(self, out_dims: np.ndarray) -> Iterator[None]:
        """Each GEMM's batch of images, the transforms' dims set to it as it is taken."""
        for first in range(0, self.n, self.batch):
            self.input_dims[:2] = out_dims[:2] = first, first + self.batch
            yield None


def _on_contiguous(fire: Fire) -> Fire:
    """`fire` given C-contiguous arrays, as the generated C reads them: the
    executor's registers are; an array that is not (a caller's view) is
    copied into staging kept for the next call (a new array each call
    would leave its pointer in the library's cache), or written through
    it."""
    staged: dict[tuple, np.ndarray] = {}

    def stage(key: tuple, like: np.ndarray) -> np.ndarray:
        found = staged.get(key)
        if found is None or found.shape != like.shape or found.dtype != like.dtype:
            found = staged[key] = np.empty(like.shape, like.dtype)
        return found

    def contiguous(xs, o):
        ins = []
        for i, x in enumerate(xs):
            if not x.flags.c_contiguous:
                copy = stage(("in", i), x)
                np.copyto(copy, x)
                x = copy
            ins.append(x)
        if o.flags.c_contiguous:
            fire(ins, o)
        else:
            result = stage(("out",), o)
            fire(ins, result)
            np.copyto(o, result)

    return contiguous


def _groups(sixteen: _Sixteen, groups: int) -> np.ndarray:
    """The 16 matrices (rows, cols) as (16, groups, rows / groups, cols)."""
    _, rows, cols = sixteen.matrices.shape
    size = sixteen.buffer.itemsize
    return np.lib.stride_tricks.as_strided(sixteen.buffer, (16, groups, rows // groups, cols),
                                           (sixteen.apart * size, rows // groups * cols * size, cols * size, size))


def _forward(image_shape, filter_shape, groups: int, padding, dtype, transposed: bool) -> Fire:
    """fire([images, filters], o): the convolution (transposed: by the
    filters transposed and flipped, as the input's gradient is)."""
    k_total, cg = filter_shape[:2]
    out_channels = cg * groups if transposed else k_total
    at = _Tiles(image_shape, out_channels, padding, dtype)
    kg_in = at.c // groups  # channels per group in the images
    u, m = _Sixteen(out_channels, kg_in, dtype), _Sixteen(out_channels, at.cols, dtype)
    filter_dims = np.array([k_total, cg, groups, int(transposed), u.apart], np.int64)
    out_dims = at.out_dims(m)
    to_filters, to_input, to_output = at.transforms["filter"](), at.transforms["input"](), at.transforms["output"]()
    gemm_u = _groups(u, groups)
    gemm_v, gemm_m = _groups(at.v, groups), _groups(m, groups)

    @_on_contiguous
    def fire(xs, o):
        to_filters([xs[1], filter_dims], u.buffer)
        for _ in at.batches(out_dims):
            to_input([xs[0], at.input_dims, at.padded[1], at.padded[0]], at.v.buffer)
            np.matmul(gemm_u, gemm_v, out=gemm_m)
            to_output([m.buffer, out_dims, at.whole[1], at.whole[0]], o)

    return fire


def conv2d(image_shape, filter_shape, groups: int, padding, dtype) -> Fire:
    """fire([images, filters], o) of lg.conv2d (3x3, stride 1)."""
    return _forward(image_shape, filter_shape, groups, padding, dtype, transposed=False)


def conv2d_grad_input(grad_shape, filter_shape, groups: int, padding, dtype) -> Fire | None:
    """fire([gradients, filters], o) of lg.conv2d_grad_input (3x3, stride
    1): the gradients convolved by the filters transposed and flipped,
    padded by 2 - padding (None where the padding is past 2)."""
    if max(padding) > 2:
        return None
    return _forward(grad_shape, filter_shape, groups, tuple(2 - p for p in padding), dtype, transposed=True)


def conv2d_grad_weight(image_shape, grad_shape, groups: int, padding, dtype) -> Fire:
    """fire([images, gradients], o) of lg.conv2d_grad_weight (3x3, stride 1)."""
    k = grad_shape[1]
    at = _Tiles(image_shape, k, padding, dtype)
    assert (at.ho, at.wo) == tuple(grad_shape[2:])
    cg, kg = at.c // groups, k // groups
    z, total = _Sixteen(k, at.cols, dtype), _Sixteen(k, cg, dtype)
    share = scratch((16, groups, kg, cg), dtype)
    sizes, out_dims = np.array([k, cg, total.apart], np.int64), at.out_dims(z)
    to_input, to_gradient = at.transforms["input"](), at.transforms["gradient"]()
    to_filter_gradient = at.transforms["filter_gradient"]()
    gemm_z, gemm_total = _groups(z, groups), _groups(total, groups)
    gemm_v = _groups(at.v, groups).swapaxes(2, 3)  # (BLAS reads it transposed)

    @_on_contiguous
    def fire(xs, o):
        total.matrices.fill(0)  # (a piece of no images has no share)
        for _ in at.batches(out_dims):
            to_input([xs[0], at.input_dims, at.padded[1], at.padded[0]], at.v.buffer)
            to_gradient([xs[1], out_dims, at.whole[1], at.whole[0]], z.buffer)
            np.matmul(gemm_z, gemm_v, out=share)
            np.add(gemm_total, share, out=gemm_total)
        to_filter_gradient([total.buffer, sizes], o)

    return fire

