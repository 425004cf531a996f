"""A small GPT whose MLPs are mixtures of experts, trained on characters on MPI ranks.

examples/models.py's GPT with `--experts E`: each block's MLP routes every
token to its `--top-k` experts (sbpc.moe.layer), each expert taking at most
`--capacity-factor` times an even share of the routed tokens, counted over
the whole batch (tokens past it are dropped, the same ones on every plan);
the router's load-balancing loss is added to the loss. Compiled for N ranks
data parallel (the experts replicated), expert parallel (`ep`: each rank
holds E/N experts), expert x data parallel (`ep-dp`, a 2 x N/2 mesh) or
expert x tensor parallel (`ep-tp`: the experts split by expert and by their
hidden units, attention Megatron's). The first step is checked against the
single-device reference interpreter.

    python examples/moe.py [--ranks 2] [--steps 200] [--parallel ep|ep-dp|ep-tp|dp] [--experts 4]
                           [--top-k 2] [--capacity-factor 1.0]
"""

import argparse
import sys

from models import EXPERT_VARIANTS, corpus, gpt, gpt_batches, reference_losses

import sbpc


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--dim", type=int, default=32)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--seq", type=int, default=16)
    parser.add_argument("--parallel", choices=(*EXPERT_VARIANTS, "dp"), default="ep")
    parser.add_argument("--experts", type=int, default=4)
    parser.add_argument("--top-k", type=int, default=2)
    parser.add_argument("--capacity-factor", type=float, default=1.0,
                        help="slots per expert, as a multiple of an even share of the routed tokens (0: no limit)")
    args = parser.parse_args()
    vocab = len(corpus()[1])
    options = {"batch": args.batch, "seq": args.seq, "dim": args.dim, "layers": args.layers,
               "experts": args.experts, "top_k": args.top_k, "capacity_factor": args.capacity_factor or None}
    try:
        module = gpt(args.parallel, args.ranks, vocab, **options)
    except ValueError as e:
        print(f"moe: {e}", file=sys.stderr)
        return 2
    exe = sbpc.compile(module)
    reference = reference_losses(module, gpt_batches(args.batch, args.seq), 1)[0]
    data = gpt_batches(args.batch, args.seq)
    try:
        for step in range(args.steps):
            out = exe.train_step(next(data))
            loss, kept = float(out["loss"]), float(out["kept"])
            if step == 0:
                print(f"step    0  loss {loss:.4f}  kept {kept:.1%} of routed tokens  "
                      f"(single-device reference: {reference:.4f}, difference {abs(loss - reference):.1e})")
                if abs(loss - reference) > 1e-4 * max(1.0, abs(reference)):
                    print("moe: the first step differs from the single-device reference", file=sys.stderr)
                    return 1
            elif step % 50 == 0 or step == args.steps - 1:
                print(f"step {step:4d}  loss {loss:.4f}  kept {kept:.1%}")
    except sbpc.RuntimeFailure as e:  # a rank's failure names the rank, step and actor
        print(f"moe: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
