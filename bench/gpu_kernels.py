"""GPU kernels: sbpc's NVRTC-compiled GEMM and elementwise kernels vs the vendor library, on the same shapes.

Builds one graph on a 1-device CUDA placement with the benchmark shapes
(GEMMs, GELU, a broadcast add, and the elementwise chain gelu(x + v) * 0.5),
compiles it (`compile`, then `plan-codegen`), and for every generated
kernel: the NVRTC compile time (PTX, needs no GPU), and where a GPU is
present, its time per launch (CUDA events, best of --repeats) next to the
same operation in the vendor library: cuBLAS / PyTorch's CUDA kernels
(torch) or CuPy, as a fraction of it (vendor time / sbpc time; 100% means
as fast). Without a GPU (or its driver) it says so and exits 0.

    python bench/gpu_kernels.py [--size 4096] [--repeats 20]
"""

from __future__ import annotations

import argparse
import sys
import time

import _common  # noqa: F401  (first: one BLAS thread per process)
import numpy as np


def kernels_module(n: int):
    from xdsl.context import Context

    import sbpc
    from sbpc.lowering.compile import CompilePass
    from sbpc.lowering.plan_codegen import PlanCodegenPass

    g = sbpc.Graph("gpu_bench", placement=sbpc.placement("cuda", ranks=1))
    a = g.input("a", (n, n))
    b = g.input("b", (n, n))
    x = g.input("x", (n // 4, n))
    v = g.input("v", (n,))
    e = g.input("e", (n * 4, n // 4))
    g.output(gemm_square=a @ b, gemm_skinny=x @ b, gemm_bt=sbpc.matmul(x, b, transpose_b=True),
             gelu=sbpc.gelu(e), add=x + v, chain=sbpc.gelu(x + v) * 0.5)
    module = g.module()
    CompilePass(device="cuda").apply(Context(), module)
    PlanCodegenPass().apply(Context(), module)
    return module


def kernels(module):
    from sbpc.dialects import plan

    program = next(p for p in module.ops if isinstance(p, plan.ProgramOp))
    device = program.devices()[0]
    regs = {r.sym_name.data: r for r in device.registers()}
    for actor in device.actors():
        if isinstance(actor, plan.ComputeOp) and plan.CUDA_SOURCE_ATTR in actor.attributes:
            ins = [regs[r.string_value()] for r in actor.ins.data]
            out = regs[actor.outs.data[0].string_value()]
            yield actor, ins, out


def vendor_op(lib, actor, inputs):
    """The same operation in the vendor library, as a no-argument callable."""
    kernel = actor.kernel.data
    props = actor.props.data
    if lib == "torch":
        import torch

        f = torch.nn.functional
        ops = {"lg.add": torch.add, "lg.mul": torch.mul, "lg.gelu": lambda x: f.gelu(x, approximate="tanh"),
               "lg.matmul": lambda a, b: torch.matmul(a.mT if "transpose_lhs" in props else a,
                                                      b.mT if "transpose_rhs" in props else b)}
    else:
        import cupy

        ops = {"lg.add": cupy.add, "lg.mul": cupy.multiply,
               "lg.gelu": lambda x: 0.5 * x * (1 + cupy.tanh(0.7978845608 * (x + 0.044715 * x ** 3))),
               "lg.matmul": lambda a, b: cupy.matmul(a.T if "transpose_lhs" in props else a,
                                                     b.T if "transpose_rhs" in props else b)}
    fn = ops.get(kernel)
    return None if fn is None else (lambda: fn(*inputs))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=4096)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--quick", action="store_true", help="small sizes (for the smoke test)")
    args = parser.parse_args()
    if args.quick:
        args.size, args.repeats = 256, 3
    missing = _common.missing_peers({"cuda.bindings": "NVRTC, to compile the kernels (sbpc[nvrtc])"})
    if missing:
        print("summary: skipped: NVRTC is not installed, nothing to compile or run")
        return 0
    from sbpc.dialects import plan
    from sbpc.runtime import cuda

    module = kernels_module(args.size)
    found = list(kernels(module))
    ptx = {}
    compile_rows = []
    for actor, _ins, out in found:
        start = time.perf_counter()
        ptx[actor] = cuda.compile_ptx(actor.attributes[plan.CUDA_SOURCE_ATTR].data, f"bench_{actor.sym_name.data}.cu")
        compile_rows.append((actor.sym_name.data, actor.kernel.data, "x".join(map(str, out.type.get_shape())),
                             (time.perf_counter() - start) * 1e3))
    try:
        drv = cuda.driver()
    except cuda.CudaUnavailable as e:
        print(f"NVRTC compile (cached after the first run), size {args.size}")
        _common.table(["actor", "kernel", "out shape", "nvrtc ms"], compile_rows)
        print(f"no GPU: {e}; launch timings need one")
        print(f"summary: skipped: no GPU here ({e}); {len(found)} kernels compiled to PTX")
        return 0

    lib = "torch" if _common.have("torch") else "cupy" if _common.have("cupy") else None
    if lib == "torch":
        import torch

        if not torch.cuda.is_available():
            lib = "cupy" if _common.have("cupy") else None
    if lib is None:
        print("peer missing: torch with CUDA or cupy (the vendor library: cuBLAS)")
    rng = np.random.default_rng(0)
    rows, fractions = [], {}
    for actor, ins, out in found:
        host = [np.asarray(rng.standard_normal(r.type.get_shape(), dtype=np.float32)) for r in ins]
        fn = drv.function(ptx[actor], actor.attributes[plan.CUDA_ENTRY_ATTR].data)
        bufs = []
        for h in host:
            bufs.append(drv.alloc(h.nbytes))
            drv.upload(bufs[-1], h)
        out_gpu = drv.alloc(int(np.prod(out.type.get_shape())) * 4)
        gx, gy, gz, bx, by, bz = actor.attributes[plan.CUDA_LAUNCH_ATTR].get_values()

        def launch():
            drv.launch(fn, (gx, gy, gz), (bx, by, bz), [*bufs, out_gpu])  # noqa: B023 - only runs in this iteration

        ours = drv.best_time(launch, args.repeats)
        for address in (*bufs, out_gpu):
            drv.free(address)
        theirs = None
        if lib is not None:
            if lib == "torch":
                import torch

                dev = [torch.from_numpy(h).cuda() for h in host]
                call = vendor_op(lib, actor, dev)
                if call is not None:
                    call()
                    torch.cuda.synchronize()
                    times = []
                    for _ in range(args.repeats):
                        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                        s.record()
                        call()
                        e.record()
                        e.synchronize()
                        times.append(s.elapsed_time(e) / 1e3)
                    theirs = min(times)
            else:
                import cupy

                dev = [cupy.asarray(h) for h in host]
                call = vendor_op(lib, actor, dev)
                if call is not None:
                    from cupyx.profiler import benchmark

                    theirs = float(np.min(benchmark(call, n_repeat=args.repeats).gpu_times))
        kernel = actor.kernel.data
        shape = "x".join(map(str, out.type.get_shape()))
        flops = None
        if kernel == "lg.matmul":
            a_shape = ins[0].type.get_shape()
            k = a_shape[-2] if "transpose_lhs" in actor.props.data else a_shape[-1]
            flops = 2 * int(np.prod(out.type.get_shape())) * k / ours / 1e12
        frac = theirs / ours if theirs else None
        if frac:
            fractions.setdefault("gemm" if kernel == "lg.matmul" else "elementwise", []).append(frac)
        rows.append((actor.sym_name.data, kernel, shape, ours * 1e3, theirs * 1e3 if theirs else None,
                     f"{frac:.0%}" if frac else "n/a", flops))
    print(f"GPU kernels, best of {args.repeats} launches; vendor: {lib or 'missing'}")
    _common.table(["actor", "kernel", "out shape", "sbpc ms", "vendor ms", "sbpc % vendor", "sbpc TFLOP/s"], rows)
    parts = [f"{k} sbpc at {np.median(v):.0%} of {lib} (median of {len(v)})" for k, v in sorted(fractions.items())]
    print("summary: " + ("; ".join(parts) if parts else f"no vendor peer; {len(rows)} kernels timed"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
