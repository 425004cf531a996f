"""The lg reference interpreter, op by op, against values worked out by hand
(small literals) or by an independent numpy formulation."""

import math

import numpy as np
import pytest

import sbpc
from sbpc.semantics.reference import EvaluationError, evaluate, initial_value


def run(body: str, feeds: dict, outputs: str, types: str, params: dict | None = None) -> dict:
    """Evaluates a one-graph module whose body is `body`; inputs are declared
    from `feeds`' arrays."""
    decls = []
    for name, value in feeds.items():
        value = np.asarray(value)
        elem = {"float32": "f32", "float64": "f64", "int64": "i64", "int32": "i32"}[str(value.dtype)]
        dims = "x".join([*(str(d) for d in value.shape), elem])
        decls.append(f'  %{name} = lg.input "{name}" : tensor<{dims}>')
    names = ", ".join(f'"{n.strip()[1:]}"' for n in outputs.split(","))
    text = "lg.graph @g {\n" + "\n".join(decls) + "\n" + body + f"\n  lg.output [{names}] {outputs} : {types}\n}}"
    return evaluate(sbpc.parse_module(text), feeds, params)


F = np.float32


def test_elementwise_unary_by_hand():
    x = np.array([-2.0, -0.5, 0.0, 1.0, 4.0], F)
    body = "\n".join(
        f"  %{op} = lg.{op} %x : tensor<5xf32>" for op in ("neg", "relu", "tanh", "exp")
    )
    out = run(body, {"x": x}, "%neg, %relu, %tanh, %exp", ", ".join(["tensor<5xf32>"] * 4))
    np.testing.assert_array_equal(out["neg"], [2.0, 0.5, -0.0, -1.0, -4.0])
    np.testing.assert_array_equal(out["relu"], [0.0, 0.0, 0.0, 1.0, 4.0])
    np.testing.assert_allclose(out["tanh"], [math.tanh(v) for v in x], rtol=1e-6)
    np.testing.assert_allclose(out["exp"], [math.exp(v) for v in x], rtol=1e-6)
    assert all(v.dtype == F for v in out.values())


def test_sqrt_rsqrt_gelu_by_hand():
    x = np.array([0.25, 1.0, 4.0, 9.0], F)
    body = """
  %s = lg.sqrt %x : tensor<4xf32>
  %r = lg.rsqrt %x : tensor<4xf32>
  %g = lg.gelu %x : tensor<4xf32>"""
    out = run(body, {"x": x}, "%s, %r, %g", "tensor<4xf32>, tensor<4xf32>, tensor<4xf32>")
    np.testing.assert_allclose(out["s"], [0.5, 1.0, 2.0, 3.0])
    np.testing.assert_allclose(out["r"], [2.0, 1.0, 0.5, 1 / 3], rtol=1e-6)
    # GELU's tanh form at x = 1: 0.5 * (1 + tanh(sqrt(2/pi) * 1.044715)) = 0.841192
    assert out["g"][1] == pytest.approx(0.841192, abs=1e-6)
    assert out["g"][3] == pytest.approx(9.0, abs=1e-6)


def test_broadcasting_arithmetic():
    a = np.array([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]], F)
    b = np.array([10.0, 20.0, 30.0], F)
    body = """
  %add = lg.add %a, %b : (tensor<2x3xf32>, tensor<3xf32>) -> tensor<2x3xf32>
  %sub = lg.sub %b, %a : (tensor<3xf32>, tensor<2x3xf32>) -> tensor<2x3xf32>
  %mul = lg.mul %a, %b : (tensor<2x3xf32>, tensor<3xf32>) -> tensor<2x3xf32>
  %div = lg.div %b, %a : (tensor<3xf32>, tensor<2x3xf32>) -> tensor<2x3xf32>"""
    out = run(body, {"a": a, "b": b}, "%add, %sub, %mul, %div", ", ".join(["tensor<2x3xf32>"] * 4))
    np.testing.assert_array_equal(out["add"], [[11, 22, 33], [14, 25, 36]])
    np.testing.assert_array_equal(out["sub"], [[9, 18, 27], [6, 15, 24]])
    np.testing.assert_array_equal(out["mul"], [[10, 40, 90], [40, 100, 180]])
    np.testing.assert_allclose(out["div"], [[10, 10, 10], [2.5, 4, 5]])


