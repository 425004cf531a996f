"""Compile time of the whole pipeline, per stage, on generated training graphs and on GPT, next to JAX/XLA.

Every graph is a training step: the forward graph, lg-autodiff, then
lg-optimizer (SGD for the generated residual stacks, Adam for GPT), then the
`compile` chain stage by stage: sbp-infer greedy (timed on a copy) and
auto (the one kept), then each pass of `compile` (sbp-insert-boxing,
sbp-simplify, sbp-to-plan, plan-fuse-elementwise, plan-allocate-memory,
plan-verify), with the module verifier between stages
as `compile` runs it (not after the plan passes that plan-verify follows, nor
after plan-verify: it verifies the module itself). Sizes are ops of the lg
training graph (after autodiff and optimizer). Graphs are data parallel on R ranks.

Peer: JAX/XLA compiling the same GPT training step (jit of loss, grad and
Adam, batch sharded over R forced host devices:
XLA_FLAGS=--xla_force_host_platform_device_count=R), in a subprocess; its
size is the StableHLO op count of the lowered module; stages are trace +
lower and XLA compile. All times are CPU seconds of the compiling process
(time.process_time: every thread of it, nothing of other processes), so
other load on a shared machine does not count. Skipped, and said, where jax is not installed.

    python bench/compile_time.py [--sizes 1000 2000 4000] [--gpt-layers 2 4] [--ranks 2]
    python bench/compile_time.py --sizes 1000 10000 50000 --gpt-layers 2 8 24 48   # the full issue set (minutes)
    python bench/compile_time.py --sizes 1000 10000 50000 --gpt-layers 1 --no-jax --repeats 3   # growth, best of 3

Goal (issue 9): a 10k-op training graph to a runnable plan in under 10 s,
linear growth to 50k ops. The defaults stay under two minutes, so the
summary also gives the time at 10k and 50k ops projected from a power-law
fit (time = a * ops^b) of the generated sizes; pass the sizes to measure.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import re
import subprocess
import sys
import time

import _common  # noqa: F401  (first: one BLAS thread per process)

SCRIPT = os.path.abspath(__file__)
STAGES = ["build", "autodiff", "optimizer", "infer greedy", "infer auto", "boxing", "simplify", "fuse norms", "bucket",
          "to-plan", "fuse", "allocate", "plan-verify", "verify"]
STAGE_OF_PASS = {"sbp-infer": "infer auto", "sbp-insert-boxing": "boxing", "sbp-simplify": "simplify",
                 "sbp-fuse-norms": "fuse norms", "sbp-bucket-collectives": "bucket", "sbp-to-plan": "to-plan",
                 "plan-fuse-elementwise": "fuse", "plan-allocate-memory": "allocate",
                 "plan-verify": "plan-verify"}
"""Column of each pass of `compile`, which this times pass by pass."""


def residual_stack(blocks: int, ranks: int, batch: int = 64, width: int = 256):
    """Forward graph: blocks of matmul, bias, gelu, matmul, residual, layernorm, scale; MSE loss."""
    import sbpc
    from sbpc import S

    g = sbpc.Graph("stack", placement=sbpc.placement("cpu", ranks=ranks))
    x = g.input("x", (batch, width), sbp=S(0))
    y = g.input("y", (batch, width), sbp=S(0))
    h = x
    for i in range(blocks):
        a = sbpc.gelu(h @ g.param(f"w1_{i}", (width, 2 * width), init=sbpc.normal(0.0, 0.02))
                      + g.param(f"b1_{i}", (2 * width,)))
        h = h + a @ g.param(f"w2_{i}", (2 * width, width), init=sbpc.normal(0.0, 0.02))
        h = sbpc.layernorm(h, g.param(f"g_{i}", (width,), init=sbpc.ones()), g.param(f"beta_{i}", (width,)))
        h = h * g.param(f"s_{i}", (width,), init=sbpc.ones())
    g.output(loss=sbpc.mse_loss(h, y))
    return g.module()


def gpt_forward(layers: int, ranks: int, cfg: dict):
    """examples/gpt.py's graph before its autodiff/optimizer passes (they are timed here)."""
    return _common.gpt("dp", ranks, {**cfg, "layers": layers}, training=False)


