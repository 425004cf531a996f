"""lg-autodiff: every gradient rule against central finite differences
(float64, on graphs that cover every differentiable op), gradient
accumulation over several uses, and diagnostics."""

import numpy as np
import pytest
from xdsl.context import Context

import sbpc
from sbpc.dialects import lg, parse_module
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
        if f"grad.{key}" not in out:  # outside the loss: no gradient (PyTorch's None), and none measured
            np.testing.assert_array_equal(numeric, 0.0, err_msg=f"d loss / d {key}, which autodiff left out")
            continue
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
    gram = sbpc.matmul(e, q, transpose_a=True)  # (2, 4, 4): a transposed lhs alone
    g.output(loss=(out * out).mean() + (table * table).sum() + (gram * gram).mean())
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
    pooled = sbpc.max_pool2d(y, 2, (1, 2), (1, 0))  # lg.max_pool2d_grad
    g.output(loss=(y * y).mean() + (pooled * pooled).sum() * 0.1)
    check_gradients(g, {"x": RNG.normal(size=(2, 4, 6, 5))})


def _ids(g, name, shape, high):
    return g.input(name, shape, dtype="i64"), {name: np.random.default_rng(len(name)).integers(0, high, shape)}


def _square(t):
    return t.reshape(1, 1, 3, 4)