def test_matmul_plain_transposed_and_batched():
    a = np.array([[1.0, 2.0], [3.0, 4.0]], F)
    b = np.array([[5.0, 6.0], [7.0, 8.0]], F)
    body = """
  %ab = lg.matmul %a, %b : (tensor<2x2xf32>, tensor<2x2xf32>) -> tensor<2x2xf32>
  %atb = lg.matmul %a, %b transpose_lhs : (tensor<2x2xf32>, tensor<2x2xf32>) -> tensor<2x2xf32>
  %abt = lg.matmul %a, %b transpose_rhs : (tensor<2x2xf32>, tensor<2x2xf32>) -> tensor<2x2xf32>"""
    out = run(body, {"a": a, "b": b}, "%ab, %atb, %abt", ", ".join(["tensor<2x2xf32>"] * 3))
    np.testing.assert_array_equal(out["ab"], [[19, 22], [43, 50]])
    np.testing.assert_array_equal(out["atb"], [[26, 30], [38, 44]])
    np.testing.assert_array_equal(out["abt"], [[17, 23], [39, 53]])

    rng = np.random.default_rng(0)
    x = rng.normal(size=(3, 2, 4)).astype(F)
    w = rng.normal(size=(4, 5)).astype(F)
    y = rng.normal(size=(3, 5, 4)).astype(F)
    body = """
  %xw = lg.matmul %x, %w : (tensor<3x2x4xf32>, tensor<4x5xf32>) -> tensor<3x2x5xf32>
  %xy = lg.matmul %x, %y transpose_rhs : (tensor<3x2x4xf32>, tensor<3x5x4xf32>) -> tensor<3x2x5xf32>"""
    out = run(body, {"x": x, "w": w, "y": y}, "%xw, %xy", "tensor<3x2x5xf32>, tensor<3x2x5xf32>")
    expected_xw = np.array(
        [[[sum(x[b, i, k] * w[k, j] for k in range(4)) for j in range(5)] for i in range(2)] for b in range(3)]
    )
    expected_xy = np.array(
        [[[sum(x[b, i, k] * y[b, j, k] for k in range(4)) for j in range(5)] for i in range(2)] for b in range(3)]
    )
    np.testing.assert_allclose(out["xw"], expected_xw, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(out["xy"], expected_xy, rtol=1e-5, atol=1e-6)


def test_softmax_and_log_softmax():
    x = np.array([[0.0, 0.0], [0.0, math.log(3.0)]], F)
    body = """
  %s = lg.softmax %x axis 1 : tensor<2x2xf32>
  %l = lg.log_softmax %x axis 1 : tensor<2x2xf32>
  %s0 = lg.softmax %x axis 0 : tensor<2x2xf32>"""
    out = run(body, {"x": x}, "%s, %l, %s0", ", ".join(["tensor<2x2xf32>"] * 3))
    np.testing.assert_allclose(out["s"], [[0.5, 0.5], [0.25, 0.75]], rtol=1e-6)
    np.testing.assert_allclose(out["l"], np.log([[0.5, 0.5], [0.25, 0.75]]), rtol=1e-6)
    np.testing.assert_allclose(out["s0"], [[0.5, 0.25], [0.5, 0.75]], rtol=1e-6)
    # Large logits must not overflow: the shift by the max is part of the semantics.
    big = np.array([[1000.0, 1000.0]], F)
    out = run("  %s = lg.softmax %x axis 1 : tensor<1x2xf32>", {"x": big}, "%s", "tensor<1x2xf32>")
    np.testing.assert_array_equal(out["s"], [[0.5, 0.5]])


def test_layernorm_plain_and_affine():
    x = np.array([[1.0, 3.0], [2.0, 2.0]], F)
    w = np.array([2.0, 1.0], F)
    b = np.array([0.5, -0.5], F)
    body = """
  %n = lg.layernorm %x axis 1 eps 1.0e-05 : tensor<2x2xf32>
  %a = lg.layernorm %x weight %w : tensor<2xf32> bias %b : tensor<2xf32> axis 1 eps 1.0e-05 : tensor<2x2xf32>"""
    out = run(body, {"x": x, "w": w, "b": b}, "%n, %a", "tensor<2x2xf32>, tensor<2x2xf32>")
    scale = 1 / math.sqrt(1 + 1e-5)  # row 0: mean 2, variance 1
    np.testing.assert_allclose(out["n"], [[-scale, scale], [0.0, 0.0]], rtol=1e-6)
    np.testing.assert_allclose(out["a"], [[-2 * scale + 0.5, scale - 0.5], [0.5, -0.5]], rtol=1e-6)
    # axis 1 of a 3-D tensor normalizes over the last two axes together
    y = np.arange(12, dtype=F).reshape(2, 2, 3)
    out = run("  %n = lg.layernorm %y axis 1 eps 1.0e-05 : tensor<2x2x3xf32>", {"y": y}, "%n", "tensor<2x2x3xf32>")
    row = np.arange(6, dtype=np.float64)
    expected = (row - row.mean()) / math.sqrt(row.var() + 1e-5)
    np.testing.assert_allclose(out["n"].reshape(2, 6), [expected, expected], rtol=1e-5)


def test_reductions():
    x = np.array([[1.0, 5.0, 3.0], [4.0, 2.0, 6.0]], F)
    body = """
  %s = lg.reduce_sum %x axes [1] : tensor<2x3xf32> -> tensor<2xf32>
  %m = lg.reduce_mean %x axes [0] keepdims : tensor<2x3xf32> -> tensor<1x3xf32>
  %x0 = lg.reduce_max %x axes [0, 1] : tensor<2x3xf32> -> tensor<f32>"""
    out = run(body, {"x": x}, "%s, %m, %x0", "tensor<2xf32>, tensor<1x3xf32>, tensor<f32>")
    np.testing.assert_array_equal(out["s"], [9.0, 12.0])
    np.testing.assert_array_equal(out["m"], [[2.5, 3.5, 4.5]])
    assert out["x0"].shape == () and out["x0"] == 6.0


def test_shape_ops():
    x = np.arange(6, dtype=F).reshape(2, 3)
    body = """
  %r = lg.reshape %x : tensor<2x3xf32> -> tensor<3x2xf32>
  %t = lg.transpose %x perm [1, 0] : tensor<2x3xf32> -> tensor<3x2xf32>
  %b = lg.broadcast_to %x : tensor<2x3xf32> -> tensor<2x2x3xf32>
  %c = lg.concat %x, %x axis 0 : (tensor<2x3xf32>, tensor<2x3xf32>) -> tensor<4x3xf32>
  %s = lg.slice %x starts [0, 0] limits [2, 3] strides [1, 2] : tensor<2x3xf32> -> tensor<2x2xf32>"""
    out = run(body, {"x": x}, "%r, %t, %b, %c, %s",
              "tensor<3x2xf32>, tensor<3x2xf32>, tensor<2x2x3xf32>, tensor<4x3xf32>, tensor<2x2xf32>")
    np.testing.assert_array_equal(out["r"], [[0, 1], [2, 3], [4, 5]])
    np.testing.assert_array_equal(out["t"], [[0, 3], [1, 4], [2, 5]])
    np.testing.assert_array_equal(out["b"], [[[0, 1, 2], [3, 4, 5]]] * 2)
    np.testing.assert_array_equal(out["c"], [[0, 1, 2], [3, 4, 5], [0, 1, 2], [3, 4, 5]])
    np.testing.assert_array_equal(out["s"], [[0, 2], [3, 5]])


def test_embedding_gathers_rows():
    table = np.array([[0.0, 0.5], [1.0, 1.5], [2.0, 2.5]], F)
    ids = np.array([[2, 0], [1, 1]], np.int64)
    out = run(
        "  %e = lg.embedding %t, %i : (tensor<3x2xf32>, tensor<2x2xi64>) -> tensor<2x2x2xf32>",
        {"t": table, "i": ids}, "%e", "tensor<2x2x2xf32>",
    )
    np.testing.assert_array_equal(out["e"], [[[2.0, 2.5], [0.0, 0.5]], [[1.0, 1.5], [1.0, 1.5]]])
    with pytest.raises(EvaluationError, match=r"'lg.embedding': index out of range \[0, 3\)"):
        run("  %e = lg.embedding %t, %i : (tensor<3x2xf32>, tensor<2x2xi64>) -> tensor<2x2x2xf32>",
            {"t": table, "i": ids + 1}, "%e", "tensor<2x2x2xf32>")


def test_cross_entropy_and_mse():
    logits = np.array([[0.0, 0.0], [0.0, math.log(3.0)]], F)
    labels = np.array([0, 1], np.int64)
    a = np.array([1.0, 2.0, 3.0], F)
    b = np.array([1.0, 0.0, 6.0], F)
    body = """
  %ce = lg.cross_entropy %l, %y : (tensor<2x2xf32>, tensor<2xi64>) -> tensor<f32>
  %mse = lg.mse_loss %a, %b : (tensor<3xf32>, tensor<3xf32>) -> tensor<f32>"""
    out = run(body, {"l": logits, "y": labels, "a": a, "b": b}, "%ce, %mse", "tensor<f32>, tensor<f32>")
    # -(log 0.5 + log 0.75) / 2
    assert out["ce"] == pytest.approx(-(math.log(0.5) + math.log(0.75)) / 2, rel=1e-6)
    assert out["mse"] == pytest.approx((0 + 4 + 9) / 3, rel=1e-6)
    with pytest.raises(EvaluationError, match="'lg.cross_entropy': label out of range"):
        run(body, {"l": logits, "y": labels + 1, "a": a, "b": b}, "%ce, %mse", "tensor<f32>, tensor<f32>")


def test_constants_and_distributed_values_are_global():
    text = """
sbp.placement @m cpu ranks [0, 1] mesh [2]
lg.graph @g on @m {
  %x = lg.input "x" : tensor<4xf32>
  %c = lg.constant dense<[1.0, 2.0, 3.0, 4.0]> : tensor<4xf32>
  %k = lg.constant dense<0.5> : tensor<4xf32> -> !sbp.dtensor<4xf32, @m, B>
  %xs = sbp.annotate %x : tensor<4xf32> -> !sbp.dtensor<4xf32, @m, S<0>>
  %cs = sbp.annotate %c : tensor<4xf32> -> !sbp.dtensor<4xf32, @m, S<0>>
  %p = lg.mul %xs, %cs : (!sbp.dtensor<4xf32, @m, S<0>>, !sbp.dtensor<4xf32, @m, S<0>>) -> !sbp.dtensor<4xf32, @m, S<0>>
  %g = sbp.all_gather %p over [0] : !sbp.dtensor<4xf32, @m, S<0>> -> !sbp.dtensor<4xf32, @m, B>
  %s = lg.add %g, %k : (!sbp.dtensor<4xf32, @m, B>, !sbp.dtensor<4xf32, @m, B>) -> !sbp.dtensor<4xf32, @m, B>
  lg.output ["s"] %s : !sbp.dtensor<4xf32, @m, B>
}"""
    out = evaluate(sbpc.parse_module(text), {"x": np.ones(4, F)})
    np.testing.assert_array_equal(out["s"], [1.5, 2.5, 3.5, 4.5])


PARAMS = """
lg.graph @g {
  %z = lg.param "z" init #lg.zeros : tensor<2x3xf32>
  %o = lg.param "o" init #lg.ones : tensor<3xf64>
  %f = lg.param "f" init #lg.fill<-2.5> : tensor<2xf32>
  %n = lg.param "n" init #lg.normal<1.0, 0.5> seed 7 : tensor<200x100xf32>
  %n2 = lg.param "n2" init #lg.normal<1.0, 0.5> seed 7 : tensor<200x100xf32>
  %u = lg.param "u" init #lg.uniform<-3.0, -1.0> seed 7 : tensor<200x100xf32>
  lg.output ["z", "o", "f", "n", "n2", "u"] %z, %o, %f, %n, %n2, %u
      : tensor<2x3xf32>, tensor<3xf64>, tensor<2xf32>, tensor<200x100xf32>, tensor<200x100xf32>, tensor<200x100xf32>
}"""


def test_initializers():
    out = evaluate(sbpc.parse_module(PARAMS), {})
    np.testing.assert_array_equal(out["z"], np.zeros((2, 3)))
    assert out["o"].dtype == np.float64
    np.testing.assert_array_equal(out["o"], np.ones(3))
    np.testing.assert_array_equal(out["f"], [-2.5, -2.5])
    assert abs(out["n"].mean() - 1.0) < 0.02 and abs(out["n"].std() - 0.5) < 0.02
    assert out["u"].min() >= -3.0 and out["u"].max() < -1.0 and abs(out["u"].mean() + 2.0) < 0.02
    # the stream depends on the seed and the name: same seed, other name, other values
    assert not np.array_equal(out["n"], out["n2"])
    # and it is reproducible across evaluations and processes
    again = evaluate(sbpc.parse_module(PARAMS), {})
    np.testing.assert_array_equal(out["n"], again["n"])


def test_given_params_override_initializers():
    module = sbpc.parse_module(PARAMS)
    out = evaluate(module, {}, params={"z": np.full((2, 3), 7.0, F)})
    np.testing.assert_array_equal(out["z"], np.full((2, 3), 7.0))
    param = next(op for op in module.walk() if getattr(op, "key", None) and op.key.data == "n")
    np.testing.assert_array_equal(initial_value(param), out["n"])


def test_bad_feeds_are_named():
    text = 'lg.graph @g {\n  %x = lg.input "x" : tensor<2xf32>\n  lg.output ["x"] %x : tensor<2xf32>\n}'
    module = sbpc.parse_module(text)
    with pytest.raises(EvaluationError, match="'lg.input' \"x\": no feed given"):
        evaluate(module, {})
    with pytest.raises(EvaluationError, match=r"'lg.input' \"x\": expected shape \[2\], got \[3\]"):
        evaluate(module, {"x": np.zeros(3, F)})
    with pytest.raises(EvaluationError, match="expected float32 values, got int64"):
        evaluate(module, {"x": np.zeros(2, np.int64)})
    with pytest.raises(EvaluationError, match=r"has no input or parameter named \['y'\]"):
        evaluate(module, {"x": np.zeros(2, F), "y": 1})


def test_graph_selection():
    text = """
lg.graph @a {
  %x = lg.input "x" : tensor<2xf32>
  lg.output ["x"] %x : tensor<2xf32>
}
lg.graph @b {
  %x = lg.input "x" : tensor<2xf32>
  %y = lg.neg %x : tensor<2xf32>
  lg.output ["y"] %y : tensor<2xf32>
}"""
    module = sbpc.parse_module(text)
    with pytest.raises(EvaluationError, match="holds 2 graphs"):
        evaluate(module, {"x": np.ones(2, F)})
    assert evaluate(module, {"x": np.ones(2, F)}, graph="b")["y"].tolist() == [-1.0, -1.0]
    with pytest.raises(EvaluationError, match="no lg.graph @c"):
        evaluate(module, {"x": np.ones(2, F)}, graph="c")


def test_16_bit_floats_compute_in_float32_and_round_each_result():
    # bf16 and f16 are storage types: every op computes in float32 and rounds
    # its result once (PyTorch's CPU kernels); a sum accumulates in float32
    import ml_dtypes

    for dtype, numpy_type in (("bf16", ml_dtypes.bfloat16), ("f16", np.float16)):
        g = sbpc.Graph("half")
        x = g.input("x", (5, 7), dtype=dtype)
        w = g.param("w", (7, 3), init=sbpc.normal(0.0, 0.5), seed=2, dtype=dtype)
        h = sbpc.gelu(x @ w) * 3.0
        g.output(h=h, total=h.sum(axes=(0, 1)), wide=sbpc.cast(h, "f32") / 3.0)
        module = g.module()
        xs = np.random.default_rng(1).normal(size=(5, 7)).astype(numpy_type)
        out = evaluate(module, {"x": xs})
        ws = initial_value(next(op for op in module.ops.last.body.ops if op.name == "lg.param"))
        assert ws.dtype == numpy_type and out["h"].dtype == numpy_type and out["wide"].dtype == np.float32

        def rounded(v, numpy_type=numpy_type):
            return np.asarray(v, np.float32).astype(numpy_type).astype(np.float32)

        mm = rounded(xs.astype(np.float32) @ ws.astype(np.float32))
        gelu = rounded(0.5 * mm * (1 + np.tanh(math.sqrt(2 / math.pi) * (mm + 0.044715 * (mm * mm * mm)))))
        expected = rounded(gelu * 3.0)
        np.testing.assert_allclose(out["h"].astype(np.float32), expected, rtol=0, atol=0)
        assert out["total"].astype(np.float32) == rounded(expected.sum(dtype=np.float32))
        # the cast to float32 is exact and the division then float32's
        np.testing.assert_array_equal(out["wide"], expected / np.float32(3.0))
