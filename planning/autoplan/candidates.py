"""What the autoplan searches choose among, and what they know of each
choice: one model for both searches (the whole graph lowered and simulated
per layout, and the layers profiled and composed)."""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, field

from xdsl.dialects.builtin import ModuleOp
from xdsl.utils.exceptions import PassFailedException

MEMORY_MODES = ("replicated", "zero", "fsdp")
"""`replicated`: parameters and optimizer state wherever the plan puts
them; `zero`: the optimizer state split over the data axis (ZeRO); `fsdp`:
the parameters split too, gathered for each use (FSDP / ZeRO-3)."""
RECOMPUTE_POLICIES = ("selective", "full")
"""lg-recompute's policies, tried in this order on the layouts that do not
fit without recomputation."""


def mesh_shapes(devices: int) -> list[tuple[int, ...]]:
    """Every mesh of `devices`: one axis, and every a x b with both axes > 1."""
    shapes: list[tuple[int, ...]] = [(devices,)]
    shapes += [(a, devices // a) for a in range(2, devices) if devices % a == 0 and devices // a > 1]
    return shapes


@dataclass(frozen=True)
class Layout:
    """How a training step is laid out on the devices: a mesh per pipeline
    stage, the micro-batches and their schedule, where parameters and
    optimizer state live, and what is recomputed."""

    mesh: tuple[int, ...]
    """The mesh of each stage."""
    memory: str
    """One of MEMORY_MODES."""
    stages: int = 1
    micro_batches: int = 1
    schedule: str = "gpipe"
    """The pipeline schedule (lg-micro-batch's): `gpipe` or `1f1b`."""
    recompute: str = "none"
    """lg-recompute's policy: `none`, `selective` or `full` (tried only
    where the layout does not fit without it)."""
    inputs: str = "free"
    """How the graph's inputs are distributed before inference: `free`
    (sbp-infer chooses), `split` (the batch, axis 0, over the first mesh
    axis: data parallelism is the natural plan) or `replicated` (every
    device sees the whole batch: only the weights can be split, tensor
    parallelism) or `data` (the batch split and every weight replicated:
    plain data parallelism, which the cost model's search from `split`
    does not always reach, as its costs are not the simulator's). The
    simulator judges what the cost model's search finds from each start."""
    tensor: int = 0
    """Planned by layers: the size of the tensor-parallel axis (the mesh's
    last; 1: none), the batch split over the data axis (the first, or the
    only one when tensor is 1). 0: the axes have no fixed roles, sbp-infer
    chooses every op's distribution over each (the whole-graph search)."""
    experts: bool = False
    """The experts' weights of a mixture of experts (the stacked weights a
    grouped matmul takes) split by expert over the first mesh axis, their
    gradients and optimizer state with them: expert parallelism."""

    @property
    def data(self) -> int:
        """The data-parallel degree (planned by layers)."""
        return math.prod(self.mesh) // max(self.tensor, 1)

    def describe(self) -> str:
        if self.tensor:
            mesh = f"data {self.data} x tensor {self.tensor}"
            parts = [f"{self.stages} stages of {mesh}" if self.stages > 1 else mesh]
        else:
            mesh = "x".join(map(str, self.mesh))
            parts = [f"{self.stages} stages of mesh {mesh}" if self.stages > 1 else f"mesh {mesh}"]
        if self.micro_batches > 1:
            parts.append(f"{self.micro_batches} micro-batches" + (f" {self.schedule}" if self.stages > 1 else ""))
        if self.inputs != "free" and not self.tensor:
            parts.append(f"inputs {self.inputs}")
        if self.experts:
            parts.append("experts split")
        parts.append(self.memory)
        if self.recompute != "none":
            parts.append(f"recompute {self.recompute}")
        return ", ".join(parts)


def by_layers(stages: int, data: int, tensor: int, micro_batches: int, memory: str, schedule: str = "1f1b",
              recompute: str = "none") -> Layout:
    """A layout of the layer search: each stage a data x tensor mesh (an
    axis of one device left out), the batch split over the data axis."""
    mesh = tuple(d for d in (data, tensor) if d > 1) or (1,)
    return Layout(mesh, memory, stages, micro_batches, schedule, recompute, "split", tensor)


@dataclass
class Candidate:
    """A layout and what a search predicts for it."""

    layout: Layout
    step_time: float = math.inf
    """Predicted seconds per training step."""
    peak_memory: float = math.inf
    """Predicted bytes on the fullest device."""
    rejected: str = ""
    """Why the layout cannot be planned (empty: it was predicted)."""
    module: ModuleOp | None = field(default=None, repr=False)
    """The whole-graph search: the inferred sbp-level IR (what sbp-autoplan
    writes if this candidate wins)."""
    stage_layers: list[list[int]] = field(default_factory=list)
    """The layer search: the layers of each stage."""
    breakdown: dict[str, float] = field(default_factory=dict)
    """The layer search: seconds per part of the step."""

    @property
    def priced(self) -> bool:
        return not self.rejected and self.step_time < math.inf

    def fits(self, budget: int) -> bool:
        return self.priced and self.peak_memory <= budget

    def describe(self, budget: int) -> str:
        if not self.priced:
            return f"{self.layout.describe()}: rejected: {self.rejected}"
        over = "" if self.peak_memory <= budget else f" (over the budget of {gib(budget)})"
        return (f"{self.layout.describe()}: predicted {self.step_time * 1e3:.3f} ms/step, "
                f"{gib(self.peak_memory)} per device{over}")


def check_memory_budget(budget: int | None) -> None:
    """The one check of a memory budget, from the API to the search: a
    positive number of bytes per device, or None (none given)."""
    if budget is not None and (isinstance(budget, bool) or not isinstance(budget, numbers.Integral) or budget <= 0):
        raise ValueError(f"memory_budget must be a positive number of bytes, got {budget!r}")


def gib(n: float) -> str:
    """Bytes as a person reads them: GiB from 128 MiB, else MiB."""
    return f"{n / 2**30:.3g} GiB" if n >= 2**27 else f"{n / 2**20:.3g} MiB"


def fastest_fitting(candidates: list[Candidate], budget: int, devices: int) -> Candidate:
    """The fastest candidate within `budget` bytes per device. Where none
    fits, the error says the least memory any plan needs (and its layout);
    where none could be planned, why each was rejected."""
    fitting = [c for c in candidates if c.fits(budget)]
    if fitting:
        return min(fitting, key=lambda c: c.step_time)
    priced = [c for c in candidates if c.priced]
    if not priced:
        reasons = "; ".join(c.describe(budget) for c in candidates[:8])
        raise PassFailedException(f"sbp-autoplan: no layout of {devices} devices works: {reasons}")
    least = min(priced, key=lambda c: c.peak_memory)
    raise PassFailedException(f"sbp-autoplan: no plan fits {gib(budget)} per device; the smallest needs "
                              f"{gib(least.peak_memory)} ({least.layout.describe()})")
