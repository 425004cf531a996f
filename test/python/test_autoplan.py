"""sbp-autoplan: a graph with no hints gets the fastest plan that fits, and
that plan computes what the single device computes."""

from __future__ import annotations

import re

import numpy as np
import pytest
from xdsl.context import Context
from xdsl.utils.exceptions import PassFailedException

from sbpc.dialects import lg, parse_module, plan
from sbpc.lowering.compile import CompilePass
from sbpc.lowering.lg_autodiff import LgAutodiffPass
from sbpc.lowering.lg_optimizer import LgOptimizerPass
from sbpc.lowering.sbp_autoplan import SbpAutoplanPass, mesh_shapes
from sbpc.semantics.plan_simulator import run_plan
from sbpc.tools.sbp_run import generated_feeds

MLP = """
sbp.placement @m cpu ranks [{ranks}] mesh [{devices}]
lg.graph @mlp on @m {{
  %x = lg.input "x" : tensor<64x32xf32>
  %labels = lg.input "labels" : tensor<64xi64>
  %w1 = lg.param "w1" init #lg.normal<0.0, 0.2> seed 1 : tensor<32x64xf32>
  %h = lg.matmul %x, %w1 : (tensor<64x32xf32>, tensor<32x64xf32>) -> tensor<64x64xf32>
  %a = lg.gelu %h : tensor<64x64xf32>
  %w2 = lg.param "w2" init #lg.normal<0.0, 0.2> seed 2 : tensor<64x8xf32>
  %y = lg.matmul %a, %w2 : (tensor<64x64xf32>, tensor<64x8xf32>) -> tensor<64x8xf32>
  %loss = lg.cross_entropy %y, %labels : (tensor<64x8xf32>, tensor<64xi64>) -> tensor<f32>
  lg.output ["loss"] %loss : tensor<f32>
}}
"""


def training(devices: int):
    module = parse_module(MLP.format(ranks=", ".join(map(str, range(devices))), devices=devices), "mlp")
    LgAutodiffPass().apply(Context(), module)
    LgOptimizerPass(algorithm="adam").apply(Context(), module)
    return module


def planned(devices: int, **options):
    module = training(devices)
    SbpAutoplanPass(strategy="auto", **options).apply(Context(), module)
    module.verify()
    return module


def train(module, feeds, steps: int) -> dict[str, list[np.ndarray]]:
    """Every output of `steps` steps of the plan (its updates feed the next)."""
    params: dict[str, np.ndarray] = {}
    history: dict[str, list[np.ndarray]] = {}
    for _ in range(steps):
        out = run_plan(module, feeds, params)
        for key, value in out.items():
            history.setdefault(key, []).append(value)
        params = {k.removeprefix("new."): v for k, v in out.items() if k.startswith("new.")}
    return history


def test_mesh_shapes_are_every_factorization():
    assert mesh_shapes(1) == [(1,)]
    assert mesh_shapes(4) == [(4,), (2, 2)]
    assert mesh_shapes(8) == [(8,), (2, 4), (4, 2)]
    assert mesh_shapes(7) == [(7,)]


def test_the_choice_is_the_fastest_layout_and_says_so():
    module = planned(4, explain=True)
    graph = next(iter(lg.graphs(module)))
    chosen = graph.attributes["sbp.autoplan"].data
    alternatives = [a.data for a in graph.attributes["sbp.autoplan.alternatives"].data]
    assert len(alternatives) == 18  # {4, 2x2} x inputs {free, split, replicated} x {replicated, zero, fsdp}
    assert chosen.startswith(alternatives[0])  # ranked fastest first
    times = [float(a.split("predicted ")[1].split(" ms")[0]) for a in alternatives]
    assert times == sorted(times)
    # every value is typed: compile lowers exactly what was predicted
    for op in graph.body.ops:
        for r in op.results:
            assert hasattr(r.type, "nd_sbp"), op


def test_a_tight_budget_shards_the_state_and_the_plan_trains_like_one_device():
    free = planned(4, explain=True)
    alternatives = [a.data for a in next(iter(lg.graphs(free))).attributes["sbp.autoplan.alternatives"].data]
    memory = {a: float(re.search(r"([0-9.]+) MiB per device", a).group(1)) * 2**20 for a in alternatives}
    smallest = min(memory.values())
    replicated = max(memory.values())
    budget = int((smallest + replicated) / 2)
    module = planned(4, memory=budget)
    chosen = next(iter(lg.graphs(module))).attributes["sbp.autoplan"].data
    assert "replicated" not in chosen and ("zero" in chosen or "fsdp" in chosen)
    CompilePass().apply(Context(), module)
    program = plan.programs(module)[0]
    assert max(d.arena.value.data + d.persistent.value.data for d in program.devices()) <= budget

    reference = training(1)
    CompilePass().apply(Context(), reference)
    ref_program = plan.programs(reference)[0]
    feeds = generated_feeds(ref_program, 0)
    assert generated_feeds(program, 0).keys() == feeds.keys()
    for name, value in generated_feeds(program, 0).items():  # the same feeds whatever the plan
        np.testing.assert_array_equal(value, feeds[name])
    feeds["lr"] = np.asarray(1e-2, np.float32)
    got, want = train(module, feeds, 4), train(reference, feeds, 4)
    assert want["loss"][-1] < want["loss"][0]  # it trains
    for key in want:
        np.testing.assert_allclose(np.array(got[key]), np.array(want[key]), rtol=2e-5, atol=2e-6, err_msg=key)


def test_a_budget_nothing_meets_names_the_smallest_plan():
    import sbpc

    with pytest.raises(PassFailedException, match="no plan fits"):  # the API says the same
        sbpc.compile(training(2), plan="auto", memory_budget=1000)
    with pytest.raises(PassFailedException, match=r"no plan fits .* the smallest needs .* \(mesh 4, .*(zero|fsdp)\)"):
        planned(4, memory=1000)


def test_devices_overrides_the_placement_and_an_unknown_cluster_is_refused():
    module = training(1)
    SbpAutoplanPass(strategy="auto", devices=2).apply(Context(), module)
    placement = next(op for op in module.ops if op.name == "sbp.placement")
    assert list(placement.ranks.get_values()) == [0, 1]
    with pytest.raises(PassFailedException, match="sbp-autoplan: .*nonexistent"):
        SbpAutoplanPass(cluster="nonexistent.json").apply(Context(), training(2))


def test_the_autoplan_example_plans_trains_and_matches_the_reference():
    import subprocess
    import sys
    from pathlib import Path

    example = Path(__file__).resolve().parents[2] / "examples" / "autoplan.py"
    done = subprocess.run([sys.executable, str(example), "--ranks", "2", "--steps", "3", "--model", "mlp"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "sbp-autoplan chose mesh 2" in done.stdout and ": equal" in done.stdout
