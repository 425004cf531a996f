"""forward's signature in the graph: its inputs, the parameters (a tied
weight once, under all its names), the buffers (folded into constants, or
state that the forward updates, such as batch-norm statistics) and the sbp
hints matched to their names. `_Importer` builds on `_StateImporter`."""

from __future__ import annotations

import fnmatch
from typing import TYPE_CHECKING, Any

import numpy as np

from sbpc.frontend import Graph, Tensor
from sbpc.torch_import.values import _DTYPES, TorchImportError, _op_name, to_numpy

if TYPE_CHECKING:
    from sbpc.torch_import.weights import CheckpointFiles


def _updated_buffers(nodes) -> set:
    """The buffer placeholders the forward updates in a way sbpc imports:
    the running statistics of a batch-norm in training mode, and a count
    increased in place (`num_batches_tracked += 1`)."""
    found: set[Any] = set()
    for node in nodes:
        name = _op_name(node.target) if node.op == "call_function" else ""
        if name == "aten.batch_norm" and len(node.args) > 5 and node.args[5] is True:
            found.update(a for a in node.args[3:5] if getattr(a, "op", None) == "placeholder")
        elif name == "aten.add_.Tensor" and getattr(node.args[0], "op", None) == "placeholder":
            found.add(node.args[0])
    return found


class _StateImporter:
    """The placeholders of export's graph, as lg inputs and parameters of `g`."""

    def __init__(self, module, sbp: dict[str, Any], g: Graph, checkpoint: CheckpointFiles | None = None):
        self.module = module
        self.checkpoint = checkpoint
        """The weights' files (`from_torch(weights=)`): the parameters' values are read from them, not the module."""
        self.from_checkpoint: dict[str, tuple[list[str], tuple[int, ...], str]] = {}
        """The parameters read from the checkpoint: their names, shapes and dtypes."""
        self.sbp = sbp
        self.g = g
        self.matched: set[str] = set()
        self.params: dict[str, Tensor] = {}
        self.inputs: dict[str, Any] = {}
        self.state_inputs: dict[Any, str] = {}
        """The placeholders of parameters and buffers, and their names."""
        self.updates: dict[str, Tensor] = {}
        """Each state buffer's value after the step (its `new.<name>` output)."""

    def _check_patterns(self) -> None:
        unmatched = sorted(set(self.sbp) - self.matched)
        if unmatched:
            inputs = [name for name, t in self.inputs.items()]
            raise TorchImportError(
                f"sbp pattern {unmatched[0]!r} matches no input or parameter of {type(self.module).__name__} "
                f"(inputs: {inputs}; parameters such as {list(self.g.state_names)[:4]})"
            )

    def _names(self) -> dict[int, list[str]]:
        """Every state_dict name of each parameter object (tied weights have several)."""
        names: dict[int, list[str]] = {}
        for key, p in self.module.named_parameters(remove_duplicate=False):
            names.setdefault(id(p), []).append(key)
        return names

    def _hint(self, name: str):
        hint = None
        for pattern, value in self.sbp.items():
            if fnmatch.fnmatchcase(name, pattern):
                self.matched.add(pattern)
                hint = hint if hint is not None else value
        if hint is not None and self.g.placement is None:
            raise TorchImportError(f"an sbp hint for {name!r} needs a placement: pass placement=")
        return hint

    def _dtype(self, tensor, what: str) -> str:
        dtype = _DTYPES.get(str(tensor.dtype))
        if dtype is None:
            raise TorchImportError(f"{what} has dtype {tensor.dtype}, which sbpc does not support "
                                   f"(supported: {', '.join(_DTYPES)})")
        return dtype

    def _param(self, target: str, value, names: dict[int, list[str]]) -> Tensor:
        # export lifts a tied weight once per name; sbpc keeps one parameter
        # under its first name, as named_parameters() does
        aliases = names.get(id(self.module.get_parameter(target)), [target])
        key = aliases[0]
        if key in self.params:
            return self.params[key]
        hint = next((h for h in (self._hint(n) for n in aliases) if h is not None), None)
        t = self.g.param(key, tuple(value.shape), dtype=self._dtype(value, f"parameter {key!r}"), sbp=hint)
        self._initial_value(key, aliases, value)
        for alias in aliases:
            self.g.state_names[alias] = key
        self.params[key] = t
        return t

    def _state(self, name: str, value) -> Tensor:
        """A buffer the forward updates, as an lg parameter marked `state`:
        its value lives across steps, `state_dict()` returns it, and the
        graph's `new.<name>` output is its next value."""
        t = self.g.param(name, tuple(value.shape), dtype=self._dtype(value, f"buffer {name!r}"), state=True)
        self._initial_value(name, [name], value)
        self.g.state_names[name] = name
        return t

    def _initial_value(self, key: str, names: list[str], value) -> None:
        """The parameter's starting value: the module's, or where the
        weights come from a checkpoint, the ranks read it from there."""
        if self.checkpoint is not None:
            self.from_checkpoint[key] = (names, tuple(value.shape), str(value.dtype).removeprefix("torch."))
        elif value.device.type == "meta":
            raise TorchImportError(f"parameter {key!r} is on the meta device: pass weights= (a safetensors "
                                   "checkpoint, as save_pretrained writes it) for its values")
        else:
            self.g.initial_values[key] = to_numpy(value).copy()

    def materialized(self, value, names: list[str], what: str):
        """A buffer's value as sbpc folds it: from the checkpoint where the
        module has it on the meta device."""
        if getattr(value, "device", None) is None or value.device.type != "meta":
            return value
        import torch

        if value.numel() == 0:  # (an empty tensor's value is known: a KV cache's start)
            return torch.empty(value.shape, dtype=value.dtype)
        if self.checkpoint is None:
            raise TorchImportError(f"{what} is on the meta device: sbpc folds it into the plan, so it needs its "
                                   "value (build it on the CPU, or pass weights= that hold it)")
        return torch.from_numpy(np.ascontiguousarray(self.checkpoint.value(names, what)))

    def update(self, node, value: Tensor) -> None:
        """Records `value` as the next value of the state buffer `node`."""
        name = self.state_inputs[node]
        if name in self.updates:
            raise ValueError(f"buffer {name!r} updated twice in one forward")
        self.updates[name] = value

    def _input(self, node) -> Tensor:
        value = node.meta.get("val")
        if value is None or not hasattr(value, "shape"):
            raise TorchImportError(f"input {node.name!r} is not a tensor; sbpc takes tensor inputs only")
        self.inputs[node.name] = value
        return self.g.input(node.name, tuple(int(d) for d in value.shape),
                            self._dtype(value, f"input {node.name!r}"), sbp=self._hint(node.name))
