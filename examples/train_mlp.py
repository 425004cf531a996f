"""Trains an MLP classifier on real MPI ranks, from Python, in any parallel variant.

The model (examples/models.py) is written with the frontend, differentiated
by lg-autodiff, given an Adam update by lg-optimizer, compiled (SBP
inference, boxing, plan, memory) for N CPU ranks, and trained with
Executable.train_step on data made from a seed: inputs from a normal
distribution, labels from a fixed random "teacher" network, so there is
something to learn. The first steps are checked against the single-device
reference interpreter.

    python examples/train_mlp.py [--ranks 2] [--steps 60] [--parallel dp|tp|2d|zero|fsdp|pipeline]
                                 [--micro-batches K] [--save ckpt.npz] [--load ckpt.npz]
"""

import argparse
import sys

from models import VARIANTS, mlp, mlp_batches

import sbpc
from sbpc.semantics.reference import evaluate, initial_value


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--parallel", choices=VARIANTS, default="dp")
    parser.add_argument("--micro-batches", type=int, default=None, help="per step (default: 4 for pipeline, else 1)")
    parser.add_argument("--save", help="write the parameters and optimizer state here at the end")
    parser.add_argument("--load", help="start from this checkpoint")
    args = parser.parse_args()

    try:
        module = mlp(args.parallel, args.ranks, micro_batches=args.micro_batches)
    except ValueError as e:
        print(f"train_mlp: {e}", file=sys.stderr)
        return 2
    exe = sbpc.compile(module)
    reference_params = {op.key.data: initial_value(op) for op in module.ops.last.body.ops if op.name == "lg.param"}
    if args.load:
        exe.load(args.load)
        reference_params = {k: exe.params[k] for k in exe.param_keys()}
    data = mlp_batches()
    losses, ok = [], True
    for step in range(args.steps):
        feeds = next(data)
        loss = float(exe.train_step(feeds)["loss"])
        losses.append(loss)
        if step < 3:  # the same step on one device, in the reference interpreter
            ref = evaluate(module, feeds, reference_params)
            reference_params.update({k[4:]: v for k, v in ref.items() if k.startswith("new.")})
            same = abs(loss - float(ref["loss"])) <= 1e-5 * max(1.0, abs(loss))
            ok &= same
            print(f"step {step:3d}  loss {loss:.5f}  (reference {float(ref['loss']):.5f}{'' if same else ' MISMATCH'})")
        elif step % 10 == 9 or step == args.steps - 1:
            bar = "#" * int(40 * (step + 1) / args.steps)
            print(f"step {step:3d}  loss {loss:.5f}  [{bar:<40}]")
    if args.save:
        exe.save(args.save)
        print(f"saved parameters and optimizer state to {args.save}")
    # From scratch the loss must fall by 30%; resumed from a checkpoint, where
    # much of that is done, it must still fall.
    learned = losses[-1] < (1.0 if args.load else 0.7) * losses[0]
    print(f"\ntrained {args.parallel} on {args.ranks} MPI ranks: loss {losses[0]:.4f} -> {losses[-1]:.4f}"
          f" ({'learning' if learned else 'NOT LEARNING'})")
    return 0 if ok and learned else 1


if __name__ == "__main__":
    sys.exit(main())
