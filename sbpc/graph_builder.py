"""Builds `lg` graphs through the Python API (much faster than parsing text).

    b = GraphBuilder("mlp")
    x = b.input("x", (8, 16))
    w = b.param("w", (16, 4), NormalInitAttr(0.0, 0.02))
    y = b.add(lg.MatmulOp(x, w))
    module = b.module({"y": y})

Op constructors infer their result types with the ops' own shape rules, so a
graph that builds is a graph that verifies. This is the layer under the
user-facing frontend.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from xdsl.dialects.builtin import ModuleOp, TensorType, bf16, f16, f32, f64, i1, i32, i64
from xdsl.ir import Attribute, Block, Operation, Region, SSAValue

from sbpc.dialects import lg

ELEMENT_TYPES: dict[str, Attribute] = {"bf16": bf16, "f16": f16, "f32": f32, "f64": f64, "i32": i32, "i64": i64,
                                       "i1": i1}


def element(dtype: str | Attribute) -> Attribute:
    """The element type a dtype names ("f32", "i64", ...)."""
    if not isinstance(dtype, str):
        return dtype
    if dtype not in ELEMENT_TYPES:
        raise ValueError(f"unknown dtype {dtype!r} (choose {', '.join(ELEMENT_TYPES)})")
    return ELEMENT_TYPES[dtype]


def check_shape(shape: Sequence[int]) -> Sequence[int]:
    """`shape`, whose sizes must be at least 0 (-1 is a dynamic size to xDSL)."""
    if any(d < 0 for d in shape):
        raise ValueError(f"a shape's sizes are at least 0, got {list(shape)}")
    return shape


def tensor_type(shape: Sequence[int], dtype: str | Attribute = "f32") -> TensorType:
    return TensorType(element(dtype), check_shape(shape))


class GraphBuilder:
    """Appends ops to one graph's body, in order."""

    def __init__(self, name: str, placement: str | None = None):
        self.name = name
        self.placement = placement
        self.block = Block()

    def add(self, op: Operation) -> SSAValue:
        """Appends `op` and returns its (single) result."""
        self.block.add_op(op)
        return op.results[0]

    def input(self, key: str, shape: Sequence[int], dtype: str | Attribute = "f32") -> SSAValue:
        return self.add(lg.InputOp(key, tensor_type(shape, dtype)))

    def param(
        self,
        key: str,
        shape: Sequence[int],
        init: lg.InitializerAttr | None = None,
        seed: int = 0,
        dtype: str | Attribute = "f32",
    ) -> SSAValue:
        return self.add(lg.ParamOp(key, tensor_type(shape, dtype), init or lg.ZerosInitAttr(), seed))

    def graph(self, outputs: Mapping[str, SSAValue]) -> lg.GraphOp:
        """Closes the body with `lg.output` and returns the graph op."""
        self.block.add_op(lg.OutputOp(list(outputs.values()), list(outputs)))
        return lg.GraphOp(self.name, Region(self.block), self.placement)

    def module(self, outputs: Mapping[str, SSAValue], *siblings: Operation) -> ModuleOp:
        """The graph in a module, after `siblings` (placements, other graphs)."""
        return ModuleOp([*siblings, self.graph(outputs)])
