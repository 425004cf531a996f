"""PyTorch's Core ATen opset, and how an op without a rule of its own reaches it.

Core ATen (about 190 operator overloads, tagged `torch.Tag.core`) is the set
every other ATen op decomposes into: `torch.export`'s default decomposition
table lowers to it, and backends that keep up with new models (XLA,
Inductor) are written against it. The importer imports export's graph
before decomposition, so ops such as `aten.linear` or
`aten.scaled_dot_product_attention` keep their meaning; an op with no rule
of its own is decomposed here, node by node, through PyTorch's own table
(or its CompositeImplicitAutograd kernel), and the ops it decomposes into
are imported by their rules in its place.

An op whose output shape depends on the values of its inputs cannot be
planned ahead (sbpc's plans fix every register's shape) and is refused by
name with that reason (`DATA_DEPENDENT`).
"""

from __future__ import annotations

import functools
from typing import Any

from sbpc.torch_import.values import _op_name, _unwrap

DATA_DEPENDENT = frozenset({
    "aten.nonzero", "aten.nonzero_numpy", "aten.argwhere", "aten.masked_select", "aten.unique",
    "aten._unique", "aten._unique2", "aten.unique_dim", "aten.unique_consecutive",
    "aten.repeat_interleave.Tensor", "aten._local_scalar_dense", "aten.item",
})
"""ATen ops whose output shape depends on the values of their inputs."""

def core_aten_ops() -> list[str]:
    """The names (as the rules spell them: `aten.<op>.<overload>`, the
    overload dropped when `default`) of every operator overload PyTorch
    tags as Core ATen."""
    import torch

    names = set()
    # every registered schema (`dir(torch.ops.aten)` lists only the op
    # packets already looked up)
    for schema in torch._C._jit_get_all_schemas():
        if not schema.name.startswith("aten::"):
            continue
        packet = getattr(torch.ops.aten, schema.name.removeprefix("aten::"), None)
        op = getattr(packet, schema.overload_name or "default", None) if packet is not None else None
        if op is not None and torch.Tag.core in op.tags:
            names.add(_op_name(op))
    return sorted(names)


def coverage(rules=None) -> dict[str, list[str]]:
    """Core ATen ops by how the importer takes them: "rule" (a rule of its
    own), "decomposition" (no rule, imported through PyTorch's
    decomposition), "computed at import" (no tensor operand: PyTorch
    computes the value, a constant), "random" (a rule drawing sbpc's own
    random numbers, new at every call), and refused by name:
    "data-dependent" (the output's shape depends on the data) and
    "refused" (no rule and no decomposition yet). `rules`: the names of
    the ops with a rule; by default the importer's, for real operands and
    for complex ones."""
    import torch

    if rules is None:
        from sbpc.torch_import.aten.registry import COMPLEX_RULES, RULES

        rules = RULES.keys() | COMPLEX_RULES.keys()

    found: dict[str, list[str]] = {"rule": [], "decomposition": [], "computed at import": [],
                                   "data-dependent": [], "random": [], "refused": []}
    for name in core_aten_ops():
        base, _, overload = name.removeprefix("aten.").partition(".")
        op = getattr(getattr(torch.ops.aten, base), overload or "default")
        if torch.Tag.nondeterministic_seeded in op.tags:
            # a draw per call, sbpc's own (lg.uniform and what is computed
            # from it), which no sample can compare with PyTorch's draw;
            # without a rule refused (folded it would be one draw for
            # every step)
            found["random" if name in rules else "refused"].append(name)
        elif name in rules:
            found["rule"].append(name)
        elif name in DATA_DEPENDENT:
            found["data-dependent"].append(name)
        elif not any("Tensor" in str(a.type) for a in op._schema.arguments):
            found["computed at import"].append(name)  # no tensor operand: PyTorch computes it (`full`, `arange`)
        else:
            found["decomposition" if decomposition(op) is not None else "refused"].append(name)
    return found


@functools.cache
def _table() -> dict:
    import torch

    return dict(torch.export.default_decompositions().items())


def decomposition(op) -> Any:
    """PyTorch's decomposition of an ATen operator overload, or None: the
    entry of export's default table, else its CompositeImplicitAutograd
    kernel (ops such as `numpy_T` or `dropout` are defined as compositions)."""
    import torch

    found = _table().get(op)
    if found is not None:
        return found
    name = getattr(op, "name", None)
    if callable(name) and torch._C._dispatch_has_kernel_for_dispatch_key(name(), "CompositeImplicitAutograd"):
        return op.decompose
    return None


def trace_decomposition(op, args: tuple, kwargs: dict, is_tensor, example) -> tuple[Any, list] | None:
    """The decomposition of `op` applied to the node's arguments, traced
    into ATen ops: (graph module, the tensor arguments in the order of its
    placeholders), or None where PyTorch has no decomposition of `op` or
    the one it has gives `op` back. `is_tensor` tells the importer's
    tensors among the arguments and `example(t)` makes a PyTorch tensor
    of its shape and dtype; every other argument is a constant of the
    trace."""
    import torch
    import torch.utils._pytree as pytree
    from torch.fx.experimental.proxy_tensor import make_fx

    fn = decomposition(op)
    if fn is None:
        return None
    leaves, spec = pytree.tree_flatten((args, kwargs))
    tensors = [leaf for leaf in leaves if is_tensor(leaf)]

    def apply(*values):
        given = iter(values)
        a, k = pytree.tree_unflatten([next(given) if is_tensor(leaf) else _unwrap(leaf) for leaf in leaves], spec)
        return fn(*a, **k)

    with torch.no_grad():
        traced = make_fx(apply)(*[example(t) for t in tensors])
    if any(node.op == "call_function" and node.target is op for node in traced.graph.nodes):
        return None
    return traced, tensors
