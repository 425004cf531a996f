"""Training throughput: sbpc data-parallel vs PyTorch DDP (gloo), same machine, same run.

Two models: the MLP 1024 -> H -> H -> 1024 (bias, ReLU, MSE, SGD) and the
GPT of examples/gpt.py (Adam), same global batch on both systems. Rows:
- sbpc on R ranks (batch S<0>) and on 1 rank, in steps/s measured inside the
  ranks (the compiled plan run by mpiexec'd ranks timing Executor.run(N)
  themselves, as the DDP peer does), and on R ranks through the user API
  (one Executable.train_step from Python: feeds sent to the ranks, the
  loss gathered back; updated parameters stay on the ranks);
- PyTorch: DistributedDataParallel over gloo on R processes, and one plain
  process (the peer; torch.set_num_threads(1) everywhere), each eager and
  (unless --no-torch-compile) as torch.compile (inductor) with the fused
  optimizer, the strongest peer a CPU user would run; sbpc is compared with
  the faster of the two;
- the compute limit: every matmul of the same step with the local shapes of
  the sbpc plan (rank 0's actors; a stack of row blocks times one matrix as
  one GEMM), run back to back by bare numpy on R
  concurrent processes (1 BLAS thread each), nothing else.
Every process has one BLAS thread; best of --repeats for every row (the
in-rank and API rows taking turns, a repeat of each per round).

    python bench/train_throughput.py [--hidden 4096] [--batch 256] [--ranks 2] [--steps 2] [--repeats 3]
        [--single mlp gpt]
    python bench/train_throughput.py --models gpt --single --gpt-plans dp tp pipeline 2d   # + GPT plans on 4
    python bench/train_throughput.py --quick      # tiny sizes, seconds

Goal (issue 9): sbpc >= 1.5x DDP and >= 75% of the compute limit at H=4096,
batch 256, 2 ranks.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

import _common  # first: one BLAS thread per process
import numpy as np

SCRIPT = os.path.abspath(__file__)
D_IO = 1024  # MLP input and output width


# -- the models, in sbpc ----------------------------------------------------------


def sbpc_mlp(ranks: int, batch: int, hidden: int, d_io: int = D_IO, algorithm: str = "sgd", zero: bool = False):
    from xdsl.context import Context

    import sbpc
    from sbpc import S
    from sbpc.lowering.lg_autodiff import LgAutodiffPass
    from sbpc.lowering.lg_optimizer import LgOptimizerPass

    g = sbpc.Graph("mlp", placement=sbpc.placement("cpu", ranks=ranks))
    x = g.input("x", (batch, d_io), sbp=S(0))
    y = g.input("y", (batch, d_io), sbp=S(0))
    h = x
    for i, (a, b) in enumerate([(d_io, hidden), (hidden, hidden), (hidden, d_io)]):
        w = g.param(f"w{i}", (a, b), init=sbpc.normal(0.0, a ** -0.5), seed=i + 1)
        h = h @ w + g.param(f"b{i}", (b,))
        if i < 2:
            h = sbpc.relu(h)
    g.output(loss=sbpc.mse_loss(h, y))
    module = g.module()
    LgAutodiffPass().apply(Context(), module)
    LgOptimizerPass(algorithm=algorithm, zero=zero).apply(Context(), module)
    return module


def mlp_feeds(batch: int, rng) -> dict:
    return {"x": rng.standard_normal((batch, D_IO), dtype=np.float32),
            "y": rng.standard_normal((batch, D_IO), dtype=np.float32), "lr": np.float32(1e-3)}


def gpt_feeds(cfg: dict, rng) -> dict:
    shape = (cfg["batch"], cfg["seq"])
    return {"tokens": rng.integers(0, cfg["vocab"], shape), "targets": rng.integers(0, cfg["vocab"], shape),
            "lr": np.float32(1e-3)}


def sbpc_module(model: str, ranks: int, cfg: dict):
    if model == "mlp":
        return sbpc_mlp(ranks, cfg["batch"], cfg["hidden"])
    return _common.gpt("dp", ranks, cfg)


def plan_gemms(program, rank: int = 0) -> list[dict]:
    """Every matmul actor of one rank: local operand shapes and transposes."""
    from sbpc.dialects import plan

    device = next(d for d in program.devices() if d.rank.value.data == rank)
    regs = {r.sym_name.data: r for r in device.registers()}
    out = []
    for actor in device.actors():
        if isinstance(actor, plan.ComputeOp) and actor.kernel.data == "lg.matmul":
            a, b = (tuple(regs[r.string_value()].type.get_shape()) for r in actor.ins.data)
            o = tuple(regs[actor.outs.data[0].string_value()].type.get_shape())
            props = actor.props.data
            out.append({"a": a, "b": b, "out": o, "ta": "transpose_lhs" in props, "tb": "transpose_rhs" in props})
    return out


def measure_sbpc(model: str, ranks: int, cfg: dict, steps: int, repeats: int, api: bool,
                 pipeline: str = "compile") -> dict:
    """Compiles here; the ranks (mpiexec, this script with --role sbpc) parse
    the plan and time Executor.run(steps) themselves, like the DDP peer. With
    `api`, also the user path: Executable.train_step from this process."""
    import numpy as np
    from xdsl.printer import Printer

    import sbpc

    t0 = time.perf_counter()
    module = sbpc_module(model, ranks, cfg)
    exe = sbpc.compile(module, pipeline=pipeline)
    compile_s = time.perf_counter() - t0
    feeds = (mlp_feeds(cfg["batch"], np.random.default_rng(0)) if model == "mlp"
             else gpt_feeds(cfg, np.random.default_rng(0)))

    def api_steps() -> None:
        for _ in range(steps):
            exe.train_step(feeds)

    with tempfile.TemporaryDirectory(prefix="sbpc-bench-") as tmp:
        plan_path, feeds_path = os.path.join(tmp, "plan.mlir"), os.path.join(tmp, "feeds.npz")
        with open(plan_path, "w") as f:
            Printer(stream=f).print_op(exe.module)
        np.savez(feeds_path, **feeds)

        def in_rank(times: int) -> dict:
            return launch("sbpc", ranks, ["--plan", plan_path, "--feeds", feeds_path, "--steps", str(steps),
                                          "--repeats", str(times)])

        if not api:
            result = in_rank(repeats)
            result["api_step_s"] = None
        else:
            # The two paths take turns, a repeat of each per round: timed one
            # after the other, a drift of the machine's speed between them
            # read as the API's cost (0.64-0.89x in-rank in 6 of 30 GPT runs
            # on a 2-core AMD EPYC, Zen 4, 2026-12-02). The pool's ranks nap
            # while the launched ones run, up to 20 ms a nap once idle for a
            # while (runtime/pool.py), so an untimed step wakes them first, as
            # a training loop's steps find them awake.
            exe.train_step(feeds)  # starts the rank pool, loads the plan

            def api_repeat() -> float:
                exe.train_step(feeds)
                return _common.timed(api_steps) / steps

            rounds = [(in_rank(1), api_repeat()) for _ in range(repeats)]
            _common.stop_pools()
            result = min((r for r, _ in rounds), key=lambda r: r["step_s"])
            result["api_step_s"] = min(api for _, api in rounds)  # per step, best of the repeats, as in the ranks
    result.update(compile_s=compile_s, gemms=plan_gemms(exe.program))
    return result


def role_sbpc(plan_path: str, feeds_path: str, steps: int, repeats: int) -> None:
    _common.time_plan_in_ranks(plan_path, feeds_path, steps, repeats)


# -- peers, each run on R processes by mpiexec (this script with --role) -------------


def launch(role: str, ranks: int, args: list[str]) -> dict:
    return _common.run_on_ranks(SCRIPT, ranks, "--role", role, *args, timeout=600)


def gemm_work(gemms: list[dict], seed: int) -> list:
    from sbpc.runtime.numpy_kernels import gemm_operands

    rng = np.random.default_rng(seed)
    work = []
    for g in gemms:
        a = rng.standard_normal(g["a"], dtype=np.float32)
        b = rng.standard_normal(g["b"], dtype=np.float32)
        a = np.swapaxes(a, -1, -2) if g["ta"] else a
        b = np.swapaxes(b, -1, -2) if g["tb"] else b
        # one GEMM where it is one, as the executor runs it (and torch's linear)
        work.append(gemm_operands(a, b, np.empty(g["out"], np.float32)))
    return work


def gemm_step(work) -> None:
    for a, b, out in work:
        np.matmul(a, b, out=out)


def role_gemm(path: str, steps: int, repeats: int) -> None:
    from mpi4py import MPI

    world = MPI.COMM_WORLD
    with open(path) as f:
        work = gemm_work(json.load(f), world.rank)

    def once() -> float:
        world.Barrier()
        start = time.perf_counter()
        for _ in range(steps):
            gemm_step(work)
        return world.allreduce((time.perf_counter() - start) / steps, op=MPI.MAX)

    once()
    best = min(once() for _ in range(repeats))
    if world.rank == 0:
        print("RESULT " + json.dumps({"step_s": best}), flush=True)


class TorchGPT:
    """examples/gpt.py's model in PyTorch (pre-layernorm blocks, causal attention, tanh GELU)."""

    @staticmethod
    def build(cfg: dict):
        import torch
        from torch import nn

        vocab, seq, dim, heads, layers = cfg["vocab"], cfg["seq"], cfg["dim"], cfg["heads"], cfg["layers"]

        class Block(nn.Module):
            def __init__(self):
                super().__init__()
                self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
                self.q, self.k, self.v, self.o = (nn.Linear(dim, dim, bias=False) for _ in range(4))
                self.w1, self.w2 = nn.Linear(dim, 4 * dim, bias=False), nn.Linear(4 * dim, dim, bias=False)

            def forward(self, h, mask):
                b, t, d = h.shape
                x = self.ln1(h)

                def heads_of(z):
                    return z.reshape(b, t, heads, d // heads).transpose(1, 2)

                q, k, v = heads_of(self.q(x)), heads_of(self.k(x)), heads_of(self.v(x))
                att = torch.softmax(q @ k.transpose(-1, -2) * (1.0 / (d // heads) ** 0.5) + mask, dim=-1) @ v
                h = h + self.o(att.transpose(1, 2).reshape(b, t, d))
                return h + self.w2(nn.functional.gelu(self.w1(self.ln2(h)), approximate="tanh"))

        class GPT(nn.Module):
            def __init__(self):
                super().__init__()
                self.wte, self.wpe = nn.Embedding(vocab, dim), nn.Parameter(torch.zeros(seq, dim))
                self.blocks = nn.ModuleList(Block() for _ in range(layers))
                self.lnf, self.head = nn.LayerNorm(dim), nn.Linear(dim, vocab, bias=False)
                self.register_buffer("mask", torch.triu(torch.full((seq, seq), -1e9), diagonal=1))

            def forward(self, tokens):
                h = self.wte(tokens) + self.wpe
                for block in self.blocks:
                    h = block(h, self.mask)
                return self.head(self.lnf(h))

        return GPT()


def role_torch(model: str, cfg: dict, steps: int, repeats: int, compiled: bool = False) -> None:
    """PyTorch on this rank: eager DDP (gloo), or with `compiled` the
    strongest peer a CPU user would run, torch.compile (inductor) of the
    DDP model with the fused (single-kernel) optimizer."""
    import torch
    import torch.distributed as dist
    from torch import nn

    torch.set_num_threads(1)
    torch.set_num_interop_threads(1)
    rank, size = _common.torch_peer_group()
    torch.manual_seed(0)
    local = cfg["batch"] // size
    if model == "mlp":
        h = cfg["hidden"]
        net = nn.Sequential(nn.Linear(D_IO, h), nn.ReLU(), nn.Linear(h, h), nn.ReLU(), nn.Linear(h, D_IO))
        x, y = torch.randn(local, D_IO), torch.randn(local, D_IO)
        loss_fn = nn.MSELoss()
    else:
        net = TorchGPT.build(cfg)
        x = torch.randint(0, cfg["vocab"], (local, cfg["seq"]))
        y = torch.randint(0, cfg["vocab"], (local, cfg["seq"]))

        def loss_fn(logits, targets):
            return nn.functional.cross_entropy(logits.reshape(-1, cfg["vocab"]), targets.reshape(-1))

    if size > 1:
        net = nn.parallel.DistributedDataParallel(net)
    fused = {"fused": True} if compiled else {}
    opt = (torch.optim.SGD(net.parameters(), lr=1e-3, **fused) if model == "mlp"
           else torch.optim.Adam(net.parameters(), lr=1e-3, **fused))
    if compiled:
        net = torch.compile(net)

    def step():
        opt.zero_grad(set_to_none=True)
        loss_fn(net(x), y).backward()
        opt.step()

    def once() -> float:
        if size > 1:
            dist.barrier()
        start = time.perf_counter()
        for _ in range(steps):
            step()
        elapsed = torch.tensor([(time.perf_counter() - start) / steps])
        if size > 1:
            dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
        return float(elapsed[0])

    step()
    step()
    best = min(once() for _ in range(repeats))
    if rank == 0:
        print("RESULT " + json.dumps({"step_s": best}), flush=True)
    _common.leave_torch_peer()


# -- driver ------------------------------------------------------------------------


def configs(args) -> dict:
    return {
        "mlp": {"batch": args.batch, "hidden": args.hidden},
        "gpt": {"batch": args.gpt_batch, "seq": args.gpt_seq, "dim": args.gpt_dim, "heads": args.gpt_heads,
                "layers": args.gpt_layers, "vocab": _common.gpt_vocab()},
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["mlp", "gpt"], choices=["mlp", "gpt"])
    parser.add_argument("--hidden", type=int, default=4096)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--gpt-layers", type=int, default=2)
    parser.add_argument("--gpt-dim", type=int, default=128)
    parser.add_argument("--gpt-heads", type=int, default=4)
    parser.add_argument("--gpt-seq", type=int, default=64)
    parser.add_argument("--gpt-batch", type=int, default=32)
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--gpt-plans", nargs="*", default=[], choices=["dp", "tp", "2d", "zero", "fsdp", "pipeline"],
                        help="also time these hand plans of the GPT on --plans-ranks (the first is the reference), "
                             "e.g. --gpt-plans dp tp pipeline 2d")
    parser.add_argument("--plans-ranks", type=int, default=4)
    parser.add_argument("--steps", type=int, default=2, help="steps per timed repeat")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--single", nargs="*", default=["mlp"], choices=["mlp", "gpt"],
                        help="models that also get the 1-rank rows (sbpc on 1 rank, one PyTorch process)")
    parser.add_argument("--api", action=argparse.BooleanOptionalAction, default=True,
                        help="also time Executable.train_step from Python")
    parser.add_argument("--quick", action="store_true", help="tiny MLP only, R ranks only (for the smoke test)")
    parser.add_argument("--pipeline", default="compile",
                        help="sbpc's pass pipeline, e.g. 'compile{bucket=false}' or 'compile{bucket_bytes=1000000}'")
    parser.add_argument("--role", help=argparse.SUPPRESS)
    parser.add_argument("--model", help=argparse.SUPPRESS)
    parser.add_argument("--cfg", help=argparse.SUPPRESS)
    parser.add_argument("--compiled", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--torch-compile", action=argparse.BooleanOptionalAction, default=True,
                        help="also time torch.compile (inductor) with the fused optimizer, and compare sbpc with "
                             "the faster PyTorch peer")
    parser.add_argument("--gemms", help=argparse.SUPPRESS)
    parser.add_argument("--plan", help=argparse.SUPPRESS)
    parser.add_argument("--feeds", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.quick:
        args.hidden, args.batch, args.steps, args.repeats = 64, 16, 2, 1
        args.models, args.single, args.api = ["mlp"], [], False

    if args.role == "sbpc":
        _common.as_rank_role(lambda: role_sbpc(args.plan, args.feeds, args.steps, args.repeats))
        return 0
    if args.role == "gemm":
        _common.as_rank_role(lambda: role_gemm(args.gemms, args.steps, args.repeats))
        return 0
    if args.role == "torch":
        _common.as_rank_role(lambda: role_torch(args.model, json.loads(args.cfg), args.steps, args.repeats,
                                                args.compiled))
        return 0

    have_torch = not _common.missing_peers({"torch": "PyTorch DDP and single-process rows"})
    cfgs = configs(args)
    rows, summary = [], []
    per_model = {}
    for model in args.models:
        cfg = cfgs[model]
        r = {}
        counts = (args.ranks, 1) if model in args.single and args.ranks > 1 else (args.ranks,)
        for ranks in counts:
            r[f"sbpc{ranks}"] = measure_sbpc(model, ranks, cfg, args.steps, args.repeats,
                                             api=args.api and ranks == args.ranks, pipeline=args.pipeline)
            if args.quick:  # one process here, no launch: the smoke test only checks that it runs
                work = gemm_work(r[f"sbpc{ranks}"]["gemms"], 0)
                r[f"limit{ranks}"] = {"step_s": _common.timed(lambda work=work: gemm_step(work))}
            else:
                with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
                    json.dump(r[f"sbpc{ranks}"]["gemms"], f)
                try:
                    r[f"limit{ranks}"] = launch("gemm", ranks, ["--gemms", f.name, "--steps", str(args.steps),
                                                                "--repeats", str(args.repeats)])
                finally:
                    os.unlink(f.name)
            if have_torch:
                peer_args = ["--model", model, "--cfg", json.dumps(cfg), "--steps", str(args.steps),
                             "--repeats", str(args.repeats)]
                eager = launch("torch", ranks, peer_args)
                eager["peer"] = "DDP gloo" if ranks > 1 else "torch 1 proc"
                r[f"eager{ranks}"] = eager
                r[f"torch{ranks}"] = eager
                if args.torch_compile and not args.quick:
                    compiled = launch("torch", ranks, [*peer_args, "--compiled"])
                    compiled["peer"] = ("DDP " if ranks > 1 else "") + "torch.compile + fused"
                    r[f"compiled{ranks}"] = compiled
                    if compiled["step_s"] < eager["step_s"]:  # the faster peer is the one to beat
                        r[f"torch{ranks}"] = compiled
        per_model[model] = r
        for ranks in counts:
            s, lim = r[f"sbpc{ranks}"], r[f"limit{ranks}"]
            t = r.get(f"torch{ranks}")
            peer = t["peer"] if t else "n/a"
            if f"compiled{ranks}" in r:
                other = r[f"eager{ranks}"] if t is r[f"compiled{ranks}"] else r[f"compiled{ranks}"]
                peer += f" (the other peer, {other['peer']}: {1 / other['step_s']:.2f} steps/s)"
            rows.append((f"{model} {ranks} rank{'s' if ranks > 1 else ''}", 1 / s["step_s"],
                         1 / s["api_step_s"] if s["api_step_s"] else None,
                         1 / t["step_s"] if t else None, 1 / lim["step_s"],
                         _common.ratio(t["step_s"] if t else None, s["step_s"]),
                         f"{lim['step_s'] / s['step_s']:.0%}",
                         f"{lim['step_s'] / t['step_s']:.0%}" if t else "n/a", peer))
    desc = []
    if "mlp" in cfgs and "mlp" in args.models:
        desc.append(f"mlp 1024-{args.hidden}-{args.hidden}-1024 batch {args.batch} SGD")
    if "gpt" in args.models:
        c = cfgs["gpt"]
        desc.append(f"gpt {c['layers']} layers dim {c['dim']} seq {c['seq']} batch {c['batch']} Adam")
    print("; ".join(desc) + f"; {args.ranks} ranks x 1 thread; steps/s, best of {args.repeats}")
    print(_common.blas_kernels())
    _common.table(["model / ranks", "sbpc", "sbpc API", "torch", "numpy limit", "sbpc/torch", "sbpc %limit",
                   "torch %limit", "torch peer"], rows)
    for model, r in per_model.items():
        s = r[f"sbpc{args.ranks}"]
        if s["api_step_s"]:
            print(f"{model}: compile {s['compile_s']:.2f} s; Executable.train_step() from Python "
                  f"{s['api_step_s'] * 1e3:.1f} ms vs {s['step_s'] * 1e3:.1f} ms per step inside the ranks "
                  f"(feeds sent from the driver, the loss gathered back): API / in-rank speed "
                  f"{s['step_s'] / s['api_step_s']:.2f}x")
        t = r.get(f"torch{args.ranks}")
        summary.append(f"{model} {args.ranks} ranks sbpc/{t['peer'] if t else 'torch'} "
                       f"{_common.ratio(t['step_s'], s['step_s']) if t else 'n/a'}"
                       f" (goal 1.50x), sbpc {r[f'limit{args.ranks}']['step_s'] / s['step_s']:.0%} of numpy limit"
                       f" (goal 75%)")
    if args.gpt_plans:
        summary.append(gpt_plans(args, cfgs["gpt"]))
    if not have_torch:
        summary.append("torch missing: no DDP peer")
    print("summary: " + "; ".join(summary))
    return 0


def gpt_plans(args, cfg: dict) -> str:
    """The GPT's hand plans of examples/models.py (tensor, pipeline, 2-D, ...)
    on --plans-ranks next to data parallelism there, so a regression in any
    mode shows; timed inside the ranks like the sbpc column."""
    import sbpc

    ranks = args.plans_ranks
    rows, rates = [], {}
    for variant in args.gpt_plans:
        exe = sbpc.compile(_common.gpt(variant, ranks, cfg), pipeline=args.pipeline)
        rates[variant] = 1 / _common.measure_plan(exe.module, ranks, args.steps, args.repeats)
    for variant, rate in rates.items():
        rows.append((variant, rate, f"{rate / rates[args.gpt_plans[0]]:.2f}x"))
    print(f"\ngpt hand plans on {ranks} ranks (examples/models.py; pipeline: 4 micro-batches); steps/s, "
          f"best of {args.repeats}")
    _common.table(["plan", "steps/s", f"vs {args.gpt_plans[0]}"], rows)
    return f"gpt on {ranks} ranks " + ", ".join(f"{v} {r:.1f}" for v, r in rates.items()) + " steps/s"


if __name__ == "__main__":
    sys.exit(main())
