"""lg-optimizer: SGD, momentum, Adam and AdamW (with bias correction) and
global-norm clipping match a numpy implementation step by step, in the
reference interpreter and trained on real MPI ranks through the API."""

import numpy as np
import pytest
from xdsl.context import Context

import sbpc
from sbpc.lowering.lg_autodiff import LgAutodiffPass
from sbpc.lowering.lg_optimizer import LgOptimizerPass
from sbpc.semantics.reference import evaluate, initial_value


def model(ranks=1):
    g = sbpc.Graph("reg", placement=sbpc.placement("cpu", ranks=ranks))
    x = g.input("x", (8, 3), sbp=sbpc.S(0))
    t = g.input("t", (8, 2), sbp=sbpc.S(0))
    w = g.param("w", (3, 2), init=sbpc.normal(0.0, 1.0), seed=3)
    b = g.param("b", (2,), init=sbpc.ones())
    g.output(loss=sbpc.mse_loss(x @ w + b, t))
    return g


def numpy_grads(w, b, x, t):
    y = x @ w + b
    d = 2 * (y - t) / y.size
    return {"w": x.T @ d, "b": d.sum(axis=0)}


def numpy_train(algorithm, steps, x, t, lr, clip=0.0, **h):
    w = initial_value(next(o for o in model().module().ops.last.body.ops if o.name == "lg.param" and o.key.data == "w"))
    params = {"w": w.astype(np.float64), "b": np.ones(2)}
    state = {k: np.zeros_like(v) for k, v in params.items()}
    m = {k: np.zeros_like(v) for k, v in params.items()}
    p1, p2 = h.get("beta1", 0.9), h.get("beta2", 0.999)
    history = []
    for _ in range(steps):
        grads = numpy_grads(params["w"], params["b"], x, t)
        history.append(np.mean((x @ params["w"] + params["b"] - t) ** 2))
        if clip:
            norm = np.sqrt(sum((g * g).sum() for g in grads.values()))
            grads = {k: g / max(1.0, norm / clip) for k, g in grads.items()}
        for k in params:
            g = grads[k]
            if algorithm == "sgd":
                step = g
            elif algorithm == "momentum":
                state[k] = h.get("momentum", 0.9) * state[k] + g
                step = state[k]
            else:
                b1, b2 = h.get("beta1", 0.9), h.get("beta2", 0.999)
                m[k] = b1 * m[k] + (1 - b1) * g
                state[k] = b2 * state[k] + (1 - b2) * g * g
                step = (m[k] / (1 - p1)) / (np.sqrt(state[k] / (1 - p2)) + h.get("eps", 1e-8))
                if algorithm == "adamw":
                    step = step + h.get("weight_decay", 0.01) * params[k]
            params[k] = params[k] - lr * step
        if algorithm in ("adam", "adamw"):
            p1 *= h.get("beta1", 0.9)
            p2 *= h.get("beta2", 0.999)
    return history, params


RNG = np.random.default_rng(0)
X = RNG.normal(size=(8, 3)).astype(np.float32)
T = RNG.normal(size=(8, 2)).astype(np.float32)


def compiled(algorithm, clip=0.0, ranks=1):
    module = model(ranks).module()
    LgAutodiffPass().apply(Context(), module)
    LgOptimizerPass(algorithm=algorithm, clip=clip).apply(Context(), module)
    module.verify()
    return module


@pytest.mark.parametrize(
    "algorithm, clip", [("sgd", 0.0), ("momentum", 0.0), ("adam", 0.0), ("adamw", 0.0), ("sgd", 0.5)]
)
def test_updates_match_numpy(algorithm, clip):
    module = compiled(algorithm, clip)
    params = {o.key.data: initial_value(o) for o in module.ops.last.body.ops if o.name == "lg.param"}
    losses = []
    for _ in range(4):
        out = evaluate(module, {"x": X, "t": T, "lr": np.float32(0.1)}, params)
        losses.append(out["loss"])
        params.update({k.removeprefix("new."): v for k, v in out.items() if k.startswith("new.")})
    history, expected = numpy_train(algorithm, 4, X.astype(np.float64), T.astype(np.float64), 0.1, clip)
    np.testing.assert_allclose(losses, history, rtol=1e-4)
    for k in ("w", "b"):
        np.testing.assert_allclose(params[k], expected[k], rtol=1e-4, atol=1e-6)


