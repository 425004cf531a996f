"""Pipeline stages: where to cut a forward graph into stages (near equal
shares of the flops where the fewest bytes cross), and placing it so.
sbp-autoplan's whole-graph search and `sbpc.compile(stages=N)` cut alike."""

from __future__ import annotations

import math

from xdsl.dialects.builtin import ModuleOp, SymbolRefAttr
from xdsl.ir import Operation
from xdsl.utils.exceptions import PassFailedException

from sbpc.dialects import lg
from sbpc.dialects.lg_analysis import SOURCES
from sbpc.dialects.sbp import (
    PLACEMENT_ATTR,
    AnnotateOp,
    DTensorType,
    PlacementOp,
    element_bytes,
    element_type,
    global_shape,
    lookup_placement,
)

FORWARD_SOURCES = (*SOURCES, lg.OutputOp)
"""Ops that are not forward computation: a stage cut counts the others."""


def crossing_bytes(order: list[Operation]) -> list[float]:
    """bytes[p]: what a cut before order[p] sends forward (values made
    before p and used at or after it)."""
    index = {op: i for i, op in enumerate(order)}
    delta = [0.0] * (len(order) + 1)
    for i, op in enumerate(order):
        for r in op.results:
            last = max((index[u.operation] for u in r.uses if u.operation in index), default=i)
            if last > i:
                nbytes = math.prod(global_shape(r.type)) * element_bytes(element_type(r.type))
                delta[i + 1] += nbytes
                delta[last + 1] -= nbytes
    out, running = [], 0.0
    for d in delta[:-1]:
        running += d
        out.append(running)
    return out


def stage_cuts(order: list[Operation], stages: int) -> list[int]:
    """Where to cut the forward ops (program order) into `stages`: near equal
    shares of the flops, and within 15% of a share of each target, where the
    fewest bytes cross (the activations a stage sends the next)."""
    weights = [lg.op_flops(op) for op in order]
    prefix = [0.0]
    for w in weights:
        prefix.append(prefix[-1] + w)
    total = prefix[-1]
    crossing = crossing_bytes(order)
    cuts: list[int] = []
    for i in range(1, stages):
        target = total * i / stages
        window = 0.15 * total / stages
        low = cuts[-1] + 1 if cuts else 1
        choices = [p for p in range(low, len(order) - (stages - i) + 1) if abs(prefix[p] - target) <= window]
        if not choices:
            choices = [min(range(low, len(order) - (stages - i) + 1), key=lambda p: abs(prefix[p] - target))]
        cuts.append(min(choices, key=lambda p: (crossing[p], abs(prefix[p] - target))))
    return cuts


def batch_size(graph: lg.GraphOp) -> int | None:
    """The batch size: axis 0 of the inputs of rank >= 1 (None if they disagree or there are none)."""
    sizes = {global_shape(o.result.type)[0] for o in graph.body.ops
             if isinstance(o, lg.InputOp) and global_shape(o.result.type)}
    return sizes.pop() if len(sizes) == 1 else None


def cut_into_stages(module: ModuleOp, graph: lg.GraphOp, placement: PlacementOp, stages: int,
                    mesh: tuple[int, ...], ranks: list[int]) -> None:
    """Stage i runs on ranks [i*per, (i+1)*per) as a mesh of shape `mesh`
    (node-major: a stage stays inside a node where it fits, its collectives
    on the fast links); the forward ops are cut by stage_cuts and each
    source (input, parameter, constant) goes with its first use. The
    graph's placement gives way to one per stage."""
    per = len(ranks) // stages
    names = [f"stage{i}" for i in range(stages)]
    for i, name in enumerate(names):
        module.body.block.insert_op_before(
            PlacementOp(name, placement.device.data, ranks[i * per:(i + 1) * per], mesh), placement)
    order = [o for o in graph.body.ops if not isinstance(o, FORWARD_SOURCES)]
    cuts = stage_cuts(order, stages)
    place_ops(graph, {o: sum(1 for c in cuts if i >= c) for i, o in enumerate(order)}, names)
    graph.placement = SymbolRefAttr(names[0])
    placement.detach()
    placement.erase()


def place_ops(graph: lg.GraphOp, stage_of: dict[Operation, int], names: list[str]) -> None:
    """Puts every op of `graph` on the placement `names[stage_of[op]]`; an op
    `stage_of` leaves out (a source) goes with its first user's stage."""
    for o in graph.body.ops:
        if isinstance(o, lg.OutputOp):
            continue
        if o in stage_of:
            stage = stage_of[o]
        else:
            users = [u.operation for r in o.results for u in r.uses if u.operation in stage_of]
            stage = min((stage_of[u] for u in users), default=0)
        o.attributes[PLACEMENT_ATTR] = SymbolRefAttr(names[stage])


def place_stages(module: ModuleOp, stages: int) -> None:
    """Cuts the forward graph of `module` into `stages` pipeline stages as
    sbp-autoplan cuts them (near equal shares of the flops where the fewest
    bytes cross; each source with its first use), stage i on the i-th
    equal share of its placement's ranks (`compile(stages=...)`). The graph
    must carry no distribution yet: sbp-infer chooses each stage's."""
    graphs = lg.graphs(module)
    if len(graphs) != 1:
        raise PassFailedException(f"pipeline stages: cuts one lg.graph, found {len(graphs)}")
    graph = graphs[0]
    if graph.placement is None:
        raise PassFailedException(f"'lg.graph' @{graph.sym_name.data}: pipeline stages need the graph's placement")
    placement = lookup_placement(graph, graph.placement)
    ranks = list(placement.ranks.get_values())
    if stages < 1 or len(ranks) % stages:
        raise PassFailedException(f"pipeline stages: {len(ranks)} ranks do not make {stages} stages of equal size")
    for op in graph.body.ops:
        if PLACEMENT_ATTR in op.attributes or isinstance(op, AnnotateOp) or any(
                isinstance(r.type, DTensorType) for r in op.results):
            raise PassFailedException(
                f"'{op.name}': pipeline stages are cut from a graph without sbp hints or placed ops "
                "(sbp-infer chooses each stage's distribution)")
    forward = [o for o in graph.body.ops if not isinstance(o, FORWARD_SOURCES)]
    if len(forward) < stages:
        raise PassFailedException(f"pipeline stages: {len(forward)} ops do not make {stages} stages")
    if stages > 1:
        cut_into_stages(module, graph, placement, stages, (len(ranks) // stages,), ranks)
