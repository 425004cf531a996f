"""`sbp-calibrate -n N -o cluster.json`: measures this machine on N MPI ranks
(GEMM rate over a range of shapes, elementwise and reduction bandwidth,
kernel and actor overhead, the latency and bandwidth of every collective
kind over the runtime's MPI, and how much communication overlaps
computation), fits a cluster to the timings, writes the cluster file and
prints the fitted figures.

    sbp-calibrate -n 2 -o cluster.json
    sbp-sim plan.mlir --cluster cluster.json
    sbp-calibrate -n 8 --hosts node0:4,node1:4 -o cluster.json   # two levels: each host, and the network

On several hosts the collectives are measured among each host's ranks and
across all of them, and the cluster gets a level for each (hosts, then the
network), which the simulator and sbp-autoplan read.

Each kernel's cost inside a step is read off traced probe steps: a
transformer block's and a convolutional network's, each at a small and a
large size. `--add-kernels-to FILE` runs only those and adds figures for
the kernels FILE has none for (and their kinds), fitted against FILE's
own rates, leaving the rest of FILE as it is:

    sbp-calibrate -n 2 --add-kernels-to perf/cpu.json -o perf/cpu.json
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from xdsl.dialects.builtin import ModuleOp

from sbpc.perf.cluster import ClusterError, load_cluster
from sbpc.perf.fit import add_kernel_costs, fit_cluster
from sbpc.runtime.hosts import Hosts
from sbpc.runtime.launch import Leftovers, command, rank_environment, stop

from .host_options import add_host_options, hosts_from

PROBE_SIZES: dict[str, tuple[int, ...]] = {"small": (4, 8, 16, 2, 32), "large": (8, 64, 128, 4, 256)}
"""(batch, seq, dim, heads, vocab) of the transformer probe steps: the small
one's kernels are all fixed cost, the large one's mostly arithmetic, so the
two separate a kernel's fixed cost from its in-step rate."""

CNN_PROBE_SIZES: dict[str, tuple[int, ...]] = {"small": (2, 4, 8), "large": (8, 32, 32)}
"""(batch, channels, image side) of the convolutional probe steps, small
and large as the transformer's."""

CNN_CLASSES = 10


def _compiled(g, optimizer: str):
    """A probe graph's training step on one device, compiled."""
    from xdsl.context import Context

    from sbpc.lowering.compile import CompilePass
    from sbpc.lowering.lg_autodiff import LgAutodiffPass
    from sbpc.lowering.lg_optimizer import LgOptimizerPass

    module = g.module()
    LgAutodiffPass().apply(Context(), module)
    LgOptimizerPass(algorithm=optimizer).apply(Context(), module)
    CompilePass().apply(Context(), module)
    return module


def probe_module(size: str = "small"):
    """A transformer block's training step on one device (embedding,
    layernorm, attention, GELU MLP, cross-entropy, Adam), compiled: its
    actors are the kernels whose fixed costs and in-step rates calibration
    measures."""
    import numpy as np

    import sbpc

    batch, seq, dim, heads, vocab = PROBE_SIZES[size]
    hd = dim // heads
    g = sbpc.Graph("probe", placement=sbpc.placement("cpu", ranks=1))
    tokens = g.input("tokens", (batch, seq), dtype="i64")
    targets = g.input("targets", (batch, seq), dtype="i64")
    wte = g.param("wte", (vocab, dim), init=sbpc.normal(0.0, 0.02), seed=1)
    wpe = g.param("wpe", (seq, dim), init=sbpc.normal(0.0, 0.02), seed=2)
    mask = g.constant(np.triu(np.full((seq, seq), -1e9, np.float32), k=1))
    h = sbpc.embedding(wte, tokens) + wpe
    x = sbpc.layernorm(h, g.param("ln.g", (dim,), init=sbpc.ones()), g.param("ln.b", (dim,)))

    def heads_of(t):
        return t.reshape(batch, seq, heads, hd).transpose(0, 2, 1, 3)

    q, k, v = (heads_of(x @ g.param(f"w{n}", (dim, dim), init=sbpc.normal(0.0, 0.02), seed=3 + i))
               for i, n in enumerate("qkv"))
    scores = sbpc.matmul(q, k, transpose_b=True) * (1.0 / np.sqrt(hd)) + mask
    att = sbpc.matmul(sbpc.softmax(scores, axis=3), v).transpose(0, 2, 1, 3).reshape(batch, seq, dim)
    h = h + att @ g.param("wo", (dim, dim), init=sbpc.normal(0.0, 0.02), seed=6)
    up = sbpc.gelu(h @ g.param("w1", (dim, 4 * dim), init=sbpc.normal(0.0, 0.02), seed=7))
    h = h + up @ g.param("w2", (4 * dim, dim), init=sbpc.normal(0.0, 0.02), seed=8)
    logits = h @ g.param("head", (dim, vocab), init=sbpc.normal(0.0, 0.02), seed=9)
    g.output(loss=sbpc.cross_entropy(logits, targets))
    return _compiled(g, "adam")