def test_training_on_real_ranks_follows_the_reference():
    module = compiled("adam", ranks=2)  # data parallel over 2 MPI ranks
    exe = sbpc.compile(module)
    history, _ = numpy_train("adam", 5, X.astype(np.float64), T.astype(np.float64), 0.05)
    losses = [float(exe.train_step({"x": X, "t": T, "lr": np.float32(0.05)})["loss"]) for _ in range(5)]
    np.testing.assert_allclose(losses, history, rtol=1e-4)
    assert losses[-1] < losses[0]


def test_missing_gradients_are_diagnosed():
    with pytest.raises(Exception, match="no grad.<param> outputs: run lg-autodiff first"):
        LgOptimizerPass().apply(Context(), model().module())
    with pytest.raises(Exception, match="unknown algorithm 'lion'"):
        LgOptimizerPass(algorithm="lion").apply(Context(), model().module())


def test_the_training_example_learns_on_two_ranks():
    import subprocess
    import sys
    from pathlib import Path

    example = Path(__file__).resolve().parents[3] / "examples" / "train_mlp.py"
    done = subprocess.run([sys.executable, str(example), "--ranks", "2", "--steps", "40"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "(learning)" in done.stdout and "MISMATCH" not in done.stdout


def test_sbp_run_steps_train_in_place(tmp_path):
    """`sbp-run --steps K` on a training graph: every step starts from the
    parameters the previous one wrote back on each rank."""
    import subprocess
    import sys

    from sbpc.runtime.launch import rank_environment  # noqa: F401 - same environment as sbp-run uses

    module = compiled("momentum", ranks=2)
    path = tmp_path / "train.mlir"
    path.write_text(str(module))
    feeds = {"x": X, "t": T, "lr": np.float32(0.1)}
    np.savez(tmp_path / "feeds.npz", **feeds)
    done = subprocess.run([sys.executable, "-m", "sbpc.tools.sbp_run", str(path), "-n", "2", "--feeds",
                           str(tmp_path / "feeds.npz"), "--steps", "3", "-o", str(tmp_path / "out.npz")],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    history, _ = numpy_train("momentum", 3, X.astype(np.float64), T.astype(np.float64), 0.1)
    with np.load(tmp_path / "out.npz") as out:
        assert float(out["loss"]) == pytest.approx(history[-1], rel=1e-4)


def test_generated_feeds_give_the_learning_rate_a_typical_value():
    """sbp-run's generated feeds (no --feeds): the optimizer's learning rate
    is a typical one, not a normal draw, which made training diverge into
    infinities and denormal floats within a few steps (and its steps 2x
    slower); the other float feeds are normal draws."""
    from sbpc.dialects.lg_analysis import TYPICAL_LEARNING_RATE
    from sbpc.lowering.compile import CompilePass
    from sbpc.runtime.program import find_program
    from sbpc.tools.sbp_run import generated_feeds

    module = compiled("adam", ranks=2)
    CompilePass().apply(Context(), module)
    feeds = generated_feeds(find_program(module), 0)
    assert feeds["lr"].shape == () and float(feeds["lr"]) == pytest.approx(TYPICAL_LEARNING_RATE)
    assert feeds["x"].std() > 0.5


def test_zero_shards_optimizer_state_over_the_data_axis():
    from sbpc.dialects import plan
    from sbpc.lowering.compile import CompilePass

    g = sbpc.Graph("reg", placement=sbpc.placement("cpu", ranks=4))
    x = g.input("x", (64, 32), sbp=sbpc.S(0))
    t = g.input("t", (64, 16), sbp=sbpc.S(0))
    w = g.param("w", (32, 16), init=sbpc.normal(0.0, 1.0), sbp=sbpc.B)
    g.output(loss=sbpc.mse_loss(x @ w, t))
    module = g.module()
    LgAutodiffPass().apply(Context(), module)
    LgOptimizerPass(algorithm="adam", zero=True).apply(Context(), module)
    assert 'lg.param "adam.m.w" init #lg.zeros : !sbp.dtensor<32x16xf32, @cpu4_0_1_2_3, S<0>>' in str(module)
    CompilePass().apply(Context(), module)
    device = next(p for p in module.ops if isinstance(p, plan.ProgramOp)).devices()[0]
    state = {r.param.data: r.size for r in device.registers() if r.param is not None}
    # each rank keeps a quarter of m and v, and the whole (replicated) weight
    assert state["adam.m.w"] == state["adam.v.w"] == 32 * 16 * 4 // 4
    assert state["w"] == 32 * 16 * 4
    # and training still follows the reference
    exe = sbpc.compile(module)
    feeds = {"x": np.ones((64, 32), np.float32), "t": np.zeros((64, 16), np.float32), "lr": np.float32(0.01)}
    first = float(exe.train_step(feeds)["loss"])
    assert float(exe.train_step(feeds)["loss"]) < first


def test_the_gpt_example_learns_and_matches_the_reference():
    import subprocess
    import sys
    from pathlib import Path

    example = Path(__file__).resolve().parents[3] / "examples" / "gpt.py"
    done = subprocess.run([sys.executable, str(example), "--ranks", "2", "--steps", "60", "--layers", "1"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "(learning)" in done.stdout and "MISMATCH" not in done.stdout


def test_a_16_bit_weight_is_updated_in_float32_and_rounded_once():
    # a graph mixing bfloat16 and float32 weights: each update computes in
    # float32 (lr and the gradient widened exactly) and rounds the new
    # bfloat16 weight once, as PyTorch's fused SGD update does
    import ml_dtypes

    g = sbpc.Graph("mixed", placement=sbpc.placement("cpu", 1))
    x = g.input("x", (4, 3))
    w1 = g.param("w1", (3, 5), init=sbpc.normal(0.0, 0.5), dtype="bf16", seed=1)
    w2 = g.param("w2", (5, 2), init=sbpc.normal(0.0, 0.5), seed=2)
    h = sbpc.cast(sbpc.cast(x, "bf16") @ w1, "f32") @ w2
    g.output(loss=(h * h).mean())
    feeds = {"x": np.random.default_rng(0).normal(size=(4, 3)).astype(np.float32)}
    module = g.module()
    LgAutodiffPass().apply(Context(), module)
    params = {op.key.data: initial_value(op) for op in module.ops.last.body.ops if op.name == "lg.param"}
    grads = evaluate(module, feeds, params)
    exe = sbpc.compile(g, mode="interpret", optimizer=sbpc.optim.SGD(lr=0.1))
    exe.train_step(feeds)
    expected = (params["w1"].astype(np.float32) - np.float32(0.1) * grads["grad.w1"].astype(np.float32)).astype(
        ml_dtypes.bfloat16)
    assert exe.params["w1"].dtype == ml_dtypes.bfloat16 and exe.params["w2"].dtype == np.float32
    np.testing.assert_array_equal(exe.params["w1"], expected)
    np.testing.assert_allclose(exe.params["w2"], params["w2"] - np.float32(0.1) * grads["grad.w2"], rtol=1e-6)
    for optimizer in (sbpc.optim.Adam(lr=0.01), sbpc.optim.SGD(lr=0.1, momentum=0.9), sbpc.optim.AdamW(lr=0.01)):
        trained = sbpc.compile(g, mode="interpret", optimizer=optimizer)
        losses = [float(trained.train_step(feeds)["loss"]) for _ in range(3)]
        assert losses[-1] < losses[0]
        assert {trained.params[k].dtype for k in trained.param_keys() if k.endswith("w1")} == {
            np.dtype(ml_dtypes.bfloat16)}


def test_a_second_optimizer_on_a_training_step_is_refused_by_name():
    module = model().module()
    LgAutodiffPass().apply(Context(), module)
    LgOptimizerPass().apply(Context(), module)
    LgAutodiffPass().apply(Context(), module)
    with pytest.raises(Exception, match=r"@\w+ is a training step already: it updates '[\w.]+' \(output new\."):
        LgOptimizerPass(algorithm="adam").apply(Context(), module)
