"""The CUDA execution backend: a rank runs its device's plan on one GPU.

Memory: one device allocation for the arena and one for the persistent
region, so every register slot is a device pointer at its planned offset
(`span`), exactly as the numpy backend's views; the executor's host views
lie over pinned host mirrors of the same two regions.

Kernels: each compute actor's `cuda.source` (plan-codegen; generated at load
where missing) is compiled by NVRTC to PTX (cached on disk), loaded with
cuModuleLoadData and launched with its `cuda.launch` grid and block and
the device pointers of its inputs, then its output (`launch_arguments`).
An actor plan-codegen has no kernel for (embedding, losses, concat, ...)
runs on the host with the numpy kernel: its inputs are copied down, the
kernel runs on the mirror, its output is copied up (`HOST` in the load
report).

Communication stages through the pinned mirrors (this MPI is not
CUDA-aware): before a collective is issued its input slots are copied
device to host, the unchanged numpy collectives run on the mirror, and once
they complete (the executor's hazard tracking decides when) the output
slots are copied host to device (`staging`). Copies are synchronous
on the default stream, so they are ordered after the kernels that wrote the
bytes and before the kernels that read them.

Parameters are written on the host and copied up; updated parameters are
copied device to device after each step; fetched outputs are copied down.

Layers: everything that decides which buffer, which offset, in which order
is a plain function or the executor subclass, tested on CPU. The driver is
behind `Gpu` (allocate, copy, load, launch): `DriverGpu` is the thin layer
over the CUDA driver API (runtime/cuda.py), imported lazily; `EmulatedGpu` keeps device memory in a numpy byte
array and launches an actor's numpy kernel on the views at the pointers it
is given, so the host logic (pointers, staging, copies) runs end to end on
CPU. It tests no CUDA kernel; where a GPU is present,
test/python/codegen/test_generators.py launches each kernel.
"""

from __future__ import annotations

import os
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import cast

import numpy as np
from xdsl.dialects.builtin import DenseArrayBase, IntegerType

from sbpc.dialects import plan
from sbpc.dialects.dtypes import numpy_dtype
from sbpc.dialects.sbp import DeviceKind, lookup_placement

from . import cuda
from .executor import Executor
from .program import RuntimeFailure

ARENA, PERSISTENT = 0, 1
"""Region ids, as the executor's byte ranges use them."""


@dataclass(frozen=True)
class Span:
    """The bytes of one register slot: region, offset, size."""

    region: int
    offset: int
    nbytes: int


def span(reg: plan.RegisterOp, step: int) -> Span:
    """Where register `reg` holds step `step` (slot step mod slots)."""
    slot = step % reg.slots.value.data
    region = PERSISTENT if reg.is_persistent is not None else ARENA
    return Span(region, reg.byte_offset() + slot * reg.bytes.value.data, reg.bytes.value.data)


def region_sizes(device: plan.DeviceOp) -> tuple[int, int]:
    """Bytes of the arena and persistent allocations (at least one each)."""
    arena, persistent = device.region_bytes()
    return max(arena, 1), max(persistent, 1)


def pointer(bases: Sequence[int], s: Span) -> int:
    return bases[s.region] + s.offset


def launch_arguments(actor: plan.ComputeOp, registers: dict, step: int, bases: Sequence[int]) -> list[int]:
    """The kernel's arguments: device pointers of its inputs, then its
    output, for `step`, given the regions' base addresses."""
    refs = [*actor.ins.data, actor.outs.data[0]]
    return [pointer(bases, span(registers[r.string_value()], step)) for r in refs]


def launch_dims(actor: plan.ComputeOp) -> tuple[tuple[int, int, int], tuple[int, int, int]]:
    """(grid, block) from the actor's `cuda.launch`."""
    launch = cast("DenseArrayBase[IntegerType]", actor.attributes[plan.CUDA_LAUNCH_ATTR])
    gx, gy, gz, bx, by, bz = (int(v) for v in launch.get_values())
    return (gx, gy, gz), (bx, by, bz)


def staging(actor, registers: dict, step: int) -> tuple[list[Span], list[Span]]:
    """(copied down before host work on the actor: a collective issued, a
    host kernel run; copied up once it completes): its input slots, then its
    output slots."""
    down = [span(registers[r.string_value()], step) for r in actor.ins.data]
    up = [span(registers[r.string_value()], step) for r in actor.outs.data]
    return down, up


def is_cuda_program(program: plan.ProgramOp) -> bool:
    """Whether any device of the program lies on a CUDA placement."""
    placements = {reg.value.placement for device in program.devices() for reg in device.registers()}
    return any(lookup_placement(program, p).mesh().device is DeviceKind.CUDA for p in placements)


# -- the driver layer -----------------------------------------------------------


