"""sbp-autoplan by layers (planning/autoplan/: layers.py, profiler.py, compose.py): the forward graph
cut into repeated layers, each layer class profiled on the simulator, plans
composed from the profiles; every plan it writes trains like one device,
and the composed prediction stays close to simulating the whole plan."""

from __future__ import annotations

import itertools
import re
import sys
from pathlib import Path

import numpy as np
import pytest
from xdsl.context import Context
from xdsl.dialects.builtin import bf16, f32
from xdsl.passes import PassPipeline
from xdsl.utils.exceptions import PassFailedException

from sbpc.dialects import lg, parse_module, plan
from sbpc.dialects.sbp import element_type
from sbpc.lowering.autoplan_hints import ProfileHints, write_layout
from sbpc.lowering.compile import CompilePass
from sbpc.lowering.lg_micro_batch import rebatch
from sbpc.lowering.sbp_autoplan import TRAINING_PASSES, SbpAutoplanPass, layer_passes
from sbpc.perf.cluster import load_cluster
from sbpc.perf.step_time import simulate_plan
from sbpc.planning.autoplan.candidates import Layout, by_layers
from sbpc.planning.autoplan.compose import Composer, candidate_layouts, partition
from sbpc.planning.autoplan.layers import split_layers
from sbpc.planning.autoplan.profiler import Profiler
from sbpc.semantics.plan_interpreter import run_plan
from sbpc.semantics.reference import evaluate, initial_value
from sbpc.tools.sbp_run import generated_feeds

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "examples"))

import models  # noqa: E402

VOCAB = 20
SIZE = {"batch": 8, "seq": 4, "dim": 8, "heads": 2, "layers": 2}
TRAIN = "lg-autodiff,lg-optimizer{algorithm=adam}"


def forward_gpt(ranks: int = 4, **size):
    return models.gpt("none", ranks, VOCAB, training=False, **{**SIZE, **size})


def test_the_layer_holding_the_loss_is_profiled_with_what_else_it_hands_on():
    """With dropout, the last layer holds the loss and the random stream's
    step count (`rng.step` + 1), an output the loss does not depend on. Its
    profile is that whole layer: the search plans it, and the plan compiles."""
    module = forward_gpt(2, dropout=0.1)
    last = split_layers(lg.graphs(module)[0])[-1]
    assert [str(element_type(v.type)) for v in last.outs] == ["f32", "i64"]
    SbpAutoplanPass(search="layers", training=TRAIN).apply(Context(), module)
    assert "by layers" in lg.graphs(module)[0].attributes["sbp.autoplan"].data
    CompilePass().apply(Context(), module)
    assert plan.programs(module)


def test_a_gpt_is_cut_into_attention_and_mlp_layers_that_repeat():
    graph = lg.graphs(forward_gpt(layers=4))[0]
    layers = split_layers(graph)
    # embedding + attention, then MLP / attention halves, the last MLP with the head and loss
    assert len(layers) == 8
    assert all(len(layer.ins) == 1 for layer in layers[1:])  # the residual stream alone crosses
    keys = [layer.key for layer in layers]
    assert keys[1] == keys[3] == keys[5]  # MLP halves
    assert keys[2] == keys[4] == keys[6]  # attention halves
    assert len(set(keys)) == 4
    owned = [op for layer in layers for op in layer.ops]
    assert len(owned) == len(set(owned)) == len([o for o in graph.body.ops if not isinstance(
        o, (lg.InputOp, lg.ParamOp, lg.ConstantOp, lg.OutputOp))])


@pytest.mark.parametrize("seed", range(6))
def test_the_stage_partition_minimizes_the_slowest_stage(seed):
    rng = np.random.default_rng(seed)
    costs = list(rng.uniform(0.1, 1.0, 7))
    for parts in (1, 2, 3, 4):
        runs = partition(costs, parts)
        assert [j for run in runs for j in run] == list(range(7)) and all(runs)
        best = min(max(sum(costs[a:b]) for a, b in zip((0, *cuts), (*cuts, 7), strict=True))
                   for cuts in itertools.combinations(range(1, 7), parts - 1))
        assert max(sum(costs[j] for j in run) for run in runs) == pytest.approx(best)


MLP = """
sbp.placement @m cpu ranks [0] mesh [1]
lg.graph @g on @m {
  %x = lg.input "x" : tensor<8x6xf32>
  %w = lg.param "w" init #lg.normal<0.0, 0.5> seed 3 : tensor<6x4xf32>
  %y = lg.matmul %x, %w : (tensor<8x6xf32>, tensor<6x4xf32>) -> tensor<8x4xf32>
  %r = lg.reshape %y : tensor<8x4xf32> -> tensor<8x2x2xf32>
  %t = lg.tanh %r : tensor<8x2x2xf32>
  lg.output ["t"] %t : tensor<8x2x2xf32>
}
"""


