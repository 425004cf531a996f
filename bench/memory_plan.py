"""How close the memory plan comes to the best possible, per example model.

Compiles each example (forward MLP, a GPT block on a 2x2 mesh, and a
forward+backward+SGD training step) to a plan and prints, per device: the
arena the allocator chose, the live-set lower bound (the most bytes live at
any point of the schedule: no allocator can do better), the total without
any reuse, and arena / bound. Goal: arena <= 1.05x the bound.

    python bench/memory_plan.py
"""

import pathlib
import statistics

from xdsl.context import Context

import sbpc
from sbpc.dialects import plan
from sbpc.lowering.compile import CompilePass

EXAMPLES = pathlib.Path(__file__).resolve().parent.parent / "examples"
MODELS = ["mlp.mlir", "gpt_block.mlir", "mlp_train.mlir", "mlp_train_zero.mlir"]


def main() -> None:
    print(f"{'model':<22} {'device':<7} {'arena B':>9} {'bound B':>9} {'no reuse B':>11} {'arena/bound':>12} "
          f"{'persistent B':>13}")
    ratios = []
    for name in MODELS:
        module = sbpc.parse_module((EXAMPLES / name).read_text(), name)
        CompilePass().apply(Context(), module)
        for program in [p for p in module.ops if isinstance(p, plan.ProgramOp)]:
            for device in program.devices():
                arena, bound = device.arena.value.data, device.live_bound.value.data
                ratio = arena / bound if bound else 1.0
                ratios.append(ratio)
                print(f"{name:<22} {device.sym_name.data:<7} {arena:>9} {bound:>9} {device.no_reuse.value.data:>11} "
                      f"{ratio:>12.3f} {device.persistent.value.data:>13}")
    print(f"summary: arena / live-set bound: median {statistics.median(ratios):.3f}, max {max(ratios):.3f} "
          f"over {len(ratios)} devices (goal <= 1.05)")


if __name__ == "__main__":
    main()
