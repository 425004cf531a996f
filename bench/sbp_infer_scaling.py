"""How sbp-infer's time grows with graph size, for both strategies.

Generates residual MLP stacks (matmul, bias, gelu, matmul, residual add,
layernorm per block, with their parameters) of about 1k, 10k and 50k ops on
a 4-device mesh with the batch hinted S<0>, and times the whole pass
(reading the IR, solving, writing the answer back). Prints seconds, the
growth factor per 10x ops, and greedy/auto total cost.

    python bench/sbp_infer_scaling.py [--sizes 1000 10000 50000]
"""

import argparse
import gc
import time

from xdsl.context import Context
from xdsl.dialects.builtin import ModuleOp

from sbpc.dialects import lg
from sbpc.dialects.sbp import AnnotateOp, DTensorType, PlacementOp, SplitAttr
from sbpc.graph_builder import GraphBuilder
from sbpc.lowering.sbp_infer import SbpInferPass

OPS_PER_BLOCK = 12  # 6 compute ops, 6 parameters


def residual_mlp(n_ops: int, batch: int = 64, width: int = 256) -> ModuleOp:
    b = GraphBuilder("stack", placement="mesh")
    x = b.input("x", (batch, width))
    h = b.add(AnnotateOp(x, DTensorType((batch, width), x.type.element_type, "mesh", [SplitAttr(0)])))
    for i in range(max(1, n_ops // OPS_PER_BLOCK)):
        w1 = b.param(f"w1_{i}", (width, 4 * width), lg.NormalInitAttr(0.0, 0.02))
        b1 = b.param(f"b1_{i}", (4 * width,))
        w2 = b.param(f"w2_{i}", (4 * width, width), lg.NormalInitAttr(0.0, 0.02))
        g = b.param(f"g_{i}", (width,), lg.OnesInitAttr())
        beta = b.param(f"beta_{i}", (width,))
        a = b.add(lg.GeluOp(b.add(lg.AddOp(b.add(lg.MatmulOp(h, w1)), b1))))
        y = b.add(lg.MatmulOp(a, w2))
        r = b.add(lg.AddOp(h, y))
        h = b.add(lg.LayerNormOp(r, 1, 1e-5, g, beta))
        scale = b.param(f"s_{i}", (width,), lg.OnesInitAttr())
        h = b.add(lg.MulOp(h, scale))
    return b.module({"y": h}, PlacementOp("mesh", "cpu", [0, 1, 2, 3], [4]))


def time_pass(n_ops: int, strategy: str) -> tuple[float, int, float]:
    gc.disable()
    try:
        module = residual_mlp(n_ops)
        ops = sum(1 for _ in module.walk()) - 3
        start = time.perf_counter()
        SbpInferPass(strategy=strategy).apply(Context(), module)
        elapsed = time.perf_counter() - start
    finally:
        gc.enable()
    cost = module.ops.last.attributes["sbp.total_cost"].value.data
    return elapsed, ops, cost


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1000, 10000, 50000])
    args = parser.parse_args()
    print(f"{'ops':>8} {'greedy s':>9} {'auto s':>9} {'auto/greedy cost':>17}")
    previous = None
    rows = []
    for size in args.sizes:
        t_greedy, ops, c_greedy = time_pass(size, "greedy")
        t_auto, _, c_auto = time_pass(size, "auto")
        rows.append((ops, t_greedy, t_auto))
        print(f"{ops:>8} {t_greedy:>9.2f} {t_auto:>9.2f} {c_auto / c_greedy:>17.3f}")
    growth = []
    for (n0, _, a0), (n1, _, a1) in zip(rows, rows[1:]):
        growth.append(f"{n0}->{n1} ops: time x{a1 / a0:.1f} for ops x{n1 / n0:.1f}")
    previous = rows[-1]
    print("summary: auto " + "; ".join(growth) + f"; {previous[0]} ops in {previous[2]:.1f} s")


if __name__ == "__main__":
    main()
