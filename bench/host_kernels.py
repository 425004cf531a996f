"""Generated C kernels vs numpy's, per kernel of a real training step.

Compiles the data-parallel GPT of bench/train_throughput.py (and its MLP)
for R ranks, takes rank 0's compute actors that plan-codegen describes for
the host (everything but matmul), and times each one both ways on random
inputs of its local shapes: numpy's bound kernel (runtime/numpy_kernels.py) and
the generated C (runtime/host_kernels.py), best of --repeats. Prints the
time per step by kernel kind and the ratio numpy / C (above 1: C is
faster), which is how host_kernels.HOST_KERNELS was chosen.

    python bench/host_kernels.py [--ranks 2] [--repeats 20] [--gpt-dim 128] [--gpt-layers 2]
"""

from __future__ import annotations

import argparse
import collections
import time

import _common  # noqa: F401  (first: one BLAS thread per process)
import numpy as np
from xdsl.context import Context

import sbpc
from sbpc.dialects import plan
from sbpc.dialects.dtypes import numpy_dtype
from sbpc.dialects.pieces import piece_of
from sbpc.dialects.sbp import lookup_placement
from sbpc.lowering.compile import CompilePass
from sbpc.runtime import host_kernels, numpy_kernels
from sbpc.semantics.plan_interpreter import actor_kernel


def best(fire, ins, out, repeats: int) -> float:
    fire(ins, out)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fire(ins, out)
        times.append(time.perf_counter() - start)
    return min(times)


def measure(module, repeats: int) -> dict[str, list[float]]:
    """Per kernel kind: [count, numpy seconds, C seconds] summed over rank 0's actors."""
    CompilePass().apply(Context(), module)
    program = plan.programs(module)[0]
    device = next(d for d in program.devices() if d.rank.value.data == 0)
    registers = {r.sym_name.data: r for r in device.registers()}
    ctx = sbpc.make_context()
    rng = np.random.default_rng(0)
    made = host_kernels.generate([a for a in device.actors() if isinstance(a, plan.ComputeOp)], registers, None)
    library = host_kernels.Library(list(made.values()))

    def piece(t):
        return piece_of(t, lookup_placement(device, t.placement).mesh(), 0)

    rows: dict[str, list[float]] = collections.defaultdict(lambda: [0, 0.0, 0.0])
    def operand(r):
        reg = registers[r.string_value()]
        shape, dtype = tuple(reg.type.get_shape()), numpy_dtype(reg.type.element_type)
        if dtype.kind in "iu":  # labels and indices: in range for any kernel's
            return rng.integers(0, 2, shape).astype(dtype)
        return np.array(rng.normal(size=shape), dtype)

    for actor, kernel in made.items():
        ins = [operand(r) for r in actor.ins.data]
        out_reg = registers[actor.outs.data[0].string_value()]
        out = np.empty(tuple(out_reg.type.get_shape()), numpy_dtype(out_reg.type.element_type))
        op, local = actor_kernel(ctx, actor, registers, piece)
        numpy_fire = numpy_kernels.bind(op, local, ins, out)
        name = actor.kernel.data
        if name == plan.FUSED:
            name += " (broadcast)" if any(x.shape != out.shape for x in ins) else " (same shape)"
        row = rows[name]
        row[0] += 1
        row[1] += best(numpy_fire, ins, out, repeats)
        row[2] += best(library.bind(kernel), ins, out, repeats)
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--gpt-dim", type=int, default=128)
    parser.add_argument("--gpt-layers", type=int, default=2)
    parser.add_argument("--quick", action="store_true", help="tiny sizes (for the smoke test)")
    args = parser.parse_args()
    if host_kernels.unavailable():
        print(f"summary: skipped: {host_kernels.unavailable()} (the executor runs numpy's kernels here)")
        return 0
    train = __import__("train_throughput")
    cfg = {"batch": 32, "seq": 64, "dim": args.gpt_dim, "heads": 4, "layers": args.gpt_layers,
           "vocab": _common.gpt_vocab()}
    models = {"mlp": train.sbpc_mlp(args.ranks, 256, 1024)}
    if args.quick:
        cfg.update(batch=4, seq=8, dim=16, layers=1)
        models = {"mlp": train.sbpc_mlp(args.ranks, 16, 64)}
        args.repeats = 2
    models[f"gpt {cfg['layers']}L d={cfg['dim']}"] = train.sbpc_module("gpt", args.ranks, cfg)
    summary = []
    for name, module in models.items():
        rows = measure(module, args.repeats)
        table = [(kind, int(n), numpy_s * 1e3, c_s * 1e3, f"{numpy_s / c_s:.2f}x" if c_s else "-")
                 for kind, (n, numpy_s, c_s) in sorted(rows.items(), key=lambda kv: -kv[1][1])]
        print(f"{name}, rank 0 of {args.ranks}: ms per step, best of {args.repeats}")
        _common.table(["kernel", "actors", "numpy ms", "C ms", "numpy/C"], table)
        total_numpy, total_c = sum(r[1] for r in rows.values()), sum(r[2] for r in rows.values())
        chosen = [r for k, r in rows.items() if k.split(" ")[0] in host_kernels.HOST_KERNELS]
        mixed = sum(r[1] for r in rows.values()) - sum(r[1] - r[2] for r in chosen)
        summary.append(f"{name}: numpy {total_numpy * 1e3:.2f} ms, all C {total_c * 1e3:.2f} ms, "
                       f"as the executor runs them {mixed * 1e3:.2f} ms")
    print("summary: " + "; ".join(summary))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