def cnn_probe_module(size: str = "small"):
    """A residual convolutional network's training step on one device (3x3
    convolutions at strides 1 and 2, batch normalization by the batch's
    statistics, ReLU, max pooling, global average pooling, cross-entropy,
    SGD), compiled: the image kernels, which the transformer probe lacks."""
    import sbpc

    batch, channels, side = CNN_PROBE_SIZES[size]
    g = sbpc.Graph("cnn_probe", placement=sbpc.placement("cpu", ranks=1))
    images = g.input("images", (batch, 3, side, side))
    labels = g.input("labels", (batch,), dtype="i64")

    def conv_norm(x, name: str, shape: tuple[int, int], stride: int = 1):
        out, inp = shape
        w = g.param(f"{name}.w", (out, inp, 3, 3), init=sbpc.normal(0.0, (2.0 / (9 * inp)) ** 0.5), seed=len(name))
        y = sbpc.conv2d(x, w, stride, 1)
        centered = y - sbpc.reduce_mean(y, [0, 2, 3], keepdims=True)
        scale = sbpc.rsqrt(sbpc.reduce_mean(centered * centered, [0, 2, 3], keepdims=True) + 1e-5)
        return (centered * scale * g.param(f"{name}.gamma", (1, out, 1, 1), init=sbpc.ones())
                + g.param(f"{name}.beta", (1, out, 1, 1)))

    h = sbpc.max_pool2d(sbpc.relu(conv_norm(images, "stem", (channels, 3))), 3, 2, 1)
    h = sbpc.relu(conv_norm(h, "block", (channels, channels)) + h)
    h = sbpc.relu(conv_norm(h, "down", (2 * channels, channels), stride=2))
    head = g.param("head", (2 * channels, CNN_CLASSES), init=sbpc.normal(0.0, 0.1), seed=9)
    g.output(loss=sbpc.cross_entropy(sbpc.reduce_mean(h, [2, 3]) @ head, labels))
    return _compiled(g, "sgd")


PROBES: dict[str, tuple[Callable[[str], ModuleOp], dict[str, tuple[int, ...]]]] = {
    "transformer": (probe_module, PROBE_SIZES), "cnn": (cnn_probe_module, CNN_PROBE_SIZES)}
"""The training steps whose traced kernels give the per-kernel costs, each at its sizes."""


def calibrate(ranks: int, quick: bool = False, timeout: float = 600.0, hosts: Hosts | None = None,
              probes_only: bool = False) -> dict:
    """The raw timings of runtime/calibrate.py on `ranks` ranks (placed on
    `hosts`); with `probes_only`, of the probe steps' kernels alone."""
    import numpy as np
    from xdsl.printer import Printer

    from sbpc.dialects import plan

    from .sbp_run import generated_feeds

    with tempfile.TemporaryDirectory(prefix="sbp-calibrate-") as tmp:
        raw_path = Path(tmp) / "raw.json"
        args = [str(raw_path), *(["--quick"] if quick else []), *(["--probes-only"] if probes_only else [])]
        for name, (build, sizes) in PROBES.items():
            for size in sizes:
                probe = build(size)
                probe_path, feeds_path = Path(tmp) / f"{name}-{size}.mlir", Path(tmp) / f"feeds-{name}-{size}.npz"
                with open(probe_path, "w") as f:
                    Printer(stream=f).print_op(probe)
                feeds = generated_feeds(plan.programs(probe)[0], 0)
                if "lr" in feeds:  # a rate that keeps the weights finite over the timed steps
                    feeds["lr"] = np.asarray(1e-3, feeds["lr"].dtype)
                if "labels" in feeds:  # classes in range
                    feeds["labels"] = np.arange(feeds["labels"].size, dtype=feeds["labels"].dtype) % CNN_CLASSES
                np.savez(feeds_path, **feeds)  # type: ignore[arg-type]
                args += ["--probe", str(probe_path), str(feeds_path)]
        return _run_ranks(ranks, args, raw_path, timeout, hosts)


