"""sbpc's convolution kernels on the CPU, as the executor binds them (the
generated C where it runs one: a stem's weight gradient; else the numpy
kernels: Winograd, or the windows copied into scratch and GEMMs) against PyTorch's CPU
convolution, one thread each, on ResNet-50's layer shapes: the forward, the
gradient for the input and the gradient for the weight, timed separately
(best of several repeats).

    python bench/conv.py [--batch 8] [--repeats 5] [--quick]

Prints, per layer, milliseconds per call and sbpc's time over PyTorch's.
"""

from __future__ import annotations

import argparse
import sys

import _common  # first: one BLAS thread per process
import numpy as np

LAYERS = [  # (name, channels in, image size, channels out, kernel, stride, padding): ResNet-50's kinds
    ("stem 7x7/2", 3, 224, 64, 7, 2, 3),
    ("stage 1 3x3", 64, 56, 64, 3, 1, 1),
    ("stage 2 1x1", 256, 28, 128, 1, 1, 0),
    ("stage 3 3x3", 256, 14, 256, 3, 1, 1),
    ("stage 4 1x1", 512, 7, 2048, 1, 1, 0),
]
QUICK = [("3x3", 8, 12, 16, 3, 1, 1), ("1x1/2", 16, 8, 8, 1, 2, 0)]


def sbpc_kernels(batch: int, c: int, size: int, o: int, k: int, stride: int, padding: int):
    """The three kernels of one layer as the executor binds them, and their arrays."""
    from xdsl.dialects.builtin import TensorType, f32
    from xdsl.ir import Block

    from sbpc.dialects import lg
    from sbpc.runtime import host_kernels, numpy_kernels

    rng = np.random.default_rng(0)
    x = rng.standard_normal((batch, c, size, size), dtype=np.float32)
    w = rng.standard_normal((o, c, k, k), dtype=np.float32)
    block = Block(arg_types=[TensorType(f32, x.shape), TensorType(f32, w.shape)])
    conv = {"stride": (stride, stride), "padding": (padding, padding)}
    forward = lg.Conv2dOp(block.args[0], block.args[1], **conv)
    y = np.empty(forward.result.type.get_shape(), np.float32)
    g = rng.standard_normal(y.shape, dtype=np.float32)
    grads = Block(arg_types=[TensorType(f32, y.shape), TensorType(f32, w.shape), TensorType(f32, x.shape)])
    to_input = lg.Conv2dGradInputOp(grads.args[0], grads.args[1], (size, size), **conv)
    to_weight = lg.Conv2dGradWeightOp(grads.args[2], grads.args[0], (k, k), **conv)
    dx, dw = np.empty_like(x), np.empty_like(w)
    runs = []
    for op, ins, out in ((forward, [x, w], y), (to_input, [g, w], dx), (to_weight, [x, g], dw)):
        fire = host_kernels.bind_kernel(op, None, ins, out) or numpy_kernels.NUMPY[type(op)](op, None, ins, out)
        runs.append(lambda fire=fire, ins=ins, out=out: fire(ins, out))
    return runs, (x, w, g)


def torch_runs(x, w, g, stride: int, padding: int):
    import torch

    torch.set_num_threads(1)
    xt, wt, gt = torch.from_numpy(x), torch.from_numpy(w), torch.from_numpy(g)
    grad = torch.nn.grad
    with torch.no_grad():
        return [lambda: torch.nn.functional.conv2d(xt, wt, None, stride, padding),
                lambda: grad.conv2d_input(xt.shape, wt, gt, stride, padding),
                lambda: grad.conv2d_weight(xt, wt.shape, gt, stride, padding)]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="two tiny layers: that the script runs")
    args = parser.parse_args()
    layers, batch = (QUICK, 2) if args.quick else (LAYERS, args.batch)
    peer = not _common.missing_peers({"torch": "PyTorch's CPU convolution"})
    rows, ratios = [], []
    for name, c, size, o, k, stride, padding in layers:
        runs, (x, w, g) = sbpc_kernels(batch, c, size, o, k, stride, padding)
        theirs = torch_runs(x, w, g, stride, padding) if peer else [None] * 3
        for what, mine, other in zip(("forward", "grad input", "grad weight"), runs, theirs):
            ms = _common.best_of(lambda mine=mine: _common.timed(mine), args.repeats) * 1e3
            peer_ms = _common.best_of(lambda other=other: _common.timed(other), args.repeats) * 1e3 if other else None
            rows.append([f"{name} {what}", f"{ms:.2f}", f"{peer_ms:.2f}" if peer_ms else "n/a",
                         _common.ratio(ms, peer_ms)])
            if peer_ms:
                ratios.append(ms / peer_ms)
    print(f"conv2d, batch {batch}, one thread each, best of {args.repeats}")
    print(_common.blas_kernels())
    _common.table(["layer", "sbpc ms", "PyTorch ms", "sbpc / PyTorch"], rows)
    middle = f"median {_common.median(ratios):.2f}x PyTorch's time" if ratios else "no peer"
    print(f"summary: sbpc's conv2d kernels (forward and gradients) {middle}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
