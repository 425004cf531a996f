"""Random draws in imported PyTorch modules (`sbpc/torch_import/aten/random.py`):
`torch.rand`, `randn`, `rand_like`/`randn_like`, `randperm` and ATen's
`native_dropout` are sbpc's own draws (lg.uniform and what is computed
from it), so no sample compares them with PyTorch's generator. What is
checked instead: each follows its distribution, is new at every step, is
the same on 1 rank and data parallel on 2, and takes the gradient PyTorch
defines for it."""

import numpy as np
import pytest

import sbpc
from sbpc import S

torch = pytest.importorskip("torch")
nn = torch.nn
aten = torch.ops.aten

RATE = 0.25


class Draws(nn.Module):
    """Every draw, and a loss through the dropped values."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.linspace(0.5, 1.5, 32))

    def forward(self, x):
        dropped, kept = aten.native_dropout(x * self.w, RATE, True)
        noise = torch.randn_like(x)
        return {"normal": torch.randn(64, 32, dtype=torch.float64), "noise": noise, "uniform": torch.rand_like(x),
                "perm": torch.randperm(24), "dropped": dropped, "kept": kept,
                "loss": (dropped * x).sum() + (noise * 0.0).sum()}


OUTPUTS = ["normal", "noise", "uniform", "perm", "dropped", "kept", "loss"]


def steps(ranks: int, count: int = 2) -> list[dict]:
    x = torch.linspace(-1.0, 1.0, 64 * 32).reshape(64, 32)
    graph = sbpc.from_torch(Draws(), (x,), placement=sbpc.placement("cpu", ranks),
                            sbp={"x": S(0)} if ranks > 1 else None)
    exe = sbpc.compile(graph, optimizer=sbpc.optim.SGD(lr=1.0), mode="interpret" if ranks == 1 else "auto", seed=7)
    out = []
    for _ in range(count):
        before = exe.state_dict()["w"].clone()
        got = exe.train_step({"x": x.numpy()}, outputs=OUTPUTS)
        got["grad.w"] = (before - exe.state_dict()["w"]).numpy()  # SGD at lr 1: the gradient
        got["x"] = x.numpy()
        out.append(got)
    return out


@pytest.fixture(scope="module")
def one_rank():
    return steps(1)


def test_normal_draws_have_the_normals_moments_and_spread(one_rank):
    for name in ("normal", "noise"):
        draws = np.concatenate([s[name].ravel() for s in one_rank])
        assert abs(draws.mean()) < 0.05 and abs(draws.std() - 1.0) < 0.05, name
        within = [np.mean(np.abs(draws) < k) for k in (1, 2, 3)]
        np.testing.assert_allclose(within, [0.6827, 0.9545, 0.9973], atol=0.02, err_msg=name)
    assert one_rank[0]["normal"].dtype == np.float64 and one_rank[0]["noise"].dtype == np.float32


def test_uniform_draws_and_permutations(one_rank):
    for step in one_rank:
        assert step["uniform"].min() >= 0.0 and step["uniform"].max() < 1.0
        assert abs(step["uniform"].mean() - 0.5) < 0.03
        assert sorted(step["perm"].tolist()) == list(range(24)) and step["perm"].dtype == np.int64


def test_native_dropout_keeps_at_its_rate_scales_the_kept_and_passes_their_gradient(one_rank):
    for step in one_rank:
        kept, x = step["kept"], step["x"]
        assert kept.dtype == np.bool_ and abs(kept.mean() - (1 - RATE)) < 0.03
        w = np.linspace(0.5, 1.5, 32, dtype=np.float32) if step is one_rank[0] else None
        if w is not None:
            np.testing.assert_allclose(step["dropped"], np.where(kept, x * w / (1 - RATE), 0.0), rtol=1e-6)
        # d loss / d w = sum over rows of x * kept / (1 - p) * x
        np.testing.assert_allclose(step["grad.w"], (x * x * kept / (1 - RATE)).sum(0), rtol=1e-4)


def test_every_draw_is_new_at_every_step(one_rank):
    first, second = one_rank
    for name in ("normal", "noise", "uniform", "perm", "kept"):
        assert not np.array_equal(first[name], second[name]), name


def test_every_draw_is_the_same_data_parallel_on_2(one_rank):
    for alone, split in zip(one_rank, steps(2), strict=True):
        for name in ("uniform", "perm", "kept"):  # the draws themselves: bit for bit
            np.testing.assert_array_equal(split[name], alone[name], err_msg=name)
        for name in ("normal", "noise", "dropped"):  # computed from them, by another backend's kernels
            np.testing.assert_allclose(split[name], alone[name], rtol=1e-6, atol=1e-7, err_msg=name)
        np.testing.assert_allclose(split["grad.w"], alone["grad.w"], rtol=1e-5)
