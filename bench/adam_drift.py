"""How far 20 float32 Adam steps of sbpc end from PyTorch float64, against
PyTorch's own float32-vs-float64 spread, for every example model and
parallel variant (issue 39's measure: sbpc's drift / PyTorch's spread,
goal <= 10x). The same initial weights and batches everywhere; sbpc runs
on real MPI ranks.

    python bench/adam_drift.py                 # every variant, 2 and 4 ranks
    python bench/adam_drift.py --models mlp --variants dp tp --ranks 2
    python bench/adam_drift.py --quick         # the MLP, data parallel, 2 ranks

drift = max over steps of |loss_sbpc - loss_torch64| / |loss_torch64|;
spread = the same of PyTorch float32. Not a timed benchmark.
"""

from __future__ import annotations

import argparse
import sys

import _common  # noqa: F401 - first: one BLAS thread per process
import numpy as np

sys.path.insert(0, str(_common.EXAMPLES))
sys.path.insert(0, str(_common.ROOT / "test" / "python" / "e2e"))

import models  # noqa: E402

STEPS = 20


def torch_losses(params, loss_fn, batches, dtype, algorithm: str, lr: float) -> list[float]:
    import torch

    p = {k: torch.tensor(v, dtype=dtype, requires_grad=True) for k, v in params.items()}
    opt = (torch.optim.Adam if algorithm == "adam" else torch.optim.AdamW)(p.values(), lr=lr)
    losses = []
    for feeds in batches:
        feeds = {k: v.astype(np.float64) if dtype == torch.float64 and v.dtype == np.float32 else v
                 for k, v in feeds.items()}
        opt.zero_grad()
        loss = loss_fn(p, feeds)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["mlp", "gpt"])
    parser.add_argument("--variants", nargs="+", default=list(models.VARIANTS))
    parser.add_argument("--ranks", nargs="+", type=int, default=[2, 4])
    parser.add_argument("--algorithm", choices=("adam", "adamw"), default="adam")
    parser.add_argument("--quick", action="store_true", help="the MLP, data parallel, 2 ranks (the smoke test)")
    args = parser.parse_args()
    if args.quick:
        args.models, args.variants, args.ranks = ["mlp"], ["dp"], [2]
    if _common.missing_peers({"torch": "the PyTorch float32 and float64 references"}):
        print("summary: no PyTorch, no drift measured")
        return 0
    import torch
    from test_against_pytorch import GPT_SIZE, STOI, gpt_torch, initial_params, mlp_torch

    import sbpc

    torch.set_num_threads(1)
    lr = 3e-3
    print(f"{'model':5} {'variant':9} {'ranks':>5} {'sbpc drift':>11} {'torch spread':>12} {'ratio':>7}")
    worst = 0.0
    for model in args.models:
        for variant in args.variants:
            for ranks in args.ranks:
                if model == "mlp":
                    module = models.mlp(variant, ranks, algorithm=args.algorithm)
                    data = models.mlp_batches(lr=lr)
                    loss_fn = mlp_torch
                else:
                    module = models.gpt(variant, ranks, len(STOI), algorithm=args.algorithm, **GPT_SIZE)
                    data = models.gpt_batches(GPT_SIZE["batch"], GPT_SIZE["seq"], lr=lr)

                    def loss_fn(p, feeds):
                        return gpt_torch(p, feeds, **GPT_SIZE)

                batches = [next(data) for _ in range(STEPS)]
                params = initial_params(module)
                torch_batches = [{k: v for k, v in b.items() if k != "lr"} for b in batches]
                t32 = np.array(torch_losses(params, loss_fn, torch_batches, torch.float32, args.algorithm, lr))
                t64 = np.array(torch_losses(params, loss_fn, torch_batches, torch.float64, args.algorithm, lr))
                exe = sbpc.compile(module)
                ours = np.array([float(exe.train_step(b)["loss"]) for b in batches])
                drift = float(np.max(np.abs(ours - t64) / np.abs(t64)))
                spread = float(np.max(np.abs(t32 - t64) / np.abs(t64)))
                ratio = drift / spread
                worst = max(worst, ratio)
                print(f"{model:5} {variant:9} {ranks:>5} {drift:>11.3g} {spread:>12.3g} {ratio:>6.2f}x", flush=True)
    print(f"summary: worst drift / PyTorch spread {worst:.2f}x (goal <= 10x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