def test_rebatch_gives_the_same_rows_on_fewer_examples():
    whole = parse_module(MLP)
    part = parse_module(MLP)
    rebatch(lg.graphs(part)[0], 2)
    part.verify()
    x = np.random.default_rng(0).standard_normal((8, 6)).astype(np.float32)
    params = {"w": initial_value(next(o for o in whole.walk() if isinstance(o, lg.ParamOp)))}
    want = evaluate(whole, {"x": x}, params)["t"]
    got = evaluate(part, {"x": x[:2]}, params)["t"]
    np.testing.assert_allclose(got, want[:2], rtol=1e-6)
    with pytest.raises(PassFailedException, match="no part of 3"):
        rebatch(lg.graphs(parse_module(MLP))[0], 3)


def written(layout: Layout, ranks: int = 4, cluster: str = "cpu", **size):
    """The forward GPT planned as `layout` (hints and training passes), its composed estimate."""
    module = forward_gpt(ranks, **size)
    graph = lg.graphs(module)[0]
    batch = {**SIZE, **size}["batch"]
    c = load_cluster(cluster, ranks)
    layers = split_layers(graph)
    training = PassPipeline.parse_spec(TRAINING_PASSES, TRAIN).passes
    profiler = Profiler(graph, "loss", c, cluster, "cpu", batch, layer_passes(training[-1], cluster))
    estimate = Composer(layers, profiler, c, list(range(ranks)), batch, "adam").estimate(layout)
    assert not estimate.rejected, estimate.rejected
    write_layout(module, estimate.layout, training, "loss",
                 ProfileHints(layers, estimate, profiler, list(range(ranks)), batch))
    module.verify()
    return module, estimate


LAYOUTS = [  # between them: data, tensor and both, stages of 1, 2 and 4 devices, every memory mode and policy
    pytest.param(by_layers(1, 2, 2, 2, "zero", "gpipe"), marks=pytest.mark.full),  # zero and gpipe: below
    by_layers(1, 2, 2, 1, "fsdp", "gpipe", "selective"),
    by_layers(2, 2, 1, 4, "zero", "1f1b", "full"),  # (a recomputed batch reshape once deadlocked this one)
    by_layers(4, 1, 1, 4, "replicated", "1f1b"),
]


@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda layout: layout.describe())
def test_every_kind_of_layered_plan_trains_like_one_device(layout):
    module, _ = written(layout)
    if layout.stages > 1:
        assert len([o for o in module.ops if o.name == "sbp.placement"]) == layout.stages
    CompilePass().apply(Context(), module)
    reference = forward_gpt()
    PassPipeline.parse_spec(TRAINING_PASSES, TRAIN).apply(Context(), reference)
    feeds = generated_feeds(plan.programs(module)[0], 0)
    feeds["lr"] = np.asarray(1e-2, np.float32)
    params = {op.key.data: initial_value(op) for op in reference.walk() if isinstance(op, lg.ParamOp)}
    want = evaluate(reference, feeds, params)
    got = run_plan(module, feeds, {})
    assert set(want) <= set(got)
    for key in want:
        np.testing.assert_allclose(got[key], want[key], rtol=1e-4, atol=1e-5, err_msg=key)


@pytest.mark.parametrize("layout", [by_layers(2, 2, 1, 2, "replicated", "1f1b"),
                                    pytest.param(by_layers(1, 2, 2, 1, "replicated"), marks=pytest.mark.full)],
                         ids=lambda layout: layout.describe())
def test_the_composed_time_is_near_the_simulated_whole_plan(layout):
    size = {"batch": 8, "seq": 32, "dim": 64, "heads": 4, "layers": 2}
    module, estimate = written(layout, **size)
    CompilePass().apply(Context(), module)
    simulated = simulate_plan(module, load_cluster("cpu", 4), steps=4)
    assert abs(estimate.step_time / simulated.step_time - 1) < 0.3, (estimate.step_time, simulated.step_time)


@pytest.mark.parametrize("layout", [by_layers(1, 4, 1, 1, "replicated"), by_layers(1, 2, 2, 1, "replicated"),
                                    by_layers(1, 1, 4, 1, "replicated"),
                                    by_layers(2, 2, 1, 4, "replicated", "1f1b")],
                         ids=lambda layout: layout.describe())
