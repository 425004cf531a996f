"""Training an imported PyTorch module with sbpc against PyTorch itself, for
the frontend tests (`test_torch_frontend.py`, `test_hf_models.py`,
`test_hf_families.py`)."""

import copy

import numpy as np
import pytest
import torch

import sbpc


class ClassifierLoss(torch.nn.Module):
    """An image classifier (a Hugging Face model) called with its inputs by
    name, its own loss returned: what both sides train."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, pixel_values, labels):
        return self.model(pixel_values=pixel_values, labels=labels).loss


class LanguageModelLoss(torch.nn.Module):
    """A language model (a Hugging Face model) called with its token ids and
    labels by name, its own loss returned."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_ids, labels):
        return self.model(input_ids=input_ids, labels=labels).loss


def loss_of(result):
    if isinstance(result, dict):
        return result["loss"]
    return result[-1] if isinstance(result, tuple) else result


def _experts_runnable_in_float64(model) -> None:
    """PyTorch's grouped matmul (transformers' default experts, `grouped_mm`)
    has no float64 kernel on CPU: the float64 reference runs the experts as
    `batched_mm`, the same function computed another way."""
    for module in model.modules():
        config = getattr(module, "config", None)
        if getattr(config, "_experts_implementation", None) in (None, "grouped_mm") and hasattr(
                module, "gate_up_proj"):
            config._experts_implementation = "batched_mm"


def torch_run(model, batches, make_opt, dtype):
    """PyTorch's own training: the loss per step and the final parameters."""
    model = copy.deepcopy(model).to(dtype)
    if dtype == torch.float64:
        _experts_runnable_in_float64(model)
    opt = make_opt(model)
    losses = []
    for batch in batches:
        batch = [t.to(dtype) if t.is_floating_point() else t for t in batch]
        opt.zero_grad()
        loss = loss_of(model(*batch))
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses, {k: v.detach().double() for k, v in model.state_dict().items()}


def check_training(model, batches, names, optimizer, make_opt, ranks=1, sbp=None, mesh=None, plan=None):
    """sbpc trains `model` on `batches[:-1]` as PyTorch does (losses, then
    parameters), and the weights back in PyTorch give sbpc's next loss;
    `plan="auto"` lets the planner choose the plan on `ranks` devices."""
    where = sbpc.placement("cpu", ranks, mesh)
    graph = sbpc.from_torch(model, batches[0], sbp=sbp, placement=where)
    exe = sbpc.compile(graph, optimizer=optimizer, mode="interpret" if ranks == 1 else "auto",
                       **({"plan": plan} if plan is not None else {}))
    losses = [float(exe.train_step(dict(zip(names, (t.numpy() for t in b))))["loss"]) for b in batches[:-1]]
    ref32, params32 = torch_run(model, batches[:-1], make_opt, torch.float32)
    ref64, params64 = torch_run(model, batches[:-1], make_opt, torch.float64)
    # a float64 model is compared with PyTorch's float64 run (where float32
    # rounding is amplified past 1e-5 by the training itself, as a small
    # batch's batch-norm does in MobileNetV2, the float64 run shows the same
    # steps exactly)
    float64 = next(model.parameters()).dtype == torch.float64
    np.testing.assert_allclose(losses, ref64 if float64 else ref32, rtol=1e-5)
    state = exe.state_dict()
    assert set(state) == set(model.state_dict())
    steps = len(batches) - 1
    adaptive = isinstance(optimizer, sbpc.optim.Adam)  # (AdamW too)
    for key, p64 in params64.items():
        diff = (state[key].double() - p64).abs().flatten()
        spread = (params32[key] - p64).abs().max().item()
        # sbpc is float32 too: its distance from float64 is PyTorch's own,
        # within a factor, plus float32 rounding of the tensor's scale, for
        # all but a few elements under Adam. Those few: split reductions sum
        # in another order (and how depends on the machine's BLAS kernels),
        # and Adam turns a last-bit change of a near-zero gradient into a
        # change of its update of up to 2 lr per step (its first step is
        # lr * sign(g)).
        tight = 4 * spread + 1e-5 * p64.abs().max().item()
        outliers = int((diff > tight).sum().item())
        if not adaptive:
            # SGD and momentum move a parameter by lr times its gradient: a
            # last-bit change of the gradient stays a last-bit change, so
            # every element is within the bound (half of a 4-element bias
            # could be wrong under the allowance below)
            assert outliers == 0, f"{key}: {outliers} of {diff.numel()} elements differ by more than {tight:.3g}"
            continue
        assert outliers <= max(2, diff.numel() // 1000), (
            f"{key}: {outliers} of {diff.numel()} elements differ by more than {tight:.3g}"
        )
        assert diff.max().item() <= tight + 2 * optimizer.lr * steps, key
    # the weights back in PyTorch give sbpc's next loss
    model = copy.deepcopy(model)
    model.load_state_dict(state)
    last = batches[-1]
    expected = float(exe.train_step(dict(zip(names, (t.numpy() for t in last))))["loss"])
    with torch.no_grad():
        assert loss_of(model(*last)).item() == pytest.approx(expected, rel=1e-5)
    return exe
