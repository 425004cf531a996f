"""The step-time simulator at scale: GPT training steps of published sizes,
built without executing them, with data, tensor, pipeline and 3-D hand
plans on presets of 8, 64 and 512 H100s. Prints, per plan, the predicted
step time, model TFLOP/s per GPU (6 x parameters x tokens per step, the
figure Megatron-LM reports), peak memory per GPU, the simulated devices and
the seconds compiling and simulating took.

    python bench/simulator_scale.py [--models 1.3b 13b] [--devices 8 64 512] [--plans dp tp pp 3d]
    python bench/simulator_scale.py --quick    # a 2-layer model on 8 and 16 GPUs

The check (issue 16): under 60 s per plan at 512 devices, and figures
plausible against Megatron-LM's (41-47% of the H100's 989 TFLOP/s bf16
peak, i.e. about 400-465 TFLOP/s per GPU, for GPT models of these sizes).
"""

from __future__ import annotations

import argparse
import math
import sys
import time

import _common  # noqa: F401  (first: one BLAS thread per process)

MODELS = {  # layers, dim, heads (GPT-3 paper, Table 2.1: XL and 13B)
    "1.3b": (24, 2048, 16),
    "13b": (40, 5120, 40),
    "tiny": (2, 256, 4),
}
SEQ, VOCAB = 2048, 50304
TP = 8  # tensor parallelism inside a node (NVLink), as Megatron-LM does


