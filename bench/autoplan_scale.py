"""sbp-autoplan at scale: GPT training graphs of published sizes, built with
no hints, planned for presets of 8 to 1024 H100s (planning by layers), and
the chosen plan compiled and simulated next to Megatron-style hand plans
(data, tensor inside a node, pipeline across nodes, 3-D) at the same global
batch, under the same step-time simulator.

    python bench/autoplan_scale.py [--models 1.3b 13b] [--devices 8 64 512]
    python bench/autoplan_scale.py --growth        # planning time against layers and devices
    python bench/autoplan_scale.py --quick         # a 2-layer model on 8 GPUs, next to data parallelism

The checks (issue 17): planning the 48-layer GPT for 64 H100s in under 30 s;
the automatic plan's simulated step time at most the best hand plan's that
fits in memory. Each row also shows the planner's composed prediction
against the simulation of the whole compiled plan.
"""

from __future__ import annotations

import argparse
import re
import sys
import time

import _common  # noqa: F401  (first: one BLAS thread per process)
import simulator_scale as scale

scale.MODELS.setdefault("48l", (48, 1600, 25))  # GPT-2 XL's shape: 48 layers, dim 1600, 25 heads
TRAIN = "lg-autodiff,lg-optimizer{algorithm=adam}"
HAND = ("dp", "tp", "pp", "3d")
MAX_MICRO = 8
"""Hand plans run micro-batches of one sequence where the replica's batch allows, up to this many."""


def _simulate(module, devices: int):
    from xdsl.context import Context

    from sbpc.lowering.compile import CompilePass
    from sbpc.perf.cluster import load_cluster
    from sbpc.perf.step_time import simulate_plan

    t0 = time.perf_counter()
    CompilePass(representatives=True, strategy="auto", device="h100").apply(Context(), module)
    compile_s = time.perf_counter() - t0
    return simulate_plan(module, load_cluster("h100", devices), steps=6), compile_s


def hand(model: str, plan: str, devices: int, batch: int):
    """A Megatron-style hand plan at `batch` sequences: (prediction, label, compile seconds) or None."""
    stages, dp, tp = scale.layout(plan, devices)
    if batch % dp:
        return None
    per = batch // dp
    micro = max(m for m in range(1, min(per, MAX_MICRO) + 1) if per % m == 0)
    if stages > 1 and micro < stages:
        return None
    module, _, _ = scale.build(model, plan, devices, per, micro)
    prediction, compile_s = _simulate(module, devices)
    return prediction, f"{stages}x{dp}x{tp}, {micro} micro", compile_s


def plan(model: str, devices: int, batch: int, compile_it: bool = True):
    """sbp-autoplan on the hint-free graph: (chosen text, planning seconds, prediction or None, compile seconds)."""
    from xdsl.context import Context

    from sbpc.dialects import lg
    from sbpc.dialects.sbp import AUTOPLAN_ATTR
    from sbpc.lowering.sbp_autoplan import SbpAutoplanPass

    module, _, _ = scale.build(model, "none", devices, batch // devices, 1, training=False)
    t0 = time.perf_counter()
    SbpAutoplanPass(cluster="h100", devices=devices, training=TRAIN, search="layers").apply(Context(), module)
    plan_s = time.perf_counter() - t0
    chosen = lg.graphs(module)[0].attributes[AUTOPLAN_ATTR].data
    if not compile_it:
        return chosen, plan_s, None, 0.0
    prediction, compile_s = _simulate(module, devices)
    return chosen, plan_s, prediction, compile_s


def _composed(chosen: str) -> float:
    return float(re.search(r"predicted ([0-9.]+) ms/step", chosen).group(1))


def compare(models, device_counts, hand_plans=HAND) -> int:
    rows = []
    ratios = []
    for model in models:
        params = scale.params_of(model)
        for devices in device_counts:
            batch = devices
            best = None
            for name in hand_plans:
                try:
                    done = hand(model, name, devices, batch)
                except Exception as e:  # noqa: BLE001 - one plan failing is a row
                    rows.append([model, devices, batch, name, "-", "-", "-", "-", f"failed: {str(e)[:60]}"])
                    continue
                if done is None:
                    continue
                p, label, compile_s = done
                tflops = 6.0 * params * batch * scale.SEQ / p.step_time / devices / 1e12
                rows.append([model, devices, batch, f"{name} ({label})", f"{p.step_time * 1e3:.1f}", "",
                             f"{tflops:.0f}", f"{p.peak_memory / 2**30:.1f}" + ("" if p.fits else " (over)"),
                             f"compile {compile_s:.0f} s"])
                if p.fits and (best is None or p.step_time < best):
                    best = p.step_time
                print(f"  {model} {name} on {devices}: {p.step_time * 1e3:.1f} ms", flush=True)
            chosen, plan_s, p, compile_s = plan(model, devices, batch)
            assert p is not None
            tflops = 6.0 * params * batch * scale.SEQ / p.step_time / devices / 1e12
            ratio = best / p.step_time if best else float("nan")
            ratios.append(ratio)
            rows.append([model, devices, batch, "auto: " + chosen.split(":")[0], f"{p.step_time * 1e3:.1f}",
                         f"{_composed(chosen):.1f}", f"{tflops:.0f}",
                         f"{p.peak_memory / 2**30:.1f}" + ("" if p.fits else " (over)"),
                         f"plan {plan_s:.1f} s, compile {compile_s:.0f} s; best hand / auto {ratio:.2f}x"])
            print(f"  {model} auto on {devices}: {chosen}; simulated {p.step_time * 1e3:.1f} ms, plan {plan_s:.1f} s",
                  flush=True)
    print()
    _common.table(["model", "GPUs", "batch", "plan", "simulated ms", "composed ms", "TFLOP/s/GPU", "GiB/GPU",
                   "notes"], rows)
    print("(batch: sequences of 2048 tokens per step; hand plans pp x dp x tp with micro-batches of one sequence "
          "where the replica's batch allows; composed: the planner's own prediction from its layer profiles)")
    print(f"summary: best fitting hand plan / auto plan: min {min(ratios, default=0):.2f}x "
          f"(goal >= 1.00: the automatic plan no slower)")
    return 0


def growth() -> int:
    rows = []
    for layers, devices in [(12, 64), (24, 64), (48, 64), (96, 64), (48, 8), (48, 512), (48, 1024)]:
        name = f"growth{layers}"
        scale.MODELS[name] = (layers, 1600, 25)
        batch = max(64, devices)
        chosen, plan_s, _, _ = plan(name, devices, batch, compile_it=False)
        rows.append([layers, devices, batch, f"{plan_s:.1f}", chosen.split(":")[0]])
        print(f"  {layers} layers on {devices}: {plan_s:.1f} s: {chosen}", flush=True)
    print()
    _common.table(["layers", "GPUs", "batch", "planning s", "chosen"], rows)
    print("(GPT dim 1600, 25 heads, sequences of 2048; goal: 48 layers on 64 H100s under 30 s)")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["1.3b", "13b"], choices=sorted(scale.MODELS))
    parser.add_argument("--devices", nargs="+", type=int, default=[8, 64, 512])
    parser.add_argument("--growth", action="store_true", help="planning time against layers and devices")
    parser.add_argument("--hand", nargs="*", default=list(HAND), choices=HAND,
                        help="the hand plans to run next to the automatic one (none: the automatic plan alone)")
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    if args.growth:
        return growth()
    if args.quick:
        return compare(["tiny"], [8], ("dp",))
    return compare(args.models, args.devices, args.hand)


if __name__ == "__main__":
    sys.exit(main())