class Gpu(ABC):
    """What the backend needs of a GPU. Addresses are ints."""

    @abstractmethod
    def alloc(self, nbytes: int) -> int: ...
    @abstractmethod
    def pinned(self, nbytes: int) -> np.ndarray: ...
    @abstractmethod
    def upload(self, address: int, host: np.ndarray) -> None: ...
    @abstractmethod
    def download(self, host: np.ndarray, address: int) -> None: ...
    @abstractmethod
    def copy(self, dst: int, src: int, nbytes: int) -> None: ...
    @abstractmethod
    def kernel(self, actor: plan.ComputeOp, host_kernel) -> Callable[[list[int], tuple, tuple], None]: ...
    @abstractmethod
    def synchronize(self) -> None: ...


class DriverGpu(Gpu):
    """The GPU through the CUDA driver API (runtime/cuda.py's `Driver`;
    imported lazily, needs a GPU and its driver)."""

    def __init__(self, rank: int):
        self.driver = cuda.driver(rank)

    def alloc(self, nbytes: int) -> int:
        return self.driver.alloc(nbytes)

    def pinned(self, nbytes: int) -> np.ndarray:
        return self.driver.pinned(nbytes)

    def upload(self, address: int, host: np.ndarray) -> None:
        self.driver.upload(address, host)

    def download(self, host: np.ndarray, address: int) -> None:
        self.driver.download(host, address)

    def copy(self, dst: int, src: int, nbytes: int) -> None:
        self.driver.copy(dst, src, nbytes)

    def kernel(self, actor, host_kernel):
        entry = actor.attributes[plan.CUDA_ENTRY_ATTR].data
        function = self.driver.function(cuda.compile_ptx(actor.attributes[plan.CUDA_SOURCE_ATTR].data, f"{entry}.cu"),
                                         entry)

        def launch(args: list[int], grid, block):
            self.driver.launch(function, grid, block, args)

        return launch

    def synchronize(self) -> None:
        self.driver.synchronize()


