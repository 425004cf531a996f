"""A layout turned into IR, by one function for both of sbp-autoplan's
searches (`write_layout`): what differs is how each writes its choices as
hints (`LayoutHints`). The layer search's (`ProfileHints`) writes the plan
into the forward graph as a hand plan would be written (per-stage
placements, hints, requests), so `compile` lowers it like a hand plan; the
whole-graph search's (sbp_autoplan.py) leaves the rest to sbp-infer."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from xdsl.context import Context
from xdsl.dialects.builtin import DenseArrayBase, ModuleOp, SymbolRefAttr, UnitAttr, i64
from xdsl.ir import Operation
from xdsl.irdl import VarConstraint
from xdsl.passes import ModulePass
from xdsl.rewriter import Rewriter

from sbpc.dialects import lg
from sbpc.dialects.lg_analysis import OPTIMIZER_STATE_PREFIXES
from sbpc.dialects.sbp import (
    PLACEMENT_ATTR,
    AnnotateOp,
    DTensorType,
    PlacementOp,
    Sbp,
    dtensor_of,
    element_type,
    global_shape,
    lookup_placement,
    nd_to_plain,
)
from sbpc.planning.autoplan.candidates import Candidate, Layout
from sbpc.planning.autoplan.layers import Layer
from sbpc.planning.autoplan.profiler import Profiler, plain_type
from sbpc.planning.autoplan.stages import place_ops

from .lg_autodiff import LgAutodiffPass
from .lg_micro_batch import LgMicroBatchPass
from .lg_recompute import LgRecomputePass

REQUEST_ATTR = "sbp.autoplan.request"
"""Marks the requests the planner writes (the profile's distribution of a value)."""


class LayoutHints(Protocol):
    """How a search writes its layout's choices into the graph: `place`
    before the training passes (placements, stages, the forward graph's
    hints), `after_autodiff` once the gradients exist, `after_training`
    once the step is whole. `write_layout` runs the passes between them."""

    def place(self, module: ModuleOp, graph: lg.GraphOp, placement: PlacementOp) -> None: ...

    def after_autodiff(self, graph: lg.GraphOp) -> None: ...

    def after_training(self, graph: lg.GraphOp) -> None: ...


def write_layout(module: ModuleOp, layout: Layout, training: Sequence[ModulePass], loss: str,
                 hints: LayoutHints) -> None:
    """Turns `layout` into IR, the one way both searches do: `hints` places
    and hints the forward graph, then micro-batches in the layout's
    schedule, the training passes, recomputation by its policy, and the
    hints on the training step. The whole-graph search (`sbp_autoplan`) hands
    the result to sbp-infer to choose the rest; the layer search's hints
    (`ProfileHints`) leave it as a hand plan would be written."""
    graph = next(iter(lg.graphs(module)))
    assert graph.placement is not None  # checked by sbp-autoplan
    hints.place(module, graph, lookup_placement(graph, graph.placement))
    ctx = Context()
    if layout.micro_batches > 1:
        LgMicroBatchPass(count=layout.micro_batches, schedule=layout.schedule).apply(ctx, module)
    for step in training:
        step.apply(ctx, module)
        if isinstance(step, LgAutodiffPass):
            hints.after_autodiff(graph)
    if layout.recompute != "none":
        LgRecomputePass(policy=layout.recompute, loss=loss).apply(ctx, module)
    hints.after_training(graph)


@dataclass
class ProfileHints:
    """The layer search's choice (planning/autoplan/) written as a hand plan
    would be: a placement per stage (stage i on the i-th block of ranks,
    its mesh data x tensor, the tensor axis inside a node), each op on its
    layer's stage, the inputs split over the data axis, every layer's
    parameters and forward values requested as its class's profile
    distributed them; each gradient requested where its update runs;
    ZeRO's state split over the data axis."""

    layers: list[Layer]
    chosen: Candidate
    profiler: Profiler
    ranks: list[int]
    batch: int

    @property
    def data_axis(self) -> int | None:
        return 0 if self.chosen.layout.data > 1 else None

    @property
    def tensor_axis(self) -> int | None:
        layout = self.chosen.layout
        return (1 if layout.data > 1 else 0) if layout.tensor > 1 else None

    def place(self, module: ModuleOp, graph: lg.GraphOp, placement: PlacementOp) -> None:
        chosen, layers, profiler, ranks, batch = self.chosen, self.layers, self.profiler, self.ranks, self.batch
        layout = chosen.layout
        per = layout.data * layout.tensor
        names = [f"stage{i}" for i in range(layout.stages)] if layout.stages > 1 else [placement.sym_name.data]
        mesh = layout.mesh
        for i, name in enumerate(names):
            if layout.stages > 1:
                module.body.block.insert_op_before(
                    PlacementOp(name, placement.device.data, ranks[i * per:(i + 1) * per], mesh), placement)
        if layout.stages == 1:
            placement.ranks = DenseArrayBase.from_list(i64, ranks)
            placement.shape = DenseArrayBase.from_list(i64, mesh)
        stage_of_layer = {j: s for s, run in enumerate(chosen.stage_layers) for j in run}
        stage_of: dict[Operation, int] = {}
        for j, layer in enumerate(layers):
            for op in layer.ops:
                stage_of[op] = stage_of_layer[j]
        micro = batch // (layout.data * layout.micro_batches)
        data_axis, tensor_axis = self.data_axis, self.tensor_axis
        hinted: set[lg.ParamOp] = set()
        for j, layer in enumerate(layers):
            profile = profiler.profile(layer, layout.tensor, micro, layout.recompute)
            name = names[stage_of_layer[j]]
            for param, on_tensor in zip(layer.params, profile.param_sbp, strict=True):
                if param in hinted:
                    continue
                hinted.add(param)
                nd = [Sbp.B] * len(mesh)
                if tensor_axis is not None:
                    nd[tensor_axis] = on_tensor
                shape = global_shape(param.result.type)
                if layout.memory == "fsdp" and data_axis is not None and shape and on_tensor != Sbp.S(0) \
                        and shape[0] % layout.data == 0:
                    nd[data_axis] = Sbp.S(0)
                Rewriter.replace_value_with_new_type(
                    param.result, dtensor_of(shape, param.result.type.element_type, name, tuple(nd)))
        # Every forward value of a layer is requested as its class's profile
        # distributed it (the profile's integer program chose them together;
        # sbp-infer's search, given only the parameters, finds worse plans).
        for j, layer in enumerate(layers):
            profile = profiler.profile(layer, layout.tensor, micro, layout.recompute)
            name = names[stage_of_layer[j]]
            for op, value_on_tensor in zip(layer.ops, profile.value_sbp, strict=True):
                value = op.results[0]
                if value_on_tensor is None or isinstance(value.type, DTensorType):
                    continue
                shape = global_shape(value.type)
                nd = [Sbp.B] * len(mesh)
                if tensor_axis is not None:
                    nd[tensor_axis] = value_on_tensor
                if data_axis is not None and shape[0] == batch:
                    nd[data_axis] = Sbp.S(0)
                uses = list(value.uses)
                request = AnnotateOp(value, dtensor_of(shape, element_type(value.type), name, tuple(nd)))
                request.attributes[PLACEMENT_ATTR] = SymbolRefAttr(name)
                request.attributes[REQUEST_ATTR] = UnitAttr()
                graph.body.block.insert_op_after(request, op)
                stage_of[request] = stage_of_layer[j]
                # a later stage reads it through its own request (the transfer), as a hand plan's `.to()` in that stage
                moved: dict[int, AnnotateOp] = {}
                for use in uses:
                    if isinstance(getattr(type(use.operation), "T", None), VarConstraint):
                        # an op typed like its operand (layernorm, softmax, GELU)
                        # would take the request as a hint on its own result,
                        # which it may not be able to give: it reads the value
                        continue
                    there = stage_of.get(use.operation, stage_of_layer[j])
                    if there != stage_of_layer[j] and there not in moved:
                        moved[there] = AnnotateOp(request.result, dtensor_of(
                            shape, element_type(value.type), names[there], tuple(nd)))
                        moved[there].attributes[PLACEMENT_ATTR] = SymbolRefAttr(names[there])
                        graph.body.block.insert_op_after(moved[there], request)
                        stage_of[moved[there]] = there
                    use.operation.operands[use.index] = moved.get(there, request).result
        _same_type_results(graph)
        place_ops(graph, stage_of, names)
        for o in graph.body.ops:
            if isinstance(o, lg.InputOp) and global_shape(o.result.type) and not isinstance(o.result.type, DTensorType):
                nd = [Sbp.B] * len(mesh)
                if data_axis is not None:
                    nd[data_axis] = Sbp.S(0)
                where = o.attributes[PLACEMENT_ATTR]
                assert isinstance(where, SymbolRefAttr)
                Rewriter.replace_value_with_new_type(
                    o.result, dtensor_of(global_shape(o.result.type), o.result.type.element_type,
                                         where.string_value(), tuple(nd)))
        graph.placement = SymbolRefAttr(names[0])
        if layout.stages > 1:
            placement.detach()
            placement.erase()

    def after_autodiff(self, graph: lg.GraphOp) -> None:
        _pin_gradients(graph, self.chosen.layout, self.data_axis, self.tensor_axis)

    def after_training(self, graph: lg.GraphOp) -> None:
        _unrequest_same_type_ops(graph)
        layout, data_axis = self.chosen.layout, self.data_axis
        if layout.memory == "zero" and data_axis is not None:
            params = {p.key.data: p for p in graph.body.ops if isinstance(p, lg.ParamOp)}
            for p in params.values():
                prefix = next((x for x in OPTIMIZER_STATE_PREFIXES if p.key.data.startswith(x)), None)
                owner = params.get(p.key.data.removeprefix(prefix)) if prefix else None
                if owner is not None and global_shape(p.result.type) and isinstance(owner.result.type, DTensorType):
                    Rewriter.replace_value_with_new_type(
                        p.result, _zero_type(owner.result.type, layout, data_axis, self.tensor_axis))


def _unrequest_same_type_ops(graph: lg.GraphOp) -> None:
    """The ops autodiff made that are typed like their operand (a softmax
    in cross-entropy's gradient) read the unrequested value, and are
    untyped again: a request's type on their result would be a hint they
    may not be able to give."""
    for op in graph.body.ops:
        if not isinstance(getattr(type(op), "T", None), VarConstraint) or not op.operands:
            continue
        source = op.operands[0].owner
        if isinstance(source, AnnotateOp) and REQUEST_ATTR in source.attributes:
            op.operands[0] = source.input
        result = op.results[0]
        if not isinstance(op.operands[0].type, DTensorType) and isinstance(result.type, DTensorType):
            Rewriter.replace_value_with_new_type(result, plain_type(result.type))


def _same_type_results(graph: lg.GraphOp) -> None:
    """Ops whose result has their operand's type (elementwise unary ops,
    softmax, layernorm: a `T` constraint) take a requested operand's
    distributed type, as the frontend types them after a hint."""
    for op in graph.body.ops:
        if not isinstance(getattr(type(op), "T", None), VarConstraint) or not op.operands:
            continue
        t = op.operands[0].type
        if isinstance(t, DTensorType) and op.results[0].type != t:
            Rewriter.replace_value_with_new_type(op.results[0], t)


def _zero_type(t: DTensorType, layout: Layout, data_axis: int, tensor_axis: int | None) -> DTensorType:
    """ZeRO: a parameter's optimizer state (and the gradient its update
    reads) distributed as the parameter over the tensor axis and split over
    the data axis, where the rows divide."""
    nd = list(nd_to_plain(t.nd_sbp))
    rows = global_shape(t)[0] if global_shape(t) else 0
    split_on_tensor = tensor_axis is not None and nd[tensor_axis] == Sbp.S(0)
    if rows and rows % (layout.data * (layout.tensor if split_on_tensor else 1)) == 0:
        nd[data_axis] = Sbp.S(0)
    return dtensor_of(global_shape(t), t.element_type, t.placement_name, tuple(nd))


def _pin_gradients(graph: lg.GraphOp, layout: Layout, data_axis: int | None, tensor_axis: int | None) -> None:
    """Requests each parameter's gradient where its update runs: distributed
    as the parameter (one all-reduce over the data axis per step), or for
    ZeRO as its state (a reduce-scatter), as the composition priced it.
    Left free, sbp-infer's search shards a replicated update over the data
    axis on its own (its cost model prefers it; on the simulator it costs a
    slice and a gather per parameter)."""
    params = {p.key.data: p for p in graph.body.ops if isinstance(p, lg.ParamOp)}
    output = graph.output()
    values = list(output.values)
    for i, name in enumerate(n.data for n in output.names.data):
        param = params.get(name.removeprefix("grad.")) if name.startswith("grad.") else None
        if param is None or not isinstance(param.result.type, DTensorType):
            continue
        want = param.result.type
        if layout.memory == "zero" and data_axis is not None:
            want = _zero_type(want, layout, data_axis, tensor_axis)
        request = AnnotateOp(values[i], want)
        request.attributes[PLACEMENT_ATTR] = SymbolRefAttr(want.placement_name)
        graph.body.block.insert_op_before(request, output)
        values[i] = request.result
    output.operands = values



