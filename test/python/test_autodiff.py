"""lg-autodiff: every gradient rule against central finite differences
(float64, on graphs that cover every differentiable op), gradient
accumulation over several uses, and diagnostics."""

import numpy as np
import pytest
from xdsl.context import Context

import sbpc
from sbpc.dialects import lg
from sbpc.lowering.lg_autodiff import LgAutodiffPass
from sbpc.semantics.reference import evaluate, initial_value


def params_of(module):
    return {op.key.data: initial_value(op) for op in module.ops.last.body.ops if op.name == "lg.param"}


def check_gradients(g: sbpc.Graph, feeds, eps=1e-6, rtol=1e-5, atol=1e-8):
    module = g.module()
    params = params_of(module)
    differentiated = g.module()
    LgAutodiffPass().apply(Context(), differentiated)
    differentiated.verify()
    out = evaluate(differentiated, feeds, params)
    trained = {op.key.data for op in module.ops.last.body.ops if isinstance(op, lg.ParamOp) and op.trained}
    for key, value in params.items():
        if key not in trained:  # state (the random numbers' seed and step) gets no gradient
            continue
        numeric = np.zeros_like(value)
        for index in np.ndindex(value.shape):
            for sign in (1, -1):
                shifted = dict(params)
                shifted[key] = value.copy()
                shifted[key][index] += sign * eps
                numeric[index] += sign * evaluate(module, feeds, shifted)["loss"] / (2 * eps)
        np.testing.assert_allclose(out[f"grad.{key}"], numeric, rtol=rtol, atol=atol, err_msg=f"d loss / d {key}")


RNG = np.random.default_rng(0)


def test_mlp_with_bias_gelu_and_cross_entropy():
    g = sbpc.Graph("mlp")
    x = g.input("x", (5, 4), dtype="f64")
    y = g.input("labels", (5,), dtype="i64")
    w1 = g.param("w1", (4, 6), init=sbpc.normal(0, 0.5), dtype="f64", seed=1)
    b1 = g.param("b1", (6,), init=sbpc.normal(0, 0.1), dtype="f64", seed=2)
    w2 = g.param("w2", (6, 3), init=sbpc.normal(0, 0.5), dtype="f64", seed=3)
    g.output(loss=sbpc.cross_entropy(sbpc.gelu(x @ w1 + b1) @ w2, y))
    check_gradients(g, {"x": RNG.normal(size=(5, 4)), "labels": np.array([0, 2, 1, 1, 0])})


def test_elementwise_ops_and_mse():
    g = sbpc.Graph("elementwise")
    x = g.input("x", (3, 4), dtype="f64")
    t = g.input("t", (3, 4), dtype="f64")
    w = g.param("w", (4,), init=sbpc.uniform(0.5, 1.5), dtype="f64", seed=4)
    v = g.param("v", (3, 1), init=sbpc.uniform(-1.0, 1.0), dtype="f64", seed=5)
    a = sbpc.relu(x * w - v) + sbpc.tanh(w) - sbpc.exp(-x * v) / sbpc.sqrt(w * w + 1.0)
    b = sbpc.rsqrt(v * v + 2.0) * a + (x / w) - (v - x)
    g.output(loss=sbpc.mse_loss(b, t) + sbpc.reduce_mean(a * a))
    check_gradients(g, {"x": RNG.normal(size=(3, 4)), "t": RNG.normal(size=(3, 4))})


def test_normalizations_reductions_and_shapes():
    g = sbpc.Graph("shapes")
    x = g.input("x", (2, 3, 4), dtype="f64")
    w = g.param("w", (4,), init=sbpc.normal(1.0, 0.2), dtype="f64", seed=6)
    b = g.param("b", (4,), init=sbpc.normal(0.0, 0.2), dtype="f64", seed=7)
    p = g.param("p", (3, 4), init=sbpc.normal(0.0, 1.0), dtype="f64", seed=8)
    h = sbpc.layernorm(x + p, w, b, axis=2) + sbpc.layernorm(x * p, axis=1)
    s = sbpc.softmax(h, axis=2) * sbpc.log_softmax(h * 2.0, axis=0)
    t = s.transpose(2, 0, 1).reshape(4, 6)
    c = sbpc.concat([t, sbpc.broadcast_to(p.sum(axes=0, keepdims=True).T, (4, 6))], axis=1)
    cut = sbpc.slice(c, [1, 2], [4, 11])
    g.output(loss=(cut * cut).sum() + s.mean(axes=(0, 1)).sum())
    check_gradients(g, {"x": RNG.normal(size=(2, 3, 4))})


