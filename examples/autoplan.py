"""Training with no parallelism written by hand: sbp-autoplan chooses it.

The MLP and the GPT of examples/models.py, built without a single SBP hint
(variant `none`), compiled with `sbpc.compile(module, plan="auto",
cluster=..., pipeline="lg-autodiff,lg-optimizer{algorithm=adam},compile")`:
every mesh shape of the ranks, every split into pipeline stages with 2, 4
or 8 micro-batches, and every memory mode (replicated, ZeRO, FSDP) is
differentiated, inferred, lowered and predicted by the step-time simulator
on the cluster, and the fastest plan that fits the memory budget is kept. The script prints the choice and
its alternatives, trains on MPI ranks, and checks every step's loss against
the single-device reference interpreter.

    python examples/autoplan.py [--ranks 4] [--steps 20] [--cluster cpu|FILE] [--memory BYTES] [--model mlp|gpt|both]

With `--cluster`, a file from `sbp-calibrate -n RANKS -o cluster.json`
plans for this machine as measured; `--memory` sets a per-device budget
(try one below what the replicated plan needs).
"""

import argparse
import sys

import numpy as np
from models import corpus, gpt, gpt_batches, mlp, mlp_batches, reference_losses
from xdsl.context import Context
from xdsl.passes import PassPipeline

import sbpc
from sbpc.lowering import PASSES


def train(name: str, module, batches, args) -> bool:
    try:
        exe = sbpc.compile(module, plan="auto", cluster=args.cluster, memory_budget=args.memory,
                           pipeline="lg-autodiff,lg-optimizer{algorithm=adam},compile")
    except Exception as e:  # noqa: BLE001 - a planning error is the user's answer: print it
        print(f"{name}: {e}", file=sys.stderr)
        return False
    print(f"== {name} on {args.ranks} ranks ==")
    lines = exe.explain().splitlines()
    print("\n".join(lines[: next(i for i, line in enumerate(lines) if line.startswith("per step"))]))
    feeds = [next(batches) for _ in range(args.steps)]
    losses = [float(exe.train_step(f)["loss"]) for f in feeds]
    # the single-device reference: the same training step in the reference interpreter
    step_module = module.clone()
    PassPipeline.parse_spec(PASSES, "lg-autodiff,lg-optimizer{algorithm=adam}").apply(Context(), step_module)
    reference = reference_losses(step_module, iter(feeds), args.steps)
    shown = ", ".join(f"{x:.4f}" for x in losses[:: max(1, len(losses) // 5)])
    print(f"loss: {shown} ... {losses[-1]:.4f}")
    worst = max(abs(a - b) / max(1.0, abs(b)) for a, b in zip(losses, reference))
    ok = worst <= 1e-4
    print(f"every step against the single-device reference: largest difference {worst:.1e}, "
          f"{'equal' if ok else 'DIFFERENT'}\n")
    return ok


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--cluster", default="cpu", help="a cluster preset or a file from sbp-calibrate")
    parser.add_argument("--memory", type=int, default=None, help="bytes per device the plan may use")
    parser.add_argument("--model", choices=("mlp", "gpt", "both"), default="both")
    args = parser.parse_args()
    ok = True
    if args.model in ("mlp", "both"):
        module = mlp("none", args.ranks, batch=64, features=32, hidden=128, classes=8, training=False)
        ok &= train("mlp", module, mlp_batches(64, 32, 8), args)
    if args.model in ("gpt", "both"):
        _, stoi = corpus()
        module = gpt("none", args.ranks, len(stoi), batch=8, seq=16, dim=32, heads=4, layers=2, training=False)
        ok &= train("gpt", module, gpt_batches(8, 16), args)
    np.set_printoptions()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
