"""sbpc against PyTorch (CPU, the version pinned in the `test` extra): the
example MLP and GPT, the same initial weights and data, 20 Adam steps, data
parallel on 2 real MPI ranks in sbpc and one process in PyTorch. Skipped
when torch is not installed."""

import sys
from pathlib import Path

import numpy as np
import pytest

import sbpc
from sbpc.semantics.reference import initial_value

torch = pytest.importorskip("torch")
F = torch.nn.functional

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "examples"))

import models  # noqa: E402

STEPS = 20
TEXT, STOI = models.corpus()
GPT_SIZE = {"batch": 8, "seq": 8, "dim": 16, "heads": 4, "layers": 2}


def initial_params(module) -> dict[str, np.ndarray]:
    return {op.key.data: initial_value(op) for op in module.ops.last.body.ops
            if op.name == "lg.param" and not op.key.data.startswith("adam.")}


def mlp_torch(p, feeds):
    h = F.gelu(torch.from_numpy(feeds["x"]) @ p["w1"] + p["b1"], approximate="tanh")
    return F.cross_entropy(h @ p["w2"], torch.from_numpy(feeds["labels"]))


def gpt_torch(p, feeds, batch, seq, dim, heads, layers):
    hd = dim // heads
    mask = torch.triu(torch.full((seq, seq), -1e9), diagonal=1)
    h = p["wte"][torch.from_numpy(feeds["tokens"])] + p["wpe"]
    for i in range(layers):
        b = f"block{i}."

        def heads_of(t):
            return t.reshape(batch, seq, heads, hd).transpose(1, 2)

        x = F.layer_norm(h, (dim,), p[b + "ln1.g"], p[b + "ln1.b"], eps=1e-5)
        q, k, v = (heads_of(x @ p[b + w]) for w in ("wq", "wk", "wv"))
        scores = q @ k.transpose(-1, -2) * (1.0 / np.sqrt(hd)) + mask
        att = (torch.softmax(scores, dim=3) @ v).transpose(1, 2).reshape(batch, seq, dim)
        h = h + att @ p[b + "wo"]
        x = F.layer_norm(h, (dim,), p[b + "ln2.g"], p[b + "ln2.b"], eps=1e-5)
        h = h + F.gelu(x @ p[b + "w1"], approximate="tanh") @ p[b + "w2"]
    h = F.layer_norm(h, (dim,), p["lnf.g"], p["lnf.b"], eps=1e-5)
    logits = h @ p["head"]
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), torch.from_numpy(feeds["targets"]).reshape(-1))


def torch_train(params, loss_fn, batches, optimizer=None, dtype=None) -> tuple[np.ndarray, dict]:
    """PyTorch's STEPS steps from `params` on `batches` (an iterator of
    feeds; float32 ones are widened for a float64 run) with `optimizer`
    (default Adam, lr 3e-3): the losses and the final parameters."""
    p = {k: torch.tensor(v, dtype=dtype, requires_grad=True) for k, v in params.items()}
    opt = (optimizer or torch.optim.Adam)(p.values(), lr=3e-3)
    losses = []
    for _ in range(STEPS):
        feeds = {k: v.astype(np.float64) if dtype == torch.float64 and v.dtype == np.float32 else v
                 for k, v in next(batches).items()}
        opt.zero_grad()
        loss = loss_fn(p, feeds)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return np.array(losses), p


@pytest.mark.parametrize("model", ["mlp", "gpt"])
def test_loss_curve_matches_pytorch(model):
    torch.manual_seed(0)
    torch.set_num_threads(1)
    if model == "mlp":
        module = models.mlp("dp", 2)
        batches, loss_fn = models.mlp_batches, mlp_torch
    else:
        module = models.gpt("dp", 2, len(STOI), **GPT_SIZE)
        batches = lambda: models.gpt_batches(GPT_SIZE["batch"], GPT_SIZE["seq"])  # noqa: E731

        def loss_fn(p, feeds):
            return gpt_torch(p, feeds, **GPT_SIZE)

    expected, _ = torch_train(initial_params(module), loss_fn, batches())
    exe = sbpc.compile(module)
    data = batches()
    losses = [float(exe.train_step(next(data))["loss"]) for _ in range(STEPS)]
    rel = np.abs(np.array(losses) - expected) / np.abs(expected)
    assert rel.max() <= 1e-5, f"step {rel.argmax()}: sbpc {losses[rel.argmax()]} vs torch {expected[rel.argmax()]}"