def test_on_gpus_the_composed_time_is_within_a_tenth_of_the_simulated_whole_plan(layout):
    """Issue 56's bound, on the H100 preset: data, tensor, 2-D and
    pipeline layouts of a GPT trained with Adam (whose updates, priced
    from simulating them lowered, are a third of these steps)."""
    size = {"batch": 16, "seq": 64, "dim": 128, "heads": 4, "layers": 4}
    module, estimate = written(layout, cluster="h100", **size)
    CompilePass(representatives=True, device="h100").apply(Context(), module)
    simulated = simulate_plan(module, load_cluster("h100", 4), steps=4)
    assert abs(estimate.step_time / simulated.step_time - 1) < 0.1, (estimate.step_time, simulated.step_time)


@pytest.mark.parametrize("cluster", ["cpu", "h100"])
def test_an_update_is_priced_as_the_simulator_runs_it(cluster):
    """The layer search prices the optimizer's update of each parameter from
    a fit to simulating it lowered (one and two parameters of one element,
    one of n and of 2n). Parameters of other sizes, from a bias to one far
    over the cache, take what the fit says, for Adam and for the plain SGD
    update taken off the layers' profiles, in float32 and bfloat16."""
    graph = lg.graphs(forward_gpt(2))[0]
    adam = PassPipeline.parse_spec(TRAINING_PASSES, TRAIN).passes[-1]
    profiler = Profiler(graph, "loss", load_cluster(cluster, 2), cluster, "cpu", SIZE["batch"],
                        layer_passes(adam, cluster))
    sizes = [7, 3000, 300_000, 3_000_000]
    for which in ("step", "sgd"):
        for element in (f32, bf16):
            price = profiler.update_price(which, element)
            simulated = profiler.update_time(sizes, element, which)
            priced = price.per_step + sum(price.seconds(n) for n in sizes)
            assert priced == pytest.approx(simulated, rel=0.05), (which, element)
    assert profiler.update_price("step", f32).per_element > 2 * profiler.update_price("sgd", f32).per_element


def test_candidates_keep_tensor_parallelism_inside_a_node_and_divide_the_batch():
    candidates = candidate_layouts(64, 8, 64, 48, ("replicated", "zero", "fsdp"))
    assert {c.tensor for c in candidates} == {1, 2, 4, 8}
    assert all(c.stages * c.data * c.tensor == 64 for c in candidates)
    assert all(64 % (c.data * c.micro_batches) == 0 for c in candidates)
    assert all(c.micro_batches >= c.stages for c in candidates if c.stages > 1)
    assert all(c.memory == "replicated" for c in candidates if c.data == 1)


def test_search_by_layers_fits_a_budget_and_explains():
    free = forward_gpt(2)
    SbpAutoplanPass(search="layers", training=TRAIN, explain=True).apply(Context(), free)
    graph = lg.graphs(free)[0]
    assert "by layers: 4 layers of 4 kinds" in graph.attributes["sbp.autoplan"].data
    fastest = graph.attributes["sbp.autoplan"].data
    alternatives = [a.data for a in graph.attributes["sbp.autoplan.alternatives"].data]
    assert alternatives[0] in fastest
    assert any(a.startswith("2 stages") for a in alternatives)  # the best pipeline is listed too

    def mib(text: str) -> float:
        return float(re.search(r"([0-9.]+) MiB per device", text).group(1)) * 2**20

    budget = int(0.9 * mib(fastest))  # the fastest plan no longer fits
    assert budget > min(mib(a) for a in alternatives)

    module = forward_gpt(2)
    SbpAutoplanPass(search="layers", training=TRAIN, memory_budget=budget).apply(Context(), module)
    chosen = lg.graphs(module)[0].attributes["sbp.autoplan"].data
    assert mib(chosen) <= budget, chosen
    CompilePass().apply(Context(), module)
    assert plan.programs(module)


def test_the_plan_chosen_within_a_budget_holds_within_it_compiled():
    # the budget checked against what the compiled plan holds, not against
    # the planner's own estimate of it (as test_autoplan.py checks the whole
    # search). Here the layers' sum for the fastest layout under the budget
    # (68,800 bytes against 70,118) is under what it holds compiled (79,936):
    # the search compiles its choice, finds it over, and takes the next.
    free = forward_gpt(2)
    SbpAutoplanPass(search="layers", training=TRAIN, explain=True).apply(Context(), free)
    fastest = lg.graphs(free)[0].attributes["sbp.autoplan"].data
    budget = int(0.9 * float(re.search(r"([0-9.]+) MiB per device", fastest).group(1)) * 2**20)
    module = forward_gpt(2)
    SbpAutoplanPass(search="layers", training=TRAIN, memory_budget=budget, explain=True).apply(Context(), module)
    alternatives = [a.data for a in lg.graphs(module)[0].attributes["sbp.autoplan.alternatives"].data]
    assert any("rejected: compiled, it holds" in a for a in alternatives), alternatives
    CompilePass().apply(Context(), module)
    held = max(d.arena.value.data + d.persistent.value.data for d in plan.programs(module)[0].devices())
    assert held <= budget, (held, budget)