GRADIENT_SAMPLES = {
    # op -> a value that uses it, built from the (3, 4) float64 parameters a
    # (normal) and b (in [0.5, 1.5]), with the feeds it needs
    lg.NegOp: lambda g, a, b: (sbpc.neg(a), {}),
    lg.ReluOp: lambda g, a, b: (sbpc.relu(a), {}),
    lg.GeluOp: lambda g, a, b: (sbpc.gelu(a), {}),
    lg.TanhOp: lambda g, a, b: (sbpc.tanh(a), {}),
    lg.ErfOp: lambda g, a, b: (sbpc.erf(a), {}),
    lg.ExpOp: lambda g, a, b: (sbpc.exp(a), {}),
    lg.SqrtOp: lambda g, a, b: (sbpc.sqrt(b), {}),
    lg.RsqrtOp: lambda g, a, b: (sbpc.rsqrt(b), {}),
    lg.AddOp: lambda g, a, b: (a + b, {}),
    lg.SubOp: lambda g, a, b: (a - b, {}),
    lg.MulOp: lambda g, a, b: (a * b, {}),
    lg.DivOp: lambda g, a, b: (a / b, {}),
    lg.MatmulOp: lambda g, a, b: (sbpc.matmul(a, b, transpose_b=True), {}),
    # rows 0 | none | 1-2 by three experts [4, 1]; rows 0-1 | 2 by transposed experts [1, 4]
    lg.GroupedMatmulOp: lambda g, a, b: (
        sbpc.grouped_matmul(a, b.reshape(3, 4, 1), g.constant(np.array([1, 1, 3], np.int64)))
        + sbpc.grouped_matmul(a, b.reshape(3, 1, 4), g.constant(np.array([2, 3, 3], np.int32)),
                              transpose_experts=True), {}),
    lg.Conv2dOp: lambda g, a, b: (sbpc.conv2d(_square(a), sbpc.slice(b, [0, 0], [2, 2]).reshape(1, 1, 2, 2),
                                              padding=(1, 0)), {}),
    lg.MaxPool2dOp: lambda g, a, b: (g.add(lg.MaxPool2dOp(_square(a).value, (2, 2), (1, 1), (0, 0))), {}),
    # the gradients of the above, each differentiated again (PyTorch's double
    # backward): linear in their gradient, the max-pooling's also choosing by a
    # (overlapping windows over padding), the weight's and the images' both
    lg.Conv2dGradInputOp: lambda g, a, b: (g.add(lg.Conv2dGradInputOp(
        a.reshape(1, 1, 4, 3).value, sbpc.slice(b, [0, 0], [2, 2]).reshape(1, 1, 2, 2).value, (3, 4), (1, 1),
        (1, 0))), {}),
    lg.Conv2dGradWeightOp: lambda g, a, b: (g.add(lg.Conv2dGradWeightOp(
        _square(a).value, sbpc.slice(b, [0, 0], [2, 3]).reshape(1, 1, 2, 3).value, (2, 2), (1, 1), (0, 0))), {}),
    lg.MaxPool2dGradOp: lambda g, a, b: (g.add(lg.MaxPool2dGradOp(
        _square(a).value, sbpc.slice(b, [0, 0], [2, 2]).reshape(1, 1, 2, 2).value, (2, 2), (2, 2), (1, 0))), {}),
    # a repeated index sums its gradients; row 0, the padding, takes none
    lg.EmbeddingGradOp: lambda g, a, b: (lambda ids: (
        g.add(lg.EmbeddingGradOp((a * b).value, ids[0].value, 5, 0)), ids[1]))(_ids(g, "ids", (3,), 5)),
    lg.SoftmaxOp: lambda g, a, b: (sbpc.softmax(a, axis=1), {}),
    lg.LogSoftmaxOp: lambda g, a, b: (sbpc.log_softmax(a, axis=0), {}),
    lg.LayerNormOp: lambda g, a, b: (sbpc.layernorm(a, b.sum(axes=(0,)), b.mean(axes=(0,)), axis=1), {}),
    # second order: both the input and the gradient it is given get theirs
    lg.LayerNormGradOp: lambda g, a, b: (g.add(lg.LayerNormGradOp((a * 1.5).value, (b * b).value, 1, 1e-3)), {}),
    lg.ReduceSumOp: lambda g, a, b: (a.sum(axes=(1,)), {}),
    lg.ReduceMeanOp: lambda g, a, b: (a.mean(axes=(0,)), {}),
    lg.ReduceMaxOp: lambda g, a, b: (sbpc.reduce_max(a * b, axes=(1,)), {}),  # (no ties: a is normal)
    lg.ReshapeOp: lambda g, a, b: (a.reshape(2, 6) * sbpc.slice(b.reshape(12), [0], [6]), {}),
    lg.BroadcastToOp: lambda g, a, b: (sbpc.broadcast_to(a, (2, 3, 4)) * b, {}),
    lg.TransposeOp: lambda g, a, b: (a.transpose(1, 0) @ b, {}),
    lg.ConcatOp: lambda g, a, b: (sbpc.concat([a, b * b], axis=1), {}),
    lg.SliceOp: lambda g, a, b: (sbpc.slice(a, [0, 1], [2, 4]) + sbpc.slice(b * b, [0, 0], [3, 4], [2, 3]).sum()
                                 + sbpc.slice(a, [1, 1], [3, 4], [1, 2]).sum(), {}),
    lg.PadOp: lambda g, a, b: (sbpc.pad(a, [1, 0], [0, 2], 0.5) * 2.0, {}),
    lg.CumsumOp: lambda g, a, b: (sbpc.cumsum(a, 1) + sbpc.cumsum(b, 0, reverse=True), {}),
    lg.DropoutOp: lambda g, a, b: (sbpc.dropout(a * b, 0.3), {}),
    lg.EmbeddingOp: lambda g, a, b: (lambda ids: (sbpc.embedding(a, ids[0]), ids[1]))(_ids(g, "ids", (2, 5), 3)),
    lg.GatherOp: lambda g, a, b: (lambda ids: (sbpc.gather(a, ids[0], 1), ids[1]))(_ids(g, "picks", (3, 2), 4)),
    # rows 2, 0, 0, 1 of a written with b's (row 0 twice: the last wins; every update gets its gradient)
    lg.ScatterOp: lambda g, a, b: (sbpc.scatter(a * 1.0, g.constant(np.array([[2, 0, 0, 1]] * 2, np.int64)),
                                                sbpc.slice(b, [0, 0], [2, 4]), 0), {}),
    lg.ScatterAddOp: lambda g, a, b: (lambda ids: (sbpc.scatter_add(a * b, ids[0], 1, 5), ids[1]))(
        _ids(g, "picks", (3, 4), 5)),
    lg.CrossEntropyOp: lambda g, a, b: (lambda ids: (sbpc.cross_entropy(a * b, ids[0]), ids[1]))(
        _ids(g, "labels", (3,), 4)),
    lg.SumExpOp: lambda g, a, b: (g.add(lg.SumExpOp(a.value, b.sum(axes=(1,)).value)), {}),
    lg.TokenCrossEntropyOp: lambda g, a, b: (lambda ids: (sbpc.token_cross_entropy(a * b, ids[0]), ids[1]))(
        _ids(g, "labels", (3,), 4)),
    lg.MseLossOp: lambda g, a, b: (sbpc.mse_loss(a, b), {}),
    lg.StepOp: lambda g, a, b: (g.add(lg.StepOp(a.value)) * a, {}),
    lg.LogOp: lambda g, a, b: (sbpc.log(b), {}),
    lg.SinOp: lambda g, a, b: (sbpc.sin(a), {}),
    lg.CosOp: lambda g, a, b: (sbpc.cos(a), {}),
    lg.AtanOp: lambda g, a, b: (sbpc.atan(a * 2.0), {}),
    # flat almost everywhere: the gradient through the rounding is zero, the product's is the rounded value
    lg.FloorOp: lambda g, a, b: (sbpc.floor(a * 3.0) * a, {}),
    lg.CeilOp: lambda g, a, b: (sbpc.ceil(a * 3.0) * a, {}),
    lg.RoundOp: lambda g, a, b: (sbpc.round(a * 3.0) * a, {}),
    lg.TruncOp: lambda g, a, b: (sbpc.trunc(a * 3.0) * a, {}),
    lg.FloorDivOp: lambda g, a, b: (sbpc.cast(sbpc.floordiv(sbpc.cast(a * 5.0, "i64"), -2), "f64") * a, {}),
    lg.CastOp: lambda g, a, b: (sbpc.cast(sbpc.cast(a, "f32"), "f64") * b, {}),
    lg.CompareOp: lambda g, a, b: (sbpc.cast(sbpc.compare("gt", a, b), "f64") * a, {}),
    lg.LogicalOp: lambda g, a, b: (sbpc.cast(sbpc.logical("or", sbpc.compare("gt", a, b),
                                                          sbpc.compare("lt", a, -b)), "f64") * b, {}),
    lg.SelectOp: lambda g, a, b: (sbpc.where(sbpc.compare("gt", a, b), a * 2.0, b), {}),
}


