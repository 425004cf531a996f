"""Kernels as both targets share them, and their renderers: a `Kernel`
(a body over the thread index, its parameters, its element type) becomes
CUDA C (`cuda_source`: one thread per index) or C for the host CPU
(`host_source`: a loop, or a loop nest where broadcasting would otherwise
divide per element). The preludes hold what every kernel file may use:
infinities, the vectorizable float exp of the host, Philox4x32-10 (the
random numbers of lg.dropout). plan-codegen (the pass) and the runtime's
generated host kernels both import this; the per-op generators are in
generators.py."""

from __future__ import annotations

from dataclasses import dataclass

BLOCK = 256
TILE = 16


class Unsupported(Exception):
    pass


C_TYPES = {"f32": "float", "f64": "double", "i64": "int64_t", "i32": "int32_t", "i1": "uint8_t"}
"""Element types as C types; i1 is numpy's bool, one byte holding 0 or 1."""

def c_type(elem) -> str:
    name = str(elem)
    if name not in C_TYPES:
        raise Unsupported(f"element type {name}")
    return C_TYPES[name]


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


@dataclass(frozen=True)
class IndexCheck:
    """An operand of indices that must lie in [0, limit): the host checks it
    before the kernel runs, as the op's numpy kernel does (C cannot raise)."""

    op: str
    """The lg op, named in the error."""
    operand: int
    what: str
    limit: int


@dataclass(frozen=True)
class Kernel:
    """A kernel as both targets share it: `threads` independent runs of
    `body` (C statements over the thread index `i`, which may `return`
    early), with parameters `params` (the inputs, then the output) over
    the element type T. `cuda_source` makes it one CUDA thread per index;
    `host_source` a loop over the indices in C for the CPU. The body may
    use NEG_INF (minus infinity in T), rsqrt and the math functions of
    both targets (`exp`, `tanh`, ...; on the host tgmath.h picks the T
    version). `restrict`: the output never shares bytes with an input."""

    name: str
    t: str
    params: tuple[str, ...]
    threads: int
    body: str
    restrict: bool = False
    nest: Nest | None = None
    """The host loop nest of a broadcasting elementwise kernel (its inner
    loop vectorizes; the flat loop's division per element would not)."""
    host_body: str | None = None
    """The host function's whole body where the threads' order would not
    vectorize (a reduction: see gen_reduce)."""
    index_checks: tuple[IndexCheck, ...] = ()
    """Operands of indices the host checks before each run (labels)."""
    contract: bool = False
    """The host function may fuse a * b + c into one multiply-add (the file
    is built without: -ffp-contract=off). Only for a sum of products that a
    GEMM would round the same way anyway (its order and fusing are BLAS's)."""

    def declarations(self, restrict: bool) -> str:
        qualifier = " __restrict__" if restrict and self.restrict else ""
        return ", ".join(p.replace("*", "*" + qualifier, 1) for p in self.params)


PHILOX_C = """{qualifiers} void sbpc_philox(uint32_t* c, uint32_t k0, uint32_t k1) {{
  /* Philox4x32-10 (Random123) of counter c under key (k0, k1), in place:
     the generator of lg.dropout (semantics/philox.py is its definition) */
  for (int r = 0; r < 10; ++r) {{
    uint64_t p0 = (uint64_t)0xD2511F53u * c[0], p1 = (uint64_t)0xCD9E8D57u * c[2];
    uint32_t n0 = (uint32_t)(p1 >> 32) ^ c[1] ^ k0, n2 = (uint32_t)(p0 >> 32) ^ c[3] ^ k1;
    c[0] = n0; c[1] = (uint32_t)p1; c[2] = n2; c[3] = (uint32_t)p0;
    k0 += 0x9E3779B9u; k1 += 0xBB67AE85u;
  }}
}}
"""

CUDA_PRELUDE = (
    "#define NEG_INF __int_as_float(0xff800000)\n#define SBPC_SUM(v)\n#define SBPC_MAX(v)\n"
    "typedef long long int64_t;\ntypedef int int32_t;\ntypedef unsigned char uint8_t;\ntypedef unsigned int uint32_t;\n"
    "typedef unsigned long long uint64_t;\n" + PHILOX_C.format(qualifiers="static __device__ __forceinline__")
)


