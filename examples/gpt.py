"""A small GPT-style decoder trained on characters, data-parallel on MPI ranks.

Token and position embeddings, L blocks of causal multi-head self-attention
and a GELU MLP (pre-layernorm, residuals), a final layernorm and an output
head, cross-entropy on the next character. Written with the frontend,
differentiated by lg-autodiff, updated by Adam (lg-optimizer), compiled with
the batch split over the ranks, and trained with Executable.train_step on
examples/data/corpus.txt. The first step is checked against the
single-device reference interpreter.

    python examples/gpt.py [--ranks 2] [--steps 300] [--layers 2]
"""

import argparse
import pathlib
import sys

import numpy as np
from xdsl.context import Context

import sbpc
from sbpc import S
from sbpc.lowering.lg_autodiff import LgAutodiffPass
from sbpc.lowering.lg_optimizer import LgOptimizerPass
from sbpc.reference import evaluate, initial_value

CORPUS = pathlib.Path(__file__).resolve().parent / "data" / "corpus.txt"


def gpt(vocab, ranks, batch, seq, dim, heads, layers):
    g = sbpc.Graph("gpt", placement=sbpc.placement("cpu", ranks=ranks))
    tokens = g.input("tokens", (batch, seq), dtype="i64", sbp=S(0))
    targets = g.input("targets", (batch, seq), dtype="i64", sbp=S(0))
    std = 0.02
    wte = g.param("wte", (vocab, dim), init=sbpc.normal(0.0, std), seed=1)
    wpe = g.param("wpe", (seq, dim), init=sbpc.normal(0.0, std), seed=2)
    # causal mask: -1e9 above the diagonal, added to the attention scores
    mask = g.constant(np.triu(np.full((seq, seq), -1e9, np.float32), k=1))
    h = sbpc.embedding(wte, tokens) + wpe
    hd = dim // heads
    for i in range(layers):
        p = f"block{i}."

        def param(name, shape, init=None, seed=0):
            return g.param(p + name, shape, init=init or sbpc.normal(0.0, std), seed=seed)

        x = sbpc.layernorm(h, param("ln1.g", (dim,), sbpc.ones()), param("ln1.b", (dim,), sbpc.zeros()))

        def heads_of(t):
            return t.reshape(batch, seq, heads, hd).transpose(0, 2, 1, 3)

        q = heads_of(x @ param("wq", (dim, dim), seed=10 * i + 3))
        k = heads_of(x @ param("wk", (dim, dim), seed=10 * i + 4))
        v = heads_of(x @ param("wv", (dim, dim), seed=10 * i + 5))
        scores = sbpc.matmul(q, k, transpose_b=True) * (1.0 / np.sqrt(hd)) + mask
        att = sbpc.matmul(sbpc.softmax(scores, axis=3), v).transpose(0, 2, 1, 3).reshape(batch, seq, dim)
        h = h + att @ param("wo", (dim, dim), seed=10 * i + 6)
        x = sbpc.layernorm(h, param("ln2.g", (dim,), sbpc.ones()), param("ln2.b", (dim,), sbpc.zeros()))
        h = h + sbpc.gelu(x @ param("w1", (dim, 4 * dim), seed=10 * i + 7)) @ param("w2", (4 * dim, dim), seed=10 * i + 8)
    h = sbpc.layernorm(h, g.param("lnf.g", (dim,), init=sbpc.ones()), g.param("lnf.b", (dim,)))
    logits = h @ g.param("head", (dim, vocab), init=sbpc.normal(0.0, std), seed=9)
    g.output(loss=sbpc.cross_entropy(logits, targets))
    module = g.module()
    LgAutodiffPass().apply(Context(), module)
    LgOptimizerPass(algorithm="adam").apply(Context(), module)
    return module


def batches(text, stoi, batch, seq, seed=0):
    data = np.array([stoi[c] for c in text], np.int64)
    rng = np.random.default_rng(seed)
    while True:
        starts = rng.integers(0, len(data) - seq - 1, batch)
        tokens = np.stack([data[s : s + seq] for s in starts])
        targets = np.stack([data[s + 1 : s + seq + 1] for s in starts])
        yield {"tokens": tokens, "targets": targets, "lr": np.float32(3e-3)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--dim", type=int, default=32)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--seq", type=int, default=16)
    parser.add_argument("--batch", type=int, default=16)
    args = parser.parse_args()
    text = CORPUS.read_text()
    chars = sorted(set(text))
    stoi = {c: i for i, c in enumerate(chars)}
    module = gpt(len(chars), args.ranks, args.batch, args.seq, args.dim, args.heads, args.layers)
    exe = sbpc.compile(module)
    data = batches(text, stoi, args.batch, args.seq)
    losses = []
    for step in range(args.steps):
        feeds = next(data)
        loss = float(exe.train_step(feeds)["loss"])
        losses.append(loss)
        if step == 0:
            params = {op.key.data: initial_value(op) for op in module.ops.last.body.ops if op.name == "lg.param"}
            ref = float(evaluate(module, feeds, params)["loss"])
            same = abs(loss - ref) <= 1e-4 * abs(ref)
            print(f"step   0  loss {loss:.4f}  (single-device reference {ref:.4f}{'' if same else ' MISMATCH'})")
            if not same:
                return 1
        elif (step + 1) % max(1, args.steps // 10) == 0:
            recent = np.mean(losses[-10:])
            bar = "#" * int(30 * (step + 1) / args.steps)
            print(f"step {step + 1:4d}  loss {recent:.4f}  [{bar:<30}]")
    first, last = np.mean(losses[:10]), np.mean(losses[-10:])
    print(f"\nGPT ({args.layers} layers, dim {args.dim}, {len(chars)} characters) on {args.ranks} MPI ranks: "
          f"loss {first:.3f} -> {last:.3f} ({'learning' if last < 0.75 * first else 'NOT LEARNING'})")
    return 0 if last < 0.75 * first else 1


if __name__ == "__main__":
    sys.exit(main())