def layout(plan: str, devices: int):
    """(stages, data, tensor) degrees of a hand plan on `devices` GPUs
    (`none`: no hints, one placement of every device, for sbp-autoplan)."""
    if plan in ("dp", "none"):
        return 1, devices, 1
    if plan == "tp":
        return 1, devices // min(TP, devices), min(TP, devices)
    if plan == "pp":
        stages = 4 if devices >= 4 else devices
        return stages, devices // stages, 1
    if plan == "3d":
        tp = min(TP, devices)
        stages = max(1, min(4, devices // tp))
        return stages, devices // (tp * stages), tp
    raise ValueError(plan)


def build(model: str, plan: str, devices: int, batch_per_replica: int, micro: int, training: bool = True):
    """The GPT training step (forward, autodiff, Adam) in bf16 with the plan's
    hints; with `training=False` the forward graph alone (plan `none`: no
    hints at all, the graph sbp-autoplan starts from)."""
    from xdsl.context import Context

    import sbpc
    from sbpc import B, S
    from sbpc.lowering.lg_autodiff import LgAutodiffPass
    from sbpc.lowering.lg_micro_batch import LgMicroBatchPass
    from sbpc.lowering.lg_optimizer import LgOptimizerPass

    layers, dim, heads = MODELS[model]
    stages, dp, tp = layout(plan, devices)
    per_stage = devices // stages
    # A mesh axis of one device is left out, as a user writes it (on it every
    # distribution is the same, and boxing between them would cost actors).
    axes = [(n, d) for n, d in (("dp", dp), ("tp", tp)) if d > 1] or [("dp", 1)]
    mesh = tuple(d for _, d in axes)
    places = [sbpc.placement("cuda", ranks=list(range(i * per_stage, (i + 1) * per_stage)), mesh=mesh,
                             name=f"stage{i}") for i in range(stages)]

    def to(t, sbp):  # a redistribution the hand plan asks for (none without hints)
        return t if sbp is None else t.to(sbp)

    def nd(on_dp, on_tp):
        return None if plan == "none" else [on_dp if n == "dp" else on_tp for n, _ in axes]

    batch = batch_per_replica * dp
    hd = dim // heads
    data, rep = nd(S(0), B), nd(B, B)
    columns, rows = nd(B, S(1)), nd(B, S(0))
    col_vec = nd(B, S(0))
    g = sbpc.Graph("gpt", placement=places[0])
    dtype = "bf16"

    def param(name, shape, sbp):
        return g.param(name, shape, init=sbpc.normal(0.0, 0.02), dtype=dtype, sbp=sbp)

    tokens = g.input("tokens", (batch, SEQ), dtype="i64", sbp=data)
    per = math.ceil(layers / stages)
    with g.on(places[0]):
        h = to(sbpc.embedding(param("wte", (VOCAB, dim), rep), tokens) + param("wpe", (SEQ, dim), rep), data)
    for i in range(layers):
        stage = i // per
        with g.on(places[stage]):
            if i and i % per == 0:
                h = to(h, data)
            p = f"h{i}."
            x = sbpc.layernorm(h, param(p + "ln1.g", (dim,), rep), param(p + "ln1.b", (dim,), rep))

            def heads_of(t):
                return t.reshape(batch, SEQ, heads, hd).transpose(0, 2, 1, 3)

            q = heads_of(x @ param(p + "wq", (dim, dim), columns) + param(p + "bq", (dim,), col_vec))
            k = heads_of(x @ param(p + "wk", (dim, dim), columns) + param(p + "bk", (dim,), col_vec))
            v = heads_of(x @ param(p + "wv", (dim, dim), columns) + param(p + "bv", (dim,), col_vec))
            # (the causal mask's add is left out: one elementwise op per layer)
            scores = sbpc.matmul(q, k, transpose_b=True) * (1.0 / math.sqrt(hd))
            att = sbpc.matmul(sbpc.softmax(scores, axis=3), v).transpose(0, 2, 1, 3).reshape(batch, SEQ, dim)
            h = to(h + att @ param(p + "wo", (dim, dim), rows), data)
            x = sbpc.layernorm(h, param(p + "ln2.g", (dim,), rep), param(p + "ln2.b", (dim,), rep))
            up = sbpc.gelu(x @ param(p + "w1", (dim, 4 * dim), columns) + param(p + "b1", (4 * dim,), col_vec))
            h = to(h + up @ param(p + "w2", (4 * dim, dim), rows), data)
    with g.on(places[-1]):
        targets = g.input("targets", (batch, SEQ), dtype="i64", sbp=data)
        if stages > 1:
            h = to(h, data)
        h = sbpc.layernorm(h, param("lnf.g", (dim,), rep), param("lnf.b", (dim,), rep))
        logits = h @ param("head", (dim, VOCAB), columns)
        loss = sbpc.cross_entropy(to(logits, data), targets)
    g.output(loss=loss)
    module = g.module()
    if not training:
        return module, params_of(model), batch
    if micro > 1:
        LgMicroBatchPass(count=micro).apply(Context(), module)
    LgAutodiffPass().apply(Context(), module)
    LgOptimizerPass(algorithm="adam").apply(Context(), module)
    return module, params_of(model), batch


def params_of(model: str) -> int:
    layers, dim, _ = MODELS[model]
    return 12 * layers * dim * dim + 2 * VOCAB * dim


def run(model: str, plan: str, devices: int, batch_per_replica: int):
    from xdsl.context import Context

    from sbpc.lowering.compile import CompilePass
    from sbpc.perf.cluster import load_cluster
    from sbpc.perf.step_time import simulate_plan

    stages = layout(plan, devices)[0]
    micro = 2 * stages if stages > 1 else 1
    t0 = time.perf_counter()
    module, params, batch = build(model, plan, devices, batch_per_replica * micro, micro)
    # The hints fix the plan's parallelism; the auto strategy fills in what they leave open (greedy's local
    # choices cost the data-parallel plan 2.8x DDP's gradient traffic), priced on the cluster it will run on.
    CompilePass(representatives=True, strategy="auto", device="h100").apply(Context(), module)
    t1 = time.perf_counter()
    prediction = simulate_plan(module, load_cluster("h100", devices), steps=6)
    t2 = time.perf_counter()
    tokens = batch * SEQ
    tflops = 6.0 * params * tokens / prediction.step_time / devices / 1e12
    return prediction, params, batch, micro, tflops, t1 - t0, t2 - t1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["1.3b", "13b"], choices=sorted(MODELS))
    parser.add_argument("--devices", nargs="+", type=int, default=[8, 64, 512])
    parser.add_argument("--plans", nargs="+", default=["dp", "tp", "pp", "3d"])
    parser.add_argument("--batch", type=int, default=1, help="sequences per data-parallel replica per micro-batch")
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    if args.quick:
        args.models, args.devices, args.plans = ["tiny"], [8, 16], ["dp", "3d"]
    rows = []
    done: list[tuple[int, float, float]] = []  # devices, seconds simulating, TFLOP/s per GPU
    for model in args.models:
        for devices in args.devices:
            for plan in args.plans:
                stages, dp, tp = layout(plan, devices)
                try:
                    p, params, batch, micro, tflops, compile_s, sim_s = run(model, plan, devices, args.batch)
                except Exception as e:  # noqa: BLE001 - one plan failing is a row, not the end of the table
                    rows.append([model, devices, plan, f"{stages}x{dp}x{tp}", "-", "-", "-", "-", "-", "-", "-",
                                 "-", "-", "-", f"failed: {type(e).__name__}: {str(e)[:80]}"])
                    continue
                done.append((devices, sim_s, tflops))
                busiest = max(p.devices, key=lambda d: d.compute)
                gemm = busiest.kernels.get("lg.matmul", 0.0)
                rows.append([model, devices, plan, f"{stages}x{dp}x{tp}", batch, micro,
                             f"{p.step_time * 1e3:.1f}", f"{gemm * 1e3:.1f}", f"{(busiest.compute - gemm) * 1e3:.1f}",
                             f"{busiest.exposed_comm * 1e3:.1f}", f"{busiest.bubble * 1e3:.1f}",
                             f"{tflops:.0f}", f"{p.peak_memory / 2**30:.1f}" + ("" if p.fits else " (over)"),
                             f"{p.simulated}",
                             f"{compile_s:.1f}+{sim_s:.1f}"])
                print(f"  {model} {plan} on {devices}: step {p.step_time * 1e3:.1f} ms, {tflops:.0f} TFLOP/s per GPU, "
                      f"{p.peak_memory / 2**30:.1f} GiB, compile {compile_s:.1f} s + simulate {sim_s:.1f} s",
                      flush=True)
    print()
    _common.table(["model", "GPUs", "plan", "pp x dp x tp", "batch", "micro", "step ms", "GEMM ms", "other ms",
                   "exposed comm ms", "bubble ms", "TFLOP/s/GPU", "GiB/GPU", "simulated", "compile+sim s"], rows)
    print("(GEMM, other kernels, exposed communication and bubble: per step on the device with the most compute;"
          " (over): more memory than the device has)")
    largest = max((d for d, _, _ in done), default=0)
    slowest = max((s for d, s, _ in done if d == largest), default=0.0)
    rates = [t for _, _, t in done]
    print(f"summary: {len(done)} of {len(rows)} plans simulated; slowest simulation at {largest} GPUs "
          f"{slowest:.1f} s (goal < 60 s); model TFLOP/s per GPU {min(rates, default=0):.0f}-"
          f"{max(rates, default=0):.0f} (Megatron-LM on H100: about 400-465)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
