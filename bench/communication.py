"""Communication per training step: bytes per rank vs the analytic minimum, and overlap with computation.

Compiles the MLP of bench/train_throughput.py and the GPT of
examples/gpt.py for R data-parallel ranks, runs K steps with
`sbp-run --trace`, and reads from the trace, per rank and step: the
collectives that ran and their bytes (each comm slice carries the `bytes`
its plan.comm actor records: what a device receives on average for that
collective; the runtime does not count MPI traffic itself), how long
communication was in flight (issue to completion), how much of that was
hidden under kernels, and how much was exposed (the rank waited).

The analytic minimum for data parallelism is one all-reduce of every
gradient, which a bandwidth-optimal (ring / reduce-scatter + all-gather)
algorithm does by receiving 2 (R-1)/R of the gradient bytes per rank,
plus the scalar loss. The plan's own count (sum of plan.comm bytes of
rank 0, from the IR) is printed next to the trace's.

    python bench/communication.py [--ranks 2] [--steps 4] [--hidden 1024] [--batch 256] [--no-bucket]
"""

from __future__ import annotations

import argparse
import collections
import sys

import _common  # noqa: F401  (first: one BLAS thread per process)
import numpy as np
from xdsl.context import Context

from sbpc.dialects import plan
from sbpc.dialects.dtypes import numpy_dtype
from sbpc.lowering.compile import CompilePass


def plan_comm(program, rank: int = 0) -> tuple[float, collections.Counter]:
    """Bytes of rank's plan.comm actors (one step) and a count per kind."""
    device = next(d for d in program.devices() if d.rank.value.data == rank)
    total, kinds = 0.0, collections.Counter()
    for actor in device.actors():
        if isinstance(actor, plan.CommOp):
            total += actor.bytes.value.data if actor.bytes else 0
            kinds[actor.kind.data] += 1
    return total, kinds


def gradient_bytes(module) -> int:
    """Bytes of every trainable parameter (one with a `grad.<key>` output)."""
    from sbpc.dialects import lg

    graph = next(op for op in module.ops if isinstance(op, lg.GraphOp))
    params = {op.key.data: op.result.type for op in graph.body.ops if isinstance(op, lg.ParamOp)}
    outs = {n.data for op in graph.body.ops if isinstance(op, lg.OutputOp) for n in op.names.data}
    keys = [k for k in params if f"new.{k}" in outs and not k.startswith(("adam.", "momentum."))]
    return sum(int(np.prod(params[k].get_shape())) * numpy_dtype(params[k].element_type).itemsize for k in keys)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--gpt-layers", type=int, default=2)
    parser.add_argument("--gpt-dim", type=int, default=128)
    parser.add_argument("--quick", action="store_true", help="tiny MLP only (for the smoke test)")
    parser.add_argument("--bucket", action=argparse.BooleanOptionalAction, default=True,
                        help="gradient bucketing (compile's sbp-bucket-collectives); --no-bucket: one per gradient")
    args = parser.parse_args()
    if args.quick:
        args.hidden, args.batch, args.steps, args.gpt_layers, args.gpt_dim = 64, 16, 2, 1, 16
    train = __import__("train_throughput")
    gpt_cfg = {"batch": 32 if not args.quick else 4, "seq": 64 if not args.quick else 8, "dim": args.gpt_dim,
               "heads": 4, "layers": args.gpt_layers, "vocab": _common.gpt_vocab()}
    models = {f"mlp H={args.hidden}": (train.sbpc_mlp(args.ranks, args.batch, args.hidden), None)}
    if not args.quick:
        models[f"gpt {args.gpt_layers}L d={args.gpt_dim}"] = (train.sbpc_module("gpt", args.ranks, gpt_cfg), None)
    rows, overlap_rows, summary = [], [], []
    for name, (module, _) in models.items():
        grads = gradient_bytes(module)
        CompilePass(bucket=args.bucket).apply(Context(), module)
        program = next(p for p in module.ops if isinstance(p, plan.ProgramOp))
        plan_bytes, kinds = plan_comm(program)
        events = _common.traced_run(module, args.ranks, args.steps)
        per_rank = _common.trace_breakdown(events, args.steps)
        minimum = 2 * (args.ranks - 1) / args.ranks * grads + 4 * 2 * (args.ranks - 1) / args.ranks
        r0 = per_rank[0]
        rows.append((name, grads / 1e6, minimum / 1e6, plan_bytes / 1e6, r0["bytes"] / 1e6,
                     f"{r0['bytes'] / minimum:.2f}x", int(r0["collectives"]),
                     " ".join(f"{k}:{v}" for k, v in sorted(kinds.items()))))
        for rank, b in per_rank.items():
            overlap_rows.append((f"{name} rank {rank}", b["wall"] * 1e3, b["kernels"] * 1e3, b["comm"] * 1e3,
                                 b["hidden"] * 1e3, b["exposed"] * 1e3,
                                 f"{b['hidden'] / b['comm']:.0%}" if b["comm"] else "n/a",
                                 f"{b['exposed'] / b['wall']:.1%}"))
        worst = max(per_rank.values(), key=lambda b: b["exposed"])
        # exposed time is what a step pays; the hidden share alone rewards
        # many small collectives in flight over one short one at the end
        summary.append(f"{name} bytes {r0['bytes'] / minimum:.2f}x the DP all-reduce minimum, "
                       f"{int(r0['collectives'])} collectives per step, "
                       f"{worst['hidden'] / worst['comm']:.0%} of comm hidden, "
                       f"{worst['exposed'] * 1e3:.2f} ms exposed ({worst['exposed'] / worst['wall']:.1%} of the step, "
                       f"worst rank)" if worst["comm"] else f"{name}: no comm")
    print(f"{args.ranks} ranks, data parallel; MB per rank per step (1 MB = 1e6 B)")
    print("DP min: one bandwidth-optimal all-reduce of the gradients; trace MB: bytes of the comm slices that ran "
          "(their plan.comm `bytes`), summed per step")
    _common.table(["model", "grad MB", "DP min MB", "plan MB", "trace MB", "trace/DP min", "colls/step",
                   "plan.comm kinds"],
                  rows)
    print(f"\noverlap from the trace ({args.steps} steps), ms per step")
    _common.table(["model / rank", "step", "kernels", "comm in flight", "comm hidden", "comm exposed", "hidden %",
                   "exposed/step"], overlap_rows)
    print("summary: " + "; ".join(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