def shared_sync(ranks: int, quick: bool = False, timeout: float = 600.0) -> dict:
    """What a collective adds as a plan meets it on `ranks` ranks of this
    host: measured where they outnumber its cores, what the simulator
    charges a collective whose members share one."""
    with tempfile.TemporaryDirectory(prefix="sbp-calibrate-") as tmp:
        raw_path = Path(tmp) / "sync.json"
        return _run_ranks(ranks, [str(raw_path), "--sync-only", *(["--quick"] if quick else [])], raw_path, timeout,
                          None)


def _run_ranks(ranks: int, args: list[str], raw_path: Path, timeout: float, hosts: Hosts | None) -> dict:
    """runtime/calibrate.py with `args` on `ranks` ranks; what it wrote to `raw_path`."""
    before = Leftovers.now()
    process = subprocess.Popen(command(ranks, "sbpc.runtime.calibrate", *args, hosts=hosts),
                               env=rank_environment(hosts), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                               text=True)
    try:
        _, stderr = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:  # mpiexec ends the ranks on SIGTERM
        stop(process, before)
        process.communicate()
        raise RuntimeError(f"the calibration did not finish in {timeout:.0f} s") from None
    except BaseException:  # Ctrl-C
        stop(process, before)
        raise
    if process.returncode != 0 or not raw_path.exists():
        before.remove_new()  # a failed rank cannot remove MPICH's segments and files
        raise RuntimeError(f"the calibration ranks failed (exit code {process.returncode}): {stderr[-2000:]}")
    return json.loads(raw_path.read_text())


def main(args: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="sbp-calibrate", description=__doc__.splitlines()[0])
    parser.add_argument("-n", "--ranks", type=int, default=2, help="MPI ranks to measure on (default 2)")
    parser.add_argument("-o", "--output", default="cluster.json", help="the cluster file to write")
    parser.add_argument("--name", help="the cluster's name (default calibrated-cpu-N)")
    parser.add_argument("--quick", action="store_true", help="fewer sizes and repeats (seconds; rougher figures)")
    parser.add_argument("--raw", help="also write the raw timings here (JSON)")
    parser.add_argument("--from-raw", help="fit raw timings written earlier instead of measuring")
    parser.add_argument("--add-kernels-to", metavar="FILE",
                        help="measure only the probe steps' kernels and write FILE's cluster (to -o) with figures "
                             "for those it has none for, and their kinds, fitted against its own rates; its other "
                             "figures stay as they are")
    parser.add_argument("--shared-ranks", type=int, metavar="M",
                        help="where the N ranks have a core each, also measure what a collective adds on M ranks "
                             "of this host sharing its cores (the cluster's sync, which the simulator charges where "
                             "a collective's members share a core: the cluster resized past the cores)")
    add_host_options(parser)
    options = parser.parse_args(args)
    if options.ranks < 1:
        print("sbp-calibrate: error: -n must be at least 1", file=sys.stderr)
        return 1
    try:
        start = time.perf_counter()
        hosts = hosts_from(options)
        if options.from_raw:
            raw = json.loads(Path(options.from_raw).read_text())
        else:
            raw = calibrate(options.ranks, options.quick, hosts=hosts, probes_only=bool(options.add_kernels_to))
            if options.shared_ranks and not options.add_kernels_to:
                if hosts is not None:
                    raise ValueError("--shared-ranks measures this host: give it without --hosts")
                raw["shared_sync"] = shared_sync(options.shared_ranks, options.quick)
        if options.raw:
            Path(options.raw).write_text(json.dumps(raw, indent=1) + "\n")
        if options.add_kernels_to:
            fitted = add_kernel_costs(load_cluster(options.add_kernels_to), raw)
            if options.name:
                fitted = replace(fitted, cluster=replace(fitted.cluster, name=options.name))
        else:
            fitted = fit_cluster(raw, options.name)
        fitted.cluster.save(options.output)
    except (RuntimeError, OSError, ValueError, KeyError, TypeError, ClusterError) as e:
        print(f"sbp-calibrate: error: {e}", file=sys.stderr)
        return 1
    print(f"sbp-calibrate: {fitted.cluster.name}: {raw['ranks']} ranks, {time.perf_counter() - start:.1f} s; "
          f"wrote {options.output}")
    print(fitted.format())
    return 0


if __name__ == "__main__":
    sys.exit(main())
