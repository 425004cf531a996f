"""Generated C kernels for the CPU backend: the kernels plan-codegen
describes for CUDA (codegen/render.py's Kernel), rendered as C for
the host, built once with the system C compiler and called through cffi.

A chain of elementwise steps in numpy makes one pass over memory per step
(and a temporary per step); the generated C makes one pass with every
intermediate in a register. Softmax and layernorm likewise run each row in
cache instead of one numpy call per statistic. Matmul stays numpy's (BLAS).
`HOST_KERNELS` lists the kernels the executor runs this way (measured
faster); the others remain numpy's. Vectorized loops call glibc's vector
math library for exp, tanh, erf and log (render.VECTOR_MATH).

Building: a kernel's C function is named by the hash of its body, and the
cache (`$SBPC_CACHE`, default `~/.cache/sbpc`) remembers which library
holds each function. A device's kernels that no library holds yet go into
one C file, compiled with `cc -O3 -march=native` into a shared library
cached under the source's hash; ranks of one machine that load the same
bodies build them once (a file lock) and share them, and a later plan
builds only its new bodies (see `Library`). Set
`SBPC_HOST_KERNELS=0` to run numpy's kernels only. Where no C compiler or
cffi is available the executor runs numpy's, and `unavailable()` says why.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import replace
from functools import cache
from pathlib import Path

import numpy as np

from sbpc.codegen.generators import Site, describe_site, generate_host
from sbpc.codegen.render import Kernel, Unsupported, c_type, host_prelude, host_source
from sbpc.dialects import plan
from sbpc.semantics.reference import check_range

VARIABLE = "SBPC_HOST_KERNELS"
CACHE_VARIABLE = "SBPC_CACHE"
FLAGS = ("-O3", "-march=native", "-mprefer-vector-width=512", "-fPIC", "-shared", "-fno-math-errno",
         "-ffp-contract=off", "-fopenmp-simd")
"""No -ffast-math and no contraction into fused multiply-adds: the
kernels keep IEEE semantics (NaN, inf, no reassociation), so they round
as numpy's do, step by step (a contracted x * x + c lost 125 ulp to
numpy's where the sum cancels). -fopenmp-simd only for the pragmas of the
row sums that may be reordered (render.py's SBPC_SUM).

-mprefer-vector-width=512: on a CPU with AVX-512, -march=native alone
vectorizes 8 floats at a time and calls libmvec's AVX2 variants (GCC
tunes Skylake-X and later for 256-bit vectors, against the frequency drop
512-bit code once cost); OpenBLAS's SkylakeX GEMMs run 512-bit anyway, so
the step pays that drop already. On a 2-core Intel Xeon (Sapphire Rapids),
2026-12-01, bench/host_kernels.py on the GPT 6L d512 step, two runs each:
fused chains 60-68 -> 47 ms a step, GELU 24-25 -> 10.5-12.6 ms, softmax
5.1-7.7 -> 3.4-3.7 ms, the others unchanged (float32 tanh over 2M
elements: 3.0 -> 1.26 ms, numpy's own 1.26). On a 2-core AMD EPYC (Zen 4),
2026-12-02, the same bench interleaved over three rounds: every non-GEMM
kernel of that step together 52.7, 55.8, 61.9 ms without the flag, 49.9,
52.7, 58.7 with it (5-6% less in each round). A CPU without AVX-512 has
no wider vector to prefer, and the flag changes nothing there."""

REDUCTIONS = frozenset({"lg.reduce_sum", "lg.reduce_mean", "lg.reduce_max"})
HOST_KERNELS = frozenset({plan.FUSED, *plan.FUSABLE_KERNELS, "lg.softmax", "lg.log_softmax", "lg.layernorm",
                          "lg.layernorm_grad", "lg.transpose", "lg.dropout", "lg.max_pool2d", "lg.max_pool2d_grad",
                          "lg.sum_exp", "lg.token_cross_entropy_grad", "lg.cross_entropy", "lg.conv2d_grad_weight",
                          *REDUCTIONS})
"""Kernels whose generated C beats numpy's on this backend, measured by
bench/host_kernels.py on the GPT step: fused chains 3x (one pass, the
intermediates in registers), lone elementwise ops 1.3-2.5x, GELU 2.6x,
softmax 3.4x, layernorm 4.3x and its input gradient 5.0x (their row sums
vectorized: SBPC_SUM), sums over adjacent axes 3x and means 1.3x,
transposes 1.8x (a loop nest over the output), sums over the leading and
the trailing axes (batch normalization's statistics) 1.2-9x. Not a
reduction over axes in other runs (one strided loop per output: numpy's
pairwise sums are 3-4x faster). Max pooling (ResNet's 3x3 stride-2 window over 32
channels of 32x32, batch 8, one core of a 2-core Intel Xeon, 2026-11-30):
forward 0.21 against 0.59 ms, its gradient 0.53 against 2.42 ms (a
scatter from each window to its first maximum, where numpy goes tap by tap
over the pooled image). The vocabulary-parallel cross-entropy's row sums of
exponentials and its gradient (GPT-2's logits, 1024 x 25129 a rank): 20
against 29 ms and 22 against 42 ms, one pass over the logits where numpy
makes three (memory-bound: a numpy sum of them reads for 12.5 ms). The
mean cross-entropy (codegen's host_cross_entropy; one core of a 2-core
Intel Xeon, 2026-12-01): 26 against 100 us over 512 rows of 16 classes, 17
against 39 us over 16 rows of 1000, 0.27 against 0.30 ms over the GPT's
2048 rows of 28, 2.6 against 3.9 ms over 64 rows of GPT-2's 50257. The
weight gradient of a convolution over images of few channels (a network's
stem on RGB images; codegen's host_conv2d_grad_weight, which declines the
others): ResNet's 7x7 stride-2 stem, 18.7-20.5 ms against 34.7 (batch 8,
one core of a 2-core AMD EPYC, Zen 4, 2026-12-02)."""

Fire = Callable[[Sequence[np.ndarray], np.ndarray], None]


class BuildError(RuntimeError):
    """The C compiler refused a generated file (its message is in the error)."""


def enabled() -> bool:
    return os.environ.get(VARIABLE, "1") not in ("0", "false", "no", "")


@cache
def unavailable() -> str | None:
    """Why generated C kernels cannot run here, or None when they can."""
    try:
        import cffi  # noqa: F401
    except ImportError:
        return "cffi is not installed"
    if compiler() is None:
        return "no C compiler (cc, gcc or clang) on PATH"
    return None


def compiler() -> str | None:
    for name in (os.environ.get("CC"), "cc", "gcc", "clang"):
        if name and shutil.which(name):
            return name
    return None


def cache_dir() -> Path:
    """$SBPC_CACHE/host-kernels (default ~/.cache/sbpc), or a folder under
    the system's temporary directory where that cannot be made. Libraries
    are loaded from it, so it must be the user's and writable by no one
    else: a folder another user made (the temporary directory is everyone's)
    or can write into is passed over for a new private one."""
    root = os.environ.get(CACHE_VARIABLE) or os.path.join(os.path.expanduser("~"), ".cache", "sbpc")
    for path in (Path(root) / "host-kernels", Path(tempfile.gettempdir()) / f"sbpc-{os.getuid()}" / "host-kernels"):
        try:
            return _private(path)
        except OSError:
            continue
    return _process_private_dir()


@cache
def _process_private_dir() -> Path:
    """A folder of this process alone (made once): its libraries are built anew."""
    return Path(tempfile.mkdtemp(prefix="sbpc-host-kernels-"))


def _private(path: Path) -> Path:
    """`path`, made (0700) if missing, when the user owns it and its parent
    and no one else can write to either; OSError otherwise."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.mkdir(mode=0o700, exist_ok=True)
    for folder in (path.parent, path):
        info = folder.stat()
        if info.st_uid != os.getuid() or info.st_mode & 0o022:
            raise PermissionError(f"{folder} is not this user's alone")
    return path


@cache
def machine() -> str:
    """What -march=native compiles for: the CPU's model and feature flags,
    part of a library's cache key (a cache shared by machines of several
    CPU kinds must not hand one a library with instructions it lacks)."""
    try:
        with open("/proc/cpuinfo") as f:
            lines = [ln for ln in f if ln.startswith(("model name", "flags"))]
    except OSError:
        lines = []
    return platform.machine() + "".join(sorted(set(lines)))


@cache
def vector_math() -> bool:
    """Whether glibc's vector math library serves every function the
    prelude declares vectorized here (a probe, built and loaded once)."""
    import cffi

    calls = "".join(f"s += {f}(a[i]) + {f}(b[i]);" for f in ("exp", "tanh", "erf", "log"))
    probe = (host_prelude(True) + "double probe(const double* a, const float* b, long n) "
             f"{{ double s = 0; for (long i = 0; i < n; ++i) {{ {calls} }} return s; }}\n")
    try:
        path = build(probe, ("-lmvec",))
        ffi = cffi.FFI()
        ffi.cdef("double probe(const double*, const float*, long);")
        ffi.dlopen(str(path))
    except (BuildError, OSError):
        return False
    return True


def build(source: str, libraries: tuple[str, ...] = ()) -> Path:
    """The shared library of C `source`, compiled once per machine and
    source (concurrent callers wait for the first)."""
    cc = compiler()
    if cc is None:
        raise BuildError("no C compiler (cc, gcc or clang) on PATH")
    key = hashlib.sha256("\0".join((cc, *FLAGS, *libraries, machine(), source)).encode()).hexdigest()[:24]
    directory = cache_dir()
    library = directory / f"k{key}.so"
    if library.exists():
        return library
    with open(directory / f"k{key}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if library.exists():  # another process built it while this one waited
            return library
        with tempfile.TemporaryDirectory(dir=directory) as tmp:
            c_file, built = Path(tmp) / "kernels.c", Path(tmp) / "kernels.so"
            c_file.write_text(source)
            done = subprocess.run([cc, *FLAGS, "-o", str(built), str(c_file), *libraries, "-lm"],
                                  capture_output=True, text=True)
            if done.returncode != 0:
                raise BuildError(f"{cc} failed on the generated host kernels:\n{done.stderr[-4000:]}")
            os.replace(built, library)
    return library


def build_functions(functions: Sequence[Kernel]) -> dict[str, Path]:
    """The shared library holding each of `functions` (kernels named by
    `function_name`), building the ones no library in the cache holds yet
    into one new library. The cache links `f<key>.so` to the library
    holding a function, the key covering what the build depends on (the
    compiler, flags, machine and prelude as well as the body): a link whose
    library is gone counts as missing."""
    libraries: tuple[str, ...] = ("-lmvec",) if vector_math() else ()
    prelude = host_prelude(bool(libraries))
    cc = compiler()
    if cc is None:
        raise BuildError("no C compiler (cc, gcc or clang) on PATH")
    directory = cache_dir()
    context = "\0".join((cc, *FLAGS, *libraries, machine(), prelude))
    links = {k.name: directory / f"f{hashlib.sha256((context + chr(0) + k.name).encode()).hexdigest()[:24]}.so"
             for k in functions}
    missing = [k for k in functions if not links[k.name].exists()]
    if missing:
        library = build(prelude + "\n".join(host_source(k) for k in missing), libraries)
        for k in missing:
            temporary = links[k.name].with_name(f"{links[k.name].name}.{os.getpid()}.tmp")
            temporary.unlink(missing_ok=True)
            temporary.symlink_to(library.name)  # beside it: relative, valid wherever the cache is
            os.replace(temporary, links[k.name])
    return {name: link.resolve() for name, link in links.items()}


def generate(actors: Sequence[plan.ComputeOp], registers: dict, kernels: frozenset[str] | None = HOST_KERNELS,
             rank: int | None = None) -> dict[plan.ComputeOp, Kernel]:
    """The host kernel of each actor whose kernel is in `kernels` (None:
    every kernel the generator describes for the host), skipping those it
    does not (matmul, integer element types), as `rank` runs it (None: the
    rank of the actor's device)."""
    made = {}
    for actor in actors:
        if kernels is None or actor.kernel.data in kernels:
            try:
                kernel = generate_host(actor, registers, rank)
            except Unsupported:
                continue
            if kernels is None or beats_numpy(actor.kernel.data, kernel):
                made[actor] = kernel
    return made


def _element(a: np.ndarray) -> str:
    """The IR's name of an array's element type (f32, i64, i1), as
    Site.in_elems holds it: a kernel of labels reads them as their own type."""
    if a.dtype.kind == "b":
        return "i1"
    return f"{'f' if a.dtype.kind == 'f' else 'i'}{a.dtype.itemsize * 8}"


def beats_numpy(name: str, kernel: Kernel) -> bool:
    """Whether the generated C of a kernel in HOST_KERNELS runs faster than
    numpy's: all but a reduction over axes in runs other than one, or the
    leading and the trailing ones (no loops of its own: the flat loop)."""
    return name not in REDUCTIONS or kernel.host_body is not None


def bind_kernel(op, local, ins: Sequence[np.ndarray], out: np.ndarray) -> Fire | None:
    """The generated C for a lone lg op on these arrays, as the executor
    would run it (None where it runs numpy's): what sbp-calibrate times, so
    the cluster's kernel rates are the ones that run. `local` None: the
    arrays are whole (a benchmark's, a test's)."""
    if op.name not in HOST_KERNELS or not enabled() or unavailable() is not None:
        return None
    global_in = tuple(local.in_shapes[0] if local is not None else ins[0].shape) if ins else ()
    try:
        site = Site(name="k_" + op.name.replace(".", "_"), kernel=op.name, t=c_type(op.results[0].type.element_type),
                    in_shapes=tuple(x.shape for x in ins), out_shape=out.shape, props=dict(op.properties),
                    global_in=global_in, in_elems=tuple(_element(x) for x in ins))
        kernel = describe_site(site, host=True)
    except Unsupported:
        return None
    if not isinstance(kernel, Kernel) or not beats_numpy(op.name, kernel):
        return None
    return Library([kernel]).bind(kernel)


def function_name(kernel: Kernel) -> str:
    """The C name of `kernel`'s function: the hash of its host source
    written under a fixed name, which kernels that differ only in their
    names share."""
    digest = hashlib.sha256(host_source(replace(kernel, name="sbpc_kernel")).encode()).hexdigest()[:20]
    return f"k{digest}"


def _pointer_type(param: str, t: str) -> str:
    """The cffi pointer type of a kernel parameter ("const T* a0" -> "float *")."""
    base = param.rsplit("*", 1)[0].replace("const", "").strip()
    return f"{t if base == 'T' else base} *"


def _declarations(kernels: Sequence[Kernel]) -> str:
    """The kernels' declarations for cffi: a function type per distinct
    parameter list, each kernel declared by its type's name. cffi parses
    declarations with pycparser, at about a millisecond per prototype
    written out: a GPT-2 rank's 270 kernels took 0.1 s of every plan load,
    and one type per signature takes a tenth of that."""
    signatures = [tuple(_pointer_type(param, k.t) for param in k.params) for k in kernels]
    types: dict[tuple[str, ...], str] = {}
    for signature in signatures:
        types.setdefault(signature, f"sbpc_kernel_type_{len(types)}")
    typedefs = [f"typedef void {name}({', '.join(signature)});" for signature, name in types.items()]
    return "\n".join(typedefs + [f"{types[s]} {k.name};" for s, k in zip(signatures, kernels, strict=True)])


class Library:
    """Compiled kernels, callable on numpy arrays.

    A kernel is compiled once per body, not once per actor or per plan: its
    C function is named by the hash of its source (`function_name`), so
    actors that run the same code at the same shapes (the layers of a
    model, the optimizer's steps over equal parameters) share one function.
    A device's library of a GPT test plan held 318 kernels and 42 distinct
    bodies: cc took 3.5 s on the whole, 0.45 s on the bodies alone. The
    cache keeps, per function, a link to the library that holds it
    (`build_functions`): a plan loaded after another compiles only the
    bodies no earlier plan had (the GPT example's plans in test_training:
    403 bodies over 18 libraries, 154 distinct), and ranks whose devices
    run the same bodies build them once between them."""

    def __init__(self, kernels: Sequence[Kernel]):
        import cffi

        self.ffi = cffi.FFI()
        self.kernels: dict[str, Kernel] = {}  # by C function name, each renamed to it
        self._given: dict[int, tuple[Kernel, str]] = {}  # by id, the object kept so the id stays its own
        self._by_name: dict[str, str] = {}  # a given kernel's name -> its function (the first of that name)
        for k in kernels:
            function = function_name(k)
            self.kernels.setdefault(function, replace(k, name=function))
            self._given[id(k)] = (k, function)
            self._by_name.setdefault(k.name, function)
        functions = [self.kernels[name] for name in sorted(self.kernels)]
        self.ffi.cdef(_declarations(functions))
        where = build_functions(functions)
        self.paths = sorted(set(where.values()))
        opened = {path: self.ffi.dlopen(str(path)) for path in self.paths}
        self._lib_of = {name: opened[path] for name, path in where.items()}

    def bind(self, kernel: Kernel | str) -> Fire:
        """fire(inputs, out) for `kernel` (one this library was made with,
        or its name). The arrays must be the ones it was generated for:
        their shapes are compiled in. They are the executor's register
        views, the same arrays step after step, so their pointers are made
        once per array and kept."""
        given = kernel if isinstance(kernel, str) else kernel.name  # named so in errors
        name = self._by_name[kernel] if isinstance(kernel, str) else self._given[id(kernel)][1]
        fn = getattr(self._lib_of[name], name)
        kernel = self.kernels[name]
        # each parameter's C pointer type: T's, or its own (labels: int64_t)
        pointer_types = [_pointer_type(param, kernel.t) for param in kernel.params]
        cast = self.ffi.cast
        pointers: dict[int, tuple[np.ndarray, object]] = {}

        def pointer(a: np.ndarray, pointer_type: str):
            known = pointers.get(id(a))
            if known is not None and known[0] is a:
                return known[1]
            if not a.flags.c_contiguous:
                raise ValueError(f"host kernel {given}: a register view is not contiguous")
            p = cast(pointer_type, a.ctypes.data)
            pointers[id(a)] = (a, p)
            return p

        def fire(xs: Sequence[np.ndarray], out: np.ndarray) -> None:
            fn(*[pointer(x, t) for x, t in zip(xs, pointer_types)], pointer(out, pointer_types[-1]))

        if not kernel.index_checks:
            return fire
        checks = kernel.index_checks

        def checked(xs: Sequence[np.ndarray], out: np.ndarray) -> None:
            for c in checks:
                check_range(c.op, c.what, xs[c.operand], c.limit)
            fire(xs, out)

        return checked