def test_batched_matmul_transposes_broadcasting_and_embedding():
    g = sbpc.Graph("attention")
    ids = g.input("ids", (2, 3), dtype="i64")
    table = g.param("table", (5, 4), init=sbpc.normal(0.0, 1.0), dtype="f64", seed=9)
    wq = g.param("wq", (4, 4), init=sbpc.normal(0.0, 0.5), dtype="f64", seed=10)
    wk = g.param("wk", (4, 4), init=sbpc.normal(0.0, 0.5), dtype="f64", seed=11)
    e = sbpc.embedding(table, ids)                      # (2, 3, 4), table used twice below
    q, k = e @ wq, sbpc.matmul(e, wk, transpose_b=True)
    scores = sbpc.softmax(sbpc.matmul(q, k, transpose_b=True) * 0.5, axis=2)  # (2, 3, 3)
    out = sbpc.matmul(scores, e) + sbpc.matmul(wq, e, transpose_a=True, transpose_b=True).transpose(0, 2, 1)
    g.output(loss=(out * out).mean() + (table * table).sum())
    check_gradients(g, {"ids": np.array([[0, 1, 1], [4, 2, 0]])})


def test_scans_gathers_padding_and_the_vocabulary_parallel_cross_entropy():
    g = sbpc.Graph("picks")
    labels = g.input("labels", (4,), dtype="i64")
    picks = g.input("picks", (4, 2), dtype="i64")
    w = g.param("w", (4, 5), init=sbpc.normal(0.0, 1.0), dtype="f64", seed=12)
    v = g.param("v", (4, 3), init=sbpc.normal(0.0, 1.0), dtype="f64", seed=13)
    logits = sbpc.cumsum(w, 1) * 0.5 + sbpc.cumsum(w, 0, reverse=True) * 0.25
    tokens = sbpc.token_cross_entropy(logits, labels, ignore_index=-100)  # lg.token_cross_entropy_grad
    shift = g.param("shift", (4,), init=sbpc.normal(0.0, 1.0), dtype="f64", seed=14)
    sums = g.add(lg.SumExpOp(v.value, shift.value))  # its own gradient, through both operands
    padded = sbpc.pad(v, [1, 0], [0, 2], 0.5)  # (5, 5)
    picked = sbpc.gather(w, picks, 1)  # lg.scatter_add
    g.output(loss=tokens.sum() + sums.sum() * 0.1 + (padded * padded).sum() * 0.1 + (picked * picked).sum())
    check_gradients(g, {"labels": np.array([1, -100, 4, 0]), "picks": np.array([[0, 0], [4, 1], [2, 3], [1, 1]])})


def test_dropout_scales_the_gradient_by_the_forward_mask():
    # the backward draws the mask again (same seed, step and stream)
    g = sbpc.Graph("dropped")
    w = g.param("w", (6, 5), init=sbpc.normal(0.0, 1.0), dtype="f64", seed=15)
    h = sbpc.dropout(sbpc.tanh(w), 0.4)
    g.output(loss=(sbpc.dropout(h * h, 0.2) * w).sum())
    check_gradients(g, {})


@pytest.mark.parametrize("stride, padding, dilation, groups",
                         [((1, 1), (0, 0), (1, 1), 1), ((2, 1), (1, 2), (1, 2), 2)])
