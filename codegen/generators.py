"""The kernel generators, one per lg op (`CUDA`, a backend registry that
test_ops.py checks complete): each turns a `Site` (what it knows of one
compute actor: local shapes, properties, where its pieces start) into a
render.Kernel for both targets, or CUDA source alone (matmul). An op
without a generator registers ON_HOST: the executor runs its numpy
kernel. `describe`/`generate`/`generate_host` are the entry points for a
plan's actors."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import cast

from xdsl.dialects.builtin import DenseArrayBase, FloatAttr, IntegerAttr, IntegerType, StringAttr
from xdsl.ir import Attribute

from sbpc.dialects import lg, plan
from sbpc.dialects.backends import Backend
from sbpc.dialects.pieces import piece_of
from sbpc.dialects.sbp import lookup_placement

from .render import (
    C_TYPES,
    IVDEP,
    TILE,
    IndexCheck,
    Kernel,
    Nest,
    Unsupported,
    _collapse,
    _header,
    c_type,
    cuda_source,
    strides,
)

INTEGER_KERNELS = frozenset({"lg.add", "lg.sub", "lg.mul", "lg.floordiv", "lg.neg", "lg.reshape", "lg.transpose",
                             "lg.cumsum", "lg.pad", "lg.gather", "lg.scatter", "lg.reduce_sum", "lg.argmax", "lg.topk",
                             *(op.name for op in lg.MASK_OPS)})
"""Kernels generated for integer elements too (counts, positions, the
random step's count): their C is the same for any arithmetic T. The others
assume floats (infinities, exp), and their integer forms run on the host."""

Generator = Callable[["Site"], "Kernel | tuple[str, list[int]]"]
"""gen(site) -> a Kernel (both targets), or CUDA C alone and its launch
[grid x, y, z, block x, y, z] (a kernel with no host form: matmul)."""

CUDA: Backend[Generator | ElementwiseExpr | OnHost | WithHost] = Backend("the CUDA code generator")
"""Every lg op's CUDA implementation: a generator, an elementwise C
expression (so it also fuses), or ON_HOST: the executor runs the actor's
numpy kernel on the host mirror (staged through pinned memory)."""


@dataclass(frozen=True)
class OnHost:
    """The registration of an op with no CUDA kernel: its actors run their
    numpy kernel on the host (runtime/cuda_backend.py stages the bytes).
    `host`, where given, generates the C that a CPU runs in place of that
    numpy kernel (runtime/host_kernels.py)."""

    host: Generator | None = None


ON_HOST = OnHost()


@dataclass(frozen=True)
class WithHost:
    """The registration of an op whose CUDA kernel, rendered for a CPU as a
    loop over its threads, is not the form a CPU runs fast: `host`
    generates the CPU's own (runtime/host_kernels.py), and where it
    declines (Unsupported) the actor runs its numpy kernel there."""

    cuda: Generator
    host: Generator

    def __call__(self, site: Site) -> Kernel | tuple[str, list[int]]:
        return self.cuda(site)


@dataclass(frozen=True)
class ElementwiseExpr:
    """An elementwise op as a C expression over its operands {0}, {1}, of
    type T: alone it is a chain of one step (gen_fused), and a fused chain
    inlines it."""

    expr: str

    def __call__(self, site: Site) -> Kernel:
        return gen_fused(
            site.name, site.t, site.in_shapes, site.out_shape, [(site.kernel, tuple(range(len(site.in_shapes))))]
        )


for _op, _expr in (
    (lg.NegOp, "-{0}"),
    (lg.ReluOp, "{0} > (T)0 ? {0} : (T)0"),
    (lg.StepOp, "{0} > (T)0 ? (T)1 : (T)0"),
    (lg.StopGradientOp, "{0}"),
    (lg.GeluOp, "(T)0.5 * {0} * ((T)1 + tanh((T)0.7978845608028654 * ({0} + (T)0.044715 * {0} * {0} * {0})))"),
    (lg.TanhOp, "tanh({0})"),
    (lg.ErfOp, "erf({0})"),
    (lg.ExpOp, "exp({0})"),
    (lg.SqrtOp, "sqrt({0})"),
    (lg.RsqrtOp, "rsqrt({0})"),
    (lg.LogOp, "log({0})"),
    (lg.SinOp, "sin({0})"),
    (lg.CosOp, "cos({0})"),
    (lg.AtanOp, "atan({0})"),
    (lg.FloorOp, "floor({0})"),
    (lg.CeilOp, "ceil({0})"),
    (lg.RoundOp, "rint({0})"),
    (lg.TruncOp, "trunc({0})"),
    (lg.AddOp, "{0} + {1}"),
    (lg.SubOp, "{0} - {1}"),
    (lg.MulOp, "{0} * {1}"),
    (lg.DivOp, "{0} / {1}"),
    # rounded down, 0 for a zero divisor; -x (modulo 2^bits) for -1, whose
    # quotient of the most negative value traps in C
    (lg.FloorDivOp, "{1} == (T)0 ? (T)0 : {1} == (T)-1 ? (T)(0ULL - (unsigned long long){0}) : "
                    "({0} / {1} - (T)(({0} % {1} != (T)0) && (({0} % {1} < (T)0) != ({1} < (T)0))))"),
):
    CUDA.register(_op, ElementwiseExpr(_expr))

for _host_op in (lg.BroadcastToOp, lg.ConcatOp, lg.SliceOp, lg.EmbeddingOp, lg.MseLossOp, lg.OneHotOp,
                 lg.EmbeddingGradOp):
    CUDA.register(_host_op, ON_HOST)


def elementwise_expr(kernel: str) -> ElementwiseExpr:
    impl = CUDA.get(lg.op_class(kernel))
    if not isinstance(impl, ElementwiseExpr):
        raise Unsupported(f"kernel {kernel} in a fused chain")
    return impl


def _index_loop(out_shape, operand_strides: list[list[int]], names: list[str]) -> str:
    """C statements computing, for flat output index i, each operand's offset."""
    lines = ["long rem = i;"] + [f"long {n} = 0;" for n in names]
    for d in reversed(range(len(out_shape))):
        lines.append(f"{{ long c = rem % {out_shape[d]}; rem /= {out_shape[d]};")
        for n, st in zip(names, operand_strides):
            if st[d]:
                lines.append(f"  {n} += c * {st[d]};")
        lines.append("}")
    return "\n    ".join(lines)


def _broadcast_strides(shape, out_shape) -> list[int]:
    st = strides(shape)
    pad = len(out_shape) - len(shape)
    return [0] * pad + [0 if shape[i] == 1 and out_shape[pad + i] != 1 else st[i] for i in range(len(shape))]


def gen_fused(name, t, in_shapes, out_shape, steps) -> Kernel:
    """One kernel for a chain of elementwise steps (kernel, argument
    indices: inputs first, then earlier steps), one thread per output
    element. Broadcasting composes, so every input is read at the
    broadcast image of the output index and every step lives in a
    register; a lone elementwise op is a chain of one."""
    lines = []
    for j, (kernel, args) in enumerate(steps):
        expr = elementwise_expr(kernel).expr.format(*(f"v{a}" for a in args))
        lines.append(f"T v{len(in_shapes) + j} = {expr};")
    return _broadcasting(name, t, in_shapes, out_shape, ["T"] * len(in_shapes), lines,
                         f"v{len(in_shapes) + len(steps) - 1}")


def _broadcasting(name, t, in_shapes, out_shape, in_types, steps: list[str], result: str) -> Kernel:
    """An elementwise kernel with numpy broadcasting: each input k (of C
    type in_types[k]) read into v<k> at the broadcast image of the output
    index, then the statements `steps`, then out[i] = (T)result."""
    n = math.prod(out_shape)
    # Not restrict: the memory plan may write the output over an input
    # (in place); each thread reads its elements before writing its own.
    params = tuple([f"const {in_types[k]}* a{k}" for k in range(len(in_shapes))] + ["T* out"])
    moved = [k for k, shape in enumerate(in_shapes) if tuple(shape) != tuple(out_shape)]
    lines = []
    if moved:
        lines.append(_index_loop(out_shape, [_broadcast_strides(in_shapes[k], out_shape) for k in moved],
                                 [f"o{k}" for k in moved]))
    lines += [f"{in_types[k]} v{k} = a{k}[{f'o{k}' if k in moved else 'i'}];" for k in range(len(in_shapes))]
    lines += steps
    lines.append(f"out[i] = {result};" if steps else f"out[i] = (T)({result});")
    element = lines[1:] if moved else lines
    nest = Nest(*_collapse(tuple(out_shape), [_broadcast_strides(in_shapes[k], out_shape) for k in moved]),
                tuple(f"o{k}" for k in moved), "\n      ".join(element)) if moved else None
    return Kernel(name, t, params, n, "\n    ".join(lines), nest=nest)


@CUDA.impl(lg.MatmulOp)
def gen_matmul(site: Site) -> tuple[str, list[int]]:
    name, t, out_shape = site.name, site.t, site.out_shape
    a, b = site.in_shapes
    ta, tb = "transpose_lhs" in site.props, "transpose_rhs" in site.props
    M, N = out_shape[-2], out_shape[-1]
    K = a[-2] if ta else a[-1]
    batch = out_shape[:-2]
    nb = math.prod(batch)
    a_b = _broadcast_strides(a[:-2], batch) if batch else []
    b_b = _broadcast_strides(b[:-2], batch) if batch else []
    a_mat, b_mat = a[-2] * a[-1], b[-2] * b[-1]
    # element strides inside one matrix
    sam, sak = (1, M) if ta else (K, 1)
    sbk, sbn = (1, K) if tb else (N, 1)
    boff = (
        _index_loop(batch, [[s * a_mat for s in a_b], [s * b_mat for s in b_b]], ["oa", "ob"])
        if batch
        else "long oa = 0, ob = 0;"
    )
    params = "const T* __restrict__ A, const T* __restrict__ B, T* __restrict__ C"
    if M >= BLOCK_TILE and N >= BLOCK_TILE:
        return _blocked_matmul(name, t, params, boff, M, N, K, sam, sak, sbk, sbn, nb)
    src = f"""{_header(t)}extern "C" __global__ void {name}({params}) {{
  __shared__ T As[{TILE}][{TILE}];
  __shared__ T Bs[{TILE}][{TILE}];
  long i = blockIdx.z;
  {boff.replace(chr(10) + '    ', chr(10) + '  ')}
  int row = blockIdx.y * {TILE} + threadIdx.y, col = blockIdx.x * {TILE} + threadIdx.x;
  T acc = (T)0;
  for (int k0 = 0; k0 < {K}; k0 += {TILE}) {{
    int ka = k0 + threadIdx.x, kb = k0 + threadIdx.y;
    As[threadIdx.y][threadIdx.x] = (row < {M} && ka < {K}) ? A[oa + (long)row * {sam} + (long)ka * {sak}] : (T)0;
    Bs[threadIdx.y][threadIdx.x] = (kb < {K} && col < {N}) ? B[ob + (long)kb * {sbk} + (long)col * {sbn}] : (T)0;
    __syncthreads();
    for (int k = 0; k < {TILE}; ++k) acc += As[threadIdx.y][k] * Bs[k][threadIdx.x];
    __syncthreads();
  }}
  if (row < {M} && col < {N}) C[(long)blockIdx.z * {M * N} + (long)row * {N} + col] = acc;
}}
"""
    return src, [-(-N // TILE), -(-M // TILE), max(nb, 1), TILE, TILE, 1]


BLOCK_TILE = 128
"""Output rows and columns a block of the register-tiled GEMM computes; a
matmul with fewer rows or columns takes the one-output-per-thread kernel."""
THREAD_TILE = 8
"""Outputs per thread along each axis (8 x 8 accumulators in registers)."""
DEPTH_TILE = 8
"""Contraction steps staged in shared memory at a time."""


def _blocked_matmul(name: str, t: str, params: str, boff: str, M: int, N: int, K: int, sam: int, sak: int,
                    sbk: int, sbn: int, nb: int) -> tuple[str, list[int]]:
    """A GEMM with register tiling: each block of 16 x 16 threads computes a
    128 x 128 tile of C, each thread an 8 x 8 patch of it in registers, from
    8-deep slices of A and B staged in shared memory (A's transposed, so
    both are read along the tile's rows). Every thread then does 64
    multiply-adds per 16 shared loads, where the one-output kernel does one
    per two. The tiles' edges are guarded, so any size and either operand
    transposed work; the staging loads are coalesced for A and B as stored
    untransposed."""
    threads = (BLOCK_TILE // THREAD_TILE) ** 2
    src = f"""{_header(t)}extern "C" __global__ void __launch_bounds__({threads}) {name}({params}) {{
  __shared__ T As[{DEPTH_TILE}][{BLOCK_TILE}];
  __shared__ T Bs[{DEPTH_TILE}][{BLOCK_TILE}];
  long i = blockIdx.z;
  {boff.replace(chr(10) + '    ', chr(10) + '  ')}
  const int tid = threadIdx.y * {BLOCK_TILE // THREAD_TILE} + threadIdx.x;
  const int row0 = blockIdx.y * {BLOCK_TILE}, col0 = blockIdx.x * {BLOCK_TILE};
  T acc[{THREAD_TILE}][{THREAD_TILE}];
  #pragma unroll
  for (int r = 0; r < {THREAD_TILE}; ++r)
    #pragma unroll
    for (int c = 0; c < {THREAD_TILE}; ++c) acc[r][c] = (T)0;
  for (int k0 = 0; k0 < {K}; k0 += {DEPTH_TILE}) {{
    #pragma unroll
    for (int l = tid; l < {BLOCK_TILE * DEPTH_TILE}; l += {threads}) {{
      int r = l / {DEPTH_TILE}, k = l % {DEPTH_TILE};  /* A: along k first (A's rows are contiguous in k) */
      int gr = row0 + r, gk = k0 + k;
      As[k][r] = (gr < {M} && gk < {K}) ? A[oa + (long)gr * {sam} + (long)gk * {sak}] : (T)0;
      int kb = l / {BLOCK_TILE}, c = l % {BLOCK_TILE};  /* B: along the columns (contiguous in n) */
      int gkb = k0 + kb, gc = col0 + c;
      Bs[kb][c] = (gkb < {K} && gc < {N}) ? B[ob + (long)gkb * {sbk} + (long)gc * {sbn}] : (T)0;
    }}
    __syncthreads();
    #pragma unroll
    for (int k = 0; k < {DEPTH_TILE}; ++k) {{
      T a[{THREAD_TILE}], b[{THREAD_TILE}];
      #pragma unroll
      for (int r = 0; r < {THREAD_TILE}; ++r) a[r] = As[k][threadIdx.y * {THREAD_TILE} + r];
      #pragma unroll
      for (int c = 0; c < {THREAD_TILE}; ++c) b[c] = Bs[k][threadIdx.x * {THREAD_TILE} + c];
      #pragma unroll
      for (int r = 0; r < {THREAD_TILE}; ++r)
        #pragma unroll
        for (int c = 0; c < {THREAD_TILE}; ++c) acc[r][c] += a[r] * b[c];
    }}
    __syncthreads();
  }}
  T* out = C + (long)blockIdx.z * {M * N};
  #pragma unroll
  for (int r = 0; r < {THREAD_TILE}; ++r) {{
    int gr = row0 + threadIdx.y * {THREAD_TILE} + r;
    #pragma unroll
    for (int c = 0; c < {THREAD_TILE}; ++c) {{
      int gc = col0 + threadIdx.x * {THREAD_TILE} + c;
      if (gr < {M} && gc < {N}) out[(long)gr * {N} + gc] = acc[r][c];
    }}
  }}
}}
"""
    side = BLOCK_TILE // THREAD_TILE
    return src, [-(-N // BLOCK_TILE), -(-M // BLOCK_TILE), max(nb, 1), side, side, 1]


@CUDA.impl(lg.ReduceSumOp, lg.ReduceMeanOp, lg.ReduceMaxOp)
def gen_reduce(site: Site) -> Kernel:
    kernel, name, t, in_shape = site.kernel, site.name, site.t, site.in_shapes[0]
    axes = list(cast(DenseArrayBase[IntegerType], site.props["axes"]).get_values())
    kept = [d for d in range(len(in_shape)) if d not in axes]
    st = strides(in_shape)
    n_out = max(math.prod(in_shape[d] for d in kept), 1)
    n_red = math.prod(in_shape[d] for d in axes)
    kept_shape = [in_shape[d] for d in kept]
    red_shape = [in_shape[d] for d in axes]
    base = _index_loop(kept_shape, [[st[d] for d in kept]], ["b"]) if kept else "long b = 0;"
    inner = _index_loop(red_shape, [[st[d] for d in axes]], ["r"]).replace("long rem = i;", "long rem = j;")
    is_max = kernel == "lg.reduce_max"
    init = "(T)NEG_INF" if is_max else "(T)0"
    # a maximum keeps a NaN once met, as numpy's does
    update = "acc = (acc > a0[b + r] || acc != acc) ? acc : a0[b + r];" if is_max else "acc += a0[b + r];"
    scale = ""
    count = math.prod(site.global_in[d] for d in axes)
    if kernel == "lg.reduce_mean":
        scale = f"acc = acc / (T){count};"
    body = f"""{base}
  T acc = {init};
  for (long j = 0; j < {n_red}; ++j) {{
    {inner}
    {update}
  }}
  {scale}
  out[i] = acc;"""
    return Kernel(name, t, ("const T* a0", "T* out"), n_out, body, restrict=True,
                  host_body=_host_reduce(in_shape, axes, is_max, count if kernel == "lg.reduce_mean" else None))


MAX_RUN_IN_C = 16
"""A maximum over a contiguous run longer than this is numpy's: it keeps
NaNs as numpy does in one chain, which does not vectorize, and numpy's own
vectorized maximum ran 4-7x faster (GPT-2's logits, 512 x 50257: 20 against
5 ms; one core of a 2-core Intel Xeon, 2026-11-30)."""


def _host_reduce(shape: Sequence[int], axes: Sequence[int], is_max: bool, mean_of: int | None) -> str | None:
    """A reduction over one run of adjacent axes as loops that vectorize:
    the input is [outer, reduced, inner]. With inner elements, each output
    row accumulates the reduced rows in order (the threads' order, one
    vector of outputs at a time); without, each output is one contiguous
    run, summed in several partial sums (SBPC_SUM; a maximum stays one
    chain, since OpenMP's combined maximum may drop a NaN that numpy's
    keeps). Axes in two runs, the leading and the trailing ones (batch
    normalization's statistics of NCHW images: axes 0, 2, 3), as
    _host_reduce_ends. None for other axes that are not adjacent: the flat
    loop then."""
    if axes and list(axes) != list(range(axes[0], axes[0] + len(axes))):
        return _host_reduce_ends(shape, axes, is_max, mean_of)
    if not axes:
        return None
    outer = math.prod(shape[: axes[0]])
    red = math.prod(shape[axes[0] : axes[-1] + 1])
    inner = math.prod(shape[axes[-1] + 1 :])
    if is_max and inner == 1 and red > MAX_RUN_IN_C:
        return None
    init = "(T)NEG_INF" if is_max else "(T)0"
    # a mean of no elements is 0 / 0: NaN, as numpy's
    scale = f" / (T){mean_of}" if mean_of is not None else ""
    if inner == 1:
        pragma = "" if is_max else "SBPC_SUM(acc)"
        update = "acc = (acc > x[r] || acc != acc) ? acc : x[r];" if is_max else "acc += x[r];"
        return f"""  for (long a = 0; a < {outer}; ++a) {{
    const T* x = a0 + a * {red};
    T acc = {init};
    {pragma}
    for (long r = 0; r < {red}; ++r) {update}
    out[a] = acc{scale};
  }}"""
    update = "o[c] = (o[c] > x[c] || o[c] != o[c]) ? o[c] : x[c];" if is_max else "o[c] += x[c];"
    finish = f"""
    {IVDEP}
    for (long c = 0; c < {inner}; ++c) o[c] = o[c]{scale};""" if mean_of is not None else ""
    return f"""  for (long a = 0; a < {outer}; ++a) {{
    T* o = out + a * {inner};
    for (long c = 0; c < {inner}; ++c) o[c] = {init};
    for (long r = 0; r < {red}; ++r) {{
      const T* x = a0 + (a * {red} + r) * {inner};
      {IVDEP}
      for (long c = 0; c < {inner}; ++c) {update}
    }}{finish}
  }}"""


def _host_reduce_ends(shape: Sequence[int], axes: Sequence[int], is_max: bool, mean_of: int | None) -> str | None:
    """A reduction over the leading axes and the trailing ones, keeping
    those between: the input is [lead, kept, trail]. Each kept element's
    run of trailing elements is summed in several partial sums (SBPC_SUM),
    then added to its output in the order of the leading axes: one pass,
    where numpy's (a GEMV over the trailing axes, then np.sum over the
    leading ones) took two and ran at a fraction of the rate on short runs
    (ResNet's statistics of 2x2 images: 37 against 10 us for 8 x 256
    channels). None for axes in more runs."""
    n = len(shape)
    lead = 0
    while lead < len(axes) and axes[lead] == lead:
        lead += 1
    trail = axes[lead:]
    if not lead or not trail or list(trail) != list(range(n - len(trail), n)):
        return None
    outer = math.prod(shape[:lead])
    kept = math.prod(shape[lead : n - len(trail)])
    run = math.prod(shape[n - len(trail) :])
    if is_max and run > MAX_RUN_IN_C:
        return None
    init = "(T)NEG_INF" if is_max else "(T)0"
    scale = f" / (T){mean_of}" if mean_of is not None else ""
    if is_max:  # one chain, keeping a NaN (as _host_reduce)
        fold = f"for (long r = 0; r < {run}; ++r) acc = (acc > x[r] || acc != acc) ? acc : x[r];"
        combine = "out[k] = (out[k] > acc || out[k] != out[k]) ? out[k] : acc;"
    else:
        fold = f"SBPC_SUM(acc)\n      for (long r = 0; r < {run}; ++r) acc += x[r];"
        combine = "out[k] += acc;"
    finish = f"""
  {IVDEP}
  for (long k = 0; k < {kept}; ++k) out[k] = out[k]{scale};""" if mean_of is not None else ""
    return f"""  for (long k = 0; k < {kept}; ++k) out[k] = {init};
  for (long a = 0; a < {outer}; ++a)
    for (long k = 0; k < {kept}; ++k) {{
      const T* x = a0 + (a * {kept} + k) * {run};
      T acc = {init};
      {fold}
      {combine}
    }}{finish}"""


@CUDA.impl(lg.SoftmaxOp, lg.LogSoftmaxOp)
def gen_softmax(site: Site) -> Kernel:
    kernel, name, t, shape = site.kernel, site.name, site.t, site.in_shapes[0]
    axis = cast(IntegerAttr, site.props["axis"]).value.data
    inner = math.prod(shape[axis + 1 :])
    rows = math.prod(shape) // shape[axis]
    n = shape[axis]
    at = f"o + k * {inner}"
    if kernel == "lg.log_softmax":
        total = f"SBPC_SUM(s)\n  for (long k = 0; k < {n}; ++k) s += exp(a0[{at}] - m);"
        write = f"for (long k = 0; k < {n}; ++k) out[{at}] = (a0[{at}] - m) - log(s);"
    else:  # each exponential once, kept in the output (a loop with no sum in it vectorizes), summed, divided
        total = (f"for (long k = 0; k < {n}; ++k) out[{at}] = exp(a0[{at}] - m);\n"
                 f"  SBPC_SUM(s)\n  for (long k = 0; k < {n}; ++k) s += out[{at}];")
        write = f"for (long k = 0; k < {n}; ++k) out[{at}] = out[{at}] / s;"
    body = f"""long o = (i / {inner}) * {n * inner} + (i % {inner});
  T m = (T)NEG_INF;
  /* lanes may drop a NaN from the maximum; it reaches every output through the sum anyway */
  SBPC_MAX(m)
  for (long k = 0; k < {n}; ++k) {{ T x = a0[{at}]; m = x > m ? x : m; }}
  T s = (T)0;
  {total}
  {write}"""
    return Kernel(name, t, ("const T* a0", "T* out"), rows, body, restrict=True)


@CUDA.impl(lg.LayerNormOp)
def gen_layernorm(site: Site) -> Kernel:
    name, t, shape = site.name, site.t, site.in_shapes[0]
    axis = cast(IntegerAttr, site.props["axis"]).value.data
    eps = cast(FloatAttr, site.props["epsilon"]).value.data
    affine = len(site.in_shapes) == 3
    inner = math.prod(shape[axis:])
    rows = math.prod(shape[:axis])
    params = ("const T* a0", "const T* w", "const T* bias", "T* out") if affine else ("const T* a0", "T* out")
    scale = " * w[k] + bias[k]" if affine else ""
    body = f"""const T* x = a0 + i * {inner};
  T mean = (T)0;
  SBPC_SUM(mean)
  for (long k = 0; k < {inner}; ++k) mean += x[k];
  mean /= (T){inner};
  T var = (T)0;
  SBPC_SUM(var)
  for (long k = 0; k < {inner}; ++k) {{ T d = x[k] - mean; var += d * d; }}
  var /= (T){inner};
  T r = rsqrt(var + (T){eps!r});
  for (long k = 0; k < {inner}; ++k) out[i * {inner} + k] = (x[k] - mean) * r{scale};"""
    return Kernel(name, t, params, rows, body, restrict=True)


@CUDA.impl(lg.LayerNormGradOp)
def gen_layernorm_grad(site: Site) -> Kernel:
    name, t, shape = site.name, site.t, site.in_shapes[0]
    axis = cast(IntegerAttr, site.props["axis"]).value.data
    eps = cast(FloatAttr, site.props["epsilon"]).value.data
    inner = math.prod(shape[axis:])
    rows = math.prod(shape[:axis])
    # Four passes over a row, in cache: the sums of x and of the gradient;
    # that of (x - mean)^2 (the variance two-pass, as lg.layernorm's); that
    # of the gradient times x^ = (x - mean) * r; then the result. x^ is
    # rounded before the product, as the reference and the ops it stands
    # for round it: r * mean(g * (x - mean)), one rounding apart, took
    # GPT-2's autocast run further from PyTorch's than float32 training
    # is (1.55e-4 against 1.50e-4 over 10 steps).
    body = f"""const T* x = a0 + i * {inner};
  const T* g = a1 + i * {inner};
  T mean = (T)0, m1 = (T)0;
  SBPC_SUM(mean)
  for (long k = 0; k < {inner}; ++k) mean += x[k];
  SBPC_SUM(m1)
  for (long k = 0; k < {inner}; ++k) m1 += g[k];
  mean /= (T){inner};
  m1 /= (T){inner};
  T var = (T)0, gd = (T)0;
  SBPC_SUM(var)
  for (long k = 0; k < {inner}; ++k) {{ T d = x[k] - mean; var += d * d; }}
  var /= (T){inner};
  T r = rsqrt(var + (T){eps!r});
  SBPC_SUM(gd)
  for (long k = 0; k < {inner}; ++k) gd += g[k] * ((x[k] - mean) * r);
  T m2 = gd / (T){inner};
  for (long k = 0; k < {inner}; ++k) out[i * {inner} + k] = r * ((g[k] - m1) - ((x[k] - mean) * r) * m2);"""
    return Kernel(name, t, ("const T* a0", "const T* a1", "T* out"), rows, body, restrict=True)


@CUDA.impl(lg.ReshapeOp)
def gen_copy(site: Site) -> Kernel:
    # Not restrict: a reshape may be planned in place (out == a0), and
    # each thread reads its element before writing it.
    return Kernel(site.name, site.t, ("const T* a0", "T* out"), math.prod(site.out_shape), "out[i] = a0[i];")


@CUDA.impl(lg.TransposeOp)
def gen_transpose(site: Site) -> Kernel:
    in_shape, out_shape = site.in_shapes[0], site.out_shape
    perm = list(cast(DenseArrayBase[IntegerType], site.props["perm"]).get_values())
    st = strides(in_shape)
    index = _index_loop(out_shape, [[st[p] for p in perm]], ["s"])
    # on the host, loops over the output with the input's permuted strides
    # (axes that stay together merged): no division per element
    nest = Nest(*_collapse(tuple(out_shape), [[st[p] for p in perm]]), ("s",), "out[i] = a0[s];")
    return Kernel(site.name, site.t, ("const T* a0", "T* out"), math.prod(out_shape), f"{index}\n  out[i] = a0[s];",
                  restrict=True, nest=nest)


# -- the vocabulary-parallel cross-entropy, padding, running sums --------------------

_INDEX_C_TYPES = {"i64": "int64_t", "i32": "int32_t"}


def _labels_type(site: Site, i: int) -> str:
    elem = site.in_elems[i] if site.in_elems else "i64"
    if elem not in _INDEX_C_TYPES:
        raise Unsupported(f"labels of element type {elem}")
    return _INDEX_C_TYPES[elem]


def _class_start(site: Site) -> int:
    """Where this device's piece of the logits starts along the classes."""
    return site.in_starts[0][-1] if site.in_starts else 0


def _ignored(site: Site) -> str:
    """A C condition on `label`: it is the ignored label (false without one)."""
    ignore = site.props.get("ignore_index")
    return f"label == {cast(IntegerAttr, ignore).value.data}" if ignore is not None else "0"


@CUDA.impl(lg.SumExpOp)
def gen_sum_exp(site: Site) -> Kernel:
    classes = site.in_shapes[0][-1]
    rows = math.prod(site.in_shapes[0][:-1])
    body = f"""const T* x = a0 + i * {classes};
  T m = a1[i];
  T s = (T)0;
  SBPC_SUM(s)
  for (long k = 0; k < {classes}; ++k) s += exp(x[k] - m);
  out[i] = s;"""
    return Kernel(site.name, site.t, ("const T* a0", "const T* a1", "T* out"), rows, body, restrict=True)


CROSS_ENTROPY_CHUNK = 256
"""lg.cross_entropy's C takes a row's exponentials this many at a time,
into a buffer on the stack, then sums them."""


def host_cross_entropy(site: Site) -> Kernel:
    """lg.cross_entropy on a CPU: a row at a time, its maximum, its sum of
    exponentials and the label's logit, where numpy's kernel makes a call
    over all rows for each (its maximum and sum over rows of a few classes
    cost about 0.1 us a row: 512 rows of 16 classes, 100 us against 26).
    Each row's loss is numpy's, -((x[label] - max) - log(sum)); the rows'
    losses are summed in double (numpy sums them pairwise in T), then
    divided by the rows and scaled to the global count as numpy's kernel
    does. On the GPU the op stays numpy's (a scalar of every row)."""
    classes = site.in_shapes[0][-1]
    rows = math.prod(site.in_shapes[1])
    global_rows = math.prod(site.global_in[:-1]) if site.global_in else rows
    if global_rows == 0:  # a mean of nothing: numpy's NaN
        raise Unsupported("a cross-entropy over no rows")
    chunk = max(1, min(classes, CROSS_ENTROPY_CHUNK))
    mean = f"o = o / (T){rows};" if rows else ""
    factor = f"o = o * (T){rows / global_rows!r};" if rows != global_rows else ""
    body = f"""  double total = 0.0;
  for (long r = 0; r < {rows}; ++r) {{
    const T* __restrict__ x = a0 + r * {classes};
    T m = (T)NEG_INF;
    /* lanes may drop a NaN from the maximum; it reaches the loss through the sum anyway */
    SBPC_MAX(m)
    for (long k = 0; k < {classes}; ++k) m = x[k] > m ? x[k] : m;
    T s = (T)0;
    for (long k0 = 0; k0 < {classes}; k0 += {chunk}) {{
      /* the exponentials of a chunk first: a loop with no sum in it vectorizes */
      long n = {classes} - k0 < {chunk} ? {classes} - k0 : {chunk};
      T e[{chunk}];
      for (long k = 0; k < n; ++k) e[k] = exp(x[k0 + k] - m);
      SBPC_SUM(s)
      for (long k = 0; k < n; ++k) s += e[k];
    }}
    total += -((x[(long)a1[r]] - m) - log(s));
  }}
  T o = (T)total;
  {mean}
  {factor}
  out[0] = o;"""
    return Kernel(site.name, site.t, ("const T* a0", f"const {_labels_type(site, 1)}* a1", "T* out"), 1, "",
                  restrict=True, host_body=body,
                  index_checks=(IndexCheck(site.kernel, 1, "label", classes),))


CUDA.register(lg.CrossEntropyOp, OnHost(host=host_cross_entropy))


@CUDA.impl(lg.TokenCrossEntropyOp)
def gen_token_cross_entropy(site: Site) -> Kernel:
    # one thread per row: the label's logit where this piece holds it, the
    # row's log-sum-exp where it holds class 0 (reference.token_cross_entropy).
    # A label outside the classes is not checked here (numpy's kernel does).
    classes = site.in_shapes[0][-1]
    rows = math.prod(site.in_shapes[1])
    start = _class_start(site)
    total = "log(a3[i]) + a2[i]" if start == 0 else "(T)0"
    body = f"""long label = (long)a1[i];
  if ({_ignored(site)}) {{ out[i] = (T)0; return; }}
  long c = label - {start};
  T picked = (c >= 0 && c < {classes}) ? a0[i * {classes} + c] : (T)0;
  out[i] = ({total}) - picked;"""
    params = ("const T* a0", f"const {_labels_type(site, 1)}* a1", "const T* a2", "const T* a3", "T* out")
    return Kernel(site.name, site.t, params, rows, body, restrict=True)


@CUDA.impl(lg.TokenCrossEntropyGradOp)
def gen_token_cross_entropy_grad(site: Site) -> Kernel:
    # one thread per logit: softmax times the incoming gradient, less it at
    # the label's column (reference.token_cross_entropy_grad)
    classes = site.in_shapes[0][-1]
    start = _class_start(site)
    body = f"""long r = i / {classes};
  long label = (long)a1[r];
  T g = ({_ignored(site)}) ? (T)0 : a4[r];
  T v = exp(a0[i] - a2[r]) * (g / a3[r]);
  out[i] = (label - {start} == i % {classes}) ? v - g : v;"""
    params = ("const T* a0", f"const {_labels_type(site, 1)}* a1", "const T* a2", "const T* a3", "const T* a4",
              "T* out")
    rows = math.prod(site.in_shapes[1])
    # the host's: a row at a time, its softmax times the gradient in one
    # straight loop (the threads' flat index divides per element), then the
    # label's column less the gradient where this piece holds it
    host = f"""  for (long r = 0; r < {rows}; ++r) {{
    const T* __restrict__ x = a0 + r * {classes};
    T* __restrict__ o = out + r * {classes};
    long label = (long)a1[r];
    T g = ({_ignored(site)}) ? (T)0 : a4[r];
    T m = a2[r], scale = g / a3[r];
    {IVDEP}
    for (long k = 0; k < {classes}; ++k) o[k] = exp(x[k] - m) * scale;
    long c = label - {start};
    if (c >= 0 && c < {classes}) o[c] = o[c] - g;
  }}"""
    return Kernel(site.name, site.t, params, math.prod(site.out_shape), body, restrict=True, host_body=host)


@CUDA.impl(lg.PadOp)
def gen_pad(site: Site) -> Kernel:
    shape, out_shape = site.in_shapes[0], site.out_shape
    low = list(cast(DenseArrayBase[IntegerType], site.props["low"]).get_values())
    value = cast(FloatAttr, site.props["value"]).value.data
    st = strides(shape)
    lines = ["long rem = i;", "long s = 0;", "int inside = 1;"]
    for d in reversed(range(len(shape))):
        lines.append(f"{{ long x = rem % {out_shape[d]} - {low[d]}; rem /= {out_shape[d]}; "
                     f"inside &= x >= 0 && x < {shape[d]}; s += x * {st[d]}; }}")
    body = "\n  ".join([*lines, f"out[i] = inside ? a0[s] : (T){value!r};"])
    return Kernel(site.name, site.t, ("const T* a0", "T* out"), math.prod(out_shape), body, restrict=True)


@CUDA.impl(lg.CumsumOp)
def gen_cumsum(site: Site) -> Kernel:
    # one thread per scanned line: what this piece's elements add to every
    # position of the whole axis (reference.cumsum_piece)
    shape, out_shape = site.in_shapes[0], site.out_shape
    axis = cast(IntegerAttr, site.props["axis"]).value.data
    reverse = "reverse" in site.props
    inner = math.prod(shape[axis + 1:])
    n, length = shape[axis], out_shape[axis]
    start = site.in_starts[0][axis] if site.in_starts and length != n else 0
    lines = math.prod(shape) // max(n, 1) if n else math.prod(out_shape) // max(length, 1)
    ahead = f"const T* x = a0 + (i / {inner}) * {n * inner} + i % {inner};\n  " \
            f"T* o = out + (i / {inner}) * {length * inner} + i % {inner};\n  T acc = (T)0;"
    if reverse:
        scan = f"""for (long k = {length - 1}; k >= {start + n}; --k) o[k * {inner}] = (T)0;
  for (long k = {n - 1}; k >= 0; --k) {{ acc += x[k * {inner}]; o[({start} + k) * {inner}] = acc; }}
  for (long k = {start - 1}; k >= 0; --k) o[k * {inner}] = acc;"""
    else:
        scan = f"""for (long k = 0; k < {start}; ++k) o[k * {inner}] = (T)0;
  for (long k = 0; k < {n}; ++k) {{ acc += x[k * {inner}]; o[({start} + k) * {inner}] = acc; }}
  for (long k = {start + n}; k < {length}; ++k) o[k * {inner}] = acc;"""
    return Kernel(site.name, site.t, ("const T* a0", "T* out"), lines, f"{ahead}\n  {scan}", restrict=True)


def _group_of_row(ends: str, experts: int, row: str) -> str:
    """C statements setting `g` to the expert whose group holds global row
    `row` (-1: none), as reference.expert_groups reads the ends."""
    return f"""long g = -1, start = 0;
  for (long e = 0; e < {experts}; ++e) {{
    long end = (long){ends}[e];
    if ({row} >= start && {row} < end) {{ g = e; break; }}
    if (end > start) start = end;
  }}"""


@CUDA.impl(lg.GroupedMatmulOp)
def gen_grouped_matmul(site: Site) -> Kernel:
    # one thread per result element: its row's expert (from the global
    # ends, the piece's first row added), then the dot product with that
    # expert's column where this piece holds the expert, else 0
    (rows, k), w, (experts,) = site.in_shapes
    transpose = "transpose_rhs" in site.props
    n = site.out_shape[1]
    row0 = site.in_starts[0][0] if site.in_starts else 0
    expert0 = site.in_starts[1][0] if site.in_starts else 0
    w_k, w_n = (1, k) if transpose else (n, 1)  # strides of rhs[g] along k and n
    body = f"""long r = i / {n}, c = i % {n};
  {_group_of_row("a2", experts, f"r + {row0}")}
  long local = g - {expert0};
  T acc = (T)0;
  if (g >= 0 && local >= 0 && local < {w[0]}) {{
    const T* wg = a1 + local * {w[1] * w[2]};
    for (long m = 0; m < {k}; ++m) acc += a0[r * {k} + m] * wg[m * {w_k} + c * {w_n}];
  }}
  out[i] = acc;"""
    params = ("const T* a0", "const T* a1", f"const {_labels_type(site, 2)}* a2", "T* out")
    return Kernel(site.name, site.t, params, rows * n, body, restrict=True)


@CUDA.impl(lg.GroupedMatmulGradWeightOp)
def gen_grouped_matmul_grad_weight(site: Site) -> Kernel:
    # one thread per result element (expert, k, n): the sum over the rows
    # of that expert's group held here of lhs[row, k] * rhs[row, n]
    (rows, k), (_, n), (experts,) = site.in_shapes
    local_experts = site.out_shape[0]
    row0 = site.in_starts[0][0] if site.in_starts else 0
    expert0 = site.out_starts[0] if site.out_starts else 0
    body = f"""long e = i / {k * n} + {expert0}, kk = (i / {n}) % {k}, c = i % {n};
  long start = 0, end = 0;
  for (long j = 0; j <= e; ++j) {{
    start = end > start ? end : start;
    end = (long)a2[j];
  }}
  long lo = start > {row0} ? start - {row0} : 0, hi = end - {row0} < {rows} ? end - {row0} : {rows};
  T acc = (T)0;
  for (long r = lo; r < hi; ++r) acc += a0[r * {k} + kk] * a1[r * {n} + c];
  out[i] = acc;"""
    params = ("const T* a0", "const T* a1", f"const {_labels_type(site, 2)}* a2", "T* out")
    return Kernel(site.name, site.t, params, local_experts * k * n, body, restrict=True)


@CUDA.impl(lg.GatherOp)
def gen_gather(site: Site) -> Kernel:
    # one thread per picked element: the index along `axis`, the element
    # there where this piece of the input holds it (reference.gather_piece)
    shape, index_shape = site.in_shapes
    axis = cast(IntegerAttr, site.props["axis"]).value.data
    start = site.in_starts[0][axis] if site.in_starts else 0
    st = strides(shape)
    lines = ["long rem = i;", "long s = 0;"]
    for d in reversed(range(len(index_shape))):
        if d != axis:
            lines.append(f"s += (rem % {index_shape[d]}) * {st[d]};")
        lines.append(f"rem /= {index_shape[d]};")
    lines.append(f"long k = (long)a1[i] - {start};")
    lines.append(f"out[i] = (k >= 0 && k < {shape[axis]}) ? a0[s + k * {st[axis]}] : (T)0;")
    params = ("const T* a0", f"const {_labels_type(site, 1)}* a1", "T* out")
    return Kernel(site.name, site.t, params, math.prod(index_shape), "\n  ".join(lines), restrict=True)


@CUDA.impl(lg.ScatterAddOp)
def gen_scatter_add(site: Site) -> Kernel:
    # one thread per line along `axis` (every other coordinate fixed): it
    # zeroes the line of the result, then adds the line's updates where
    # their indices point, in order (no two threads write one element)
    updates_shape, out_shape = site.in_shapes[0], site.out_shape
    axis = cast(IntegerAttr, site.props["axis"]).value.data
    inner = math.prod(out_shape[axis + 1:])
    n, m = out_shape[axis], updates_shape[axis]
    lines = math.prod(out_shape) // n if n else 0
    start = site.out_starts[axis] if site.out_starts else 0  # where this device's rows of the result begin
    body = f"""long outer = i / {inner}, c = i % {inner};
  T* o = out + outer * {n * inner} + c;
  const T* u = a0 + outer * {m * inner} + c;
  const {_labels_type(site, 1)}* x = a1 + outer * {m * inner} + c;
  for (long k = 0; k < {n}; ++k) o[k * {inner}] = (T)0;
  for (long j = 0; j < {m}; ++j) {{
    long k = (long)x[j * {inner}] - {start};
    if (k >= 0 && k < {n}) o[k * {inner}] += u[j * {inner}];
  }}"""
    params = ("const T* a0", f"const {_labels_type(site, 1)}* a1", "T* out")
    return Kernel(site.name, site.t, params, lines, body, restrict=True)


@CUDA.impl(lg.ScatterOp)
def gen_scatter(site: Site) -> Kernel:
    # one thread per line along `axis`: it copies the input's line, then
    # writes the line's updates where their indices point, in order, so the
    # last aimed at an element wins (reference.scatter_piece)
    data_shape, updates_shape = site.in_shapes[0], site.in_shapes[2]
    axis = cast(IntegerAttr, site.props["axis"]).value.data
    inner = math.prod(data_shape[axis + 1:])
    n, m = data_shape[axis], updates_shape[axis]
    lines = math.prod(data_shape) // n if n else 0
    start = site.in_starts[0][axis] if site.in_starts else 0  # where this device's rows begin
    body = f"""long outer = i / {inner}, c = i % {inner};
  T* o = out + outer * {n * inner} + c;
  const T* x = a0 + outer * {n * inner} + c;
  const {_labels_type(site, 1)}* k_of = a1 + outer * {m * inner} + c;
  const T* u = a2 + outer * {m * inner} + c;
  for (long k = 0; k < {n}; ++k) o[k * {inner}] = x[k * {inner}];
  for (long j = 0; j < {m}; ++j) {{
    long k = (long)k_of[j * {inner}] - {start};
    if (k >= 0 && k < {n}) o[k * {inner}] = u[j * {inner}];
  }}"""
    params = ("const T* a0", f"const {_labels_type(site, 1)}* a1", "const T* a2", "T* out")
    return Kernel(site.name, site.t, params, lines, body, restrict=True)


@CUDA.impl(lg.ArgmaxOp)
def gen_argmax(site: Site) -> Kernel:
    # one thread per output element: its line along the axis, the first
    # largest (or first NaN) element's index (numpy's argmax)
    shape = site.in_shapes[0]
    axis = cast(IntegerAttr, site.props["axis"]).value.data
    inner, n = math.prod(shape[axis + 1:]), shape[axis]
    in_type = C_TYPES.get(site.in_elems[0], "T") if site.in_elems else "T"
    body = f"""const {in_type}* x = a0 + (i / {inner}) * {n * inner} + i % {inner};
  long best = 0;
  {in_type} m = x[0];
  for (long k = 1; k < {n}; ++k) {{
    {in_type} v = x[k * {inner}];
    if (m == m && (v > m || v != v)) {{ m = v; best = k; }}
  }}
  out[i] = best;"""
    return Kernel(site.name, site.t, (f"const {in_type}* a0", "T* out"), math.prod(site.out_shape), body,
                  restrict=True)


@CUDA.impl(lg.TopkOp)
def gen_topk(site: Site) -> Kernel:
    # one thread per input element: its rank in its line's order (NaN
    # above every number, the lower index first among equals: reference.
    # topk_indices), and its index written at that rank if it is below k
    shape = site.in_shapes[0]
    axis = cast(IntegerAttr, site.props["axis"]).value.data
    k = cast(IntegerAttr, site.props["k"]).value.data
    inner, n = math.prod(shape[axis + 1:]), shape[axis]
    in_type = C_TYPES.get(site.in_elems[0], "T") if site.in_elems else "T"
    if "smallest" in site.props:
        before = "(w != w) ? (v != v && m < j) : (v != v || w < v || (w == v && m < j))"
    else:
        before = "(w != w) ? (v == v || m < j) : (v == v && (w > v || (w == v && m < j)))"
    body = f"""long outer = i / {n * inner}, j = (i / {inner}) % {n}, c = i % {inner};
  const {in_type}* x = a0 + outer * {n * inner} + c;
  {in_type} v = x[j * {inner}];
  long rank = 0;
  for (long m = 0; m < {n}; ++m) {{
    {in_type} w = x[m * {inner}];
    rank += {before};
  }}
  if (rank < {k}) out[outer * {k * inner} + rank * {inner} + c] = j;"""
    return Kernel(site.name, site.t, (f"const {in_type}* a0", "T* out"), math.prod(shape), body, restrict=True)


def _draw_kernel(site: Site, local, st, at, seed: str, step: str, statement: str, params) -> Kernel:
    """A kernel of Philox draws (lg.dropout, lg.uniform): each element's index
    g in the whole tensor (`at(d, c)`: along axis d, of local coordinate c,
    times the whole tensor's strides `st`), then its word of the Philox block
    of four it falls in (semantics/philox.py), which `statement` reads as
    `w[g & 3]` to write out[i]. On the host the elements run in order, so
    four neighbours share one block, drawn once."""
    key = f"(uint32_t){seed}[0], (uint32_t)((uint64_t){seed}[0] >> 32)"
    draw = f"sbpc_philox(w, {key});"
    stream = cast(IntegerAttr, site.props["stream"]).value.data
    counter = f"w[0] = (uint32_t)group; w[1] = (uint32_t)(group >> 32); w[2] = {stream}u; w[3] = (uint32_t){step}[0];"
    lines = ["long rem = i;", "long g = 0;"]
    for d in reversed(range(len(local))):
        lines.append(f"{{ long c = rem % {local[d]}; rem /= {local[d]}; g += ({at(d, 'c')}) * {st[d]}; }}")
    body = "\n  ".join([*lines, "uint64_t group = (uint64_t)g >> 2;", "uint32_t w[4];", counter, draw, statement])
    nest = ["  uint32_t w[4];", "  uint64_t cached = ~(uint64_t)0;  /* no block has this number */", "  long i = 0;"]
    for d, n in enumerate(local):
        pad = "  " * (d + 1)
        before = f"g{d - 1} + " if d else ""
        nest.append(f"{pad}for (long c{d} = 0; c{d} < {n}; ++c{d}) {{")
        nest.append(f"{pad}  long g{d} = {before}({at(d, f'c{d}')}) * {st[d]};")
    pad = "  " * (len(local) + 1)
    nest += [f"{pad}long g = g{len(local) - 1};", f"{pad}uint64_t group = (uint64_t)g >> 2;",
             f"{pad}if (group != cached) {{ {counter} {draw} cached = group; }}", f"{pad}{statement}", f"{pad}++i;"]
    nest += ["  " * (d + 1) + "}" for d in reversed(range(len(local)))]
    return Kernel(site.name, site.t, params, math.prod(local), body, restrict=True, host_body="\n".join(nest))


@CUDA.impl(lg.DropoutOp)
def gen_dropout(site: Site) -> Kernel:
    # the input's piece numbered from where it starts (and, in a micro-batch
    # copy, its row in the batch)
    rate = cast(FloatAttr, site.props["rate"]).value.data
    batch = site.props.get("micro_batch")
    count, index, rows = tuple(cast(DenseArrayBase[IntegerType], batch).get_values()) if batch else (1, 0, 1)
    local, shape = site.in_shapes[0] or (1,), site.global_in or (1,)
    starts = site.in_starts[0] if site.in_starts and site.in_starts[0] else (0,) * len(local)

    def at(d: int, c: str) -> str:
        """The index along axis d of the whole tensor of local coordinate c."""
        g = f"({c} + {starts[d]})"
        return f"(({g} / {rows}) * {count} + {index}) * {rows} + {g} % {rows}" if d == 0 and count > 1 else g

    keep = f"out[i] = a0[i] * ((w[g & 3] >> {32 - lg.DROPOUT_BITS}) >= {lg.dropout_threshold(rate)}u ? " \
           f"(T){1.0 / (1.0 - rate)!r} : (T)0);"
    return _draw_kernel(site, local, strides([shape[0] * count, *shape[1:]]), at, "a1", "a2", keep,
                        ("const T* a0", "const int64_t* a1", "const int64_t* a2", "T* out"))


@CUDA.impl(lg.UniformOp)
def gen_uniform(site: Site) -> Kernel:
    # the result's piece numbered from where it starts
    local, shape = site.out_shape or (1,), site.global_out or (1,)
    starts = site.out_starts or (0,) * len(local)
    value = f"out[i] = (T)(w[g & 3] >> {32 - lg.DROPOUT_BITS}) * (T){2.0 ** -lg.DROPOUT_BITS!r};"
    return _draw_kernel(site, local, strides(list(shape)), lambda d, c: f"{c} + {starts[d]}", "a0", "a1", value,
                        ("const int64_t* a0", "const int64_t* a1", "T* out"))


# -- masks: comparisons, casts, logical ops, select -----------------------------

COMPARISONS = {"eq": "==", "ne": "!=", "lt": "<", "le": "<=", "gt": ">", "ge": ">="}
LOGICAL = {"and": "{0} && {1}", "or": "{0} || {1}", "xor": "({0} != 0) != ({1} != 0)"}


def _mask_kernel(site: Site, expr: str) -> Kernel:
    """One of the mask ops: elementwise with broadcasting, each operand of
    its own element type (site.in_elems), the result `(T)(expr)`."""
    in_types = [C_TYPES[e] if e in C_TYPES else c_type(e) for e in site.in_elems]
    return _broadcasting(site.name, site.t, site.in_shapes, site.out_shape, in_types, [], expr)


@CUDA.impl(lg.CompareOp)
def gen_compare(site: Site) -> Kernel:
    # IEEE comparisons, as numpy's: NaN compares unequal to everything
    return _mask_kernel(site, f"v0 {COMPARISONS[cast(StringAttr, site.props['kind']).data]} v1")


@CUDA.impl(lg.LogicalOp)
def gen_logical(site: Site) -> Kernel:
    return _mask_kernel(site, LOGICAL[cast(StringAttr, site.props["kind"]).data].format("v0", "v1"))


@CUDA.impl(lg.CastOp)
def gen_cast(site: Site) -> Kernel:
    # to i1: != 0 (NaN is true, as numpy's bool()); float to integer truncates toward zero (C's conversion)
    return _mask_kernel(site, "v0 != 0" if site.t == "uint8_t" else "v0")


@CUDA.impl(lg.SelectOp)
def gen_select(site: Site) -> Kernel:
    return _mask_kernel(site, "v0 ? v1 : v2")


def _conv_site(site: Site) -> tuple:
    p = {k: tuple(cast(DenseArrayBase[IntegerType], site.props[k]).get_values())
         for k in ("stride", "padding", "dilation")}
    return p["stride"], p["padding"], p["dilation"], cast(IntegerAttr, site.props["groups"]).value.data


def _decompose(names: Sequence[str], shape: Sequence[int]) -> str:
    """C statements naming the coordinates of flat index i in `shape`."""
    lines = ["long rem = i;"]
    for name, n in zip(reversed(names), reversed(shape)):
        lines.append(f"long {name} = rem % {n}; rem /= {n};")
    return "\n  ".join(lines)


@CUDA.impl(lg.Conv2dOp)
def gen_conv2d(site: Site) -> Kernel:
    # one thread per output element: its window's dot product with the filter
    (_, c, h, w), (o, cg, kh, kw) = site.in_shapes
    (sh, sw), (ph, pw), (dh, dw), groups = _conv_site(site)
    body = f"""{_decompose(["b", "oc", "y", "x"], site.out_shape)}
  long first = (oc / {o // groups}) * {cg};
  T acc = (T)0;
  for (long c = 0; c < {cg}; ++c)
    for (long ki = 0; ki < {kh}; ++ki) {{
      long hi = y * {sh} - {ph} + ki * {dh};
      if (hi < 0 || hi >= {h}) continue;
      for (long kj = 0; kj < {kw}; ++kj) {{
        long wi = x * {sw} - {pw} + kj * {dw};
        if (wi < 0 || wi >= {w}) continue;
        acc += a0[((b * {c} + first + c) * {h} + hi) * {w} + wi] * a1[((oc * {cg} + c) * {kh} + ki) * {kw} + kj];
      }}
    }}
  out[i] = acc;"""
    return Kernel(site.name, site.t, ("const T* a0", "const T* a1", "T* out"), math.prod(site.out_shape), body,
                  restrict=True)


@CUDA.impl(lg.Conv2dGradInputOp)
def gen_conv2d_grad_input(site: Site) -> Kernel:
    # one thread per input element: the gradients of the outputs whose
    # windows read it, times the filter taps that read it
    (_, o, ho, wo), (_, cg, kh, kw) = site.in_shapes
    (sh, sw), (ph, pw), (dh, dw), groups = _conv_site(site)
    og = o // groups
    body = f"""{_decompose(["b", "ch", "y", "x"], site.out_shape)}
  long first = (ch / {cg}) * {og}, cl = ch % {cg};
  T acc = (T)0;
  for (long oc = first; oc < first + {og}; ++oc)
    for (long ki = 0; ki < {kh}; ++ki) {{
      long ry = y + {ph} - ki * {dh};
      if (ry < 0 || ry % {sh} || ry / {sh} >= {ho}) continue;
      for (long kj = 0; kj < {kw}; ++kj) {{
        long rx = x + {pw} - kj * {dw};
        if (rx < 0 || rx % {sw} || rx / {sw} >= {wo}) continue;
        acc += a0[((b * {o} + oc) * {ho} + ry / {sh}) * {wo} + rx / {sw}]
               * a1[((oc * {cg} + cl) * {kh} + ki) * {kw} + kj];
      }}
    }}
  out[i] = acc;"""
    return Kernel(site.name, site.t, ("const T* a0", "const T* a1", "T* out"), math.prod(site.out_shape), body,
                  restrict=True)


def gen_conv2d_grad_weight(site: Site) -> Kernel:
    # one thread per filter tap: the sum over examples and output positions
    # of the gradient times the input the tap read
    (n, c, h, w), (_, o, ho, wo) = site.in_shapes
    (sh, sw), (ph, pw), (dh, dw), groups = _conv_site(site)
    cg = c // groups
    body = f"""{_decompose(["oc", "cl", "ki", "kj"], site.out_shape)}
  long ch = (oc / {o // groups}) * {cg} + cl;
  T acc = (T)0;
  for (long b = 0; b < {n}; ++b)
    for (long y = 0; y < {ho}; ++y) {{
      long hi = y * {sh} - {ph} + ki * {dh};
      if (hi < 0 || hi >= {h}) continue;
      for (long x = 0; x < {wo}; ++x) {{
        long wi = x * {sw} - {pw} + kj * {dw};
        if (wi < 0 || wi >= {w}) continue;
        acc += a1[((b * {o} + oc) * {ho} + y) * {wo} + x] * a0[((b * {c} + ch) * {h} + hi) * {w} + wi];
      }}
    }}
  out[i] = acc;"""
    return Kernel(site.name, site.t, ("const T* a0", "const T* a1", "T* out"), math.prod(site.out_shape), body,
                  restrict=True)


DIRECT_GRAD_WEIGHT_CHANNELS = 4
"""lg.conv2d_grad_weight runs as generated C on a CPU (host_conv2d_grad_weight)
where the images have at most this many channels (a network's stem on RGB
images) and an output row is whole vectors (a multiple of 16 positions).
Such a filter's gradient is a GEMM of a small output (taps x filters) over
a long sum (every output position of every image), which OpenBLAS runs
below its rate. Batch 8, one core of a 2-core AMD EPYC (Zen 4),
2026-12-02, against the numpy kernel's windows and GEMMs: ResNet's stem
(3 channels, 7x7 stride 2, 224x224 images, 64 filters) 18.7-20.5 against
30.7-36.2 ms (PyTorch's 21.1-22.9), a 3x3 stride-2 stem of 32 filters 4.2
against 11.4, 3x3 stride 1 on 64x64 images 1.2 against 2.1, on 32x32 0.10
against 0.17 ms. Where it lost: 16 channels and more (3x3 of 16 on 56x56,
11.0 against 3.7 ms; a 1x1 of 256 channels, 19.8 against 5.2), whose
products run at BLAS's rate, and rows with a tail past whole vectors (a
stem on 200x200 images, rows of 100: 17.8 against 17.6 ms), whose lanes
would be gathered one by one."""


def host_conv2d_grad_weight(site: Site) -> Kernel:
    """lg.conv2d_grad_weight on a CPU, computed directly: no window copied
    into a GEMM's layout. Each image is first split into its stride x
    stride phases (plane (c, a, b) holds the padded image's rows a, a + s,
    ... and columns b, b + s, ...), so that every tap reads a contiguous
    row of a plane for a row of output positions. Then for a block of
    filters and a block of taps, vectors along the output row are
    multiplied and summed in registers over every row of the image (CB x
    JB accumulators, each gradient vector and each plane vector loaded
    once), and summed across the vector's lanes once per image. The
    planes' border stays zero (never written: the static scratch is mapped
    zero). The planes are the function's own state: one call at a time, as
    a rank's executor fires its actors. A vector reads exactly the
    positions its windows read (output rows are whole vectors), so an inf
    where no window reads reaches no sum, as with the windows. Sums are in
    T, with fused multiply-adds (a GEMM's rounding, not an elementwise
    op's)."""
    (n, c, h, w), (_, o, ho, wo) = site.in_shapes
    (sh, sw), (ph, pw), dilation, groups = _conv_site(site)
    kh, kw = site.out_shape[2:]
    taps = c * kh * kw
    if site.t not in ("float", "double") or groups != 1 or dilation != (1, 1) or sh != sw:
        raise Unsupported("a direct weight gradient of groups, dilation or unequal strides")
    if c > DIRECT_GRAD_WEIGHT_CHANNELS or wo % 16 or n * c * o * ho == 0:
        raise Unsupported("a weight gradient that the GEMMs run faster")
    s = sh
    rows = ho + (kh - 1) // s  # of a plane: the rows some window reads
    used = wo + (kw - 1) // s  # of a plane row: the columns some window reads
    cols = -(-used // 16) * 16  # (rows of whole 64-byte lines)
    planes = c * s * s * rows * cols
    if planes * 8 > 1 << 26:
        raise Unsupported("phase planes over 64 MiB")
    offsets = ", ".join(str(((ci * s + ki % s) * s + kj % s) * rows * cols + (ki // s) * cols + kj // s)
                        for ci in range(c) for ki in range(kh) for kj in range(kw))
    body = f"""  /* vectors of 64 bytes and 4 x 6 accumulators where AVX-512 gives 32
     registers; of 32 bytes and 3 x 4 accumulators in AVX2's 16 */
#if defined(__AVX512F__)
  enum {{ VB = 64, CB = 4, JB = 6 }};
#else
  enum {{ VB = 32, CB = 3, JB = 4 }};
#endif
  typedef T V __attribute__((vector_size(VB)));
  enum {{ L = VB / (int)sizeof(T) }};
  _Static_assert({wo} % L == 0, "output rows of whole vectors");
  static T planes[{planes}];
  static const long tap[{taps}] = {{{offsets}}};
  for (long q = 0; q < {o * taps}; ++q) out[q] = (T)0;
  for (long b = 0; b < {n}; ++b) {{
    const T* img = a0 + b * {c * h * w};
    for (long ci = 0; ci < {c}; ++ci)
      for (long pa = 0; pa < {s}; ++pa)
        for (long pb = 0; pb < {s}; ++pb) {{
          T* plane = planes + ((ci * {s} + pa) * {s} + pb) * {rows * cols};
          for (long i = 0; i < {rows}; ++i) {{
            long y = i * {s} + pa - {ph};
            if (y < 0 || y >= {h}) continue;
            for (long j = 0; j < {used}; ++j) {{
              long x = j * {s} + pb - {pw};
              if (x >= 0 && x < {w}) plane[i * {cols} + j] = img[(ci * {h} + y) * {w} + x];
            }}
          }}
        }}
    const T* grad = a1 + b * {o * ho * wo};
    for (long c0 = 0; c0 < {o}; c0 += CB)
      for (long j0 = 0; j0 < {taps}; j0 += JB) {{
        /* a last block past the filters or taps repeats the last one, unused */
        const T* gr[CB];
        const T* pr[JB];
        for (int f = 0; f < CB; ++f) gr[f] = grad + (c0 + f < {o} ? c0 + f : {o - 1}) * {ho * wo};
        for (int t = 0; t < JB; ++t) pr[t] = planes + tap[j0 + t < {taps} ? j0 + t : {taps - 1}];
        V acc[CB][JB];
        for (int f = 0; f < CB; ++f)
          for (int t = 0; t < JB; ++t) acc[f][t] = (V){{0}};
        for (long r = 0; r < {ho}; ++r) {{
          for (long v = 0; v < {wo}; v += L) {{
            V g[CB];
            for (int f = 0; f < CB; ++f) __builtin_memcpy(&g[f], gr[f] + r * {wo} + v, sizeof(V));
            for (int t = 0; t < JB; ++t) {{
              V x;
              __builtin_memcpy(&x, pr[t] + r * {cols} + v, sizeof(V));
#if defined(__x86_64__) && defined(__AVX__)
              __asm__("" : "+v"(x)); /* in a register: loaded once, not once per filter */
#endif
              for (int f = 0; f < CB; ++f) acc[f][t] += g[f] * x;
            }}
          }}
        }}
        for (int f = 0; f < CB && c0 + f < {o}; ++f)
          for (int t = 0; t < JB && j0 + t < {taps}; ++t) {{
            T sum = (T)0;
            for (int l = 0; l < L; ++l) sum += acc[f][t][l];
            out[(c0 + f) * {taps} + j0 + t] += sum;
          }}
      }}
  }}"""
    return Kernel(site.name, site.t, ("const T* a0", "const T* a1", "T* out"), 1, "", restrict=True,
                  host_body=body, contract=True)


CUDA.register(lg.Conv2dGradWeightOp, WithHost(gen_conv2d_grad_weight, host_conv2d_grad_weight))


def _pool_site(site: Site) -> tuple:
    return tuple(tuple(cast(DenseArrayBase[IntegerType], site.props[k]).get_values())
                 for k in ("kernel", "stride", "padding"))


@CUDA.impl(lg.MaxPool2dOp)
def gen_max_pool2d(site: Site) -> Kernel:
    # one thread per output: its window's first maximum (a NaN wins, as numpy's max)
    _, _, h, w = site.in_shapes[0]
    (kh, kw), (sh, sw), (ph, pw) = _pool_site(site)
    body = f"""{_decompose(["bc", "y", "x"], (math.prod(site.out_shape[:2]), *site.out_shape[2:]))}
  T m = (T)NEG_INF;
  for (long ki = 0; ki < {kh}; ++ki) {{
    long hi = y * {sh} - {ph} + ki;
    if (hi < 0 || hi >= {h}) continue;
    for (long kj = 0; kj < {kw}; ++kj) {{
      long wi = x * {sw} - {pw} + kj;
      if (wi < 0 || wi >= {w}) continue;
      T v = a0[(bc * {h} + hi) * {w} + wi];
      m = (v > m || v != v || m != m) ? (m != m ? m : v) : m;
    }}
  }}
  out[i] = m;"""
    return Kernel(site.name, site.t, ("const T* a0", "T* out"), math.prod(site.out_shape), body, restrict=True,
                  host_body=_host_max_pool2d(site))


def _tap_columns(w: int, wo: int, kw: int, sw: int, pw: int) -> list[tuple[int, int]]:
    """Per window column tap b, the output columns [lo, hi) whose tap b lies
    inside an image row of w (the others read the padding)."""
    spans = []
    for b in range(kw):
        lo = max(0, -(-(pw - b) // sw))
        hi = min(wo, (w - 1 + pw - b) // sw + 1)
        spans.append((lo, max(lo, hi)))
    return spans


def _host_max_pool2d(site: Site) -> str:
    """The host's loop: an output row at a time, tap by tap, each tap's pass
    over the row's outputs a straight loop (it vectorizes; the threads' flat
    index takes three divisions per output). Only taps inside the image are
    read: the numpy kernel's border of minus infinity is never a maximum
    but of a window of minus infinities, which this leaves at minus
    infinity too. A NaN anywhere in a window is its maximum."""
    planes, ho, wo = math.prod(site.out_shape[:2]), *site.out_shape[2:]
    _, _, h, w = site.in_shapes[0]
    (kh, kw), (sh, sw), (ph, pw) = _pool_site(site)
    taps = "\n".join(
        f"""        for (long ox = {lo}; ox < {hi}; ++ox) {{
          T v = row[ox * {sw} + {b - pw}];
          m[ox] = v != v ? v : (v > m[ox] ? v : m[ox]);  /* (no ||: its branch stops vectorizing) */
        }}""" for b, (lo, hi) in enumerate(_tap_columns(w, wo, kw, sw, pw)))
    return f"""  for (long bc = 0; bc < {planes}; ++bc) {{
    const T* __restrict__ img = a0 + bc * {h * w};
    for (long oy = 0; oy < {ho}; ++oy) {{
      T* __restrict__ m = out + (bc * {ho} + oy) * {wo};
      for (long ox = 0; ox < {wo}; ++ox) m[ox] = (T)NEG_INF;
      for (long a = 0; a < {kh}; ++a) {{
        long y = oy * {sh} - {ph} + a;
        if (y < 0 || y >= {h}) continue;
        const T* row = img + y * {w};
{taps}
      }}
    }}
  }}"""


@CUDA.impl(lg.MaxPool2dGradOp)
def gen_max_pool2d_grad(site: Site) -> Kernel:
    # one thread per input element: the gradients of the windows whose first
    # maximum it is (row-major order within the window, as numpy's argmax)
    (_, _, h, w), (_, _, ho, wo) = site.in_shapes
    (kh, kw), (sh, sw), (ph, pw) = _pool_site(site)
    body = f"""{_decompose(["bc", "y", "x"], (math.prod(site.out_shape[:2]), h, w))}
  const T* img = a0 + bc * {h * w};
  T acc = (T)0;
  for (long ki = 0; ki < {kh}; ++ki) {{
    long ry = y + {ph} - ki;
    if (ry < 0 || ry % {sh} || ry / {sh} >= {ho}) continue;
    long oy = ry / {sh};
    for (long kj = 0; kj < {kw}; ++kj) {{
      long rx = x + {pw} - kj;
      if (rx < 0 || rx % {sw} || rx / {sw} >= {wo}) continue;
      long ox = rx / {sw};
      /* the window (oy, ox): is this element its first maximum? */
      long best = -1;
      T m = (T)NEG_INF;
      for (long a = 0; a < {kh}; ++a)
        for (long b = 0; b < {kw}; ++b) {{
          long hi = oy * {sh} - {ph} + a, wi = ox * {sw} - {pw} + b;
          T v = (hi < 0 || hi >= {h} || wi < 0 || wi >= {w}) ? (T)NEG_INF : img[hi * {w} + wi];
          if (best < 0 || v > m) {{ m = v; best = a * {kw} + b; }}
        }}
      if (best == ki * {kw} + kj) acc += a1[(bc * {ho} + oy) * {wo} + ox];
    }}
  }}
  out[i] = acc;"""
    return Kernel(site.name, site.t, ("const T* a0", "const T* a1", "T* out"), math.prod(site.out_shape), body,
                  restrict=True, host_body=_host_max_pool2d_grad(site))


def _host_max_pool2d_grad(site: Site) -> str:
    """The host's scatter: each window's gradient added to its first
    maximum (its first NaN where it has one). An output row's windows find
    theirs together, tap by tap in the window's row-major order (straight
    loops over the row, as _host_max_pool2d), then add their gradients.
    Rows and windows go last to first, so an element takes its windows'
    gradients in the order of its own taps, as the numpy kernel adds them
    (the same rounding). A window whose first tap is padding and whose
    elements are all minus infinity gives its gradient to no element, as
    there (its first maximum is the padding's minus infinity)."""
    planes, h, w = math.prod(site.out_shape[:2]), *site.out_shape[2:]
    _, _, ho, wo = site.in_shapes[1]
    (kh, kw), (sh, sw), (ph, pw) = _pool_site(site)
    spans = _tap_columns(w, wo, kw, sw, pw)
    taps = []
    for a in range(kh):
        for b, (lo, hi) in enumerate(spans):
            if a == 0 and b == 0:  # the first tap sets every window's candidate, padding or not
                taps.append(f"""      {{
        long y = y0;
        int row_inside = y >= 0 && y < {h};
        SBPC_PRAGMA(omp simd)
        for (long ox = 0; ox < {wo}; ++ox) {{
          int inside = row_inside && ox >= {lo} && ox < {hi};
          m[ox] = inside ? img[y * {w} + ox * {sw} - {pw}] : (T)NEG_INF;
          at[ox] = inside ? y * {w} + ox * {sw} - {pw} : -1;
        }}
      }}""")
                continue
            taps.append(f"""      if (y0 + {a} >= 0 && y0 + {a} < {h}) {{
        long base = (y0 + {a}) * {w} + {b - pw};
        SBPC_PRAGMA(omp simd)
        for (long ox = {lo}; ox < {hi}; ++ox) {{
          T v = img[base + ox * {sw}];
          T c = m[ox];
          int take = (c == c) & ((v != v) | (v > c));  /* (bitwise: a branch per tap mispredicts) */
          m[ox] = take ? v : m[ox];
          at[ox] = take ? base + ox * {sw} : at[ox];
        }}
      }}""")
    body = "\n".join(taps)
    index = "int" if h * w < 2**31 else "long"  # (an int vectorizes beside a float)
    return f"""  T m[{wo}];
  {index} at[{wo}];
  for (long i = 0; i < {planes * h * w}; ++i) out[i] = (T)0;
  for (long bc = 0; bc < {planes}; ++bc) {{
    const T* __restrict__ img = a0 + bc * {h * w};
    const T* g = a1 + bc * {ho * wo};
    T* o = out + bc * {h * w};
    for (long oy = {ho - 1}; oy >= 0; --oy) {{
      long y0 = oy * {sh} - {ph};
{body}
      for (long ox = {wo - 1}; ox >= 0; --ox)
        if (at[ox] >= 0) o[at[ox]] += g[oy * {wo} + ox];
    }}
  }}"""


@dataclass(frozen=True)
class Site:
    """What a generator knows of one compute actor: its kernel's name (the
    C entry point), the lg kernel, the C element type, local shapes, the
    lg op's properties, the global shape of the first input (a mean over a
    split axis divides by the global count), and the inputs' element types
    and where their pieces start."""

    name: str
    kernel: str
    t: str
    in_shapes: tuple[tuple[int, ...], ...]
    out_shape: tuple[int, ...]
    props: dict[str, Attribute]
    global_in: tuple[int, ...]
    in_elems: tuple[str, ...] = ()
    """The inputs' element types ("f32", "i64", ...): labels and indices."""
    in_starts: tuple[tuple[int, ...], ...] = ()
    """Where each input's piece on this device starts in the global tensor
    (empty: the inputs are whole): the classes a vocabulary-split piece of
    logits holds."""
    out_starts: tuple[int, ...] = ()
    """Where the result's piece starts (empty: whole or partial)."""
    global_out: tuple[int, ...] = ()
    """The result's global shape (a draw numbers its elements in it)."""


def generate(actor: plan.ComputeOp, registers: dict, rank: int | None = None) -> tuple[str, str, list[int]]:
    """(CUDA source, entry, launch) for one compute actor, run by `rank`
    (None: its device's)."""
    made = describe(actor, registers, rank)
    if isinstance(made, Kernel):
        src, launch = cuda_source(made)
        return src, made.name, launch
    src, launch = made
    return src, _kernel_name(actor), launch


def generate_host(actor: plan.ComputeOp, registers: dict, rank: int | None = None) -> Kernel:
    """The kernel of one compute actor for the host (render it with
    host_source), run by `rank` (None: its device's); Unsupported where only
    a CUDA form exists (matmul)."""
    made = describe(actor, registers, rank, host=True)
    if not isinstance(made, Kernel):
        raise Unsupported(f"kernel {actor.kernel.data} on the host")
    return made


def _kernel_name(actor: plan.ComputeOp) -> str:
    return "k_" + "".join(c if c.isalnum() else "_" for c in actor.sym_name.data)


def describe(actor: plan.ComputeOp, registers: dict, rank: int | None = None,
             host: bool = False) -> Kernel | tuple[str, list[int]]:
    """What the generators make of one compute actor run by `rank` (None:
    the rank of the device it is in; a device `like` that one runs it as
    its own): a Kernel for both targets, or CUDA source and launch alone;
    with `host`, for a CPU alone (OnHost.host, WithHost.host). Where the pieces start in
    their global tensors is the rank's."""
    kernel = actor.kernel.data
    ins = [registers[r.string_value()] for r in actor.ins.data]
    out = registers[actor.outs.data[0].string_value()]
    device = actor.parent_op()
    assert isinstance(device, plan.DeviceOp)  # compute actors live in a device's body
    if rank is None:
        rank = device.rank.value.data
    site = Site(
        name=_kernel_name(actor),
        kernel=kernel,
        t=c_type(out.type.element_type),
        in_shapes=tuple(tuple(r.type.get_shape()) for r in ins),
        out_shape=tuple(out.type.get_shape()),
        props=dict(actor.props.data),
        global_in=tuple(ins[0].value.get_shape()) if ins else (),
        in_elems=tuple(str(r.type.element_type) for r in ins),
        in_starts=tuple(_starts(device, r.value, rank) for r in ins),
        out_starts=_starts(device, out.value, rank),
        global_out=tuple(out.value.get_shape()),
    )
    if kernel == plan.FUSED:
        steps = [(step.kernel, step.args) for step in plan.fused_steps(actor)]
        _check_element_type(site, [k for k, _ in steps])
        return gen_fused(site.name, site.t, site.in_shapes, site.out_shape, steps)
    _check_element_type(site, [kernel])
    return describe_site(site, host)


def _check_element_type(site: Site, kernels: Sequence[str]) -> None:
    if site.t not in ("float", "double") and not set(kernels) <= INTEGER_KERNELS:
        raise Unsupported(f"kernel {', '.join(sorted(set(kernels) - INTEGER_KERNELS))} on {site.t} elements")


def _starts(device: plan.DeviceOp, t, rank: int) -> tuple[int, ...]:
    """Where `rank`'s piece of dtensor `t` starts in the global tensor."""
    return tuple(s.start for s in piece_of(t, lookup_placement(device, t.placement).mesh(), rank))


def describe_site(site: Site, host: bool = False) -> Kernel | tuple[str, list[int]]:
    """What the generator registered for `site.kernel` makes of it (an lg
    kernel; fused chains go through gen_fused); with `host`, for a CPU
    alone (OnHost.host, WithHost.host)."""
    try:
        impl = CUDA.get(lg.op_class(site.kernel))
    except KeyError:
        impl = None
    if host and isinstance(impl, OnHost | WithHost) and impl.host is not None:
        return impl.host(site)
    if impl is None or isinstance(impl, OnHost):
        raise Unsupported(f"kernel {site.kernel}")
    return impl(site)
