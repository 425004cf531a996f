"""How close the memory plan comes to the best possible, per example model.

Compiles each example (forward MLP, a GPT block on a 2x2 mesh, and a
forward+backward+SGD training step) to a plan and prints, per device: the
arena the allocator chose, the live-set lower bound (the most bytes live at
any point of the schedule: no allocator can do better), the total without
any reuse, and arena / bound. Goal: arena <= 1.05x the bound. The GPT
training step of examples/gpt.py (Adam, 2 ranks) is included.

Then ZeRO: the same Adam training steps (the MLP of
bench/train_throughput.py and the GPT) compiled with lg-optimizer's
zero=false and zero=true, and per rank: optimizer-state bytes (the
persistent adam.m/adam.v registers), parameter bytes, the arena and the
whole device (arena + persistent); the ratio plain / ZeRO of the state
(ideal: the rank count).

    python bench/memory_plan.py [--ranks 2] [--hidden 1024]
"""

import argparse
import pathlib
import statistics

import _common  # noqa: F401  (first: one BLAS thread per process)
import numpy as np
from xdsl.context import Context

import sbpc
from sbpc.dialects import plan
from sbpc.lowering.compile import CompilePass

EXAMPLES = pathlib.Path(__file__).resolve().parent.parent / "examples"
MODELS = ["mlp.mlir", "gpt_block.mlir", "mlp_train.mlir", "mlp_train_zero.mlir"]


def gpt_module(ranks: int, zero: bool, cfg: dict):
    return _common.gpt("zero" if zero else "dp", ranks, cfg)


def mlp_module(ranks: int, hidden: int, zero: bool):
    # the throughput MLP, with Adam (it has state) instead of SGD
    return __import__("train_throughput").sbpc_mlp(ranks, 64, hidden, algorithm="adam", zero=zero)


def per_rank_bytes(module) -> list[tuple[int, int, int, int, int, int]]:
    """(rank, optimizer state, parameters, arena, arena + persistent, state
    if replicated) per device."""
    out = []
    for program in [p for p in module.ops if isinstance(p, plan.ProgramOp)]:
        for device in program.devices():
            state = params = replicated = 0
            for reg in device.registers():
                if reg.param is None:
                    continue
                size = reg.bytes.value.data * reg.slots.value.data
                if reg.param.data.startswith(("adam.m.", "adam.v.", "momentum.")):
                    state += size
                    replicated += 4 * int(np.prod(reg.value.get_shape()))
                elif not reg.param.data.startswith("adam."):
                    params += size
            arena, persistent = device.arena.value.data, device.persistent.value.data
            out.append((device.rank.value.data, state, params, arena, arena + persistent, replicated))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--quick", action="store_true", help="small MLP only (for the smoke test)")
    args = parser.parse_args()
    if args.quick:
        args.hidden = 64
    cfg = {
        "vocab": _common.gpt_vocab(), "batch": 16, "seq": 16, "dim": 32, "heads": 4,
        "layers": 2 if not args.quick else 1,
    }
    modules = [(name, sbpc.parse_module((EXAMPLES / name).read_text(), name)) for name in MODELS]
    if not args.quick:
        modules.append((f"gpt.py {cfg['layers']}L train", gpt_module(args.ranks, False, cfg)))
    print(f"{'model':<22} {'device':<7} {'arena B':>9} {'bound B':>9} {'no reuse B':>11} {'arena/bound':>12} "
          f"{'persistent B':>13}")
    ratios = []
    for name, module in modules:
        CompilePass().apply(Context(), module)
        for program in [p for p in module.ops if isinstance(p, plan.ProgramOp)]:
            for device in program.devices():
                arena, bound = device.arena.value.data, device.live_bound.value.data
                ratio = arena / bound if bound else 1.0
                ratios.append(ratio)
                print(f"{name:<22} {device.sym_name.data:<7} {arena:>9} {bound:>9} {device.no_reuse.value.data:>11} "
                      f"{ratio:>12.3f} {device.persistent.value.data:>13}")

    print(f"\nZeRO vs plain data parallel, Adam, {args.ranks} ranks: bytes per rank")
    rows, zero_ratios = [], []
    builds = [(f"mlp 1024-{args.hidden}-{args.hidden}-1024", lambda z: mlp_module(args.ranks, args.hidden, z))]
    if not args.quick:
        builds.append((f"gpt {cfg['layers']}L d={cfg['dim']}", lambda z: gpt_module(args.ranks, z, cfg)))
    for name, build in builds:
        got = {}
        for zero in (False, True):
            module = build(zero)
            CompilePass().apply(Context(), module)
            got[zero] = per_rank_bytes(module)
        for (rank, s0, p0, a0, t0, rep), (_, s1, p1, a1, t1, _) in zip(got[False], got[True]):
            zero_ratios.append(rep / s1 if s1 else float("inf"))
            rows.append((f"{name} rank {rank}", rep, s0, s1, f"{rep / s1:.2f}x" if s1 else "n/a",
                         f"{s0 / s1:.2f}x" if s1 else "n/a", p0, p1, a0, a1, t0, t1))
    print("(state replicated: every rank holding all of adam.m/adam.v, as PyTorch DDP does; state plain: what "
          "sbp-infer chose with zero=false)")
    _common.table(["model", "state replicated", "state plain", "state ZeRO", "replicated/ZeRO", "plain/ZeRO",
                   "params plain", "params ZeRO",
                   "arena plain", "arena ZeRO", "device plain", "device ZeRO"], rows)
    print(f"summary: arena / live-set bound: median {statistics.median(ratios):.3f}, max {max(ratios):.3f} "
          f"over {len(ratios)} devices (goal <= 1.05); ZeRO optimizer state per rank {min(zero_ratios):.2f}x-"
          f"{max(zero_ratios):.2f}x smaller than replicated data parallel on {args.ranks} ranks (ideal {args.ranks}x)")


if __name__ == "__main__":
    main()
