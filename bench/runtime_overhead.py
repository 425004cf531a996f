"""The executor's own cost: actor firings per second, and the share of a
training step outside kernels and communication.

1. Builds a chain of N tiny elementwise ops (so kernels cost almost nothing),
compiles it for one rank, and times steps of the real executor (arena
views, register protocol, trace off) in this process, against the same
numpy calls made directly on preallocated arrays (the peer: numpy with no
runtime around it). Prints microseconds per firing for both and the
difference, which is the runtime's overhead, and firings per second.
2. Trains the MLP of bench/train_throughput.py (1024 -> H -> H -> 1024, SGD)
   on R ranks with `sbp-run --trace` and splits each rank's step into
   kernels (compute slices), communication not hidden under kernels, and
   the rest: the time outside kernels and communication (executor
   bookkeeping, feed copies, parameter write-back, waiting).
   --profile also runs the same step on one rank in this process under
   cProfile and prints where the executor's own time goes.

    python bench/runtime_overhead.py [--ops 400] [--steps 50] [--hidden 1024] [--batch 256] [--ranks 2]
        [--train-steps 5]
"""

import argparse
import time

import _common  # noqa: F401  (first: one BLAS thread per process)
import numpy as np
from mpi4py import MPI
from xdsl.context import Context

import sbpc
from sbpc.lowering.compile import CompilePass
from sbpc.runtime.executor import Executor
from sbpc.runtime.program import find_program


def chain(ops: int):
    g = sbpc.Graph("chain", placement=sbpc.placement("cpu", ranks=1))
    x = g.input("x", (8,))
    for i in range(ops):
        x = sbpc.tanh(x) if i % 2 else x * 0.5
    g.output(y=x)
    return g.module()


def main() -> None:
    # the summary paragraph (two lines; argparse refills it into one)
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ops", type=int, default=400)
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--train-steps", type=int, default=5)
    parser.add_argument("--profile", action="store_true", help="cProfile the training step on one rank, in-process")
    parser.add_argument("--quick", action="store_true", help="tiny sizes (for the smoke test)")
    args = parser.parse_args()
    if args.quick:
        args.ops, args.steps, args.hidden, args.batch, args.train_steps = 40, 5, 64, 16, 2
    module = chain(args.ops)
    # Unfused: plan-fuse-elementwise would make the whole chain one actor,
    # and this measures the cost of a firing.
    CompilePass(fuse=False).apply(Context(), module)
    program = find_program(module)
    executor = Executor(module, program, MPI.COMM_WORLD)
    executor.initialize()
    executor.feed({"x": np.ones(8, np.float32)})
    firings = len(executor.schedule)
    executor.run(2)  # warm up
    start = time.perf_counter()
    executor.run(args.steps)
    runtime = (time.perf_counter() - start) / (args.steps * firings)

    a = np.ones(8, np.float32)
    out = np.empty_like(a)
    half = np.float32(0.5)
    start = time.perf_counter()
    for _ in range(args.steps):
        for i in range(firings):
            if i % 2:
                np.tanh(a, out=out)
            else:
                np.multiply(a, half, out=out)
    bare = (time.perf_counter() - start) / (args.steps * firings)
    print(f"chain of {firings} tiny actors, {args.steps} steps, 1 rank in this process")
    _common.table(["", "us per firing", "firings/s"],
                  [("sbpc executor", runtime * 1e6, 1 / runtime), ("bare numpy calls (peer)", bare * 1e6, 1 / bare)])

    # 2. a real training step on R ranks, from the trace
    train = __import__("train_throughput")
    module = train.sbpc_mlp(args.ranks, args.batch, args.hidden)
    CompilePass().apply(Context(), module)
    events = _common.trace_breakdown(_common.traced_run(module, args.ranks, args.train_steps), args.train_steps)
    print(f"\nMLP 1024-{args.hidden}-{args.hidden}-1024 batch {args.batch} SGD training step on {args.ranks} ranks "
          f"(sbp-run --trace, {args.train_steps} steps), ms per step")
    rows = []
    for rank, b in events.items():
        rows.append((f"rank {rank}", b["wall"] * 1e3, b["kernels"] * 1e3, b["exposed"] * 1e3, b["outside"] * 1e3,
                     f"{b['outside'] / b['wall']:.1%}", f"{b['hidden'] / b['comm']:.0%}" if b["comm"] else "n/a"))
    _common.table(["", "step", "kernels", "exposed comm", "outside", "outside %", "comm hidden"], rows)
    outside = max(b["outside"] / b["wall"] for b in events.values())
    if args.profile:
        profile(args)
    print(f"summary: executor {1 / runtime / 1e3:.0f}k firings/s ({(runtime - bare) * 1e6:.1f} us overhead per "
          f"firing, {runtime / bare:.1f}x bare numpy calls); training step: {outside:.1%} of the step outside "
          f"kernels and communication (worst rank)")


def profile(args) -> None:
    """cProfile of the training step on one rank, in this process."""
    import cProfile
    import pstats

    train = __import__("train_throughput")
    module = train.sbpc_mlp(1, args.batch, args.hidden)
    CompilePass().apply(Context(), module)
    executor = Executor(module, find_program(module), MPI.COMM_WORLD)
    executor.initialize()
    executor.feed(train.mlp_feeds(args.batch, np.random.default_rng(0)))
    executor.run(1)
    prof = cProfile.Profile()
    prof.enable()
    executor.run(args.train_steps)
    prof.disable()
    print(f"\ncProfile, 1 rank in-process, {args.train_steps} steps (top 15 by internal time):")
    pstats.Stats(prof).sort_stats("tottime").print_stats(15)


if __name__ == "__main__":
    main()
