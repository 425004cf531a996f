"""Compiles examples/mlp.mlir as far as sbpc goes today and evaluates it.

Parses and verifies the graph, then runs the reference interpreter (the
semantics every later level must keep) on a random batch, and checks the
loss against a hand-written numpy forward pass of the same MLP.
"""

import pathlib
import sys

import numpy as np

import sbpc
from sbpc.dialects import lg
from sbpc.reference import evaluate, initial_value

HERE = pathlib.Path(__file__).parent


def main() -> int:
    module = sbpc.parse_module((HERE / "mlp.mlir").read_text(), "mlp.mlir")
    graph = next(op for op in module.ops if isinstance(op, lg.GraphOp))
    params = {op.key.data: initial_value(op) for op in graph.body.ops if isinstance(op, lg.ParamOp)}

    rng = np.random.default_rng(0)
    feeds = {"x": rng.normal(size=(32, 64)).astype(np.float32), "labels": rng.integers(0, 10, 32)}
    out = evaluate(module, feeds, params)

    # the same forward pass, written out in numpy
    h = feeds["x"] @ params["w1"] + params["b1"]
    a = 0.5 * h * (1 + np.tanh(np.sqrt(2 / np.pi) * (h + 0.044715 * h**3)))
    logits = a @ params["w2"] + params["b2"]
    z = logits - logits.max(axis=1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(axis=1, keepdims=True))
    loss = -logp[np.arange(32), feeds["labels"]].mean()

    print(f"graph @{graph.sym_name.data}: {len(list(graph.body.ops))} ops, {len(params)} parameters "
          f"({sum(p.size for p in params.values())} values)")
    print(f"loss (sbpc reference) = {float(out['loss']):.6f}")
    print(f"loss (numpy by hand)  = {loss:.6f}")
    ok = np.isclose(out["loss"], loss, rtol=1e-5) and np.allclose(out["logits"], logits, rtol=1e-4, atol=1e-5)
    print("match" if ok else "MISMATCH")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
