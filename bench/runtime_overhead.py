"""The executor's own cost per actor firing.

Builds a chain of N tiny elementwise ops (so kernels cost almost nothing),
compiles it for one rank, and times steps of the real executor (arena
views, register protocol, trace off) in this process, against the same
numpy calls made directly on preallocated arrays (the peer: numpy with no
runtime around it). Prints microseconds per firing for both and the
difference, which is the runtime's overhead.

    python bench/runtime_overhead.py [--ops 400] [--steps 50]
"""

import argparse
import time

import numpy as np
from mpi4py import MPI
from xdsl.context import Context

import sbpc
from sbpc.lowering.compile import CompilePass
from sbpc.runtime.executor import Executor, find_program


def chain(ops: int):
    g = sbpc.Graph("chain", placement=sbpc.placement("cpu", ranks=1))
    x = g.input("x", (8,))
    for i in range(ops):
        x = sbpc.tanh(x) if i % 2 else x * 0.5
    g.output(y=x)
    return g.module()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ops", type=int, default=400)
    parser.add_argument("--steps", type=int, default=50)
    args = parser.parse_args()
    module = chain(args.ops)
    CompilePass().apply(Context(), module)
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
    print(f"{'':<28} {'us per firing':>14}")
    print(f"{'sbpc executor':<28} {runtime * 1e6:>14.2f}")
    print(f"{'bare numpy calls (peer)':<28} {bare * 1e6:>14.2f}")
    print(f"summary: {firings} actors x {args.steps} steps: executor overhead {(runtime - bare) * 1e6:.1f} us "
          f"per firing, {runtime / bare:.1f}x bare numpy")


if __name__ == "__main__":
    main()