NOT_A_DERIVATIVE = {lg.StopGradientOp}
"""Ops whose gradient is by definition not the derivative finite
differences measure (each has its own test below)."""


@pytest.mark.parametrize("op", [op for op in lg.COMPUTE_OPS if op.differentiable() and op not in NOT_A_DERIVATIVE],
                         ids=lambda op: op.name)
def test_every_differentiable_op_against_finite_differences(op):
    # walks lg's ops: an op with a gradient rule and no sample here fails
    assert op in GRADIENT_SAMPLES, f"{op.name} has a gradient rule but no finite-difference check: add a sample"
    g = sbpc.Graph(op.name.removeprefix("lg."))
    a = g.param("a", (3, 4), init=sbpc.normal(0.0, 1.0), dtype="f64", seed=21)
    b = g.param("b", (3, 4), init=sbpc.uniform(0.5, 1.5), dtype="f64", seed=22)
    value, feeds = GRADIENT_SAMPLES[op](g, a, b)
    weights = g.constant(np.random.default_rng(3).normal(size=value.shape))  # every element's own weight
    g.output(loss=(value * weights).sum() + (value * value).sum() * 0.1)
    module = g.module()
    assert any(isinstance(o, op) for o in module.walk()), f"the sample of {op.name} does not use it"
    # a float32 round trip (lg.cast) needs a step float32 resolves, and gives float32's precision
    eps, rtol = (1e-2, 1e-3) if op is lg.CastOp else (1e-6, 1e-5)
    check_gradients(g, feeds, eps=eps, rtol=rtol, atol=1e-8 if op is not lg.CastOp else 1e-4)


