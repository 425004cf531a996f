"""`sbp-sim FILE --cluster FILE-or-preset [-n DEVICES]`: predicts the step
time of a plan on a cluster, where each device spends it, peak memory per
device and the critical path, without running it.

    sbp-sim examples/mlp_train.mlir --cluster cpu
    sbp-sim gpt.mlir --cluster h100 -n 512          # one device per equivalence class
    sbp-sim plan.mlir --cluster cluster.json --compare trace.json   # against sbp-run --trace

FILE is lg or sbp IR (compiled with -p, default `compile`; for more than 64
devices the plan is lowered for one representative device per class) or
plan IR. `--compare` reads a trace written by `sbp-run --trace` of the same
plan and shows where the measured and predicted steps differ: the steps
after the first, time by kernel, and each collective kind by what it cost
the step (the part of it no kernel covers).
"""

from __future__ import annotations

import argparse
import bisect
import json
import math
import sys
from collections.abc import Sequence
from pathlib import Path

from xdsl.context import Context
from xdsl.dialects.builtin import ModuleOp
from xdsl.passes import PassPipeline
from xdsl.utils.exceptions import DiagnosticException, ParseError

from sbpc.dialects import parse_module, plan
from sbpc.lowering import PASSES
from sbpc.perf.cluster import COLLECTIVE_KINDS, ClusterError, load_cluster, presets
from sbpc.perf.step_time import EXACT_LIMIT, Prediction, SimulationError, simulate_plan


def representative_pipeline(pipeline: str) -> str:
    """`compile` stopped before the plan, then the plan lowered for one
    device per equivalence class (plan-verify needs every device)."""
    if pipeline.strip() != "compile":
        raise ValueError("a plan for more than 64 devices is lowered for representatives: use -p compile")
    return "compile{representatives=true}"


def placement_devices(module: ModuleOp) -> int:
    from sbpc.dialects.sbp import PlacementOp

    ranks = {r for op in module.ops if isinstance(op, PlacementOp) for r in op.mesh().ranks}
    return max(ranks, default=-1) + 1


def load_plan(path: str, pipeline: str) -> ModuleOp:
    text = Path(path).read_text()
    module = parse_module(text, path)
    if not plan.programs(module):
        if placement_devices(module) > EXACT_LIMIT:
            pipeline = representative_pipeline(pipeline)
        PassPipeline.parse_spec(PASSES, pipeline).apply(Context(), module)
    return module


def kernels_of(module: ModuleOp) -> dict[str, str]:
    """Actor name -> kernel (or collective kind)."""
    out = {}
    for program in plan.programs(module):
        for device in program.devices():
            for actor in device.actors():
                what = actor.kernel.data if isinstance(actor, plan.ComputeOp) else actor.kind.data
                out[actor.sym_name.data] = what
    return out


