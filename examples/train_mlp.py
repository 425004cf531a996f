"""Trains an MLP classifier data-parallel on real MPI ranks, from Python.

The model is written with the frontend, differentiated by lg-autodiff,
given an Adam update by lg-optimizer, compiled (SBP inference, boxing, plan,
memory) for N CPU ranks, and trained with Executable.train_step on data made
from a seed: inputs from a normal distribution, labels from a fixed random
"teacher" network, so there is something to learn. The first steps are
checked against the single-device reference interpreter.

    python examples/train_mlp.py [--ranks 2] [--steps 60]
"""

import argparse
import sys

import numpy as np
from xdsl.context import Context

import sbpc
from sbpc import S
from sbpc.lowering.lg_autodiff import LgAutodiffPass
from sbpc.lowering.lg_optimizer import LgOptimizerPass
from sbpc.reference import evaluate, initial_value

BATCH, FEATURES, HIDDEN, CLASSES = 64, 32, 64, 8


def training_graph(ranks: int):
    g = sbpc.Graph("mlp_train", placement=sbpc.placement("cpu", ranks=ranks))
    x = g.input("x", (BATCH, FEATURES), sbp=S(0))
    labels = g.input("labels", (BATCH,), dtype="i64", sbp=S(0))
    w1 = g.param("w1", (FEATURES, HIDDEN), init=sbpc.normal(0.0, FEATURES ** -0.5), seed=1)
    b1 = g.param("b1", (HIDDEN,))
    w2 = g.param("w2", (HIDDEN, CLASSES), init=sbpc.normal(0.0, HIDDEN ** -0.5), seed=2)
    logits = sbpc.gelu(x @ w1 + b1) @ w2
    g.output(loss=sbpc.cross_entropy(logits, labels))
    module = g.module()
    LgAutodiffPass().apply(Context(), module)
    LgOptimizerPass(algorithm="adam").apply(Context(), module)
    module.verify()
    return module


def batches(seed: int = 0):
    rng = np.random.default_rng(seed)
    teacher = rng.normal(size=(FEATURES, CLASSES))
    while True:
        x = rng.normal(size=(BATCH, FEATURES)).astype(np.float32)
        yield {"x": x, "labels": np.argmax(x @ teacher, axis=1).astype(np.int64), "lr": np.float32(3e-3)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--steps", type=int, default=60)
    args = parser.parse_args()

    module = training_graph(args.ranks)
    exe = sbpc.compile(module)
    reference_params = {op.key.data: initial_value(op) for op in module.ops.last.body.ops if op.name == "lg.param"}
    data = batches()
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
    learned = losses[-1] < 0.7 * losses[0]
    print(f"\ntrained on {args.ranks} MPI ranks: loss {losses[0]:.4f} -> {losses[-1]:.4f}"
          f" ({'learning' if learned else 'NOT LEARNING'})")
    return 0 if ok and learned else 1


if __name__ == "__main__":
    sys.exit(main())