def cuda_source(k: Kernel) -> tuple[str, list[int]]:
    """The CUDA C of `k` (one thread per index) and its launch."""
    src = (
        f'{CUDA_PRELUDE}{_header(k.t)}extern "C" __global__ void {k.name}({k.declarations(True)}) {{\n'
        f"  long i = blockIdx.x * (long)blockDim.x + threadIdx.x;\n  if (i >= {k.threads}) return;\n"
        f"  {k.body}\n}}\n"
    )
    return src, _grid(k.threads)


HOST_PRELUDE = """#include <math.h>
#include <stdint.h>
#include <tgmath.h>
#define NEG_INF (-INFINITY)
#define rsqrt(x) (1 / sqrt(x))
/* A row's sum or maximum in several partial results at once (OpenMP's simd
   reduction, -fopenmp-simd): the one place the order of a sum may change
   (numpy's is pairwise, not serial, either), so the loop vectorizes; the
   rest keeps IEEE semantics step by step. */
#define SBPC_PRAGMA(x) _Pragma(#x)
#define SBPC_SUM(v) SBPC_PRAGMA(omp simd reduction(+:v))
#define SBPC_MAX(v) SBPC_PRAGMA(omp simd reduction(max:v))
/* A function whose sums of products may fuse multiply-adds (Kernel.contract). */
#if defined(__GNUC__) && !defined(__clang__)
#define SBPC_CONTRACT __attribute__((optimize("fp-contract=fast")))
#else
#define SBPC_CONTRACT
#endif
/* exp in float: Cephes' expf (range reduction by ln 2, a degree-6 polynomial,
   within 3 ulp) written without branches, so a loop of it vectorizes; exact
   0 below -104, inf above 89, NaN kept. glibc's vector expf calls its scalar
   code for each lane out of range, and a causal mask puts -inf in half of a
   softmax's lanes. */
/* The polynomial's steps as fused multiply-adds where the CPU has them
   (the build does not contract a * b + c by itself: the kernels round as
   numpy's do, step by step). */
#ifdef __FMA__
#define SBPC_FMA(a, b, c) fmaf(a, b, c)
#else
#define SBPC_FMA(a, b, c) ((a) * (b) + (c))
#endif
static inline float sbpc_pow2i(int32_t k) { union { int32_t i; float f; } u; u.i = (k + 127) << 23; return u.f; }
static inline float sbpc_expf(float x) {
  float c = x < -104.0f ? -104.0f : x;
  c = c > 89.0f ? 89.0f : c;
  float fn = (c * 1.44269504088896341f + 12582912.0f) - 12582912.0f; /* rounded: 1.5 * 2^23 */
  int32_t n = (int32_t)fn;
  float r = (c - fn * 0.693359375f) + fn * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = SBPC_FMA(p, r, 1.3981999507e-3f);
  p = SBPC_FMA(p, r, 8.3334519073e-3f);
  p = SBPC_FMA(p, r, 4.1665795894e-2f);
  p = SBPC_FMA(p, r, 1.6666665459e-1f);
  p = SBPC_FMA(p, r, 5.0000001201e-1f);
  float v = ((p * r) * r + r + 1.0f) * sbpc_pow2i(n >> 1) * sbpc_pow2i(n - (n >> 1));
  v = x < -104.0f ? 0.0f : v;
  v = x > 89.0f ? INFINITY : v;
  return x != x ? x : v;
}
static inline double sbpc_exp(double x) { return (exp)(x); }
#undef exp
#define exp(x) _Generic((x), float: sbpc_expf, default: sbpc_exp)(x)
""" + PHILOX_C.format(qualifiers="static inline")
"""What every host kernel file starts with (host_source is one kernel)."""

VECTOR_MATH = "".join(
    f'__attribute__((simd("notinbranch"))) {t} {f}{suffix}({t});\n'
    for f, types in (("exp", (("double", ""),)), ("tanh", (("float", "f"), ("double", ""))),
                     ("erf", (("float", "f"), ("double", ""))), ("log", (("float", "f"), ("double", ""))))
    for t, suffix in types
)
"""Declarations that let the C compiler call glibc's vector math library
(libmvec) in vectorized loops, as it does under -ffast-math, without
-ffast-math's loss of IEEE semantics (placed before tgmath.h, and linked
with -lmvec; runtime/host_kernels.py falls back to the scalar prelude
where the library lacks one). Float exp is the prelude's own."""


