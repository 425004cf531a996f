"""Optimizers for `sbpc.compile(graph, optimizer=...)`, with PyTorch's
names, arguments and arithmetic (`torch.optim.SGD`, `Adam`, `AdamW`).

    exe = sbpc.compile(graph, optimizer=sbpc.optim.AdamW(
        lr=6e-4, betas=(0.9, 0.95), weight_decay=0.1,
        groups=[{"params": ["*.bias", "*ln*"], "weight_decay": 0.0}]))

Each is a description: `compile` appends lg-autodiff and lg-optimizer (the
update as lg ops, its state as parameters) before the rest of the pipeline,
and the learning rate becomes the default of the graph's `lr` input
(`train_step` feeds it unless the caller does, so schedules stay possible).
`groups` gives parameters matched by glob patterns over their names
(PyTorch's `state_dict()` names for imported modules) their own weight
decay, as PyTorch's parameter groups do; the first group that matches wins.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from xdsl.passes import ModulePass


@dataclass(frozen=True)
class Optimizer:
    lr: float = 1e-3
    zero: bool = False
    """ZeRO (stage 1): each rank of the data axis keeps and updates 1/p of
    the optimizer state (lg-optimizer's `zero`), as PyTorch's
    ZeroRedundancyOptimizer does."""

    def options(self) -> dict[str, Any]:
        """lg-optimizer's options for this update (without `zero`)."""
        raise NotImplementedError

    def _options(self) -> dict[str, Any]:
        return {**self.options(), **({"zero": True} if self.zero else {})}

    def passes(self) -> list[ModulePass]:
        """lg-autodiff, then the lg-optimizer pass that applies this update."""
        from sbpc.lowering.lg_autodiff import LgAutodiffPass
        from sbpc.lowering.lg_optimizer import LgOptimizerPass

        return [LgAutodiffPass(), LgOptimizerPass(**self._options())]

    def pass_spec(self) -> str:
        """The lg-optimizer pass that applies this update, as pipeline text
        (for sbp-opt)."""
        options = " ".join(f"{k}={_option_text(v)}" for k, v in self._options().items())
        return f"lg-optimizer{{{options}}}"


@dataclass(frozen=True)
class SGD(Optimizer):
    """`torch.optim.SGD(lr, momentum)`: p -= lr * buf, buf = momentum * buf + grad."""

    momentum: float = 0.0
    weight_decay: float = 0.0

    def options(self) -> dict[str, Any]:
        _no_coupled_decay(self.weight_decay, "SGD")
        if self.momentum:
            return {"algorithm": "momentum", "momentum": float(self.momentum)}
        return {"algorithm": "sgd"}


@dataclass(frozen=True)
class Adam(Optimizer):
    """`torch.optim.Adam(lr, betas, eps)`."""

    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    weight_decay: float = 0.0

    def options(self) -> dict[str, Any]:
        _no_coupled_decay(self.weight_decay, "Adam")
        return {"algorithm": "adam", **self._adam()}

    def _adam(self) -> dict[str, Any]:
        return {"beta1": float(self.betas[0]), "beta2": float(self.betas[1]), "eps": float(self.eps)}


@dataclass(frozen=True)
class AdamW(Adam):
    """`torch.optim.AdamW(lr, betas, eps, weight_decay)`: decoupled decay,
    p -= lr * (adam_step + weight_decay * p), per group of parameters."""

    weight_decay: float = 0.01
    groups: Sequence[Mapping[str, Any]] = field(default_factory=tuple)

    def options(self) -> dict[str, Any]:
        options: dict[str, Any] = {"algorithm": "adamw", **self._adam(), "weight_decay": float(self.weight_decay)}
        rules = []
        for group in self.groups:
            unknown = set(group) - {"params", "weight_decay"}
            if unknown or "params" not in group:
                raise ValueError(f"an AdamW group takes 'params' (glob patterns) and 'weight_decay', got {group}")
            patterns = [group["params"]] if isinstance(group["params"], str) else list(group["params"])
            for pattern in patterns:
                if any(c in pattern for c in ":;\"{} "):
                    raise ValueError(f"parameter pattern {pattern!r} may not contain spaces or :;\"{{}}")
                rules.append(f"{pattern}:{_num(group.get('weight_decay', self.weight_decay))}")
        if rules:
            options["decay_groups"] = ";".join(rules)
        return options


def _option_text(value: Any) -> str:
    """A pass option's value as the pipeline parser reads it."""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float):
        return _num(value)
    if isinstance(value, str) and not value.isidentifier():
        return f'"{value}"'
    return str(value)


def _num(x: float) -> str:
    """A float as the pass-option parser reads it (it takes no exponents)."""
    text = repr(float(x))
    return text if "e" not in text else f"{float(x):.30f}".rstrip("0")


def _no_coupled_decay(weight_decay: float, name: str) -> None:
    if weight_decay:
        raise ValueError(f"{name}(weight_decay=...) (L2 added to the gradient) is not supported: use AdamW's "
                         "decoupled weight decay")