def count_ops(module) -> int:
    from sbpc.dialects import lg

    graph = next(op for op in module.ops if isinstance(op, lg.GraphOp))
    return sum(1 for _ in graph.body.ops)


def compile_stages(build, optimizer: str) -> tuple[int, dict[str, float]]:
    from xdsl.context import Context

    from sbpc.lowering.compile import CompilePass, skips_verify
    from sbpc.lowering.lg_autodiff import LgAutodiffPass
    from sbpc.lowering.lg_optimizer import LgOptimizerPass
    from sbpc.lowering.sbp_infer import SbpInferPass

    ctx = Context()
    t = dict.fromkeys(STAGES, 0.0)
    gc.collect()
    gc.disable()  # as sbpc.compile and sbp-opt run passes (dialects.collector_paused)
    try:
        start = time.process_time()
        module = build()
        t["build"] = time.process_time() - start
        for stage, p in [("autodiff", LgAutodiffPass()), ("optimizer", LgOptimizerPass(algorithm=optimizer))]:
            start = time.process_time()
            p.apply(ctx, module)
            t[stage] = time.process_time() - start
        ops = count_ops(module)
        copy = module.clone()
        start = time.process_time()
        SbpInferPass(strategy="greedy").apply(ctx, copy)
        t["infer greedy"] = time.process_time() - start
        del copy
        stages = [(STAGE_OF_PASS[p.name], p) for p in CompilePass().passes()]
        for i, (stage, p) in enumerate(stages):
            start = time.process_time()
            p.apply(ctx, module)
            t[stage] = time.process_time() - start
            if skips_verify(p, [q for _, q in stages[i + 1:]]):
                continue  # as `compile` does: plan-verify verifies the plan itself
            start = time.process_time()
            module.verify()
            t["verify"] += time.process_time() - start
    finally:
        gc.enable()
    return ops, t


# -- the JAX/XLA peer ------------------------------------------------------------------