def host_prelude(vector_math: bool) -> str:
    if not vector_math:
        return HOST_PRELUDE
    return HOST_PRELUDE.replace("#include <tgmath.h>\n", VECTOR_MATH + "#include <tgmath.h>\n", 1)


IVDEP = "#pragma GCC ivdep"
"""The indices of a kernel are independent (CUDA threads run in any order),
and its output meets an input only element for element (in place): no
dependence between iterations, so the loop vectorizes without the runtime
overlap checks the compiler would otherwise need (it gives up beyond ten
pointers, and takes an in-place output for an overlap)."""


def host_source(k: Kernel) -> str:
    """The C of `k` for the host, one function `void <name>(params)` that
    runs the thread body for every index in order (or `k.nest`'s loops), T
    defined for it alone (kernels of several element types share one file
    after a host prelude)."""
    if k.nest is not None:
        return f"#define T {k.t}\nvoid {k.name}({k.declarations(False)}) {{\n{_host_nest(k.nest)}}}\n#undef T\n"
    if k.host_body is not None:
        contract = "SBPC_CONTRACT " if k.contract else ""
        return f"#define T {k.t}\n{contract}void {k.name}({k.declarations(False)}) {{\n{k.host_body}\n}}\n#undef T\n"
    return (
        f"#define T {k.t}\n"
        f"static inline void {k.name}_at(long i, {k.declarations(False)}) {{\n  {k.body}\n}}\n"
        f"void {k.name}({k.declarations(False)}) {{\n"
        f"  {IVDEP}\n  for (long i = 0; i < {k.threads}; ++i) {k.name}_at(i, {', '.join(_param_names(k))});\n}}\n"
        "#undef T\n"
    )


def _host_nest(nest: Nest) -> str:
    shape = nest.shape
    lines = []
    for d, n in enumerate(shape):
        if d == len(shape) - 1:
            lines.append("  " * (d + 1) + IVDEP)
        lines.append("  " * (d + 1) + f"for (long c{d} = 0; c{d} < {n}; ++c{d}) {{")
    depth = "  " * (len(shape) + 1)
    flat = "0"
    for d, n in enumerate(shape):
        flat = f"({flat}) * {n} + c{d}" if d else f"c{d}"
    lines.append(f"{depth}long i = {flat};")
    for name, st in zip(nest.offsets, nest.strides):
        terms = [f"c{d} * {s}" for d, s in enumerate(st) if s] or ["0"]
        lines.append(f"{depth}long {name} = {' + '.join(terms)};")
    lines.append(depth + nest.element.replace("\n      ", "\n" + depth))
    for d in reversed(range(len(shape))):
        lines.append("  " * (d + 1) + "}")
    return "\n".join(lines) + "\n"


def _param_names(k: Kernel) -> list[str]:
    return [p.rsplit("*", 1)[1].strip() for p in k.params]


@dataclass(frozen=True)
class Nest:
    """A broadcasting kernel's iteration as a loop nest, for the host: the
    output's shape (adjacent axes merged where every input's strides allow),
    each broadcast input's element strides over it and the name of its
    offset, and the statements for one element (reading a<k>[o<k>], writing
    out[i]). On a GPU each thread finds its offsets by division instead."""

    shape: tuple[int, ...]
    strides: tuple[tuple[int, ...], ...]
    offsets: tuple[str, ...]
    element: str


def _collapse(shape: tuple[int, ...], strides: list[list[int]]) -> tuple[tuple[int, ...], tuple[tuple[int, ...], ...]]:
    """Merges axis d into d+1 where every stride list steps over both as
    over one axis (stride[d] == stride[d+1] * shape[d+1])."""
    dims = list(shape)
    sts = [list(st) for st in strides]
    d = len(dims) - 2
    while d >= 0:
        if all(st[d] == st[d + 1] * dims[d + 1] for st in sts):
            dims[d + 1] *= dims[d]
            del dims[d]
            for st in sts:
                del st[d]
        d -= 1
    return tuple(dims), tuple(tuple(st) for st in sts)
