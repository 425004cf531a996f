"""Train a plain PyTorch GPT (nanoGPT's, in examples/torch_models.py, which
imports nothing from sbpc) with sbpc on MPI ranks, then load the weights back
into the PyTorch module and sample a line of text from it.

    python examples/torch_gpt.py [--ranks 2] [--parallel dp|tp] [--steps 200]

`--parallel dp` splits the batch over the ranks; `tp` splits the attention
and MLP weights Megatron's way (column-parallel in, row-parallel out), by
glob patterns over the module's own parameter names. Both import the module
with `sbpc.from_torch`, train it with `sbpc.optim.AdamW`, and return the
weights with `Executable.state_dict()`.
"""

import argparse
import sys
import time

import torch
from models import corpus, corpus_windows
from torch_models import GPT, GPTConfig

import sbpc
from sbpc import S

TENSOR_PARALLEL = {"*.c_attn.weight": S(0), "*.c_attn.bias": S(0), "*.attn.c_proj.weight": S(1),
                   "*.c_fc.weight": S(0), "*.c_fc.bias": S(0), "*.mlp.c_proj.weight": S(1)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--parallel", choices=("dp", "tp"), default="dp")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--lr", type=float, default=3e-3)
    args = parser.parse_args()

    text, stoi = corpus()
    itos = {i: c for c, i in stoi.items()}
    torch.manual_seed(0)
    config = GPTConfig(vocab_size=len(stoi), block_size=32, n_layer=2, n_head=4, n_embd=64)
    model = GPT(config)
    feed = corpus_windows(args.batch, config.block_size)
    example = tuple(torch.from_numpy(a) for a in next(feed))

    start = time.perf_counter()
    sbp = {"idx": S(0), "targets": S(0)} if args.parallel == "dp" else TENSOR_PARALLEL
    graph = sbpc.from_torch(model, example, sbp=sbp, placement=sbpc.placement("cpu", args.ranks))
    imported = time.perf_counter() - start
    optimizer = sbpc.optim.AdamW(lr=args.lr, betas=(0.9, 0.95), weight_decay=0.1,
                                 groups=[{"params": ["*.bias", "*ln_*", "*wpe*"], "weight_decay": 0.0}])
    exe = sbpc.compile(graph, optimizer=optimizer)
    print(f"imported {type(model).__name__} ({sum(p.numel() for p in model.parameters())} parameters) "
          f"in {imported:.1f} s, compiled for {args.ranks} ranks ({args.parallel}) in "
          f"{time.perf_counter() - start - imported:.1f} s")

    first = last = None
    start = time.perf_counter()
    for step in range(args.steps):
        idx, targets = next(feed)
        loss = float(exe.train_step({"idx": idx, "targets": targets})["loss"])
        first = loss if first is None else first
        last = loss
        if step % 50 == 0 or step == args.steps - 1:
            print(f"step {step:4d}  loss {loss:.4f}")
    print(f"{args.steps / (time.perf_counter() - start):.1f} steps/s")

    model.load_state_dict(exe.state_dict())
    model.eval()
    with torch.no_grad():
        _, check = model(*(torch.from_numpy(a) for a in (idx, targets)))
    print(f"PyTorch with sbpc's weights: loss {check.item():.4f} on the last batch (sbpc, before its update: "
          f"{last:.4f})")
    prompt = torch.tensor([[stoi[c] for c in text[:8]]])
    sample = model.generate(prompt, 40)[0].tolist()
    print("sample:", repr("".join(itos[i] for i in sample)))
    assert first is not None and last is not None
    return 0 if last < first else 1


if __name__ == "__main__":
    sys.exit(main())