def test_convolutions_and_max_pooling(stride, padding, dilation, groups):
    g = sbpc.Graph("conv")
    x = g.input("x", (2, 4, 6, 5), dtype="f64")
    w = g.param("w", (6, 4 // groups, 3, 2), init=sbpc.normal(0.0, 0.5), dtype="f64", seed=15)
    lift = g.param("lift", (2, 4, 6, 5), init=sbpc.normal(0.0, 0.5), dtype="f64", seed=16)  # the input's gradient
    y = sbpc.conv2d(x * lift, w, stride, padding, dilation, groups)
    pooled = g.add(lg.MaxPool2dOp(y.value, (2, 2), (1, 2), (1, 0)))  # lg.max_pool2d_grad
    g.output(loss=(y * y).mean() + (pooled * pooled).sum() * 0.1)
    check_gradients(g, {"x": RNG.normal(size=(2, 4, 6, 5))})


def test_unused_parameters_get_zero_gradients_and_hints_pass_through():
    where = sbpc.placement("cpu", ranks=2)
    g = sbpc.Graph("hinted", placement=where)
    x = g.input("x", (4, 3), sbp=sbpc.S(0), dtype="f64")
    w = g.param("w", (3, 2), init=sbpc.ones(), dtype="f64")
    unused = g.param("unused", (2,), dtype="f64")
    g.output(loss=sbpc.reduce_sum(x @ w.to(sbpc.B)), other=unused)
    module = g.module()
    LgAutodiffPass().apply(Context(), module)
    out = evaluate(module, {"x": np.ones((4, 3))})
    np.testing.assert_array_equal(out["grad.w"], np.full((3, 2), 4.0))
    np.testing.assert_array_equal(out["grad.unused"], np.zeros(2))


def test_diagnostics():
    g = sbpc.Graph("bad")
    x = g.input("x", (3,), dtype="f64")
    w = g.param("w", (3,), dtype="f64")
    g.output(notloss=x * w)
    with pytest.raises(Exception, match='no output named "loss"'):
        LgAutodiffPass().apply(Context(), g.module())
    with pytest.raises(Exception, match='the loss "notloss" must be a scalar'):
        LgAutodiffPass(loss="notloss").apply(Context(), g.module())
    g2 = sbpc.Graph("max")
    w2 = g2.param("w", (3,), dtype="f64")
    g2.output(loss=sbpc.reduce_max(w2))
    with pytest.raises(Exception, match="'lg.reduce_max': lg-autodiff cannot differentiate this op"):
        LgAutodiffPass().apply(Context(), g2.module())


@pytest.mark.parametrize("ranks, mesh", [(2, None), (4, (2, 2))])
def test_distributed_training_gradients_match_the_reference(ranks, mesh):
    """Forward + backward compiled to a data-parallel (and, on 2x2, also
    model-parallel) plan: the gradients the plan computes on real arenas, and
    on real MPI ranks, equal the reference."""
    where = sbpc.placement("cpu", ranks=ranks, mesh=mesh)
    g = sbpc.Graph("train", placement=where)
    batch = [sbpc.S(0)] + [sbpc.B] * (len(where.mesh) - 1)
    ids = g.input("ids", (8, 3), dtype="i64", sbp=batch)
    labels = g.input("labels", (8, 3), dtype="i64", sbp=batch)
    table = g.param("table", (10, 8), init=sbpc.normal(0.0, 0.5), seed=1)
    w = g.param("w", (8, 10), init=sbpc.normal(0.0, 0.5), seed=2)
    h = sbpc.layernorm(sbpc.relu(sbpc.embedding(table, ids)), axis=-1)
    g.output(loss=sbpc.cross_entropy(h @ w, labels))
    module = g.module()
    LgAutodiffPass().apply(Context(), module)
    rng = np.random.default_rng(1)
    feeds = {"ids": rng.integers(0, 10, (8, 3)), "labels": rng.integers(0, 10, (8, 3))}
    expected = evaluate(module, feeds)
    exe = sbpc.compile(module)
    simulated = sbpc.compile(module, mode="simulate").run(feeds)
    real = exe.run(feeds)
    for name in expected:
        np.testing.assert_allclose(simulated[name], expected[name], rtol=1e-4, atol=1e-6, err_msg=name)
        np.testing.assert_allclose(real[name], expected[name], rtol=1e-4, atol=1e-6, err_msg=name)
    # data parallel: each rank's weight gradient is a partial sum over the
    # data axis (fetched outputs are summed; an optimizer would all_reduce)
    import re

    fetched = re.search(r'fetch "grad.w" of !sbp.dtensor<8x10xf32, @\S+, (\[?P)', exe.plan_text)
    assert fetched, "grad.w is not partial over the data axis"


@pytest.mark.parametrize("schedule, order", [("1f1b", [0, 1, 2, 3]), ("gpipe", [3, 2, 1, 0])])
def test_micro_batch_weight_gradients_are_summed_in_the_order_the_schedule_makes_them(schedule, order):
    # 1F1B runs micro-batch 0's backward first: ((dW0 + dW1) + dW2) + dW3
    # frees each part as the next arrives (GPipe's backward runs 3 first).
    from sbpc.dialects import lg
    from sbpc.lowering.lg_micro_batch import LgMicroBatchPass
    from sbpc.lowering.sbp_to_plan import micro_batch_labels

    g = sbpc.Graph("mlp")
    x = g.input("x", (8, 4))
    w = g.param("w", (4, 3), init=sbpc.normal(0.0, 0.5), seed=1)
    g.output(loss=sbpc.reduce_mean(sbpc.tanh(x @ w), axes=[0, 1]))
    module = g.module()
    LgMicroBatchPass(count=4, schedule=schedule).apply(Context(), module)
    LgAutodiffPass().apply(Context(), module)
    graph = lg.graphs(module)[0]
    labels = micro_batch_labels(list(graph.body.ops))
    out = graph.output()
    total = out.values[[n.data for n in out.names.data].index("grad.w")]
    parts = []
    while isinstance(total.owner, lg.AddOp):
        total, last = total.owner.operands
        parts.append(labels[last.owner])
    parts.append(labels[total.owner])
    assert parts[::-1] == order
