"""An operation as plain Python data that pickles flat and rebuilds without
parsing: how a plan crosses from the driver to the ranks of a pool.

The text form stays the contract everywhere a person or a file is involved
(sbp-opt, sbp-run's per-rank files, the lit tests). Between two processes
of one job, though, parsing it was most of a plan's load: 0.7 s of CPU for
a GPT-2 rank's plan (about 1000 ops), up to four ranks parsing at once on
two cores, after the driver printed each rank's text (0.1 s). Its op tree
is made and pickled in 0.03 s and unpickled and rebuilt in 0.05-0.09 s.

A tree holds each op's class, properties, attributes and regions; the ops
of a block are a list, not the linked list xDSL keeps, so pickling it
recurses only as deep as the regions nest (pickling a module directly
recursed through every op of a block: a GPT-2 rank's plan exceeded
Python's recursion limit).
Only ops that speak through attributes alone fit (the plan dialect: its ops
name registers by symbol); an op with operands, results, successors or
block arguments is refused.
"""

from __future__ import annotations

from xdsl.dialects.builtin import ModuleOp
from xdsl.ir import Attribute, Block, Operation, Region

OpTree = tuple[type[Operation], dict[str, Attribute], dict[str, Attribute], list[list[list["OpTree"]]]]
"""(class, properties, attributes, regions), each region a list of blocks and
each block a list of op trees."""


def op_tree(op: Operation) -> OpTree:
    """`op` and everything nested in it as an op tree."""
    if op.operands or op.results or op.successors:
        raise ValueError(f"{op.name} has operands, results or successors: an op tree holds ops that speak "
                         "through attributes alone")
    regions = []
    for region in op.regions:
        blocks = []
        for block in region.blocks:
            if block.args:
                raise ValueError(f"a block of {op.name} has arguments: an op tree holds ops that speak through "
                                 "attributes alone")
            blocks.append([op_tree(inner) for inner in block.ops])
        regions.append(blocks)
    return type(op), dict(op.properties), dict(op.attributes), regions


def build(tree: OpTree) -> Operation:
    """The operation an op tree holds, built as its text would parse (not
    verified: call `verify_module` where the tree came from elsewhere)."""
    cls, properties, attributes, regions = tree
    return cls.create(properties=properties, attributes=attributes,
                      regions=[Region([Block([build(inner) for inner in ops]) for ops in blocks])
                               for blocks in regions])


def build_module(tree: OpTree) -> ModuleOp:
    module = build(tree)
    if not isinstance(module, ModuleOp):
        raise ValueError(f"the op tree holds a {module.name}, not a builtin.module")
    return module


def structure_key(op: Operation) -> tuple:
    """A hashable value that two ops share exactly when they print alike:
    the same ops in the same order, with equal properties, attributes,
    types and name hints, the same uses (each value by its position), and
    regions of the same shape. Where a pass compares whole modules (the
    planner's layouts whose inference agrees), this is what the printed
    text was compared for, at a twelfth of printing's time (a GPT's
    inferred module: 8 ms against 100 ms)."""
    position: dict[object, int] = {}
    key = []
    for inner in op.walk():
        uses = tuple(position[value] for value in inner.operands)
        for result in inner.results:
            position[result] = len(position)
        regions = []
        for region in inner.regions:
            blocks = []
            for block in region.blocks:
                for arg in block.args:
                    position[arg] = len(position)
                blocks.append((tuple((arg.type, arg.name_hint) for arg in block.args), len(block.ops)))
            regions.append(tuple(blocks))
        key.append((inner.name, uses, tuple((result.type, result.name_hint) for result in inner.results),
                    tuple(inner.properties.items()), tuple(inner.attributes.items()), tuple(regions),
                    len(inner.successors)))
    return tuple(key)
