"""Resource limits as errors a user can act on: a plan over the memory
budget says what it needs, a feed of another width is converted with one
warning (the same in `run`, `train_step` and `sbp-run`), and zero-size
tensors compute what numpy and PyTorch compute (a mean of nothing is NaN)
or are refused with the axis named."""

from __future__ import annotations

import subprocess
import sys
import warnings

import numpy as np
import pytest

import sbpc


def classifier(ranks: int = 2, batch: int = 8):
    g = sbpc.Graph("classifier", placement=sbpc.placement("cpu", ranks))
    x = g.input("x", (batch, 16), sbp=sbpc.S(0) if ranks > 1 else None)
    labels = g.input("labels", (batch,), dtype="i64")
    w = g.param("w", (16, 4), init=sbpc.normal(0.0, 0.5), seed=1)
    g.output(loss=sbpc.cross_entropy(x @ w, labels))
    return g


def test_a_hand_plan_over_the_memory_budget_says_what_it_needs():
    exe = sbpc.compile(classifier(), mode="interpret", memory_budget=10**6, optimizer=sbpc.optim.Adam(lr=0.1))
    need = max(sum(d.region_bytes()) for d in exe.program.devices())
    with pytest.raises(ValueError, match=rf"the plan needs .* on rank \d \({need} bytes: arena and persistent "
                                         rf"region\), over memory_budget={need - 1} .*plan='auto'"):
        sbpc.compile(classifier(), mode="interpret", memory_budget=need - 1, optimizer=sbpc.optim.Adam(lr=0.1))
    sbpc.compile(classifier(), mode="interpret", memory_budget=need, optimizer=sbpc.optim.Adam(lr=0.1))


@pytest.mark.parametrize("budget", [0, -1])
def test_a_memory_budget_that_is_not_a_byte_count_is_refused(budget):
    with pytest.raises(ValueError, match="memory_budget must be a positive number of bytes"):
        sbpc.compile(classifier(), mode="interpret", memory_budget=budget)


@pytest.mark.parametrize("budget", [True, 1.5, "1GB", 2**63])
def test_a_memory_budget_of_another_type_is_refused(budget):
    with pytest.raises(TypeError, match="memory_budget must be a 64-bit integer or None"):
        sbpc.compile(classifier(), mode="interpret", memory_budget=budget)


def test_a_budget_no_automatic_plan_meets_names_the_smallest():
    with pytest.raises(ValueError,
                       match=r"sbpc.compile: sbp-autoplan: no plan fits .* per device; the smallest needs [0-9.]+ MiB"):
        sbpc.compile(classifier(), plan="auto", memory_budget=1000, optimizer=sbpc.optim.Adam(lr=0.1))


def feeds(x_dtype=np.float32, labels_dtype=np.int64):
    rng = np.random.default_rng(0)
    return {"x": rng.normal(size=(8, 16)).astype(x_dtype), "labels": rng.integers(0, 4, 8).astype(labels_dtype)}


@pytest.mark.parametrize("mode", ["interpret", "auto"])
def test_a_feed_of_another_width_is_converted_with_one_warning(mode):
    exe = sbpc.compile(classifier(), mode=mode)
    want = float(exe.run(feeds())["loss"])
    wide = feeds(np.float64, np.int32)
    with pytest.warns(sbpc.FeedConversionWarning) as caught:
        got = float(exe.run(wide)["loss"])
    assert got == pytest.approx(want, rel=1e-6)
    assert sorted(str(w.message).split(":")[0] for w in caught) == ["feed 'labels'", "feed 'x'"]
    assert "float64 values converted to float32, the input's type" in str(caught[0].message) + str(
        caught[1].message)
    with warnings.catch_warnings(record=True) as again:  # once per plan and feed, whatever the filters
        warnings.simplefilter("default")
        exe.run(wide)
        exe.run(wide)
    assert not [w for w in again if w.category is sbpc.FeedConversionWarning]
    with warnings.catch_warnings():  # Python numbers and lists take the input's type
        warnings.simplefilter("error", sbpc.FeedConversionWarning)
        exe.run({"x": feeds()["x"].tolist(), "labels": feeds()["labels"].tolist()})


def test_train_step_converts_alike_and_a_feed_of_another_kind_is_refused():
    exe = sbpc.compile(classifier(), mode="interpret", optimizer=sbpc.optim.SGD(lr=0.1))
    with pytest.warns(sbpc.FeedConversionWarning, match="feed 'x': float64 values converted to float32"):
        exe.train_step(feeds(np.float64))
    with pytest.raises(Exception, match="feed 'labels': expected int64 values, got float32"):
        exe.train_step(feeds(labels_dtype=np.float32))


def test_sbp_run_converts_a_feed_file_with_the_same_warning(tmp_path):
    exe = sbpc.compile(classifier(ranks=1), mode="interpret")
    path, feed_file, out = tmp_path / "g.mlir", tmp_path / "feeds.npz", tmp_path / "out.npz"
    path.write_text(str(exe.module))
    np.savez(feed_file, **feeds(np.float64))
    done = subprocess.run([sys.executable, "-m", "sbpc.tools.sbp_run", str(path), "-n", "1", "--feeds",
                           str(feed_file), "-o", str(out)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "FeedConversionWarning: feed 'x': float64 values converted to float32" in done.stderr
    with np.load(out) as got:
        assert float(got["loss"]) == pytest.approx(float(exe.run(feeds())["loss"]), rel=1e-6)


def empty_losses(ranks: int):
    g = sbpc.Graph("empty", placement=sbpc.placement("cpu", ranks))
    x = g.input("x", (0, 4))
    y = g.input("y", (0, 4))
    labels = g.input("labels", (0,), dtype="i64")
    g.output(mean=sbpc.reduce_mean(x, [0]), ce=sbpc.cross_entropy(x, labels), mse=sbpc.mse_loss(x, y),
             total=sbpc.reduce_sum(x, [0]))
    return g


@pytest.mark.parametrize("mode", ["interpret", "auto"])
def test_a_mean_over_no_elements_is_nan_as_in_pytorch(mode):
    torch = pytest.importorskip("torch")
    empty = torch.zeros(0, 4)
    assert torch.isnan(empty.mean(0)).all() and torch.isnan(torch.nn.functional.mse_loss(empty, empty))
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # the reference's numpy mean of nothing
        out = sbpc.compile(empty_losses(1), mode=mode).run(
            {"x": np.zeros((0, 4), np.float32), "y": np.zeros((0, 4), np.float32),
             "labels": np.zeros(0, np.int64)})
    assert np.isnan(out["mean"]).all() and out["mean"].shape == (4,)
    assert np.isnan(out["ce"]) and np.isnan(out["mse"])
    np.testing.assert_array_equal(out["total"], np.zeros(4, np.float32))


def test_an_empty_axis_is_not_split_and_the_error_says_so():
    g = sbpc.Graph("empty", placement=sbpc.placement("cpu", 2))
    x = g.input("x", (0, 4), sbp=sbpc.S(0))
    g.output(y=sbpc.relu(x))
    with pytest.raises(ValueError, match="sbpc.compile: 'lg.input': the hint S<0> on its result cannot be met.*axis 0 "
                                         "of the result has no elements, and an empty axis is not split"):
        sbpc.compile(g, mode="interpret")
