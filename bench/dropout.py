"""sbpc's dropout kernels on the CPU against PyTorch's, one thread each:
the generated C (what the executor runs: Philox4x32-10, one block of four
words per four elements, in order) and the numpy kernel (the fallback),
against `torch.nn.functional.dropout` in training (a Bernoulli draw, then
a multiply), on GPT-2 small's shapes (batch 8 x 128): the residual stream
and the attention probabilities. Best of several repeats.

    python bench/dropout.py [--repeats 5] [--quick]

Prints, per shape, milliseconds per call, elements per second and sbpc's
time over PyTorch's.
"""

from __future__ import annotations

import argparse
import sys

import _common  # first: one BLAS thread per process
import numpy as np

SHAPES = [("residual stream 8x128x768", (8, 128, 768)), ("attention probabilities 8x12x128x128", (8, 12, 128, 128))]
QUICK = [("tiny 4x8x16", (4, 8, 16))]
RATE = 0.1


def sbpc_kernels(shape):
    """The generated C kernel (None where no C compiler or cffi is here) and
    the numpy kernel of one lg.dropout, bound to arrays of `shape`."""
    from xdsl.dialects.builtin import FloatAttr, IntegerAttr, TensorType, f32, f64, i64
    from xdsl.ir import Block

    from sbpc.codegen.generators import Site, describe_site
    from sbpc.dialects import lg
    from sbpc.dialects.sbp import Sbp
    from sbpc.runtime import host_kernels, numpy_kernels
    from sbpc.semantics.local_eval import LocalContext

    x = np.random.default_rng(0).standard_normal(shape, dtype=np.float32)
    seed, step = np.asarray(1234, np.int64), np.asarray(7, np.int64)
    out = np.empty_like(x)
    block = Block(arg_types=[TensorType(f32, shape), TensorType(i64, []), TensorType(i64, [])])
    op = lg.DropoutOp(block.args[0], block.args[1], block.args[2], RATE, 1)
    whole = tuple(slice(0, d) for d in shape)
    local = LocalContext((tuple(shape), (), ()), tuple(shape), (whole, (), ()), whole, (Sbp.B,))
    fire = numpy_kernels.NUMPY[lg.DropoutOp](op, local, [x, seed, step], out)
    runs = {"numpy": lambda: fire([x, seed, step], out)}
    if host_kernels.enabled() and host_kernels.unavailable() is None:
        site = Site("dropout_bench", "lg.dropout", "float", (tuple(shape), (), ()), tuple(shape),
                    {"rate": FloatAttr(RATE, f64), "stream": IntegerAttr(1, i64)}, tuple(shape))
        kernel = describe_site(site)
        c_fire = host_kernels.Library([kernel]).bind(kernel.name)
        c_out = np.empty_like(x)
        runs["C"] = lambda: c_fire([x, seed, step], c_out)
        runs["C"]()
        fire([x, seed, step], out)
        if not np.array_equal(out, c_out):
            raise SystemExit("the generated C and the numpy kernel drew different masks")
    return runs, x


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="one tiny shape: that the script runs")
    args = parser.parse_args()
    peer = not _common.missing_peers({"torch": "PyTorch's CPU dropout"})
    if peer:
        import torch

        torch.set_num_threads(1)
    rows, ratios = [], []
    for name, shape in QUICK if args.quick else SHAPES:
        runs, x = sbpc_kernels(shape)
        n = x.size
        peer_ms = None
        if peer:
            xt = torch.from_numpy(x)
            peer_ms = _common.best_of(lambda xt=xt: _common.timed(
                lambda: torch.nn.functional.dropout(xt, RATE, training=True)), args.repeats) * 1e3
        for kind, run in runs.items():
            ms = _common.best_of(lambda run=run: _common.timed(run), args.repeats) * 1e3
            rows.append([f"{name}, {kind}", f"{ms:.2f}", f"{n / ms / 1e3:.0f}",
                         f"{peer_ms:.2f}" if peer_ms else "n/a", _common.ratio(ms, peer_ms)])
            if peer_ms and kind == "C":
                ratios.append(ms / peer_ms)
    print(f"dropout p={RATE}, float32, one thread each, best of {args.repeats}")
    _common.table(["shape, sbpc kernel", "sbpc ms", "M elements/s", "PyTorch ms", "sbpc / PyTorch"], rows)
    middle = f"median {_common.median(ratios):.2f}x PyTorch's time" if ratios else "no peer or no C compiler"
    print(f"summary: sbpc's generated C dropout {middle}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
