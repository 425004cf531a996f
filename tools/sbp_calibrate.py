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
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from sbpc.perf.cluster import ClusterError
from sbpc.perf.fit import fit_cluster
from sbpc.runtime.hosts import Hosts
from sbpc.runtime.launch import Leftovers, command, rank_environment, stop

from .host_options import add_host_options, hosts_from

PROBE_SIZES = {"small": (4, 8, 16, 2, 32), "large": (8, 64, 128, 4, 256)}
"""(batch, seq, dim, heads, vocab) of the probe steps: the small one's
kernels are all fixed cost, the large one's mostly arithmetic, so the two
separate a kernel's fixed cost from its in-step rate."""


def probe_module(size: str = "small"):
    """A transformer block's training step on one device (embedding,
    layernorm, attention, GELU MLP, cross-entropy, Adam), compiled: its
    actors are the kernels whose fixed costs and in-step rates calibration
    measures."""
    import numpy as np
    from xdsl.context import Context

    import sbpc
    from sbpc.lowering.compile import CompilePass
    from sbpc.lowering.lg_autodiff import LgAutodiffPass
    from sbpc.lowering.lg_optimizer import LgOptimizerPass

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
    module = g.module()
    LgAutodiffPass().apply(Context(), module)
    LgOptimizerPass(algorithm="adam").apply(Context(), module)
    CompilePass().apply(Context(), module)
    return module


def calibrate(ranks: int, quick: bool = False, timeout: float = 600.0, hosts: Hosts | None = None) -> dict:
    """The raw timings of runtime/calibrate.py on `ranks` ranks (placed on `hosts`)."""
    import numpy as np
    from xdsl.printer import Printer

    from sbpc.dialects import plan

    from .sbp_run import generated_feeds

    with tempfile.TemporaryDirectory(prefix="sbp-calibrate-") as tmp:
        raw_path = Path(tmp) / "raw.json"
        args = [str(raw_path), *(["--quick"] if quick else [])]
        for size in PROBE_SIZES:
            probe = probe_module(size)
            probe_path, feeds_path = Path(tmp) / f"probe-{size}.mlir", Path(tmp) / f"feeds-{size}.npz"
            with open(probe_path, "w") as f:
                Printer(stream=f).print_op(probe)
            feeds = generated_feeds(plan.programs(probe)[0], 0)
            if "lr" in feeds:  # a rate that keeps the weights finite over the timed steps
                feeds["lr"] = np.asarray(1e-3, feeds["lr"].dtype)
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
            raw = calibrate(options.ranks, options.quick, hosts=hosts)
            if options.shared_ranks:
                if hosts is not None:
                    raise ValueError("--shared-ranks measures this host: give it without --hosts")
                raw["shared_sync"] = shared_sync(options.shared_ranks, options.quick)
        if options.raw:
            Path(options.raw).write_text(json.dumps(raw, indent=1) + "\n")
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
