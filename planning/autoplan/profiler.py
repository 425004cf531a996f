"""Profiling a layer class: the layer alone becomes a small training
graph on a mesh of t devices inside a node (its incoming activations
replicated over them, Megatron-style), sbp-infer's search chooses its ops'
SBP, and the step-time simulator replays it forward only and forward plus
backward. The passes that make the training step and lower it are
lowering/'s, handed in as `LayerPasses` (planning does not import passes)."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from xdsl.dialects.builtin import ModuleOp, TensorType, f32
from xdsl.ir import Attribute, Block, Operation, Region, SSAValue
from xdsl.rewriter import Rewriter
from xdsl.utils.exceptions import PassFailedException

from sbpc.dialects import lg
from sbpc.dialects.lg_analysis import saved_values
from sbpc.dialects.sbp import (
    PLACEMENT_ATTR,
    AnnotateOp,
    DTensorType,
    PlacementOp,
    Sbp,
    dtensor_of,
    element_bytes,
    element_type,
    global_shape,
    nd_to_plain,
)
from sbpc.perf.cluster import Cluster
from sbpc.perf.step_time import simulate_plan

from ..cost_model import load_device
from ..sbp_problem import build_problem
from ..sbp_search import solve_auto, solve_ilp
from ..sbp_solution import apply_solution
from .layers import SOURCES, Layer, local_bytes

ILP_GAP = 0.05
"""HiGHS stops within 5% of its bound, then the plan is refined locally: on
GPT-1.3B layers on 8 devices 0.2-1 s and within 0.5% of the optimum, which
HiGHS takes 2-11 s to prove (auto's search: 13-25% above it)."""


@dataclass(frozen=True)
class LayerPasses:
    """What profiling needs from the passes (lowering/ gives it)."""

    rebatch: Callable[[lg.GraphOp, int], None]
    """The graph on n examples (lg-micro-batch's rebatch)."""
    train: Callable[[ModuleOp, str], None]
    """Makes a layer's forward graph (output `loss`) a training step:
    lg-autodiff, a plain SGD update, then lg-recompute's policy."""
    lower: Callable[[ModuleOp], None]
    """Lowers an inferred sbp-level module to an allocated plan (one
    device per equivalence class) for the simulator."""
    update: Callable[[ModuleOp, str], None]
    """lg-autodiff on a graph (output `loss`), then `sgd` (the plain update
    `train` makes), `step` (the training step's own optimizer, as
    configured) or `none` (no update): what an update is priced by."""


UPDATE_PROBE_BYTES = 1 << 23
"""Bytes of the parameters an update is timed on (and twice that): above a
device's cache, where the parameters that take most of an update's time are."""


@dataclass(frozen=True)
class UpdatePrice:
    """Seconds an optimizer's update of the parameters takes on a device,
    from simulating it lowered (its casts, fused chains and kernels' fixed
    costs, as the whole step runs them)."""

    per_step: float
    """Once a step (a step count, bias corrections)."""
    least: float
    """A parameter's update, at the least (a small one's kernels' fixed costs)."""
    per_param: float
    per_element: float
    """A large parameter's: per_param + per_element x its elements."""

    def seconds(self, elements: float) -> float:
        """One parameter's update (of `elements` on the device). A device
        that launches ahead hides a kernel's fixed cost behind a long one, so
        a small parameter costs its kernels' fixed costs (`least`) and a
        large one its bytes; a CPU pays both, and the two agree."""
        return max(self.least, self.per_param + self.per_element * elements)


@dataclass
class Profile:
    """One layer class at one (tensor degree, micro-batch, recomputation), per device."""

    forward: float
    backward: float
    """Seconds of one micro-batch's backward (recomputation included)."""
    params: list[int]
    """Bytes of each parameter's piece on a device (first-use order)."""
    param_sbp: list[Sbp]
    """Each parameter's distribution over the tensor axis."""
    saved: int
    """Bytes of activations one micro-batch keeps from its forward to its backward."""
    working: int
    """Bytes the layer needs on top while it runs."""
    outs: int
    """Bytes of the activations it hands the next layer (replicated over the tensor axis)."""
    value_sbp: list[Sbp | None] = field(default_factory=list)
    """The distribution over the tensor axis of each of the layer's ops' result (None: a scalar)."""
    backward_comm: float = 0.0
    """Seconds its backward keeps the communication stream busy (tensor-parallel collectives)."""
    param_types: list[Attribute] = field(default_factory=list)
    """The element type of each parameter (the order of `params`)."""


class Profiler:
    """Profiles of a graph's layer classes, each made once per (tensor
    degree, examples per micro-batch, recomputation) and cached."""

    def __init__(self, graph: lg.GraphOp, loss: str, cluster: Cluster, device: str, kind: str, batch: int,
                 passes: LayerPasses):
        self.graph = graph
        self.passes = passes
        self.batch = batch
        self.loss = loss
        self.cluster = cluster
        self.device = device
        self.kind = kind
        names = [n.data for n in graph.output().names.data]
        if loss not in names:
            raise PassFailedException(f"sbp-autoplan: the graph has no output named \"{loss}\"")
        self.loss_value = graph.output().values[names.index(loss)]
        self.cache: dict[tuple, Profile] = {}
        self.updates: dict[tuple[str, Attribute], UpdatePrice] = {}
        self.bare: dict[tuple[tuple[int, ...], Attribute], float] = {}
        """The step time of parameters of these sizes differentiated, not updated."""
        self.compiles = 0
        self.references: dict[tuple, list] = {}
        """(layer class, tensor degree, recomputation) -> the signatures chosen
        at the first micro-batch size profiled (the integer program's)."""

    def profile(self, layer: Layer, tensor: int, micro: int, recompute: str) -> Profile:
        key = (layer.key, tensor, micro, recompute)
        if key not in self.cache:
            self.cache[key] = self._profile(layer, tensor, micro, recompute)
        return self.cache[key]

    def module(self, layer: Layer, tensor: int, micro: int) -> ModuleOp:
        """The layer alone, on `micro` examples, on a mesh of `tensor` devices:
        its incoming activations become parameters (so the backward computes
        their gradients, as the layer before needs them), replicated over the
        mesh; a layer without the loss gets a stand-in: the sum of the means
        of what it hands on."""
        block = Block()
        mapping: dict[SSAValue, SSAValue] = {}

        def add(op: Operation) -> Operation:
            op.attributes.pop(PLACEMENT_ATTR, None)
            block.add_op(op)
            return op

        for k, v in enumerate(layer.ins):
            mapping[v] = add(lg.InputOp(f"activation{k}", plain_type(v.type))).results[0]
        for op in layer.ops:
            for v in op.operands:
                if v not in mapping and isinstance(v.owner, (lg.InputOp, lg.ParamOp, lg.ConstantOp)):
                    source = v.owner.clone()
                    Rewriter.replace_value_with_new_type(source.results[0], plain_type(v.type))
                    mapping[v] = add(source).results[0]
            new = add(op.clone(value_mapper=dict(mapping)))
            for old, made in zip(op.results, new.results, strict=True):
                Rewriter.replace_value_with_new_type(made, plain_type(old.type))
                mapping[old] = new.results[old.index]
        handed: list[SSAValue] = []
        if self.loss_value in mapping:
            loss = mapping[self.loss_value]
            # what else the loss's layer hands on (the dropout's step count):
            # outputs beside the loss, so that its ops are profiled too
            handed = [mapping[v] for v in layer.outs if v is not self.loss_value]
        else:
            terms = []
            # the terms add up in the layer's float type (a float64 model's
            # activations are f64), masks and labels cast to it
            floats = [element_type(v.type) for v in layer.outs if lg.is_float(element_type(v.type))]
            loss_type = floats[0] if floats else f32
            for v in layer.outs:
                shape = global_shape(v.type)
                value = mapping[v]
                if shape:
                    # handed on replicated over the tensor axis, as the next layer's profile takes it
                    value = add(AnnotateOp(value, _replicated(v.type))).results[0]
                if element_type(v.type) != loss_type:  # a mask or labels handed on (no gradient), another float
                    value = add(lg.CastOp(value, loss_type)).results[0]
                if shape:
                    value = add(lg.ReduceMeanOp(value, list(range(len(shape))))).results[0]
                terms.append(value)
            loss = terms[0]
            for t in terms[1:]:
                loss = add(lg.AddOp(loss, t)).results[0]
        add(lg.OutputOp([loss, *handed], ["loss", *(f"{HANDED}{k}" for k in range(len(handed)))]))
        graph = lg.GraphOp("layer", Region(block), "mesh")
        module = ModuleOp([PlacementOp("mesh", self.kind, list(range(tensor)), (tensor,)), graph])
        self.passes.rebatch(graph, micro)
        for op in list(block.ops):
            if (isinstance(op, lg.InputOp) and op.key.data.startswith("activation")
                    and lg.is_float(element_type(op.result.type))):
                param = lg.ParamOp(op.key.data, _replicated(op.result.type), lg.NormalInitAttr(0.0, 0.02))
                block.insert_op_before(param, op)
                op.result.replace_all_uses_with(param.result)
                op.detach()
                op.erase()
            elif isinstance(op, lg.InputOp) and global_shape(op.result.type):
                Rewriter.replace_value_with_new_type(op.result, _replicated(op.result.type))
        return module

    def update_price(self, which: str, element: Attribute) -> UpdatePrice:
        """The price of `which` update (LayerPasses.update) of parameters of
        `element` type, on one device. Each timing is the step with the
        update less the step without it: of one and of two parameters of one
        element (the fixed costs), and of one parameter of n and of 2n
        elements (the cost per element, above the device's cache)."""
        key = (which, element)
        if key not in self.updates:
            n = max(1, UPDATE_PROBE_BYTES // element_bytes(element))

            def timed(sizes: list[int]) -> float:
                return self.update_time(sizes, element, which)

            one, two = timed([1]), timed([1, 1])
            large, larger = timed([n]), timed([2 * n])
            least = max(0.0, two - one)
            per_step = max(0.0, one - least)
            per_element = max(0.0, (larger - large) / n)
            self.updates[key] = UpdatePrice(per_step, least, max(0.0, large - per_step - n * per_element),
                                            per_element)
        return self.updates[key]

    def update_time(self, sizes: Sequence[int], element: Attribute, which: str) -> float:
        """Seconds `which` update of parameters of `sizes` elements takes on
        one device, simulated: the step with it less the step without."""
        updated = self._simulate(self._update_probe(sizes, element, which))[0]
        key = (tuple(sizes), element)
        if key not in self.bare:  # (the same for every update priced)
            self.bare[key] = self._simulate(self._update_probe(sizes, element, "none"))[0]
        return max(0.0, updated - self.bare[key])

    def _update_probe(self, sizes: Sequence[int], element: Attribute, which: str) -> ModuleOp:
        """A graph of parameters of `sizes` elements, its loss the sum of
        their means, made a training step by `which` update and inferred on
        one device."""
        block = Block()
        loss: SSAValue | None = None
        for k, elements in enumerate(sizes):
            param = lg.ParamOp(f"p{k}", TensorType(element, [elements]), lg.NormalInitAttr(0.0, 0.02))
            mean = lg.ReduceMeanOp(param.result, [0])
            block.add_ops([param, mean])
            if loss is None:
                loss = mean.results[0]
            else:
                total = lg.AddOp(loss, mean.results[0])
                block.add_op(total)
                loss = total.results[0]
        assert loss is not None
        block.add_op(lg.OutputOp([loss], ["loss"]))
        module = ModuleOp([PlacementOp("mesh", self.kind, [0], (1,)), lg.GraphOp("update", Region(block), "mesh")])
        self.passes.update(module, which)
        self._infer(module, 1, None)
        return module

    def _simulate(self, module: ModuleOp) -> tuple[float, int, float]:
        """Step time, peak memory and seconds of collectives in flight."""
        self.compiles += 1
        self.passes.lower(module)
        prediction = simulate_plan(module, self.cluster, steps=2)
        return prediction.step_time, prediction.peak_memory, max(d.comm for d in prediction.devices)

    def _infer(self, module: ModuleOp, tensor: int, reference: list | None) -> list:
        """sbp-infer on a profiled layer: with no reference, the integer
        program (within ILP_GAP, refined); else each op starts from the
        reference's signature (the same layer at another micro-batch size),
        refined locally, or auto's search where that is cheaper. Returns the
        chosen signatures."""
        graph = lg.graphs(module)[0]
        device = load_device(self.device, list(range(tensor)))
        problem = build_problem(graph, device)
        if tensor == 1:  # nothing to choose but where a value sits (auto's search, milliseconds)
            choice = solve_auto(problem)
        elif reference is None or len(reference) != len(problem.nodes):
            choice = solve_ilp(problem, ILP_GAP)
        else:
            start = [node.candidates.index(sig) if sig in node.candidates else 0
                     for node, sig in zip(problem.nodes, reference, strict=True)]
            exact = problem.exact()
            choice = min(exact.refine(start), solve_auto(problem), key=exact.total)
        apply_solution(graph, problem, choice, "ilp", False)
        return [node.candidates[k] for node, k in zip(problem.nodes, choice, strict=True)]

    def _profile(self, layer: Layer, tensor: int, micro: int, recompute: str) -> Profile:
        train = self.module(layer, tensor, micro)
        self.passes.train(train, recompute)
        key = (layer.key, tensor, recompute)
        chosen = self._infer(train, tensor, self.references.get(key))
        self.references.setdefault(key, chosen)
        forward = _forward_only(train)
        graph = lg.graphs(train)[0]
        params = [op for op in graph.body.ops if isinstance(op, lg.ParamOp)]
        weights = [p for p in params if not p.key.data.startswith("activation")]
        activations = [p for p in params if p.key.data.startswith("activation")]
        keys = [p.key.data for p in layer.params]
        by_key = {p.key.data: p for p in weights}
        ordered = [by_key[k] for k in keys]
        param_bytes = [local_bytes(p.result) for p in ordered]
        # What the plain update `train` made updates: the weights and the
        # incoming activations, each on a device's share of it (sbp-infer
        # computes the elementwise update of a parameter replicated over the
        # mesh on each device's share, as the composer prices the step's).
        updated = [(local_bytes(p.result) / (1 if _split(p.result.type) else tensor), element_type(p.result.type))
                   for p in params if lg.is_float(element_type(p.result.type))]
        param_sbp = [nd_to_plain(p.result.type.nd_sbp)[0] if isinstance(p.result.type, DTensorType) else Sbp.B
                     for p in ordered]
        forward_set = _layer_forward(graph)
        computed = [op for op in graph.body.ops
                    if op in forward_set and not isinstance(op, (*SOURCES, AnnotateOp))][:len(layer.ops)]
        assert [op.name for op in computed] == [op.name for op in layer.ops]  # the layer's ops, in its order
        value_sbp = [nd_to_plain(op.results[0].type.nd_sbp)[0]
                     if isinstance(op.results[0].type, DTensorType) and global_shape(op.results[0].type) else None
                     for op in computed]
        saved = sum(local_bytes(v) for v in saved_values(graph, forward_set))
        in_bytes = sum(local_bytes(p.result) for p in activations)
        out_bytes = sum(math.prod(_rows(global_shape(v.type), self.batch, micro)) * element_bytes(element_type(v.type))
                        for v in layer.outs)
        fwd_time, _, fwd_comm = self._simulate(forward)
        train_time, peak, train_comm = self._simulate(train)
        persistent = 2 * (sum(param_bytes) + in_bytes)
        working = max(0, peak - persistent - saved)
        updates = sum(self.update_price("sgd", e).seconds(n / element_bytes(e)) for n, e in updated)
        if updated:
            updates += self.update_price("sgd", updated[0][1]).per_step
        return Profile(fwd_time, max(0.0, train_time - fwd_time - updates), param_bytes, param_sbp,
                       saved + in_bytes, working, out_bytes, value_sbp, max(0.0, train_comm - fwd_comm),
                       [element_type(p.result.type) for p in ordered])


HANDED = "handed."
"""The profiled layer's outputs beside its loss, where it holds the loss: what else it hands on."""


def _layer_outputs(graph: lg.GraphOp) -> list[tuple[str, SSAValue]]:
    """The profiled layer's own outputs: its loss and what it hands on besides."""
    output = graph.output()
    return [(n.data, v) for n, v in zip(output.names.data, output.values)
            if n.data == "loss" or n.data.startswith(HANDED)]


def _layer_forward(graph: lg.GraphOp) -> set[Operation]:
    """The forward pass of a profiled layer: what its own outputs depend on."""
    return lg.ancestors([v for _, v in _layer_outputs(graph)])


def _forward_only(train: ModuleOp) -> ModuleOp:
    """The inferred training step cut to its forward pass (the same
    distributions): what the layer's own outputs depend on."""
    forward = train.clone()
    graph = lg.graphs(forward)[0]
    kept = _layer_outputs(graph)
    keep = _layer_forward(graph)
    output = graph.output()
    output.detach()
    output.erase()
    for op in reversed(list(graph.body.ops)):
        if op not in keep and not isinstance(op, SOURCES):
            op.detach()
            op.erase()
    graph.body.block.add_op(lg.OutputOp([v for _, v in kept], [n for n, _ in kept]))
    return forward


def _split(t) -> bool:
    """Whether a value of type `t` is split (not replicated) over its mesh."""
    return isinstance(t, DTensorType) and any(s != Sbp.B for s in nd_to_plain(t.nd_sbp))


def _rows(shape: Sequence[int], batch: int, micro: int) -> tuple[int, ...]:
    """`shape` with its batch axis (axis 0 of `batch` rows) at `micro` rows."""
    return (micro, *shape[1:]) if shape and shape[0] == batch else tuple(shape)


def plain_type(t) -> TensorType:
    """`t` without its distribution."""
    return TensorType(element_type(t), list(global_shape(t)))


def _replicated(t) -> DTensorType:
    return dtensor_of(global_shape(t), element_type(t), "mesh", (Sbp.B,))
