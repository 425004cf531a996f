"""lg-recompute: a training step that repeats forward ops for the backward
pass computes the same values in less memory, on every kind of plan."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
from xdsl.context import Context

from sbpc.dialects import lg, plan
from sbpc.lowering.compile import CompilePass
from sbpc.lowering.lg_recompute import RECOMPUTE_ATTR, LgRecomputePass
from sbpc.semantics.plan_interpreter import run_plan
from sbpc.tools.sbp_run import generated_feeds

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "examples"))

import models  # noqa: E402

SIZE = {"batch": 4, "seq": 4, "dim": 8, "heads": 2, "layers": 2}
VOCAB = 20


def compiled(variant: str, policy: str):
    module = models.gpt(variant, 2, VOCAB, micro_batches=2 if variant == "pipeline" else 1, **SIZE)
    LgRecomputePass(policy=policy).apply(Context(), module)
    module.verify()
    CompilePass().apply(Context(), module)
    return module


def arena(module) -> int:
    return max(d.arena.value.data for d in plan.programs(module)[0].devices())


def steps(module, feeds, count: int) -> dict[str, list[np.ndarray]]:
    params: dict[str, np.ndarray] = {}
    history: dict[str, list[np.ndarray]] = {}
    for _ in range(count):
        out = run_plan(module, feeds, params)
        for key, value in out.items():
            history.setdefault(key, []).append(value)
        params = {k.removeprefix("new."): v for k, v in out.items() if k.startswith("new.")}
    return history


@pytest.mark.parametrize("variant", [pytest.param("dp", marks=pytest.mark.full), "pipeline"])
def test_recomputation_keeps_the_values_and_lowers_the_arena(variant):
    base = compiled(variant, "none")
    feeds = generated_feeds(plan.programs(base)[0], 0)
    feeds["lr"] = np.asarray(1e-2, np.float32)
    want = steps(base, feeds, 1)
    arenas = {"none": arena(base)}
    for policy in ("selective", "full"):
        module = compiled(variant, policy)
        arenas[policy] = arena(module)
        got = steps(module, feeds, 1)
        assert got.keys() == want.keys()
        for key in want:
            np.testing.assert_allclose(np.array(got[key]), np.array(want[key]), rtol=1e-5, atol=1e-7,
                                       err_msg=f"{policy}: {key}")
    # only the residual stream kept between blocks (full)
    assert arenas["full"] < arenas["none"], arenas
    if variant == "dp":  # every block's GELU and layernorms repeated (selective)
        assert arenas["full"] < arenas["selective"] < arenas["none"], arenas
    # (On the pipeline's last stage the per-micro-batch weight gradients,
    # summed only at the end, set the peak at this size, not activations.)


def test_clones_run_in_the_backward_pass_just_before_their_use():
    module = models.gpt("dp", 2, VOCAB, **SIZE)
    LgRecomputePass(policy="selective").apply(Context(), module)
    graph = lg.graphs(module)[0]
    clones = [op for op in graph.body.ops if RECOMPUTE_ATTR in op.attributes]
    assert {op.name for op in clones} >= {"lg.gelu", "lg.layernorm"}
    CompilePass().apply(Context(), module)
    device = plan.programs(module)[0].devices()[0]
    actors = device.actors()
    position = {a.sym_name.data: i for i, a in enumerate(actors)}
    loss = next(i for i, a in enumerate(actors) if isinstance(a, plan.ComputeOp)
                and a.kernel.data == "lg.cross_entropy")
    readers: dict[str, list[int]] = {}
    for i, a in enumerate(actors):
        for ref in a.ins.data:
            readers.setdefault(ref.string_value(), []).append(i)
    made = [(position[a.sym_name.data], a.outs.data[0].string_value()) for a in actors
            if isinstance(a, plan.ComputeOp) and "again" in a.outs.data[0].string_value()]
    assert made, "no recomputed register in the plan"
    for at, register in made:
        assert at > loss  # in the backward pass
        first_use = min(readers[register])
        assert first_use - at <= 3, (register, at, first_use)  # and next to its use
