"""A small GPT-style decoder trained on characters on MPI ranks, in any parallel variant.

Token and position embeddings, L blocks of causal multi-head self-attention
and a GELU MLP (pre-layernorm, residuals), a final layernorm and an output
head (tied to the token embedding with --tied), cross-entropy on the next
character (examples/models.py). Differentiated by lg-autodiff, updated by
Adam (lg-optimizer), compiled for N ranks in the chosen variant (data,
tensor, 2-D, ZeRO, FSDP or pipeline parallel), and trained with
Executable.train_step on examples/data/corpus.txt. The first step is
checked against the single-device reference interpreter.

    python examples/gpt.py [--ranks 2] [--steps 300] [--layers 2] [--parallel dp|tp|2d|zero|fsdp|pipeline]
                           [--tied] [--micro-batches K] [--dropout 0.1 --seed 0] [--save ckpt.npz] [--load ckpt.npz]
                           [--device cpu|cuda]

With --device cuda each rank runs its plan on GPU rank mod device count
(generated CUDA kernels, NVRTC); the first step is still checked against
the reference interpreter on the CPU.
"""

import argparse
import sys

import numpy as np
from models import VARIANTS, corpus, gpt, gpt_batches

import sbpc
from sbpc.semantics.reference import evaluate, initial_value


def main() -> int:
    try:
        return train()
    except sbpc.RuntimeFailure as e:  # a rank's failure names the rank, step and actor: the user's answer
        print(f"gpt: {e}", file=sys.stderr)
        return 1


def train() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--dim", type=int, default=32)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--seq", type=int, default=16)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--parallel", choices=VARIANTS, default="dp")
    parser.add_argument("--tied", action="store_true", help="tie the output head to the token embedding")
    parser.add_argument("--micro-batches", type=int, default=None, help="per step (default: 4 for pipeline, else 1)")
    parser.add_argument("--dropout", type=float, default=0.0, help="GPT-2's dropout sites (the same masks on any plan)")
    parser.add_argument("--seed", type=int, default=0, help="of the dropout masks")
    parser.add_argument("--save", help="write the parameters and optimizer state here at the end")
    parser.add_argument("--load", help="start from this checkpoint")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="where each rank computes")
    args = parser.parse_args()
    text, stoi = corpus()
    try:
        module = gpt(args.parallel, args.ranks, len(stoi), batch=args.batch, seq=args.seq, dim=args.dim,
                     heads=args.heads, layers=args.layers, tied=args.tied, micro_batches=args.micro_batches,
                     dropout=args.dropout, device=args.device)
    except ValueError as e:
        print(f"gpt: {e}", file=sys.stderr)
        return 2
    exe = sbpc.compile(module, seed=args.seed)
    if args.load:
        exe.load(args.load)
    data = gpt_batches(args.batch, args.seq)
    losses = []
    for step in range(args.steps):
        feeds = next(data)
        if step == 0:
            params = ({k: exe.params[k] for k in exe.param_keys()} if args.load else
                      {op.key.data: initial_value(op) for op in module.ops.last.body.ops if op.name == "lg.param"})
            if "rng.seed" in params and not args.load:
                params["rng.seed"] = np.asarray(args.seed, np.int64)
            ref = float(evaluate(module, feeds, params)["loss"])
        loss = float(exe.train_step(feeds)["loss"])
        losses.append(loss)
        if step == 0:
            same = abs(loss - ref) <= 1e-4 * abs(ref)
            print(f"step    0  loss {loss:.4f}  (single-device reference {ref:.4f}{'' if same else ' MISMATCH'})")
            if not same:
                return 1
        elif (step + 1) % max(1, args.steps // 10) == 0:
            recent = np.mean(losses[-10:])
            bar = "#" * int(30 * (step + 1) / args.steps)
            print(f"step {step + 1:4d}  loss {recent:.4f}  [{bar:<30}]")
    if args.save:
        exe.save(args.save)
        print(f"saved parameters and optimizer state to {args.save}")
    first, last = np.mean(losses[:10]), np.mean(losses[-10:])
    learning = last < 0.75 * first
    print(f"\nGPT ({args.layers} layers, dim {args.dim}, {len(stoi)} characters, {args.parallel}) on {args.ranks} "
          f"MPI ranks: loss {first:.3f} -> {last:.3f} ({'learning' if learning else 'NOT LEARNING'})")
    return 0 if learning or args.load or args.steps < 50 else 1


if __name__ == "__main__":
    sys.exit(main())