def role_jax(cfg: dict, ranks: int) -> None:
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    vocab, seq, dim, heads, layers, batch = (cfg[k] for k in ("vocab", "seq", "dim", "heads", "layers", "batch"))
    hd = dim // heads
    rng = np.random.default_rng(0)

    def normal(*shape):
        return jnp.asarray(rng.normal(0, 0.02, shape).astype(np.float32))

    params = {"wte": normal(vocab, dim), "wpe": normal(seq, dim), "lnf_g": jnp.ones(dim), "lnf_b": jnp.zeros(dim),
              "head": normal(dim, vocab), "blocks": []}
    for _ in range(layers):
        params["blocks"].append({"ln1_g": jnp.ones(dim), "ln1_b": jnp.zeros(dim), "wq": normal(dim, dim),
                                 "wk": normal(dim, dim), "wv": normal(dim, dim), "wo": normal(dim, dim),
                                 "ln2_g": jnp.ones(dim), "ln2_b": jnp.zeros(dim), "w1": normal(dim, 4 * dim),
                                 "w2": normal(4 * dim, dim)})
    mask = jnp.triu(jnp.full((seq, seq), -1e9, jnp.float32), k=1)

    def layernorm(x, g, b):
        mu = x.mean(-1, keepdims=True)
        var = ((x - mu) ** 2).mean(-1, keepdims=True)
        return (x - mu) / jnp.sqrt(var + 1e-5) * g + b

    def loss_fn(p, tokens, targets):
        h = p["wte"][tokens] + p["wpe"]
        for blk in p["blocks"]:  # unrolled, as sbpc's graph is
            x = layernorm(h, blk["ln1_g"], blk["ln1_b"])

            def heads_of(t):
                return t.reshape(batch, seq, heads, hd).transpose(0, 2, 1, 3)

            q, k, v = heads_of(x @ blk["wq"]), heads_of(x @ blk["wk"]), heads_of(x @ blk["wv"])
            att = jax.nn.softmax(q @ k.transpose(0, 1, 3, 2) / np.sqrt(hd) + mask, axis=-1) @ v
            h = h + att.transpose(0, 2, 1, 3).reshape(batch, seq, dim) @ blk["wo"]
            x = layernorm(h, blk["ln2_g"], blk["ln2_b"])
            h = h + jax.nn.gelu(x @ blk["w1"], approximate=True) @ blk["w2"]
        logits = layernorm(h, p["lnf_g"], p["lnf_b"]) @ p["head"]
        logp = jax.nn.log_softmax(logits, -1)
        return -jnp.take_along_axis(logp, targets[..., None], -1).mean()

    def train_step(p, m, v, t, tokens, targets, lr):
        loss, g = jax.value_and_grad(loss_fn)(p, tokens, targets)
        m = jax.tree.map(lambda m_, g_: 0.9 * m_ + 0.1 * g_, m, g)
        v = jax.tree.map(lambda v_, g_: 0.999 * v_ + 0.001 * g_ * g_, v, g)
        t = t + 1
        p = jax.tree.map(lambda p_, m_, v_: p_ - lr * (m_ / (1 - 0.9 ** t)) / (jnp.sqrt(v_ / (1 - 0.999 ** t)) + 1e-8),
                         p, m, v)
        return loss, p, m, v, t

    mesh = Mesh(np.array(jax.devices()[:ranks]), ("dp",))
    rep, split = NamedSharding(mesh, P()), NamedSharding(mesh, P("dp"))
    zeros = jax.tree.map(jnp.zeros_like, params)
    tokens = jnp.zeros((batch, seq), jnp.int32)
    step = jax.jit(train_step, in_shardings=(rep, rep, rep, rep, split, split, rep),
                   out_shardings=(rep, rep, rep, rep, rep))
    start = time.process_time()
    lowered = step.lower(params, zeros, zeros, jnp.float32(0), tokens, tokens, jnp.float32(1e-3))
    text = lowered.as_text()
    t_lower = time.process_time() - start
    start = time.process_time()
    lowered.compile()
    t_compile = time.process_time() - start
    ops = sum(1 for line in text.splitlines() if re.search(r"\b(stablehlo|chlo|sdy|func)\.[a-z_]+", line))
    print("RESULT " + json.dumps({"ops": ops, "lower": t_lower, "compile": t_compile, "jax": jax.__version__}),
          flush=True)


