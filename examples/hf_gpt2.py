"""Train a Hugging Face GPT-2 (`transformers.GPT2LMHeadModel`, a small
configuration of the real architecture) with sbpc on MPI ranks, with the
model's own loss from `labels`, then load the weights back into the model and
let Hugging Face's `generate` write a line.

    pip install -e ".[models]"
    python examples/hf_gpt2.py [--ranks 2] [--parallel dp|tp] [--steps 200]

The model is imported as it is, with keyword inputs (`input_ids`, `labels`);
its `ModelOutput` keys (`loss`, `logits`) are the outputs. `--parallel tp`
splits GPT-2's `Conv1D` weights (stored `(in, out)`) Megatron's way.
"""

import argparse
import sys
import time

import torch
import transformers
from models import corpus, corpus_windows

import sbpc
from sbpc import S

TENSOR_PARALLEL = {"*.c_attn.weight": S(1), "*.c_attn.bias": S(0), "*.attn.c_proj.weight": S(0),
                   "*.c_fc.weight": S(1), "*.c_fc.bias": S(0), "*.mlp.c_proj.weight": S(0)}


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
    # GPT-2's own defaults but for the sizes: its dropout (0.1 on the embeddings, the
    # residual stream and the attention probabilities) trains as configured
    config = transformers.GPT2Config(vocab_size=len(stoi), n_positions=32, n_embd=64, n_layer=2, n_head=4,
                                     bos_token_id=0, eos_token_id=0)
    model = transformers.GPT2LMHeadModel(config)
    feed = (tokens for tokens, _ in corpus_windows(args.batch, config.n_positions))  # GPT-2 shifts its labels
    example = torch.from_numpy(next(feed))

    start = time.perf_counter()
    sbp = {"input_ids": S(0), "labels": S(0)} if args.parallel == "dp" else TENSOR_PARALLEL
    graph = sbpc.from_torch(model, (), {"input_ids": example, "labels": example}, sbp=sbp,
                            placement=sbpc.placement("cpu", args.ranks))
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
        tokens = next(feed)
        loss = float(exe.train_step({"input_ids": tokens, "labels": tokens}, outputs=["loss"])["loss"])
        first = loss if first is None else first
        last = loss
        if step % 50 == 0 or step == args.steps - 1:
            print(f"step {step:4d}  loss {loss:.4f}")
    print(f"{args.steps / (time.perf_counter() - start):.1f} steps/s")

    model.load_state_dict(exe.state_dict())
    model.eval()
    with torch.no_grad():
        check = model(input_ids=torch.from_numpy(tokens), labels=torch.from_numpy(tokens)).loss
        prompt = torch.tensor([[stoi[c] for c in text[:8]]])
        sample = model.generate(prompt, attention_mask=torch.ones_like(prompt), pad_token_id=0, max_new_tokens=24,
                                do_sample=False)[0].tolist()
    print(f"PyTorch with sbpc's weights: loss {check.item():.4f} on the last batch, no dropout (sbpc, training "
          f"with dropout, before its update: {last:.4f})")
    print("sample:", repr("".join(itos[i] for i in sample)))
    assert first is not None and last is not None
    return 0 if last < first else 1


if __name__ == "__main__":
    sys.exit(main())
