"""Random numbers in the IR: lg.dropout draws each element's keep decision
from Philox4x32-10 keyed by (seed, step, stream, the element's index in the
whole tensor), so every plan draws the same mask as one device and as the
reference interpreter.

- The generator is Philox4x32-10 (Random123's known answers).
- Data, tensor and 2-D splits on MPI ranks give the reference's values bit
  for bit; micro-batch copies draw the whole batch's mask (the gradients
  of a micro-batched step equal the whole batch's).
- The masks look like independent draws: keep rate, across elements,
  steps, streams and the four words of one Philox block.
- The step advances inside the plan; the seed is a compile option; a
  checkpoint holds both and resumes the same stream.
- The GPT of examples/models.py with dropout 0.1 trains alike under
  pipeline stages with micro-batches (and, under `make test-all`, every
  other variant) as in the reference interpreter.
"""

import sys
from pathlib import Path

import numpy as np
import pytest
from xdsl.context import Context

import sbpc
from sbpc import S
from sbpc.lowering.lg_autodiff import LgAutodiffPass
from sbpc.lowering.lg_micro_batch import LgMicroBatchPass
from sbpc.semantics.philox import Philox
from sbpc.semantics.reference import evaluate, initial_value

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "examples"))

import models  # noqa: E402


def test_the_generator_is_philox4x32_10():
    # Random123's tests/kat_vectors, the three "philox4x32 10" lines
    cases = [((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
             ((0xFFFFFFFF,) * 4, (0xFFFFFFFF, 0xFFFFFFFF), (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
             ((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0),
              (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1))]
    for counter, key, expected in cases:
        assert tuple(int(w[0]) for w in Philox(1)(counter, key)) == expected


def dropped(ranks=1, sbp=None, mesh=None):
    """Two dropouts: of a (12, 10, 7) input as its plan splits it, and of
    that result seen as 120 rows."""
    g = sbpc.Graph("dropped", placement=sbpc.placement("cpu", ranks, mesh))
    x = g.input("x", (12, 10, 7), sbp=sbp)
    y = sbpc.dropout(x, 0.3)
    g.output(y=y, z=sbpc.dropout(y.reshape(120, 7), 0.5), u=g.rand((12, 10, 7)) * x)
    return g


X = np.random.default_rng(0).normal(size=(12, 10, 7)).astype(np.float32)


def steps_of(exe, count=2):
    return [exe.train_step({"x": X}) for _ in range(count)]


@pytest.fixture(scope="module")
def one_device():
    return steps_of(sbpc.compile(dropped(), mode="interpret", seed=11))


@pytest.mark.parametrize("ranks, sbp, mesh", [(2, S(1), None), (4, [S(0), S(2)], (2, 2))],
                         ids=["split inside a row", "2-D"])
def test_every_plan_draws_the_one_devices_mask(one_device, ranks, sbp, mesh):
    got = steps_of(sbpc.compile(dropped(ranks, sbp, mesh), seed=11))
    for step, (expected, actual) in enumerate(zip(one_device, got)):
        for name in ("y", "z", "u"):
            np.testing.assert_array_equal(actual[name], expected[name], err_msg=f"{name}, step {step}")
    assert not np.array_equal(one_device[0]["y"], one_device[1]["y"])  # the step advanced


def test_the_reference_interpreter_draws_what_the_plan_draws(one_device):
    module = dropped().module()
    params = {op.key.data: initial_value(op) for op in module.ops.last.body.ops if op.name == "lg.param"}
    params["rng.seed"] = np.asarray(11, np.int64)
    for expected in one_device:
        out = evaluate(module, {"x": X}, params)
        np.testing.assert_array_equal(out["y"], expected["y"])
        params["rng.step"] = out["new.rng.step"]


@pytest.mark.parametrize("count", [2, 4])
def test_micro_batches_draw_the_whole_batchs_mask(count):
    # rows per example 1 (the batch) and 3 (after a reshape merges it with
    # the next axis): the micro-batched step's gradients are the whole batch's
    g = sbpc.Graph("micro")
    x = g.input("x", (8, 3, 5))
    w = g.param("w", (5,), init=sbpc.normal(0.0, 1.0), dtype="f32", seed=3)
    h = sbpc.dropout(x * w, 0.4) * sbpc.floor(g.rand((8, 1, 1)) + 0.7)  # and drop path's per-example draw
    rows = sbpc.dropout(h.reshape(24, 5), 0.25)
    g.output(loss=(rows * rows).mean() + (h * x).mean())
    whole, micro = g.module(), g.module()
    LgMicroBatchPass(count=count).apply(Context(), micro)
    for module in (whole, micro):
        LgAutodiffPass().apply(Context(), module)
    params = {"w": initial_value(next(op for op in whole.ops.last.body.ops if op.name == "lg.param")),
              "rng.seed": np.asarray(5, np.int64), "rng.step": np.asarray(3, np.int64)}
    feeds = {"x": np.random.default_rng(1).normal(size=(8, 3, 5)).astype(np.float32)}
    expected, got = evaluate(whole, feeds, params), evaluate(micro, feeds, params)
    np.testing.assert_allclose(got["grad.w"], expected["grad.w"], rtol=1e-6)
    np.testing.assert_allclose(got["loss"], expected["loss"], rtol=1e-6)


def test_uniform_draws_cover_the_unit_interval_and_drop_path_keeps_what_dropout_keeps():
    """lg.uniform: values in [0, 1) with the uniform's mean and variance, a
    new draw at each step; floor(keep + u) (drop path's mask) is 1 exactly
    where lg.dropout of the same stream at rate 1 - keep keeps."""
    from xdsl.dialects.builtin import f32

    from sbpc.dialects import lg

    g = sbpc.Graph("uniform", placement=sbpc.placement("cpu", 1))
    ones = g.input("ones", (400, 250))
    seed, step = g.random_state()
    u = g.add(lg.UniformOp(seed.value, step.value, (400, 250), f32, 7))
    kept = g.add(lg.DropoutOp(ones.value, seed.value, step.value, 0.3, 7))
    g.output(u=u, path=sbpc.floor(u + 0.7), kept=kept)
    exe = sbpc.compile(g, mode="interpret", seed=3)
    draws = [exe.train_step({"ones": np.ones((400, 250), np.float32)}) for _ in range(2)]
    for d in draws:
        values = d["u"].ravel()
        assert values.min() >= 0.0 and values.max() < 1.0
        n = values.size
        assert abs(values.mean() - 0.5) < 5 * np.sqrt(1 / 12 / n)
        assert abs(values.var() - 1 / 12) < 0.01
        np.testing.assert_array_equal(d["path"] > 0, d["kept"] > 0)
    assert not np.array_equal(draws[0]["u"], draws[1]["u"])  # the step advanced


def test_the_masks_look_like_independent_draws():
    g = sbpc.Graph("stats", placement=sbpc.placement("cpu", 1))
    ones = g.input("ones", (400, 250))
    first, second = sbpc.dropout(ones, 0.1), sbpc.dropout(ones, 0.1)
    g.output(first=first, second=second)
    exe = sbpc.compile(g, mode="interpret")
    feeds = {"ones": np.ones((400, 250), np.float32)}
    draws = [exe.train_step(feeds) for _ in range(3)]
    masks = [d["first"].ravel() > 0 for d in draws]
    n = masks[0].size
    sigma = np.sqrt(0.1 * 0.9 / n)
    for m in masks:
        assert abs(1 - m.mean() - 0.1) < 5 * sigma  # the keep rate
        for lane in range(4):  # each of a Philox block's four words
            assert abs(1 - m[lane::4].mean() - 0.1) < 5 * sigma * 2
    assert set(np.unique(draws[0]["first"])) == {0.0, np.float32(1 / 0.9)}

    def correlation(a, b):
        return np.corrcoef(a.astype(float), b.astype(float))[0, 1]

    bound = 5 / np.sqrt(n)
    assert abs(correlation(masks[0], masks[1])) < bound  # across steps
    assert abs(correlation(masks[0], draws[0]["second"].ravel() > 0)) < bound  # across streams
    for lag in (1, 2, 4, 250):  # across neighbours in a block, across blocks and rows
        assert abs(correlation(masks[0][:-lag], masks[0][lag:])) < bound, lag


def test_the_seed_is_a_compile_option():
    def first_mask(**options):
        return sbpc.compile(dropped(), mode="interpret", **options).train_step({"x": X})["y"]

    assert np.array_equal(first_mask(seed=3), first_mask(seed=3))
    assert not np.array_equal(first_mask(seed=3), first_mask(seed=4))
    assert np.array_equal(first_mask(), first_mask(seed=0))  # the default seed
    assert not np.array_equal(first_mask(seed=-1), first_mask(seed=2**63 - 1))
    for bad in (2**63, 1.5, True):
        with pytest.raises(TypeError, match="seed must be a 64-bit integer or None"):
            sbpc.compile(dropped(), mode="interpret", seed=bad)


def test_a_checkpoint_resumes_the_same_stream(tmp_path):
    module = models.gpt("dp", 2, len(models.corpus()[1]), batch=8, seq=8, dim=16, heads=4, dropout=0.1)
    data = models.gpt_batches(8, 8)
    feeds = [next(data) for _ in range(6)]
    exe = sbpc.compile(module, seed=9)
    straight = [float(exe.train_step(f)["loss"]) for f in feeds]
    exe = sbpc.compile(module, seed=9)
    for f in feeds[:3]:
        exe.train_step(f)
    path = tmp_path / "ckpt.npz"
    exe.save(path)
    with np.load(path) as saved:
        assert int(saved["rng.seed"]) == 9 and int(saved["rng.step"]) == 3
    resumed = sbpc.compile(module, mode="interpret")  # its own seed is 0 until the checkpoint's is loaded
    resumed.load(path)
    again = [float(resumed.train_step(f)["loss"]) for f in feeds[3:]]
    np.testing.assert_allclose(again, straight[3:], rtol=1e-5)
    assert int(resumed.params["rng.step"]) == 6


GPT = {"batch": 8, "seq": 8, "dim": 16, "heads": 4, "layers": 2, "dropout": 0.1}
STEPS = 10


@pytest.fixture(scope="module")
def reference_losses():
    vocab = len(models.corpus()[1])
    without = models.reference_losses(models.gpt("dp", 1, vocab, **{**GPT, "dropout": 0.0}),
                                      models.gpt_batches(8, 8), STEPS)
    losses = models.reference_losses(models.gpt("dp", 1, vocab, **GPT), models.gpt_batches(8, 8), STEPS)
    assert np.abs(np.array(losses) - without).min() > 1e-4  # dropout changes every step's loss
    return losses


@pytest.mark.parametrize("variant, ranks", [
    ("pipeline", 4), *(pytest.param(v, r, marks=pytest.mark.full)
                       for v, r in [("dp", 2), ("tp", 2), ("2d", 4), ("zero", 2), ("fsdp", 2), ("pipeline", 2)])])
def test_the_gpt_with_dropout_trains_as_the_reference_under_every_variant(reference_losses, variant, ranks):
    # the pipeline variant: two stages, four micro-batches, each stage data parallel inside
    exe = sbpc.compile(models.gpt(variant, ranks, len(models.corpus()[1]), **GPT))
    data = models.gpt_batches(8, 8)
    losses = [float(exe.train_step(next(data))["loss"]) for _ in range(STEPS)]
    np.testing.assert_allclose(losses, reference_losses, rtol=1e-5)