def jax_peer(cfg: dict, ranks: int, timeout: float) -> dict | str:
    env = dict(os.environ)
    env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") + f" --xla_force_host_platform_device_count={ranks}").strip()
    env["JAX_PLATFORMS"] = "cpu"
    try:
        done = subprocess.run([sys.executable, SCRIPT, "--role", "jax", "--cfg", json.dumps(cfg),
                               "--ranks", str(ranks)], env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return f"over {timeout:.0f} s"
    for line in done.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    return "failed: " + done.stderr.strip().splitlines()[-1] if done.stderr.strip() else "failed"


# -- driver ------------------------------------------------------------------------------


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1000, 2000, 4000],
                        help="target ops of the generated training graphs")
    parser.add_argument("--gpt-layers", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--gpt-dim", type=int, default=64)
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--jax", action=argparse.BooleanOptionalAction, default=True,
                        help="run the JAX/XLA peer where jax is installed")
    parser.add_argument("--jax-timeout", type=float, default=60.0, help="seconds per JAX compile before giving up")
    parser.add_argument("--repeats", type=int, default=1,
                        help="compile each graph this many times and keep the fastest run (a growth fit over "
                             "single runs moves by a few hundredths)")
    parser.add_argument("--quick", action="store_true", help="tiny sizes (for the smoke test)")
    parser.add_argument("--role", help=argparse.SUPPRESS)
    parser.add_argument("--cfg", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.role == "jax":
        role_jax(json.loads(args.cfg), args.ranks)
        return 0
    if args.quick:
        args.sizes, args.gpt_layers, args.gpt_dim = [200, 400], [1], 16
    have_jax = args.jax and not _common.missing_peers({"jax": "JAX/XLA compile-time peer"})
    if not args.jax:
        print("peer skipped: jax (--no-jax)")

    # ops per block of the generated training graph, from a 1- and a 2-block probe
    from xdsl.context import Context

    from sbpc.lowering.lg_autodiff import LgAutodiffPass
    from sbpc.lowering.lg_optimizer import LgOptimizerPass

    def train_ops(blocks):
        m = residual_stack(blocks, args.ranks)
        LgAutodiffPass().apply(Context(), m)
        LgOptimizerPass(algorithm="sgd").apply(Context(), m)
        return count_ops(m)

    o1, o2 = train_ops(1), train_ops(2)
    per_block, base = o2 - o1, o1 - (o2 - o1)

    rows, gen = [], []
    header = ["graph", "ops", "total s", "us/op", *STAGES]

    def fastest(build, optimizer):
        """compile_stages `args.repeats` times: the run with the least total."""
        runs = [compile_stages(build, optimizer) for _ in range(max(1, args.repeats))]
        return min(runs, key=lambda run: sum(v for k, v in run[1].items() if k != "infer greedy"))

    def add_row(name, ops, t):
        total = sum(v for k, v in t.items() if k != "infer greedy")
        rows.append((name, ops, total, total / ops * 1e6, *(t[s] for s in STAGES)))
        return total

    for size in args.sizes:
        blocks = max(1, round((size - base) / per_block))
        ops, t = fastest(lambda b=blocks: residual_stack(b, args.ranks), "sgd")
        gen.append((ops, add_row(f"stack {blocks} blocks", ops, t)))
    vocab = _common.gpt_vocab()
    jax_rows = []
    gpt_rows = []
    for layers in args.gpt_layers:
        cfg = {"vocab": vocab, "batch": 8, "seq": 32, "dim": args.gpt_dim, "heads": 4, "layers": layers}
        ops, t = fastest(lambda c=cfg: gpt_forward(c["layers"], args.ranks, c), "adam")
        total = add_row(f"gpt {layers} layers", ops, t)
        gpt_rows.append((layers, ops, total))
        if have_jax:
            _common.stop_pools()
            j = jax_peer(cfg, args.ranks, args.jax_timeout)
            jax_rows.append((layers, ops, total, j))
    print(f"CPU seconds per stage (process time: other load on a shared machine does not count), "
          f"data parallel on {args.ranks} ranks; total excludes 'infer greedy' (timed on a copy); "
          f"'verify' is the module verifier between stages")
    _common.table(header, rows)
    if jax_rows:
        print(f"\nGPT training step: sbpc vs JAX/XLA ({args.ranks} forced host devices)")
        jt = []
        for layers, ops, total, j in jax_rows:
            if isinstance(j, dict):
                jt.append((f"gpt {layers} layers", ops, total, j["ops"], j["lower"], j["compile"],
                           j["lower"] + j["compile"], _common.ratio(j["lower"] + j["compile"], total)))
            else:
                jt.append((f"gpt {layers} layers", ops, total, None, None, None, j, "n/a"))
        _common.table(["graph", "sbpc ops", "sbpc s", "stablehlo ops", "jax lower s", "xla compile s", "jax s",
                       "jax/sbpc"], jt)
    summary = []
    for (n0, t0), (n1, t1) in zip(gen, gen[1:]):
        summary.append(f"{n0}->{n1} ops: time x{t1 / t0:.1f} for ops x{n1 / n0:.1f}")
    near = min(gen, key=lambda r: abs(r[0] - 10000))
    summary.append(f"{near[0]} ops in {near[1]:.1f} s")
    if len(gen) >= 2:
        import numpy as np

        b, log_a = np.polyfit(np.log([n for n, _ in gen]), np.log([t for _, t in gen]), 1)
        summary.append(f"fit time ~ ops^{b:.2f}: projected 10k ops {np.exp(log_a) * 1e4 ** b:.0f} s (goal < 10 s), "
                       f"50k ops {np.exp(log_a) * 5e4 ** b:.0f} s")
    for layers, _ops, total, j in jax_rows:
        if isinstance(j, dict):
            summary.append(f"gpt {layers}L jax/sbpc {(j['lower'] + j['compile']) / total:.2f}x")
    if not have_jax:
        summary.append("no XLA peer (jax " + ("skipped" if not args.jax else "missing") + ")")
    print("summary: " + "; ".join(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
