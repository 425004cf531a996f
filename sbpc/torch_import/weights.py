"""`from_torch(..., weights=PATH)`: a module's weights from a Hugging Face
safetensors checkpoint instead of the module, so that a module built on the
meta device (`with torch.device("meta")`) imports without its weights ever
being in this process: the ranks read their own pieces of each tensor from
the files (runtime/checkpoint.py).

A parameter is found in the checkpoint under one of its state_dict() names
(a tied weight has several), less a module prefix the checkpoint lacks: a
wrapper's `model.` before GPT-2's `transformer.wte.weight`. The prefix is
the one under which the most parameters are found; a parameter found under
none is named."""

from __future__ import annotations

import os
from collections.abc import Mapping

import numpy as np

from sbpc.runtime.checkpoint import CheckpointError, Weights, hf_files, tensor_types
from sbpc.torch_import.values import TorchImportError


class CheckpointFiles:
    """The tensors of a Hugging Face checkpoint, by name, and the prefix of
    the module's names they lack."""

    def __init__(self, path: str | os.PathLike, module_names: list[str]):
        try:
            self.folder, self.files = hf_files(path)
        except CheckpointError as e:
            raise TorchImportError(str(e)) from None
        self.path = os.fspath(path)
        self.prefix = _prefix(module_names, self.files)

    def name_of(self, names: list[str]) -> str | None:
        """The checkpoint's name of the tensor the module calls by any of `names`."""
        for name in names:
            stripped = name.removeprefix(self.prefix) if name.startswith(self.prefix) else None
            if stripped in self.files:
                return stripped
        return None

    def value(self, names: list[str], what: str) -> np.ndarray:
        """A (small) tensor read whole now: a buffer sbpc folds into the plan."""
        from safetensors import safe_open

        name = self.name_of(names)
        if name is None:
            raise TorchImportError(f"{what} is on the meta device and the weights {self.path!r} do not hold it: "
                                   "sbpc folds it into the plan, so it needs its value (build it on the CPU)")
        with safe_open(os.path.join(self.folder, self.files[name]), framework="numpy") as f:
            return f.get_tensor(name)

    def weights(self, params: Mapping[str, tuple[list[str], tuple[int, ...], str]]) -> Weights:
        """Where each parameter ({key: (its names, shape, dtype)}) lies in the
        files, after checking that each is there with its shape."""
        tensors = {}
        for key, (names, _, _) in sorted(params.items()):
            name = self.name_of(names)
            if name is None:
                less = f", less the prefix {self.prefix!r}" if self.prefix else ""
                raise TorchImportError(f"the weights {self.path!r} hold no tensor for parameter {key!r} (under the "
                                       f"names {names}{less})")
            tensors[key] = name
        try:
            found = tensor_types(self.folder, self.files, tensors.values())
        except CheckpointError as e:
            raise TorchImportError(str(e)) from None
        for key, name in tensors.items():
            shape, dtype = found[name]
            if shape != params[key][1]:
                raise TorchImportError(f"the weights {self.path!r} hold {name!r} as {dtype}{list(shape)}; the module's "
                                       f"parameter {key!r} is {params[key][2]}{list(params[key][1])}")
        pieces = {key: [(self.files[name], [0] * len(params[key][1]), list(params[key][1]))]
                  for key, name in tensors.items()}
        return Weights(self.folder, pieces, tensors, self.prefix)


def _prefix(module_names: list[str], files: Mapping[str, str]) -> str:
    """The prefix of the module's names the checkpoint lacks ("" if none):
    of the first name's dotted prefixes, the one that finds the most names."""
    if not module_names:
        return ""
    first = module_names[0].split(".")
    candidates = [".".join(first[:i]) + "." if i else "" for i in range(len(first))]

    def found(prefix: str) -> int:
        return sum(1 for n in module_names if n.startswith(prefix) and n.removeprefix(prefix) in files)

    return max(candidates, key=lambda p: (found(p), -len(p)))
