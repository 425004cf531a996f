"""`plan-codegen`: CUDA C for every compute actor of a plan's CUDA devices.

Each kernel is generated for the actor's local shapes, with the SBP-local
semantics baked in (a mean over a split axis divides by the global count),
and attached to the actor as discardable attributes:

    cuda.source   the CUDA C source (one `extern "C" __global__` kernel)
    cuda.entry    the kernel's name
    cuda.launch   [grid x, y, z, block x, y, z]

The runtime compiles the source with NVRTC to PTX for compute_90 and
launches it with the kernel's inputs, then its output, as device pointers.
Covered: elementwise unary and broadcasting binary ops and fused chains of
them (`plan.fused`, from plan-fuse-elementwise: one thread per output
element, intermediates in registers), matmul (tiled
through shared memory, batched, transposes), reductions, softmax and
log_softmax, layernorm, reshape and transpose. Other kernels are reported.
`all=true` generates for every device (used to test generation on CPU
plans).
"""

from __future__ import annotations

from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects.builtin import DenseArrayBase, ModuleOp, StringAttr, i64
from xdsl.passes import ModulePass
from xdsl.utils.exceptions import PassFailedException

from sbpc.codegen.generators import generate
from sbpc.codegen.render import Unsupported
from sbpc.dialects import plan
from sbpc.dialects.sbp import DeviceKind, lookup_placement


@dataclass(frozen=True)
class PlanCodegenPass(ModulePass):
    name = "plan-codegen"

    all: bool = False
    """Generate for every device, not only those of CUDA placements."""

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        for program in plan.programs(op):
            for device in program.devices():
                if not self.all and all(lookup_placement(device, r.value.placement).mesh().device is not DeviceKind.CUDA
                                        for r in device.registers()):
                    continue
                device.expand()  # a device like another gets its own actors: their kernels are this rank's
                registers = {r.sym_name.data: r for r in device.registers()}
                for actor in device.actors():
                    if not isinstance(actor, plan.ComputeOp):
                        continue
                    out = registers[actor.outs.data[0].string_value()]
                    kind = lookup_placement(device, out.value.placement).mesh().device
                    if kind is not DeviceKind.CUDA and not self.all:
                        continue
                    try:
                        src, entry, launch = generate(actor, registers)
                    except Unsupported as e:
                        raise PassFailedException(
                            f"'plan.compute' @{actor.sym_name.data} on @{device.sym_name.data}: no CUDA kernel for {e}"
                        ) from None
                    actor.attributes[plan.CUDA_SOURCE_ATTR] = StringAttr(src)
                    actor.attributes[plan.CUDA_ENTRY_ATTR] = StringAttr(entry)
                    actor.attributes[plan.CUDA_LAUNCH_ATTR] = DenseArrayBase.from_list(i64, launch)