def test_a_stopped_value_is_a_constant_to_autodiff():
    """loss = sum(stop_gradient(b) * b * a): b's gradient comes through the
    second factor alone (b * a, not 2 b * a), a's is b * b; the forward
    value is b's."""
    g = sbpc.Graph("stopped")
    a = g.param("a", (3, 4), init=sbpc.normal(0.0, 1.0), dtype="f64", seed=21)
    b = g.param("b", (3, 4), init=sbpc.uniform(0.5, 1.5), dtype="f64", seed=22)
    g.output(loss=(sbpc.stop_gradient(b) * b * a).sum())
    module = g.module()
    params = params_of(module)
    LgAutodiffPass().apply(Context(), module)
    out = evaluate(module, {}, params)
    va, vb = params["a"], params["b"]
    np.testing.assert_allclose(out["loss"], (vb * vb * va).sum(), rtol=1e-12)
    np.testing.assert_allclose(out["grad.b"], vb * va, rtol=1e-12)
    np.testing.assert_allclose(out["grad.a"], vb * vb, rtol=1e-12)


def test_parameters_outside_the_loss_get_no_gradient_flat_ones_zero_and_hints_pass_through():
    """As in PyTorch: a parameter the loss is not computed from (only
    another output reads it, or only through a stopped value or an
    integer) has no gradient (.grad None), one the loss is computed from
    with a zero derivative (through trunc) has zeros."""
    where = sbpc.placement("cpu", ranks=2)
    g = sbpc.Graph("hinted", placement=where)
    x = g.input("x", (4, 3), sbp=sbpc.S(0), dtype="f64")
    w = g.param("w", (3, 2), init=sbpc.ones(), dtype="f64")
    unused = g.param("unused", (2,), dtype="f64")
    stopped = g.param("stopped", (2,), dtype="f64")
    counted = g.param("counted", (2,), dtype="f64")
    flat = g.param("flat", (2,), dtype="f64")
    y = x @ w.to(sbpc.B)
    g.output(loss=sbpc.reduce_sum(y * sbpc.stop_gradient(stopped) + sbpc.cast(sbpc.cast(counted, "i64"), "f64")
                                  + sbpc.trunc(flat)), other=unused)
    module = g.module()
    LgAutodiffPass().apply(Context(), module)
    out = evaluate(module, {"x": np.ones((4, 3))})
    np.testing.assert_array_equal(out["grad.w"], np.zeros((3, 2)))  # (the stopped factor is 0)
    np.testing.assert_array_equal(out["grad.flat"], np.zeros(2))
    assert not {"grad.unused", "grad.stopped", "grad.counted"} & set(out)


def test_diagnostics():
    g = sbpc.Graph("bad")
    x = g.input("x", (3,), dtype="f64")
    w = g.param("w", (3,), dtype="f64")
    g.output(notloss=x * w)
    with pytest.raises(Exception, match='no output named "loss"'):
        LgAutodiffPass().apply(Context(), g.module())
    with pytest.raises(Exception, match='the loss "notloss" must be a scalar'):
        LgAutodiffPass(loss="notloss").apply(Context(), g.module())
    # an op only a backward graph holds, on the path from a parameter to the loss
    module = parse_module("""
    lg.graph @backward_op {
      %w = lg.param "w" init #lg.normal<0.0, 1.0> : tensor<8x4xf32>
      %x = lg.input "x" : tensor<8x2xf32>
      %e = lg.input "e" : tensor<3xi64>
      %dw = lg.grouped_matmul_grad_weight %w, %x, %e
          : (tensor<8x4xf32>, tensor<8x2xf32>, tensor<3xi64>) -> tensor<3x4x2xf32>
      %loss = lg.reduce_sum %dw axes [0, 1, 2] : tensor<3x4x2xf32> -> tensor<f32>
      lg.output ["loss"] %loss : tensor<f32>
    }""", "backward_op")
    with pytest.raises(Exception, match="'lg.grouped_matmul_grad_weight': lg-autodiff cannot differentiate this op"):
        LgAutodiffPass().apply(Context(), module)


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
    interpreted = sbpc.compile(module, mode="interpret").run(feeds)
    real = exe.run(feeds)
    for name in expected:
        np.testing.assert_allclose(interpreted[name], expected[name], rtol=1e-4, atol=1e-6, err_msg=name)
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