class EmulatedGpu(Gpu):
    """Device memory in a numpy byte array; a launch runs the actor's numpy
    kernel on the views at the pointers it is given. For testing the host
    logic on CPU (select it with SBPC_CUDA_EMULATE=1); it checks no CUDA
    code."""

    BASE = 1 << 20
    """Address 0 is never handed out, so a zero pointer is a bug."""

    def __init__(self, rank: int = 0):
        self.memory = np.zeros(0, np.uint8)
        self.launches: list[tuple[str, list[int]]] = []
        self.copies: list[tuple[str, int, int]] = []

    def _bytes(self, address: int, nbytes: int) -> np.ndarray:
        lo = address - self.BASE
        if lo < 0 or lo + nbytes > self.memory.size:
            raise RuntimeFailure(f"emulated GPU: access [{address}, {address + nbytes}) outside the allocations")
        return self.memory[lo:lo + nbytes]

    def alloc(self, nbytes: int) -> int:
        address = self.BASE + self.memory.size
        self.memory = np.concatenate([self.memory, np.zeros(-(-nbytes // 256) * 256, np.uint8)])
        return address

    def pinned(self, nbytes: int) -> np.ndarray:
        return np.zeros(nbytes, np.uint8)

    def upload(self, address: int, host: np.ndarray) -> None:
        self.copies.append(("htod", address, host.nbytes))
        self._bytes(address, host.nbytes)[...] = host.reshape(-1).view(np.uint8)

    def download(self, host: np.ndarray, address: int) -> None:
        self.copies.append(("dtoh", address, host.nbytes))
        host.reshape(-1).view(np.uint8)[...] = self._bytes(address, host.nbytes)

    def copy(self, dst: int, src: int, nbytes: int) -> None:
        self.copies.append(("dtod", dst, nbytes))
        self._bytes(dst, nbytes)[...] = self._bytes(src, nbytes).copy()

    def kernel(self, actor, host_kernel):
        fire, regs = host_kernel
        types = [(tuple(r.type.get_shape()), numpy_dtype(r.type.element_type)) for r in regs]

        def launch(args: list[int], grid, block):
            self.launches.append((actor.sym_name.data, list(args)))
            views = [self._bytes(a, int(np.prod(shape)) * np.dtype(dt).itemsize).view(dt).reshape(shape)
                     for a, (shape, dt) in zip(args, types)]
            with np.errstate(all="ignore"):
                fire(views[:-1], views[-1])

        return launch

    def synchronize(self) -> None:
        pass


def make_gpu(rank: int) -> Gpu:
    if os.environ.get("SBPC_CUDA_EMULATE") == "1":
        return EmulatedGpu(rank)
    return DriverGpu(rank)


# -- the executor -------------------------------------------------------------------


class CudaExecutor(Executor):
    """The actor executor with registers in GPU memory (see the module
    docstring); scheduling, hazards and MPI are the numpy executor's."""

    def __init__(self, module, program, world, trace: bool = False, write_back: bool = True, gpu: Gpu | None = None):
        self.gpu = gpu
        for device in program.devices():
            if device.rank.value.data == world.rank:
                device.expand()  # kernels particular to this rank are written on its own actors
        super().__init__(module, program, world, trace=trace, write_back=write_back)
        if self.device is None:
            return
        assert self.gpu is not None  # _host_buffer made one for the base class's arenas
        self.bases = (self.gpu.alloc(region_sizes(self.device)[0]), self.gpu.alloc(region_sizes(self.device)[1]))
        self.launches: dict[plan.ComputeOp, Callable] = {}
        self.on_host: set[plan.ComputeOp] = set()
        self._ensure_sources()
        for actor in self.schedule:
            if isinstance(actor, plan.ComputeOp):
                if plan.CUDA_SOURCE_ATTR in actor.attributes:
                    regs = [self.registers[r.string_value()] for r in (*actor.ins.data, actor.outs.data[0])]
                    self.launches[actor] = self.gpu.kernel(actor, (self.kernels[actor], regs))
                else:
                    self.on_host.add(actor)

    def _ensure_sources(self) -> None:
        """Generates the kernels plan-codegen can where the plan has none."""
        from sbpc.codegen.generators import generate
        from sbpc.codegen.render import Unsupported

        for actor in self.schedule:
            if isinstance(actor, plan.ComputeOp) and plan.CUDA_SOURCE_ATTR not in actor.attributes:
                try:
                    src, entry, dims = generate(actor, self.registers)
                except Unsupported:
                    continue
                from xdsl.dialects.builtin import DenseArrayBase, StringAttr, i64

                actor.attributes[plan.CUDA_SOURCE_ATTR] = StringAttr(src)
                actor.attributes[plan.CUDA_ENTRY_ATTR] = StringAttr(entry)
                actor.attributes[plan.CUDA_LAUNCH_ATTR] = DenseArrayBase.from_list(i64, dims)

    # -- host mirrors ----------------------------------------------------------------

    def _host_buffer(self, nbytes: int) -> np.ndarray:
        if self.gpu is None:
            rank = self.world.rank
            self.gpu = make_gpu(rank)
        return self.gpu.pinned(nbytes)

    def _host_bytes(self, s: Span) -> np.ndarray:
        region = self.persistent if s.region == PERSISTENT else self.arena
        return region[s.offset:s.offset + s.nbytes]

    def _up(self, s: Span) -> None:
        assert self.gpu is not None  # mirrors exist only where _host_buffer made the GPU
        self.gpu.upload(pointer(self.bases, s), self._host_bytes(s))

    def _down(self, s: Span) -> None:
        assert self.gpu is not None  # mirrors exist only where _host_buffer made the GPU
        self.gpu.download(self._host_bytes(s), pointer(self.bases, s))

    def _host_written(self, name: str, slot: int) -> None:
        if hasattr(self, "bases"):
            self._up(span(self.registers[name], slot))

    def _host_needed(self, name: str, slot: int) -> None:
        self._down(span(self.registers[name], slot))

    # -- running ----------------------------------------------------------------------

    STAGED = True

    def _stage_in(self, actor, step: int) -> None:
        for s in staging(actor, self.registers, step)[0]:
            self._down(s)

    def _stage_out(self, actor, step: int) -> None:
        for s in staging(actor, self.registers, step)[1]:
            self._up(s)

    def _fire_compute(self, actor: plan.ComputeOp, step: int, ins, out, pending=None) -> None:
        start = time.perf_counter()
        if actor in self.on_host:
            self._stage_in(actor, step)
            super()._fire_compute(actor, step, ins, out)
            self._stage_out(actor, step)
            return
        grid, block = launch_dims(actor)
        self.launches[actor](launch_arguments(actor, self.registers, step, self.bases), grid, block)
        self._record(actor, "compute", start, time.perf_counter())

    def _write_back(self, pending, step: int) -> None:
        for new, param in self.updates:
            assert self.gpu is not None  # updates are paired only on a rank with a device
            self._wait_register(pending, new, step)
            src, dst = span(self.registers[new], step), span(self.registers[param], 0)
            self.gpu.copy(pointer(self.bases, dst), pointer(self.bases, src), src.nbytes)

    def run(self, steps: int = 1, outputs=None):
        fetched = super().run(steps, outputs)
        if self.device is not None:
            assert self.gpu is not None  # made with the device's arenas
            self.gpu.synchronize()
        return fetched


def make_executor(module, program, world, trace: bool = False, write_back: bool = True) -> Executor:
    """The executor for the program's device kind: CUDA placements run on
    GPUs, the others with numpy."""
    if is_cuda_program(program):
        try:
            return CudaExecutor(module, program, world, trace=trace, write_back=write_back)
        except cuda.CudaUnavailable as e:
            raise RuntimeFailure(
                f"rank {world.rank}: the plan is placed on CUDA devices but this rank has none: {e}"
            ) from None
    return Executor(module, program, world, trace=trace, write_back=write_back)