def test_search_by_layers_needs_the_training_passes():
    with pytest.raises(PassFailedException, match="search=layers plans a forward graph"):
        SbpAutoplanPass(search="layers").apply(Context(), forward_gpt())
    with pytest.raises(PassFailedException, match="unknown search 'sideways'"):
        SbpAutoplanPass(search="sideways", training=TRAIN).apply(Context(), forward_gpt())


def test_the_pipeline_replay_gives_the_textbook_period_on_balanced_stages_and_more_when_unbalanced():
    from sbpc.planning.autoplan.compose import pipeline_period

    for schedule in ("gpipe", "1f1b"):
        # p = 4 equal stages, m = 8: (m + p - 1) cycles of F + B
        assert pipeline_period([1.0] * 4, [2.0] * 4, [0.0] * 3, [0.0] * 4, 8, schedule) == pytest.approx(11 * 3.0)
    balanced = pipeline_period([1.0] * 4, [2.0] * 4, [0.0] * 3, [0.5] * 4, 8, "1f1b")
    slow_middle = pipeline_period([1.0, 1.0, 2.0, 1.0], [2.0, 2.0, 4.0, 2.0], [0.0] * 3, [0.5] * 4, 8, "1f1b")
    # the slow stage's 8 x 6 of work; between its steps the backwards after it (2 + 2), stage 0's
    # tail and the next step's forwards before it (1 + 1); one wait in its warm-up for the last stage
    assert slow_middle == pytest.approx(8 * 6.0 + 2 * 1.0 + 2 * 2.0 + 0.5 + 1.0)
    assert balanced < slow_middle
    hops = pipeline_period([1.0] * 4, [2.0] * 4, [0.25] * 3, [0.0] * 4, 8, "1f1b")
    assert hops >= 33.0 + 2 * 3 * 0.25  # at least the fill and the drain cross every boundary


def test_a_stages_gradient_reductions_in_its_last_backward_delay_every_stage_before_it():
    """On one lane per device, a tensor-parallel stage's last backward waits
    for its queued data-parallel reductions (`drag`); the gradient it hands
    the stage before it comes that much later, so the drags of the stages
    add up along the drain, where the same time in each stage's tail
    (after its backward) overlaps across stages."""
    from sbpc.planning.autoplan.compose import pipeline_period

    args = ([1.0] * 4, [2.0] * 4, [0.0] * 3)
    base = pipeline_period(*args, [0.5] * 4, 8, "1f1b")
    assert pipeline_period(*args, [1.5] * 4, 8, "1f1b") == pytest.approx(base + 1.0)
    assert pipeline_period(*args, [0.5] * 4, 8, "1f1b", [1.0] * 4) == pytest.approx(base + 4.0)
    assert pipeline_period(*args, [0.5] * 4, 8, "1f1b", [0.0, 0.0, 0.0, 1.0]) == pytest.approx(base + 1.0)


def test_rebatch_takes_a_batch_norms_statistics_over_the_smaller_batch():
    """The profiler's smaller batch: statistics over the batch axis (a
    batch-norm's mean, kept as [1, C] and reshaped to [C]) stay the
    channels' shape; what reads the batch gets the smaller batch. (The
    micro-batch pass itself would join them: it means the whole batch.)"""
    module = parse_module("""
    lg.graph @step {
      %x = lg.input "x" : tensor<8x4xf32>
      %mean = lg.reduce_mean %x axes [0] keepdims : tensor<8x4xf32> -> tensor<1x4xf32>
      %flat = lg.reshape %mean : tensor<1x4xf32> -> tensor<4xf32>
      %y = lg.sub %x, %flat : (tensor<8x4xf32>, tensor<4xf32>) -> tensor<8x4xf32>
      %loss = lg.reduce_mean %y axes [0, 1] : tensor<8x4xf32> -> tensor<f32>
      lg.output ["loss"] %loss : tensor<f32>
    }
    """)
    graph = next(iter(lg.graphs(module)))
    rebatch(graph, 2)
    module.verify()
    shapes = {op.results[0].name_hint: tuple(op.results[0].type.get_shape()) for op in graph.body.ops if op.results}
    assert shapes == {"x": (2, 4), "mean": (1, 4), "flat": (4,), "y": (2, 4), "loss": ()}
