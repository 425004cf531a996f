"""sbpc.moe.layer: routing, capacity and dropping against numpy, and the
same tokens dropped (the same losses) on every plan."""

import math
import sys
from pathlib import Path

import numpy as np
import pytest

import sbpc
from sbpc import moe

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "examples"))
from models import corpus, gpt, gpt_batches, reference_losses  # noqa: E402


def numpy_moe(x, router, w_in, w_out, top_k, capacity_factor):
    """The layer written plainly: each token's top k experts by router
    probability (renormalized), slots given in token order, a copy past its
    expert's capacity dropped; Switch's load-balancing loss."""
    tokens, experts = x.shape[0], router.shape[1]
    logits = x @ router
    probs = np.exp(logits - logits.max(axis=1, keepdims=True))
    probs /= probs.sum(axis=1, keepdims=True)
    slots = tokens if capacity_factor is None else math.ceil(capacity_factor * tokens * top_k / experts)
    used = np.zeros(experts, int)
    y = np.zeros_like(x)
    routed = np.zeros(experts)
    kept = 0
    for t in range(tokens):
        order = np.argsort(-probs[t], kind="stable")[:top_k]
        gates = probs[t, order] / probs[t, order].sum()
        for e, gate in zip(order, gates):
            routed[e] += 1
            if used[e] < slots:
                used[e] += 1
                kept += 1
                h = x[t] @ w_in[e]
                h = 0.5 * h * (1 + np.tanh(np.sqrt(2 / np.pi) * (h + 0.044715 * h ** 3)))
                y[t] += gate * (h @ w_out[e])
    balance = experts * np.sum(routed / (tokens * top_k) * probs.mean(axis=0))
    return y, balance, kept / (tokens * top_k)


@pytest.mark.parametrize("capacity_factor", [None, 1.0, 0.5])
def test_routing_capacity_and_dropping_as_written_plainly(capacity_factor):
    rng = np.random.default_rng(1)
    tokens, dim, experts, hidden = 12, 6, 4, 5
    values = {"x": rng.normal(size=(tokens, dim)), "router": rng.normal(size=(dim, experts)),
              "w_in": rng.normal(size=(experts, dim, hidden)) * 0.5, "w_out": rng.normal(size=(experts, hidden, dim))}
    g = sbpc.Graph("moe", placement=sbpc.placement("cpu", 1))
    x, router, w_in, w_out = (g.input(k, v.shape, dtype="f64") for k, v in values.items())
    y, balance, kept = moe.layer(x, router, w_in, w_out, top_k=2, capacity_factor=capacity_factor)
    g.output(y=y, balance=balance, kept=kept)
    got = sbpc.compile(g, mode="interpret").run(values)
    want = numpy_moe(*values.values(), 2, capacity_factor)
    np.testing.assert_allclose(got["y"], want[0], rtol=1e-12, atol=1e-12)
    assert float(got["balance"]) == pytest.approx(want[1], rel=1e-12)
    assert float(got["kept"]) == want[2]
    if capacity_factor == 0.5:
        assert want[2] < 0.75  # half the even share: many tokens dropped


def test_capacity_rounds_up_an_even_share_and_refuses_a_bad_factor():
    assert moe.capacity(64, 4, 2, 1.0) == 32 and moe.capacity(10, 4, 1, 1.0) == 3
    assert moe.capacity(64, 4, 2, None) == 64 and moe.capacity(8, 4, 2, 100.0) == 8
    with pytest.raises(ValueError, match="capacity_factor must be positive"):
        moe.capacity(8, 4, 2, 0.0)


PLANS = {"1 rank": ("ep", 1), "data parallel 2": ("dp", 2), "expert parallel 2": ("ep", 2),
         "expert x data 2x2": ("ep-dp", 4), "expert x tensor 2x2": ("ep-tp", 4)}
MOE_GPT = {"batch": 8, "seq": 8, "dim": 16, "heads": 2, "layers": 2, "experts": 4, "top_k": 2,
           "capacity_factor": 1.0}
STEPS = 3


@pytest.mark.parametrize("plan", [pytest.param(p, marks=[] if p == "expert parallel 2"
                                               else [pytest.mark.full]) for p in PLANS])
def test_the_moe_gpt_drops_the_same_tokens_on_every_plan(plan):
    """Capacity is counted over the whole batch (a running count over the
    tokens, whatever splits them), so each plan drops the same tokens as
    the single-device reference interpreter and trains to the same losses."""
    vocab = len(corpus()[1])
    variant, ranks = PLANS[plan]
    module = gpt(variant, ranks, vocab, **MOE_GPT)
    reference = reference_losses(module, gpt_batches(8, 8), STEPS)
    exe = sbpc.compile(module, mode="interpret" if ranks == 1 else "auto")
    data = gpt_batches(8, 8)
    steps = [exe.train_step(next(data)) for _ in range(STEPS)]
    np.testing.assert_allclose([float(s["loss"]) for s in steps], reference, rtol=1e-6)
    assert all(float(s["kept"]) < 1.0 for s in steps)  # tokens were dropped


MICRO_BATCHED = {"2 micro-batches": ("ep", 1, 2), "expert parallel 2, 2 micro-batches": ("ep", 2, 2),
                 "2 pipeline stages, 4 micro-batches": ("pipeline", 2, None)}


@pytest.mark.parametrize("plan", [pytest.param(p, marks=[] if p == "2 micro-batches" else [pytest.mark.full])
                                  for p in MICRO_BATCHED])
def test_micro_batches_drop_the_tokens_the_whole_batch_drops(plan):
    """lg-micro-batch runs the capacity's running count, the balance loss's
    means over the tokens and the dispatch into the experts' buffers once,
    on the whole batch joined from the micro-batches: the losses are those
    of the batch in one piece."""
    vocab = len(corpus()[1])
    variant, ranks, micro_batches = MICRO_BATCHED[plan]
    whole = reference_losses(gpt("ep", 1, vocab, **MOE_GPT), gpt_batches(8, 8), STEPS)
    module = gpt(variant, ranks, vocab, micro_batches=micro_batches, **MOE_GPT)
    exe = sbpc.compile(module, mode="interpret" if ranks == 1 else "auto")
    data = gpt_batches(8, 8)
    steps = [exe.train_step(next(data)) for _ in range(STEPS)]
    np.testing.assert_allclose([float(s["loss"]) for s in steps], whole, rtol=1e-6)
    assert all(float(s["kept"]) < 1.0 for s in steps)  # tokens were dropped


def test_the_1f1b_schedule_refuses_an_op_that_needs_the_whole_batch_by_name():
    with pytest.raises(Exception, match="lg.cumsum.*lg-micro-batch.*1f1b schedule"):
        gpt("pipeline", 2, len(corpus()[1]), schedule="1f1b", **MOE_GPT)


@pytest.mark.full
def test_the_moe_example_trains_expert_parallel_and_checks_its_first_step():
    import subprocess

    example = Path(__file__).resolve().parents[3] / "examples" / "moe.py"
    done = subprocess.run([sys.executable, str(example), "--ranks", "2", "--parallel", "ep", "--steps", "3"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "single-device reference" in done.stdout and "kept" in done.stdout  # (the script checks the step)
