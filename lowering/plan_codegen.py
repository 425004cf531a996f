"""`plan-codegen`: CUDA C for every compute actor of a plan's CUDA devices.

Each kernel is generated for the actor's local shapes, with the SBP-local
semantics baked in (a mean over a split axis divides by the global count),
and attached to the actor as discardable attributes:

    cuda.source   the CUDA C source (one `extern "C" __global__` kernel)
    cuda.entry    the kernel's name
    cuda.launch   [grid x, y, z, block x, y, z]

The runtime compiles the source with NVRTC to PTX for compute_90 and
launches it with the kernel's inputs, then its output, as device pointers.
Covered: elementwise unary and broadcasting binary ops and fused chains of
them (`plan.fused`, from plan-fuse-elementwise: one thread per output
element, intermediates in registers), matmul (tiled
through shared memory, batched, transposes), reductions, softmax and
log_softmax, layernorm, reshape and transpose. Other kernels are reported.
`all=true` generates for every device (used to test generation on CPU
plans).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import cast

from xdsl.context import Context
from xdsl.dialects.builtin import DenseArrayBase, FloatAttr, IntegerAttr, IntegerType, ModuleOp, StringAttr, i64
from xdsl.ir import Attribute
from xdsl.passes import ModulePass
from xdsl.utils.exceptions import PassFailedException

from sbpc.dialects import lg, plan
from sbpc.dialects.backends import Backend
from sbpc.dialects.sbp import DeviceKind, lookup_placement

BLOCK = 256
TILE = 16


class Unsupported(Exception):
    pass


def c_type(elem) -> str:
    name = str(elem)
    if name == "f32":
        return "float"
    if name == "f64":
        return "double"
    raise Unsupported(f"element type {name}")


def strides(shape) -> list[int]:
    out, acc = [], 1
    for d in reversed(shape):
        out.append(acc)
        acc *= d
    return list(reversed(out))


def _header(t: str) -> str:
    return f"typedef {t} T;\n"


def _grid(n: int) -> list[int]:
    return [max(1, -(-n // BLOCK)), 1, 1, BLOCK, 1, 1]


Generator = Callable[["Site"], tuple[str, list[int]]]
"""gen(site) -> (CUDA C source, launch [grid x, y, z, block x, y, z])"""

CUDA: Backend[Generator | ElementwiseExpr | OnHost] = Backend("the CUDA code generator")
"""Every lg op's CUDA implementation: a generator, an elementwise C
expression (so it also fuses), or ON_HOST: the executor runs the actor's
numpy kernel on the host mirror (staged through pinned memory)."""


class OnHost:
    """The registration of an op with no CUDA kernel: its actors run their
    numpy kernel on the host (runtime/cuda_backend.py stages the bytes)."""


ON_HOST = OnHost()


@dataclass(frozen=True)
class ElementwiseExpr:
    """An elementwise op as a C expression over its operands {0}, {1}, of
    type T: alone it is a chain of one step (gen_fused), and a fused chain
    inlines it."""

    expr: str

    def __call__(self, site: Site) -> tuple[str, list[int]]:
        return gen_fused(
            site.name, site.t, site.in_shapes, site.out_shape, [(site.kernel, tuple(range(len(site.in_shapes))))]
        )


for _op, _expr in (
    (lg.NegOp, "-{0}"),
    (lg.ReluOp, "{0} > (T)0 ? {0} : (T)0"),
    (lg.StepOp, "{0} > (T)0 ? (T)1 : (T)0"),
    (lg.GeluOp, "(T)0.5 * {0} * ((T)1 + tanh((T)0.7978845608028654 * ({0} + (T)0.044715 * {0} * {0} * {0})))"),
    (lg.TanhOp, "tanh({0})"),
    (lg.ErfOp, "erf({0})"),
    (lg.ExpOp, "exp({0})"),
    (lg.SqrtOp, "sqrt({0})"),
    (lg.RsqrtOp, "rsqrt({0})"),
    (lg.AddOp, "{0} + {1}"),
    (lg.SubOp, "{0} - {1}"),
    (lg.MulOp, "{0} * {1}"),
    (lg.DivOp, "{0} / {1}"),
):
    CUDA.register(_op, ElementwiseExpr(_expr))

for _op in (lg.BroadcastToOp, lg.ConcatOp, lg.SliceOp, lg.EmbeddingOp, lg.CrossEntropyOp, lg.MseLossOp, lg.OneHotOp,
            lg.EmbeddingGradOp):
    CUDA.register(_op, ON_HOST)


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


def gen_fused(name, t, in_shapes, out_shape, steps):
    """One kernel for a chain of elementwise steps (kernel, argument
    indices: inputs first, then earlier steps), one thread per output
    element. Broadcasting composes, so every input is read at the
    broadcast image of the output index and every step lives in a
    register; a lone elementwise op is a chain of one."""
    n = math.prod(out_shape)
    # No __restrict__: the memory plan may write the output over an input
    # (in place); each thread reads its elements before writing its own.
    params = ", ".join([f"const T* a{k}" for k in range(len(in_shapes))] + ["T* out"])
    moved = [k for k, shape in enumerate(in_shapes) if tuple(shape) != tuple(out_shape)]
    lines = []
    if moved:
        lines.append(_index_loop(out_shape, [_broadcast_strides(in_shapes[k], out_shape) for k in moved],
                                 [f"o{k}" for k in moved]))
    lines += [f"T v{k} = a{k}[{f'o{k}' if k in moved else 'i'}];" for k in range(len(in_shapes))]
    for j, (kernel, args) in enumerate(steps):
        expr = elementwise_expr(kernel).expr.format(*(f"v{a}" for a in args))
        lines.append(f"T v{len(in_shapes) + j} = {expr};")
    lines.append(f"out[i] = v{len(in_shapes) + len(steps) - 1};")
    body = "\n    ".join(lines)
    src = (
        f'{_header(t)}extern "C" __global__ void {name}({params}) {{\n'
        f"  long i = blockIdx.x * (long)blockDim.x + threadIdx.x;\n  if (i >= {n}) return;\n    {body}\n}}\n"
    )
    return src, _grid(n)


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


@CUDA.impl(lg.ReduceSumOp, lg.ReduceMeanOp, lg.ReduceMaxOp)
def gen_reduce(site: Site) -> tuple[str, list[int]]:
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
    init = "(T)__int_as_float(0xff800000)" if is_max else "(T)0"
    update = "acc = acc > a0[b + r] ? acc : a0[b + r];" if is_max else "acc += a0[b + r];"
    scale = ""
    if kernel == "lg.reduce_mean":
        scale = f"acc = acc / (T){math.prod(site.global_in[d] for d in axes)};"
    src = f"""{_header(t)}extern "C" __global__ void {name}(const T* __restrict__ a0, T* __restrict__ out) {{
  long i = blockIdx.x * (long)blockDim.x + threadIdx.x;
  if (i >= {n_out}) return;
  {base}
  T acc = {init};
  for (long j = 0; j < {n_red}; ++j) {{
    {inner}
    {update}
  }}
  {scale}
  out[i] = acc;
}}
"""
    return src, _grid(n_out)


@CUDA.impl(lg.SoftmaxOp, lg.LogSoftmaxOp)
def gen_softmax(site: Site) -> tuple[str, list[int]]:
    kernel, name, t, shape = site.kernel, site.name, site.t, site.in_shapes[0]
    axis = cast(IntegerAttr, site.props["axis"]).value.data
    inner = math.prod(shape[axis + 1 :])
    rows = math.prod(shape) // shape[axis]
    n = shape[axis]
    log = kernel == "lg.log_softmax"
    write = "out[o + k * {inner}] = (x - m) - log(s);" if log else "out[o + k * {inner}] = exp(x - m) / s;"
    src = f"""{_header(t)}extern "C" __global__ void {name}(const T* __restrict__ a0, T* __restrict__ out) {{
  long i = blockIdx.x * (long)blockDim.x + threadIdx.x;
  if (i >= {rows}) return;
  long o = (i / {inner}) * {n * inner} + (i % {inner});
  T m = (T)__int_as_float(0xff800000);
  for (long k = 0; k < {n}; ++k) {{ T x = a0[o + k * {inner}]; m = x > m ? x : m; }}
  T s = (T)0;
  for (long k = 0; k < {n}; ++k) s += exp(a0[o + k * {inner}] - m);
  for (long k = 0; k < {n}; ++k) {{ T x = a0[o + k * {inner}]; {write.format(inner=inner)} }}
}}
"""
    return src, _grid(rows)


@CUDA.impl(lg.LayerNormOp)
def gen_layernorm(site: Site) -> tuple[str, list[int]]:
    name, t, shape = site.name, site.t, site.in_shapes[0]
    axis = cast(IntegerAttr, site.props["axis"]).value.data
    eps = cast(FloatAttr, site.props["epsilon"]).value.data
    affine = len(site.in_shapes) == 3
    inner = math.prod(shape[axis:])
    rows = math.prod(shape[:axis])
    params = (
        "const T* __restrict__ a0, const T* __restrict__ w, const T* __restrict__ bias, T* __restrict__ out"
        if affine
        else "const T* __restrict__ a0, T* __restrict__ out"
    )
    scale = " * w[k] + bias[k]" if affine else ""
    src = f"""{_header(t)}extern "C" __global__ void {name}({params}) {{
  long i = blockIdx.x * (long)blockDim.x + threadIdx.x;
  if (i >= {rows}) return;
  const T* x = a0 + i * {inner};
  T mean = (T)0;
  for (long k = 0; k < {inner}; ++k) mean += x[k];
  mean /= (T){inner};
  T var = (T)0;
  for (long k = 0; k < {inner}; ++k) {{ T d = x[k] - mean; var += d * d; }}
  var /= (T){inner};
  T r = rsqrt(var + (T){eps!r});
  for (long k = 0; k < {inner}; ++k) out[i * {inner} + k] = (x[k] - mean) * r{scale};
}}
"""
    return src, _grid(rows)


@CUDA.impl(lg.ReshapeOp)
def gen_copy(site: Site) -> tuple[str, list[int]]:
    name, t, n = site.name, site.t, math.prod(site.out_shape)
    # No __restrict__: a reshape may be planned in place (out == a0), and
    # each thread reads its element before writing it.
    src = (f'{_header(t)}extern "C" __global__ void {name}(const T* a0, T* out) {{\n'
           f"  long i = blockIdx.x * (long)blockDim.x + threadIdx.x;\n  if (i < {n}) out[i] = a0[i];\n}}\n")
    return src, _grid(n)


@CUDA.impl(lg.TransposeOp)
def gen_transpose(site: Site) -> tuple[str, list[int]]:
    name, t, in_shape, out_shape = site.name, site.t, site.in_shapes[0], site.out_shape
    perm = list(cast(DenseArrayBase[IntegerType], site.props["perm"]).get_values())
    st = strides(in_shape)
    n = math.prod(out_shape)
    index = _index_loop(out_shape, [[st[p] for p in perm]], ["s"])
    src = (f'{_header(t)}extern "C" __global__ void {name}(const T* __restrict__ a0, T* __restrict__ out) {{\n'
           f"  long i = blockIdx.x * (long)blockDim.x + threadIdx.x;\n  if (i >= {n}) return;\n    {index}\n"
           f"  out[i] = a0[s];\n}}\n")
    return src, _grid(n)


@dataclass(frozen=True)
class Site:
    """What a generator knows of one compute actor: its kernel's name (the
    C entry point), the lg kernel, the C element type, local shapes, the
    lg op's properties, and the global shape of the first input (a mean
    over a split axis divides by the global count)."""

    name: str
    kernel: str
    t: str
    in_shapes: tuple[tuple[int, ...], ...]
    out_shape: tuple[int, ...]
    props: dict[str, Attribute]
    global_in: tuple[int, ...]


def generate(actor: plan.ComputeOp, registers: dict) -> tuple[str, str, list[int]]:
    """(source, entry, launch) for one compute actor."""
    kernel = actor.kernel.data
    ins = [registers[r.string_value()] for r in actor.ins.data]
    out = registers[actor.outs.data[0].string_value()]
    site = Site(
        name="k_" + "".join(c if c.isalnum() else "_" for c in actor.sym_name.data),
        kernel=kernel,
        t=c_type(out.type.element_type),
        in_shapes=tuple(tuple(r.type.get_shape()) for r in ins),
        out_shape=tuple(out.type.get_shape()),
        props=dict(actor.props.data),
        global_in=tuple(ins[0].value.get_shape()) if ins else (),
    )
    if kernel == plan.FUSED:
        steps = [(step.kernel, step.args) for step in plan.fused_steps(actor)]
        src, launch = gen_fused(site.name, site.t, site.in_shapes, site.out_shape, steps)
    else:
        try:
            impl = CUDA.get(lg.op_class(kernel))
        except KeyError:
            impl = None
        if impl is None or isinstance(impl, OnHost):
            raise Unsupported(f"kernel {kernel}")
        src, launch = impl(site)
    return src, site.name, launch


@dataclass(frozen=True)
class PlanCodegenPass(ModulePass):
    name = "plan-codegen"

    all: bool = False
    """Generate for every device, not only those of CUDA placements."""

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        for program in plan.programs(op):
            for device in program.devices():
                registers = {r.sym_name.data: r for r in device.registers()}
                for actor in device.actors():
                    if not isinstance(actor, plan.ComputeOp):
                        continue
                    out = registers[actor.outs.data[0].string_value()]
                    kind = lookup_placement(device, out.value.placement).mesh().device
                    if kind is not DeviceKind.CUDA and not self.all:
                        continue
                    try:
                        src, entry, launch = generate(actor, registers)
                    except Unsupported as e:
                        raise PassFailedException(
                            f"'plan.compute' @{actor.sym_name.data} on @{device.sym_name.data}: no CUDA kernel for {e}"
                        ) from None
                    actor.attributes["cuda.source"] = StringAttr(src)
                    actor.attributes["cuda.entry"] = StringAttr(entry)
                    actor.attributes["cuda.launch"] = DenseArrayBase.from_list(i64, launch)
