"""Train an existing PyTorch model: `sbpc.from_torch(module, args)` captures
`module` with `torch.export` and builds the same computation as an `lg` graph.

    graph = sbpc.from_torch(model, (idx, targets), sbp={"idx": S(0)}, placement=mesh)
    exe = sbpc.compile(graph, optimizer=sbpc.optim.AdamW(lr=3e-4, weight_decay=0.1))
    for batch in data:
        exe.train_step({"idx": x, "targets": y})
    model.load_state_dict(exe.state_dict())

What is imported is export's ATen graph before decomposition (`aten.linear`,
`aten.layer_norm`, `aten.scaled_dot_product_attention`, `aten.cross_entropy_loss`
...): those map onto lg ops that keep their meaning for SBP inference and the
kernels, where the core ATen set would have spelt them in gathers and
`where`s. The rules:

- Inputs are `forward`'s parameter names with the example's shapes and
  dtypes. Parameters keep their `state_dict()` names and PyTorch's layout (a
  Linear weight is `(out, in)`, applied with `lg.matmul ... transpose_rhs`);
  their values are the parameters' initial values. A parameter shared by
  several modules (GPT-2's tied `lm_head` and `wte`) is one lg parameter,
  returned under all its names by `Executable.state_dict()`.
- Buffers, constants and everything computed only from them (causal masks,
  `arange` positions, rotary tables) are folded here, with PyTorch, into
  `lg.constant`s.
- The training objective is the output named `loss`: `forward` returns the
  loss alone, a dict with the key `loss`, or a tuple whose last element is a
  scalar (nanoGPT's `(logits, loss)`); the other outputs keep their dict keys
  or are named `output<i>` by position.
- `sbp` maps glob patterns over input and parameter names to hints.

An ATen op with no rule of its own is imported through PyTorch's
decomposition of it (`sbpc.torch_import.core_aten`), the ops it decomposes
into each by its rule.

What cannot be imported (data-dependent control flow, an op whose output
shape depends on the data, an ATen op with neither a rule nor a
decomposition, a pattern that matches nothing) raises `TorchImportError` naming
the op or the name, and the user's source line where PyTorch recorded it.

The importer itself is the package `sbpc.torch_import`: `capture` (export
and its failures), `importer` (the walk over export's graph), `state`
(inputs, parameters, buffers), `precision` (16-bit floats, autocast) and
`aten`, the lowering of each ATen op by op family. This module is its
entry: `from_torch`, and the names users import from here.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from sbpc.frontend import Graph, Placement
from sbpc.torch_import.aten.registry import RULES as RULES
from sbpc.torch_import.aten.registry import rule as rule
from sbpc.torch_import.capture import _export_failure, _quiet_torch, _register_caches
from sbpc.torch_import.capture import _user_line as _user_line
from sbpc.torch_import.importer import _Importer
from sbpc.torch_import.precision import AUTOCAST_LOWER as AUTOCAST_LOWER
from sbpc.torch_import.values import TorchImportError as TorchImportError
from sbpc.torch_import.values import to_numpy as to_numpy
from sbpc.torch_import.weights import CheckpointFiles


def from_torch(module, args, kwargs: Mapping[str, Any] | None = None, *, sbp: Mapping[str, Any] | None = None,
               placement: Placement | None = None, name: str | None = None,
               weights: str | os.PathLike | None = None) -> Graph:
    """`module` (a `torch.nn.Module`) as an `sbpc.Graph`, captured with
    `torch.export` on the example `args` (and `kwargs`). With `weights` (a
    Hugging Face safetensors checkpoint: a file, a sharded one's index, or
    the directory `save_pretrained` wrote), the parameters' values come
    from there, read by the ranks piece by piece, and never by this
    process: the module may be built on the meta device
    (`with torch.device("meta")`)."""
    import torch

    args = tuple(args) if isinstance(args, tuple | list) else (args,)
    checkpoint = None
    if weights is not None:
        names = [n for n, _ in module.named_parameters(remove_duplicate=False)]
        checkpoint = CheckpointFiles(weights, names + [n for n, _ in module.named_buffers()])
    _register_caches(module)
    try:
        with _quiet_torch():
            program = torch.export.export(module, args, kwargs=dict(kwargs or {}))
    except Exception as error:  # export's failures come in many classes; each becomes one message
        raise TorchImportError(_export_failure(module, error)) from None
    return _Importer(program, module, dict(sbp or {}), placement, name or type(module).__name__, checkpoint).graph()