def compare(prediction: Prediction, module: ModuleOp, trace_path: str, top: int = 12) -> str:
    """Measured (a runtime trace) against predicted, per step: the step, and
    time by kernel and, exposed (`exposed`), by collective kind, largest
    differences first."""
    with open(trace_path) as f:
        data = json.load(f)
    events = [e for e in (data["traceEvents"] if isinstance(data, dict) else data) if e.get("ph") == "X"]
    if not events:
        raise ValueError(f"{trace_path}: no trace events (write one with sbp-run --trace)")
    kernel = kernels_of(module)
    measured_ranks = sorted({e["pid"] for e in events})
    # Each event's step: its actor's firings on its rank, counted in time
    # order; the steps in the trace: the most firings of any one actor.
    counts: dict[tuple[int, str], int] = {}
    fired: list[tuple[int, dict]] = []
    for e in sorted(events, key=lambda e: e["ts"]):
        key = (e["pid"], e["name"])
        fired.append((counts.get(key, 0), e))
        counts[key] = counts.get(key, 0) + 1
    steps = max(counts.values())
    # The steady state, as the prediction: a first step pays what a run pays
    # once (a kernel's first call took 1.5 ms where the next took 0.1).
    skipped = 1 if steps > 1 else 0
    events = [e for step, e in fired if step >= skipped]
    steps -= skipped
    span = max(e["ts"] + e["dur"] for e in events) - min(e["ts"] for e in events)
    measured_step = span / steps / 1e6

    def by_kind(items: Sequence[tuple[str, int, float]], ranks: int, n: int) -> dict[str, float]:
        out: dict[str, float] = {}
        for name, tid, seconds in items:
            key = kernel.get(name, name if tid == 0 else "comm")
            if tid != 0 and key in COLLECTIVE_KINDS:  # (local slices and copies cost the thread all their time)
                key = f"{key} (exposed)"
            out[key] = out.get(key, 0.0) + seconds / ranks / n
        return out

    # A collective's trace event runs from its issue to where the thread
    # next found it complete, over the kernels the thread ran meanwhile:
    # what it cost the step is the part no kernel covers, on either side.
    comm = [e for e in events if e["tid"] != 0]
    uncovered: dict[int, float] = {}
    for rank in measured_ranks:
        spans = [e for e in comm if e["pid"] == rank]
        thread = [(e["ts"], e["ts"] + e["dur"]) for e in events if e["pid"] == rank and e["tid"] == 0]
        uncovered.update(zip(map(id, spans), exposed(thread, [(e["ts"], e["ts"] + e["dur"]) for e in spans])))
    measured = by_kind([(e["name"], e["tid"], (uncovered[id(e)] if e["tid"] != 0 else e["dur"]) / 1e6)
                        for e in events], len(measured_ranks), steps)
    simulated_ranks = {d.rank for d in prediction.devices}
    first = 1 if prediction.steps > 1 else 0  # the steady state, as the prediction
    steady = [e for e in prediction.events if e.step >= first and e.what != "issue"
              and not e.name.endswith((".feed", ".write_back"))]
    on_thread = ("compute", "copy")
    for rank in simulated_ranks:
        spans = [e for e in steady if e.device == rank and e.what not in on_thread]
        thread = [(e.start, e.end) for e in steady if e.device == rank and e.what in on_thread]
        uncovered.update(zip(map(id, spans), exposed(thread, [(e.start, e.end) for e in spans])))
    predicted = by_kind([(e.name, 0, e.end - e.start) if e.what in on_thread else (e.name, 1, uncovered[id(e)])
                         for e in steady], len(simulated_ranks), prediction.steps - first)
    counted = f"{steps} steps in the trace after its first" if skipped else f"{steps} step in the trace"
    lines = [f"measured step {measured_step * 1e3:.3f} ms ({counted}, ranks {measured_ranks}), "
             f"predicted {prediction.step_time * 1e3:.3f} ms ({prediction.step_time / measured_step - 1:+.1%})",
             "per step and device, ms:  what                      measured  predicted  difference"]
    keys = sorted(set(measured) | set(predicted), key=lambda k: -abs(measured.get(k, 0) - predicted.get(k, 0)))
    for k in keys[:top]:
        m, p = measured.get(k, 0.0), predicted.get(k, 0.0)
        lines.append(f"  {k:<40}  {m * 1e3:8.3f}  {p * 1e3:9.3f}  {(p - m) * 1e3:+10.3f}")
    m_total = sum(v for k, v in measured.items() if k in kernel.values() and not _is_comm(k))
    p_total = sum(v for k, v in predicted.items() if k in kernel.values() and not _is_comm(k))
    lines.append(f"  {'kernels in total':<40}  {m_total * 1e3:8.3f}  {p_total * 1e3:9.3f}  "
                 f"{(p_total - m_total) * 1e3:+10.3f}")
    return "\n".join(lines)


def _is_comm(kind: str) -> bool:
    return kind in plan.CommOp.KINDS


def exposed(busy: Sequence[tuple[float, float]], spans: Sequence[tuple[float, float]]) -> list[float]:
    """For each span (a collective's, taken in order of start), the part of
    it that none of `busy` (a thread's kernels) covers and that no earlier
    span was given: collectives in flight together and waited for in one
    gap share it, once."""
    claimed = _union(busy)
    out = [0.0] * len(spans)
    for i in sorted(range(len(spans)), key=lambda i: spans[i]):
        lo, hi = spans[i]
        gaps, at = [], lo
        for start, end in claimed[max(0, bisect.bisect_right(claimed, (lo, math.inf)) - 1):]:
            if start >= hi:
                break
            if start > at:
                gaps.append((at, start))
            at = max(at, end)
        if at < hi:
            gaps.append((at, hi))
        out[i] = sum(b - a for a, b in gaps)
        claimed = _union(claimed + gaps)
    return out


def _union(intervals: Sequence[tuple[float, float]]) -> list[tuple[float, float]]:
    """The intervals merged: sorted, disjoint."""
    out: list[tuple[float, float]] = []
    for start, end in sorted(intervals):
        if out and start <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], end))
        else:
            out.append((start, end))
    return out


def main(args: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="sbp-sim", description=__doc__.splitlines()[0])
    parser.add_argument("file", help="lg/sbp IR (compiled first) or plan IR")
    parser.add_argument("--cluster", default="cpu", help=f"a cluster file or a preset ({', '.join(presets())})")
    parser.add_argument("-n", "--devices", type=int, help="devices of the cluster (resizes the preset or file)")
    parser.add_argument("-p", "--pipeline", default="compile", help="passes for non-plan input (default: compile)")
    parser.add_argument("--steps", type=int, default=4, help="steps to replay (the prediction is the steady state)")
    parser.add_argument("--exact", action="store_true", help="replay every device, not one per equivalence class")
    parser.add_argument("--compare", help="a trace of the same plan from sbp-run --trace")
    parser.add_argument("--trace", help="write the replay as a Chrome/Perfetto trace here")
    options = parser.parse_args(args)
    try:
        module = load_plan(options.file, options.pipeline)
        cluster = load_cluster(options.cluster, options.devices)
        prediction = simulate_plan(module, cluster, steps=options.steps, exact=True if options.exact else None)
        print(prediction.format())
        if options.trace:
            Path(options.trace).write_text(json.dumps(prediction.trace()))
        if options.compare:
            print(compare(prediction, module, options.compare))
    except (ParseError, DiagnosticException, SimulationError, ClusterError, OSError, ValueError, KeyError) as e:
        print(f"sbp-sim: error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