@pytest.mark.parametrize("model, algorithm", [("mlp", "sgd"), ("gpt", "adam")])
def test_float64_end_to_end_matches_pytorch_float64(model, algorithm):
    # A float64 graph computes in float64 everywhere (constants, kernels,
    # collectives, the optimizer's corrections): the first step's loss and
    # gradients are PyTorch float64's to 1e-12, and 20 steps stay within
    # 1e-10, on 2 real MPI ranks (data parallel).
    torch.set_num_threads(1)
    if model == "mlp":
        build = lambda training: models.mlp("dp", 2, algorithm=algorithm, training=training, dtype="f64")  # noqa: E731
        batches = lambda: models.mlp_batches(dtype=np.float64)  # noqa: E731
        loss_fn = mlp_torch
    else:
        build = lambda training: models.gpt("dp", 2, len(STOI), algorithm=algorithm, training=training,  # noqa: E731
                                            dtype="f64", **GPT_SIZE)
        batches = lambda: models.gpt_batches(GPT_SIZE["batch"], GPT_SIZE["seq"], dtype=np.float64)  # noqa: E731

        def loss_fn(p, feeds):
            return gpt_torch(p, feeds, **GPT_SIZE)

    params = initial_params(build(False))
    assert all(v.dtype == np.float64 for v in params.values())
    p = {k: torch.tensor(v, requires_grad=True) for k, v in params.items()}
    first = {k: v for k, v in next(batches()).items() if k != "lr"}
    loss = loss_fn(p, first)
    loss.backward()
    grads = sbpc.compile(build(False), pipeline="lg-autodiff,compile").run(first)
    assert float(grads["loss"]) == pytest.approx(loss.item(), rel=1e-12, abs=0)
    for key, value in p.items():
        np.testing.assert_allclose(grads[f"grad.{key}"], value.grad.numpy(), rtol=1e-12, atol=1e-15, err_msg=key)

    expected, p = torch_train(params, loss_fn, batches(), torch.optim.SGD if algorithm == "sgd" else None)
    exe = sbpc.compile(build(True))
    data = batches()
    losses = [float(exe.train_step(next(data))["loss"]) for _ in range(STEPS)]
    np.testing.assert_allclose(losses, expected, rtol=1e-10, atol=0)
    state = exe.params
    for key, value in p.items():
        np.testing.assert_allclose(state[key], value.detach().numpy(), rtol=1e-10, atol=1e-13, err_msg=key)


@pytest.mark.parametrize("model, variant", [("mlp", "tp"), ("gpt", "zero"), ("mlp", "pipeline")])
def test_adam_drift_stays_within_pytorchs_own_float32_spread(model, variant):
    # 20 float32 Adam steps of sbpc against PyTorch float64 drift no more
    # than 10x PyTorch float32's own drift (bench/adam_drift.py measures
    # every model, variant and rank count; the worst was 1.6x)
    torch.set_num_threads(1)
    if model == "mlp":
        module, data, loss_fn = models.mlp(variant, 2), models.mlp_batches(), mlp_torch
    else:
        module = models.gpt(variant, 2, len(STOI), **GPT_SIZE)
        data = models.gpt_batches(GPT_SIZE["batch"], GPT_SIZE["seq"])

        def loss_fn(p, feeds):
            return gpt_torch(p, feeds, **GPT_SIZE)

    batches = [next(data) for _ in range(STEPS)]
    params = initial_params(module)

    t32, _ = torch_train(params, loss_fn, iter(batches), dtype=torch.float32)
    t64, _ = torch_train(params, loss_fn, iter(batches), dtype=torch.float64)
    exe = sbpc.compile(module)
    ours = np.array([float(exe.train_step(b)["loss"]) for b in batches])
    spread = np.max(np.abs(t32 - t64) / np.abs(t64))
    drift = np.max(np.abs(ours - t64) / np.abs(t64))
    assert drift <= 10 * spread, (drift, spread)
