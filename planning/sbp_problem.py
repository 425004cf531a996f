"""The SBP choice problem as plain data and its exact cost: what
`sbp-infer` builds from a graph and writes back (sbp_solution.py), what
the searches of sbp_search.py solve and what `sbp_ilp.py` poses as an
integer program.

A `Problem` holds, per op, its candidate nd-SBP signatures with their
compute and memory costs and, per producer-consumer edge, a matrix of boxing
costs (N-D signatures are products of the ops' 1-D rules over the mesh
axes). `ExactCost` prices a plan as sbp-infer builds it (a value boxed once
per distinct distribution its uses want).
"""

from __future__ import annotations

import bisect
import functools
import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import cast

import numpy as np
from xdsl.dialects.builtin import SymbolRefAttr
from xdsl.ir import Operation, SSAValue
from xdsl.utils.exceptions import PassFailedException

from sbpc.dialects import lg
from sbpc.dialects.lg_analysis import OPTIMIZER_STATE_KEYS
from sbpc.dialects.pieces import rank_group
from sbpc.dialects.row_groups import row_groups
from sbpc.dialects.sbp import (
    COLLECTIVE_OPS,
    PLACEMENT_ATTR,
    AnnotateOp,
    DTensorType,
    Mesh,
    PlainNd,
    Sbp,
    element_bytes,
    element_type,
    format_nd,
    global_shape,
    is_collective,
    lookup_placement,
    nd_to_plain,
)
from sbpc.perf.cluster import Rates

from .boxing_planner import boxing_cost, grouping_ok
from .cost_model import local_fraction, transfer_cost

NdSignature = tuple[tuple[PlainNd, ...], PlainNd]
"""(one nd-SBP per operand, the result's nd-SBP)."""

# --------------------------------------------------------------------------
# N-D signatures from 1-D rules
# --------------------------------------------------------------------------

def _rule(op_cls, in_shapes, out_shape, p, params_key, grouped: bool = False) -> list:
    rule = op_cls.grouped_signatures if grouped else op_cls.signatures
    return rule(in_shapes, out_shape, p, params_key)


def nd_signatures(op_cls, in_shapes, out_shape, mesh: tuple[int, ...], params: dict,
                  grouped: bool = False) -> list[NdSignature]:
    """Products of per-mesh-axis 1-D signatures. Where several mesh axes split
    one tensor axis, they must all use the same 1-D signature and the rule
    must accept it for the product of their sizes; one nd-SBP never mixes P
    with Pmax. `grouped`: the op may group its rows by expert (G), so the
    signatures' twins on grouped rows are candidates too."""
    params_key = tuple(sorted(params.items()))
    in_shapes = tuple(in_shapes)
    per_axis = [_rule(op_cls, in_shapes, out_shape, p, params_key, grouped) for p in mesh]
    if len(mesh) == 1:
        return [(tuple((s,) for s in ins), (outs[0],)) for ins, outs in per_axis[0]]
    result = []
    n_in = len(in_shapes)
    for combo in itertools.product(*per_axis):
        ins = tuple(tuple(sig[0][j] for sig in combo) for j in range(n_in))
        out = tuple(sig[1][0] for sig in combo)
        if _nested_splits_ok(op_cls, in_shapes, out_shape, mesh, params_key, combo, (*ins, out), grouped):
            result.append((ins, out))
    return result


def _nested_splits_ok(op_cls, in_shapes, out_shape, mesh, params_key, combo, nds, grouped: bool) -> bool:
    for nd in nds:
        if Sbp.P in nd and Sbp.PMAX in nd or not grouping_ok(nd):
            return False
        by_axis: dict[int, list[int]] = {}
        for mesh_axis, sbp in enumerate(nd):
            axis = sbp.axis
            if axis is not None:
                by_axis.setdefault(axis, []).append(mesh_axis)
        for mesh_axes in by_axis.values():
            if len(mesh_axes) < 2:
                continue
            sigs = {combo[a] for a in mesh_axes}
            if len(sigs) != 1:
                return False
            p = math.prod(mesh[a] for a in mesh_axes)
            if sigs.pop() not in _rule(op_cls, in_shapes, out_shape, p, params_key, grouped):
                return False
    return True


# --------------------------------------------------------------------------
# The problem as plain data
# --------------------------------------------------------------------------


@dataclass
class Node:
    op: Operation
    mesh: Mesh
    candidates: list[NdSignature]
    compute: np.ndarray
    memory: np.ndarray
    producers: list[int | None]
    """Per operand, the node that produces it (None for none)."""
    fixed_input: bool = False
    """sbp.annotate: its operand is redistributed by the annotation itself."""

    @property
    def cost(self) -> np.ndarray:
        return self.compute + self.memory


@dataclass
class Problem:
    nodes: list[Node]
    device: Rates
    edges: dict[tuple[int, int], np.ndarray] = field(default_factory=dict)
    """(producer, consumer) -> boxing cost [producer candidate, consumer candidate],
    parallel operands summed."""
    ties: dict[tuple[int, int], np.ndarray] = field(default_factory=dict)
    """(parameter, producer of its update) -> boxing cost [param candidate,
    producer candidate], in the order of the graph's outputs (tied_updates);
    also summed into `edges`."""
    sizes: list[tuple[float, int]] = field(default_factory=list)
    """Per node: bytes and rank of its result (what every use of it moves)."""
    gradients: list[bool] = field(default_factory=list)
    """Per node: whether its result is a gradient (`gradients`): its
    reductions join the step's bucket of gradients."""
    bucket_members: int = 1
    """The parameters the step trains: about as many gradients share a
    bucket (sbp-bucket-collectives cuts the buckets of a CPU cluster so)."""
    _boxing: dict[tuple, float] = field(default_factory=dict)
    _axis_groups: dict[str, tuple[tuple[int, ...], ...]] = field(default_factory=dict)
    _exact: ExactCost | None = None

    def exact(self) -> ExactCost:
        """The exact cost model of this problem, built once (the search
        refines on it and the answer's recorded cost is read from it)."""
        if self._exact is None:
            self._exact = ExactCost(self)
        return self._exact

    def boxing(self, src: PlainNd, dst: PlainNd, mesh: Mesh, rank: int, nbytes: float,
               gradient: bool = False) -> float:
        """boxing_cost on this problem's device, memoized by its arguments: a
        deep graph repeats the same few (size, distribution) pairs on
        thousands of edges. A gradient's reductions are priced as bucket members."""
        groups = self.axis_groups(mesh)
        key = (src, dst, mesh.shape, groups, rank, nbytes, gradient)
        cost = self._boxing.get(key)
        if cost is None:
            members = self.bucket_members if gradient else 1
            cost = self._boxing[key] = boxing_cost(src, dst, mesh.shape, rank, nbytes, self.device, groups, members)
        return cost

    def axis_groups(self, mesh: Mesh) -> tuple[tuple[int, ...], ...]:
        """`axis_groups(mesh)`, once per mesh."""
        found = self._axis_groups.get(mesh.name)
        if found is None:
            found = self._axis_groups[mesh.name] = axis_groups(mesh)
        return found

    def total(self, choice: Sequence[int]) -> float:
        cost = sum(float(node.cost[choice[i]]) for i, node in enumerate(self.nodes))
        cost += sum(float(m[choice[u], choice[v]]) for (u, v), m in self.edges.items())
        return cost

    def boxing_of(self, v: int, choice: Sequence[int]) -> np.ndarray:
        """Boxing cost of each candidate of v given its producers' choices."""
        total = np.zeros(len(self.nodes[v].candidates))
        for (u, w), matrix in self.edges.items():
            if w == v:
                total += matrix[choice[u]]
        return total


def axis_groups(mesh: Mesh) -> tuple[tuple[int, ...], ...]:
    """Per mesh axis of `mesh`, the ranks a collective along it spans (the
    group of the mesh's first rank): what the collective's price reads."""
    return tuple(tuple(rank_group(mesh, mesh.ranks[0], [a])) for a in range(len(mesh.shape)))


def _nbytes(value: SSAValue) -> float:
    return math.prod(global_shape(value.type)) * element_bytes(element_type(value.type))


OUTPUT, ANNOTATION, COLLECTIVE, RULED, UNKNOWN = range(5)


@functools.cache
def _role(op_class: type[Operation]) -> int:
    """What build_problem makes of an op of this class, decided once per
    class (op classes are ABCs: isinstance against a tuple of them cost
    microseconds per op)."""
    if issubclass(op_class, lg.OutputOp):
        return OUTPUT
    if issubclass(op_class, AnnotateOp):
        return ANNOTATION
    if is_collective(op_class):
        return COLLECTIVE
    if issubclass(op_class, lg.LgOp | lg.InputOp | lg.ParamOp | lg.ConstantOp):  # every op with SBP rules
        return RULED
    return UNKNOWN


def build_problem(graph: lg.GraphOp, device: Rates) -> Problem:
    nodes: list[Node] = []
    sizes: list[tuple[float, int]] = []  # per node: bytes and rank of its result
    index: dict[int, int] = {}  # id of a value -> its node (an SSAValue hashes in Python)
    default_mesh = lookup_placement(graph, graph.placement).mesh() if graph.placement is not None else None
    same_kind: dict[tuple, tuple[list[NdSignature], np.ndarray, np.ndarray]] = {}
    # (op class, id of its result type, ids of its operand types) -> (result
    # shape, operand shapes, result bytes): values alike share type objects
    # (dtensor_of, tensor_type), which the graph keeps alive meanwhile
    shapes_of: dict[tuple, tuple[tuple[int, ...], list[tuple[int, ...]], float]] = {}
    params_by_key: dict[str, SSAValue] = {}  # the parameters, by key (tied_updates)
    groups = row_groups(graph.body.ops)  # where rows may be grouped by expert (G)
    # an output is fetched whole from its pieces: no group ends go with it
    outputs = {id(v) for op in graph.body.ops if isinstance(op, lg.OutputOp) for v in op.operands}
    op: Operation
    for op in graph.body.ops:
        role = _role(type(op))
        if role == OUTPUT:
            continue
        like_key: tuple | None = None
        producers = [index.get(id(o)) for o in op.operands]
        result = op.results[0]
        hinted = result.type if isinstance(result.type, DTensorType) else None
        placed = op.attributes.get(PLACEMENT_ATTR)
        if hinted is not None:
            mesh = lookup_placement(op, hinted.placement).mesh()
        elif isinstance(placed, SymbolRefAttr):
            mesh = lookup_placement(op, placed).mesh()
        elif any(p is not None for p in producers):
            mesh = nodes[next(p for p in producers if p is not None)].mesh
        elif default_mesh is not None:
            mesh = default_mesh
        else:
            raise PassFailedException(
                f"'{op.name}': no placement: give graph @{graph.sym_name.data} a default (`on @mesh`) or hint the value"
            )
        shapes_key = (type(op), id(result.type), tuple([id(o.type) for o in op.operands]))
        shapes = shapes_of.get(shapes_key)
        if shapes is None:
            shapes = shapes_of[shapes_key] = (global_shape(result.type), [global_shape(o.type) for o in op.operands],
                                              _nbytes(result))
        out_shape, operand_shapes, nbytes = shapes
        fixed_input = False
        own_boxing = 0.0
        if role == ANNOTATION:
            assert isinstance(op, AnnotateOp)
            # The annotation is the requested distribution: what its operand
            # has is paid on the edge from the producer.
            assert hinted is not None
            out_nd = nd_to_plain(hinted.nd_sbp)
            candidates: list[tuple[tuple[PlainNd, ...], PlainNd]] = [((out_nd,), out_nd)]
            fixed_input = True
            flops = 0.0
        elif role == COLLECTIVE:
            assert isinstance(op, COLLECTIVE_OPS)
            # Already boxed IR: the collective is fixed and costs its transfer.
            assert hinted is not None
            source = op.operands[0].type
            assert isinstance(source, DTensorType)  # boxed IR: every value is distributed
            candidates = [((nd_to_plain(source.nd_sbp),), nd_to_plain(hinted.nd_sbp))]
            src_mesh = lookup_placement(op, source.placement).mesh()
            nbytes_in = _nbytes(op.operands[0])
            own_boxing = (
                boxing_cost(candidates[0][0][0], candidates[0][1], mesh.shape, len(out_shape), nbytes_in, device,
                            axis_groups(mesh))
                if src_mesh == mesh
                else transfer_cost(nbytes_in, device, src_mesh.ranks, mesh.ranks)
            )
            flops = 0.0
        elif role == RULED:
            op = cast(lg.LgOp | lg.InputOp | lg.ParamOp | lg.ConstantOp, op)  # (what _role decided)
            if isinstance(op, lg.ParamOp):
                params_by_key[op.key.data] = op.result
            in_shapes = operand_shapes
            params = op.params()
            # Repeated layers repeat ops alike in everything the candidates
            # and their costs read: those are computed once per kind.
            want_key = nd_to_plain(hinted.nd_sbp) if hinted is not None else None
            fetched = id(result) in outputs
            grouped = groups is not None and not fetched and groups.grouping(op) is not None
            like_key = (type(op), tuple(in_shapes), out_shape, mesh.shape, tuple(sorted(params.items())),
                        want_key, nbytes, grouped, fetched)
            try:
                alike = same_kind.get(like_key)
            except TypeError:  # a property without a hash: no sharing
                like_key, alike = None, None
            if alike is not None:
                candidates, compute, memory = alike
                index[id(result)] = len(nodes)
                nodes.append(Node(op, mesh, candidates, compute, memory, producers, False))
                sizes.append((nbytes, len(out_shape)))
                continue
            candidates = nd_signatures(type(op), in_shapes, out_shape, mesh.shape, params, grouped)
            if not grouped:  # no one routing's ends say whose rows are whose here (a rule's own G)
                candidates = [c for c in candidates if not any(Sbp.G in nd for nd in (*c[0], c[1]))]
            if fetched:  # rows gathered by an index are owned by rows: not fetched so
                candidates = [c for c in candidates if not any(s.is_indexed for s in c[1])]
            if hinted is not None:
                want = nd_to_plain(hinted.nd_sbp)
                allowed = [c for c in candidates if c[1] == want]
                if not allowed:
                    results = sorted({format_nd(c[1]) for c in candidates})
                    note = f"; {type(op).SBP_NOTE}" if type(op).SBP_NOTE else ""
                    empty = sorted({a for sbp in want if (a := sbp.axis) is not None and out_shape[a] == 0})
                    if empty:
                        note += f"; axis {empty[0]} of the result has no elements, and an empty axis is not split"
                    raise PassFailedException(
                        f"'{op.name}': the hint {format_nd(want)} on its result cannot be met: no SBP "
                        f"signature gives it (it can give {', '.join(results)}){note}"
                    )
                candidates = allowed
            flops = type(op).flops(in_shapes, out_shape, **params)
        else:
            raise PassFailedException(f"'{op.name}': sbp-infer does not know how to distribute this op")
        # Each candidate's local work as the step-time simulator prices a
        # kernel (Rates.op_time): its share of the flops (that of its
        # smallest piece: a split operand or result divides the work) and
        # the bytes it touches of its pieces (the op's bytes_touched), at
        # the device's GEMM, vector or memory rate, whichever binds.
        operand_bytes = [_nbytes(o) for o in op.operands]
        dtype = str(element_type(result.type))
        work = []
        op_class = cast(type[lg.LgOp], type(op))  # (an op with flops is ruled: an lg op)
        for operand_nds, result_nd in candidates:
            shares = [local_fraction(nd, mesh.shape, shape) for nd, shape in zip(operand_nds, operand_shapes)]
            out_share = local_fraction(result_nd, mesh.shape, out_shape)
            pieces = [s * b for s, b in zip(shares, operand_bytes)]
            touched = op_class.bytes_touched(pieces, out_share * nbytes) if flops else 0.0
            work.append((min([out_share, *shares]), touched))
        # On a mesh axis of one device a split is B; a hair of cost keeps such
        # splits for where a hint asks for them.
        trivial = [sum(1 for nd in (*ins, out) for a, s in enumerate(nd) if s.is_split and mesh.shape[a] == 1)
                   for ins, out in candidates]
        # (An op without arithmetic, a source or a view, costs nothing here as before.)
        compute = np.array([(device.op_time(op.name, flops * f, touched, dtype) if flops else 0.0) + own_boxing
                            + 1e-15 * t for (f, touched), t in zip(work, trivial)])
        # Buffers of redistributions are not modelled (their cost is the
        # boxing); charging an annotation's would make inference depend on
        # whether its requests are already in the IR.
        memory = np.array(
            [
                0.0 if fixed_input else device.memory_cost(nbytes * local_fraction(out, mesh.shape, out_shape))
                for _, out in candidates
            ]
        )
        if like_key is not None:
            same_kind[like_key] = (candidates, compute, memory)
        index[id(result)] = len(nodes)
        nodes.append(Node(op, mesh, candidates, compute, memory, producers, fixed_input))
        sizes.append((nbytes, len(out_shape)))

    # Edges. Operand j of v is u's result, so its size is u's.
    updates = tied_updates(graph, index, params_by_key)
    trained = [p for p, _ in updates if not cast(lg.ParamOp, nodes[p].op).key.data.startswith(OPTIMIZER_STATE_KEYS)]
    problem = Problem(nodes, device, sizes=sizes, gradients=gradients(nodes), bucket_members=max(1, len(trained)))
    tables: dict[tuple, np.ndarray] = {}
    # (producer candidates, consumer candidates (by identity: every node's
    # list lives as long as `nodes`), operand, mesh shape, rank, bytes) -> matrix;
    # edge matrices are never changed in place, so edges alike share one
    spread_tables: dict[tuple, np.ndarray] = {}
    for v, node in enumerate(nodes):
        for j, u in enumerate(node.producers):
            if u is None:
                continue
            producer = nodes[u]
            nbytes, rank = sizes[u]
            gradient = problem.gradients[u]
            # meshes alike in shape and in the ranks of their axes' groups price alike
            where = (node.mesh.shape, problem.axis_groups(node.mesh), gradient)
            if producer.mesh is not node.mesh and producer.mesh != node.mesh:
                matrix = np.full((len(producer.candidates), len(node.candidates)),
                                 transfer_cost(nbytes, device, producer.mesh.ranks, node.mesh.ranks))
            elif (spread := spread_tables.get(
                    (id(producer.candidates), id(node.candidates), j, where, rank, nbytes))) is not None:
                # ops alike share their candidate lists (above), so an edge
                # between two such ops has the matrix of the last one alike
                matrix = spread
            else:
                # The cost of each distinct (source, destination) pair, then
                # spread over the candidates by index: on a 2-D mesh both
                # sides have dozens of candidates but few distinct pairs.
                outs = {s: i for i, s in enumerate(sorted({c[1] for c in producer.candidates}))}
                ins = {d: i for i, d in enumerate(sorted({c[0][j] for c in node.candidates}))}
                # repeated layers and micro-batches repeat the same table
                table_key = (tuple(outs), tuple(ins), where, rank, nbytes)
                pairs = tables.get(table_key)
                if pairs is None:
                    pairs = tables[table_key] = np.array(
                        [[problem.boxing(s, d, node.mesh, rank, nbytes, gradient) for d in ins] for s in outs])
                matrix = pairs[np.ix_([outs[pc[1]] for pc in producer.candidates],
                                     [ins[nc[0][j]] for nc in node.candidates])]
                spread_tables[(id(producer.candidates), id(node.candidates), j, where, rank, nbytes)] = matrix
            key = (u, v)
            problem.edges[key] = problem.edges[key] + matrix if key in problem.edges else matrix
    # An updated parameter (output `new.<key>`, from lg-optimizer) is written
    # back into the parameter, so it must come out in the parameter's
    # distribution: tie the two, charging the boxing between them.
    for param_node, producer_node in updates:
        param, producer = nodes[param_node], nodes[producer_node]
        nbytes, rank = sizes[param_node]
        same_mesh = param.mesh == producer.mesh
        unit = {}
        matrix = np.zeros((len(param.candidates), len(producer.candidates)))
        for kp, pc in enumerate(param.candidates):
            for ku, uc in enumerate(producer.candidates):
                if not same_mesh:
                    matrix[kp, ku] = transfer_cost(nbytes, device, producer.mesh.ranks, param.mesh.ranks)
                    continue
                pair = (uc[1], pc[1])
                if pair not in unit:
                    unit[pair] = problem.boxing(pair[0], pair[1], param.mesh, rank, nbytes)
                matrix[kp, ku] = unit[pair]
        key = (param_node, producer_node)
        problem.edges[key] = problem.edges[key] + matrix if key in problem.edges else matrix
        problem.ties[key] = matrix
    return problem


def gradients(nodes: Sequence[Node]) -> list[bool]:
    """Per node, whether its result is a gradient: a value that only an
    update and the outputs read, not a source and not a part of an update
    itself. An update is the elementwise chain (lg-optimizer's) that only
    other parts of updates and the outputs read. sbp-bucket-collectives
    joins the reductions of such values into buckets (no computation
    waits for them). A sum of gradients (micro-batches' accumulated) is
    one too."""
    only_updates_read = [True] * len(nodes)
    in_update = [False] * len(nodes)
    for v in range(len(nodes) - 1, -1, -1):
        node = nodes[v]
        role = _role(type(node.op))
        in_update[v] = only_updates_read[v] and (role == ANNOTATION or lg.is_elementwise(type(node.op)))
        if not in_update[v]:
            for u in node.producers:
                if u is not None:
                    only_updates_read[u] = False
    found = [False] * len(nodes)
    for v, node in enumerate(nodes):
        if in_update[v]:
            found[v] = isinstance(node.op, lg.AddOp) and all(u is not None and found[u] for u in node.producers)
        else:
            found[v] = only_updates_read[v] and not isinstance(node.op, lg.InputOp | lg.ParamOp | lg.ConstantOp)
    return found


def tied_updates(graph: lg.GraphOp, index: dict[int, int], params: dict[str, SSAValue]) -> list[tuple[int, int]]:
    """(parameter node, producer node of its `new.<key>` output) pairs;
    `index` gives the node of each value by the value's id, `params` each
    parameter of the graph by key."""
    output = graph.output()
    pairs = []
    for name, value in zip(output.names.data, output.values):
        key = name.data.removeprefix("new.")
        if (
            name.data.startswith("new.")
            and key in params
            and id(value) in index
            and id(params[key]) in index
            and index[id(params[key])] != index[id(value)]
        ):
            pairs.append((index[id(params[key])], index[id(value)]))
    return pairs


class ExactCost:
    """The cost of a plan as it will be built, for the final local search.

    The pairwise model the elimination works on charges boxing per use, but
    sbp-infer's annotations are shared by every use that wants the same
    distribution (a weight gradient read by three update ops is all-reduced
    once). Here each producer pays once per distinct distribution its uses
    want (per use for parameters and for sbp.annotate, which are
    redistributed at each use). Moves: one node at a time, and a whole
    connected region of split nodes at once to its replicated signature
    (first regions joined without boxing, then any connected region)
    (single moves cannot leave a plateau such as an elementwise chain
    computed split whose result is gathered at the end), or from one split
    to another (split_region: the uses of one reduced gradient with their
    chains); where none of these
    finds a better plan, a producer and a consumer (or a parameter and its
    update) at once, every pair of their candidates (on an FSDP MLP the
    backward's input gradient and its gelu product move from replicated to
    split together or not at all: each alone costs a gather that the other
    saves)."""

    def __init__(self, problem: Problem):
        self.problem = problem
        nodes = problem.nodes
        self.slots: list[list[tuple[int, int]]] = [[] for _ in nodes]  # producer -> [(consumer, operand)]
        for v, node in enumerate(nodes):
            for j, u in enumerate(node.producers):
                if u is not None:
                    self.slots[u].append((v, j))
        # Nodes alike share their candidate lists and cost arrays
        # (build_problem): what is derived from those alone is derived once
        # per list, by its id (the lists live as long as the problem).
        mesh_ids: dict[Mesh, int] = {}
        self._mesh_id = [mesh_ids.setdefault(node.mesh, len(mesh_ids)) for node in nodes]
        one_distribution: dict[tuple[int, int, int], bool] = {}

        def always_unboxed(u: int, v: int, j: int) -> bool:
            """Every candidate of v wants on operand j what every candidate of u gives."""
            produced, consumed = nodes[u].candidates, nodes[v].candidates
            key = (id(produced), id(consumed), j)
            verdict = one_distribution.get(key)
            if verdict is None:
                verdict = one_distribution[key] = len({c[0][j] for c in consumed} | {c[1] for c in produced}) == 1
            return verdict

        # The uses that can cost anything: a use whose every signature wants
        # the distribution of every signature of its producer, on the same
        # mesh, never adds to producer_cost. Leaving those out is exact and
        # keeps producer_cost short where a value has a great many uses of
        # that kind (the learning rate, read by every parameter's update).
        self.costly_slots = [
            [(v, j) for v, j in uses if self._mesh_id[v] != self._mesh_id[u] or not always_unboxed(u, v, j)]
            for u, uses in enumerate(self.slots)
        ]
        self.ties_of: list[list[tuple[int, int]]] = [[] for _ in nodes]
        for key in problem.ties:
            for n in key:
                self.ties_of[n].append(key)
        self.per_use = [isinstance(node.op, lg.ParamOp) for node in nodes]
        self._unit: dict[tuple, float] = {}
        self._tracked: list[int] | None = None  # the choice list refine is changing, if any
        self._trackers: dict[int, _UseTracker] = {}
        self._tracked_producers: list[list[int]] = [[] for _ in nodes]
        replicated_of: dict[int, int | None] = {}
        for node in nodes:
            if id(node.candidates) not in replicated_of:
                replicated_of[id(node.candidates)] = next(
                    (k for k, (ins, out) in enumerate(node.candidates)
                     if all(s == Sbp.B for nd in (*ins, out) for s in nd)), None)
        self.replicated = [replicated_of[id(node.candidates)] for node in nodes]
        # Plain-data views of the above for producer_cost and local, which
        # refine calls hundreds of thousands of times: per node, its cost per
        # candidate as floats and its mesh as a small int; per producer, what
        # each candidate gives and, per costly use, what each candidate of the
        # consumer wants, each distribution as its index in `_dists`. The
        # same values, read without attribute lookups, numpy scalars, Mesh
        # comparisons or hashing nested tuples. Lists derived from shared
        # ones are shared too (none is ever changed).
        cost_of: dict[tuple[int, int], list[float]] = {}
        for node in nodes:
            if (id(node.compute), id(node.memory)) not in cost_of:
                cost_of[id(node.compute), id(node.memory)] = node.cost.tolist()
        self._node_cost = [cost_of[id(node.compute), id(node.memory)] for node in nodes]
        dist_ids: dict[PlainNd, int] = {}
        gives_of: dict[int, list[int]] = {}
        for node in nodes:
            if id(node.candidates) not in gives_of:
                gives_of[id(node.candidates)] = [dist_ids.setdefault(c[1], len(dist_ids)) for c in node.candidates]
        self._gives = [gives_of[id(node.candidates)] for node in nodes]
        wants_of: dict[tuple[int, int], list[int]] = {}

        def wants(v: int, j: int) -> list[int]:
            """Per candidate of v, the index of the distribution it wants on operand j."""
            key = (id(nodes[v].candidates), j)
            if key not in wants_of:
                wants_of[key] = [dist_ids.setdefault(c[0][j], len(dist_ids)) for c in nodes[v].candidates]
            return wants_of[key]

        # Per (size of u's result, whether it is a gradient, consumer mesh
        # id, same mesh as u): the unit cost of each (source, destination)
        # pair of distribution indices, all that unit reads of u and v, so
        # producers alike share entries; each use holds the table of its own.
        unit_tables: dict[tuple, dict[tuple[int, int], float]] = {}
        self._uses = [
            [(v, wants(v, j), self._mesh_id[v], self._mesh_id[v] == self._mesh_id[u],
              self.per_use[u] or nodes[v].fixed_input,
              unit_tables.setdefault((problem.sizes[u], problem.gradients[u], self._mesh_id[v],
                                      self._mesh_id[v] == self._mesh_id[u]), {}))
             for v, j in uses]
            for u, uses in enumerate(self.costly_slots)
        ]
        self._dists = list(dist_ids)
        self._tie_costs = {key: m.tolist() for key, m in problem.ties.items()}
        # ties alike (repeated layers' parameters) by their matrices' contents: a pair's move is decided once
        tie_ids: dict[tuple, int] = {}
        self._tie_kind = {key: tie_ids.setdefault((m.shape, m.tobytes()), len(tie_ids))
                          for key, m in problem.ties.items()}
        self._pair_moves: dict[tuple, tuple[int, int]] = {}
        self._around: list[tuple[list[int], list[tuple[int, int]]] | None] = [None] * len(nodes)
        self._candidate_pairs: dict[tuple[int, int], list[tuple[int, int]]] = {}
        self._relabels: dict[tuple[int, Sbp, Sbp], dict[int, int]] = {}

    def unit(self, u: int, v: int, j: int, src, dst) -> float:
        node = self.problem.nodes[v]
        same_mesh = self.problem.nodes[u].mesh == node.mesh
        if src == dst and same_mesh:
            return 0.0
        key = (u, node.mesh, src, dst)
        cost = self._unit.get(key)
        if cost is None:
            cost = self._unit[key] = self._unit_cost(u, v, src, dst, same_mesh)
        return cost

    def _unit_cost(self, u: int, v: int, src, dst, same_mesh: bool) -> float:
        """unit(u, v, j, src, dst) where src and dst differ or the meshes
        do, without a memo (producer_cost keeps its own, by plain keys)."""
        nbytes, rank = self.problem.sizes[u]  # operand j of v is u's result
        if not same_mesh:
            return transfer_cost(nbytes, self.problem.device, self.problem.nodes[u].mesh.ranks,
                                 self.problem.nodes[v].mesh.ranks)
        return self.problem.boxing(src, dst, self.problem.nodes[v].mesh, rank, nbytes, self.problem.gradients[u])

    def producer_cost(self, u: int, choice: Sequence[int]) -> float:
        """Boxing of u's result for all its uses."""
        if choice is self._tracked and u in self._trackers:
            return self._trackers[u].cost(choice)
        src = self._gives[u][choice[u]]
        total, seen = 0.0, set()
        for v, wants, mesh, same_mesh, per_use, units in self._uses[u]:
            dst = wants[choice[v]]
            if dst == src and same_mesh:
                continue
            if not per_use:
                if (mesh, dst) in seen:
                    continue
                seen.add((mesh, dst))
            cost = units.get((src, dst))
            if cost is None:
                cost = units[src, dst] = self._unit_cost(u, v, self._dists[src], self._dists[dst], same_mesh)
            total += cost
        return total

    def total(self, choice: Sequence[int]) -> float:
        cost = sum([own[choice[i]] for i, own in enumerate(self._node_cost)])
        cost += sum([self.producer_cost(u, choice) for u in range(len(self._node_cost))])
        cost += sum([m[choice[a]][choice[b]] for (a, b), m in self._tie_costs.items()])
        return cost

    def local(self, changed, choice: Sequence[int]) -> float:
        """The part of the total that depends on the nodes in `changed`."""
        if len(changed) == 1:
            return self._local_of(changed[0], choice)
        nodes = self.problem.nodes
        producers, ties = set(), set()
        for v in changed:
            producers.add(v)
            producers.update(u for u in nodes[v].producers if u is not None)
            ties.update(self.ties_of[v])
        cost = sum(self._node_cost[v][choice[v]] for v in changed)
        cost += sum(self.producer_cost(u, choice) for u in producers)
        cost += sum(self._tie_costs[k][choice[k[0]]][choice[k[1]]] for k in ties)
        return cost

    def _local_of(self, v: int, choice: Sequence[int]) -> float:
        """local([v]): the same terms added in the same order (its sets of
        producers and ties are built as local builds them, once per node,
        and kept in their iteration order), so the very same float."""
        producers_of, ties_of = self._around_of(v)
        cost = 0 + self._node_cost[v][choice[v]]
        cost += sum([self.producer_cost(u, choice) for u in producers_of])
        cost += sum([self._tie_costs[k][choice[k[0]]][choice[k[1]]] for k in ties_of])
        return cost

    def _around_of(self, v: int) -> tuple[list[int], list[tuple[int, int]]]:
        """The producers (v first) and ties whose costs local([v]) adds."""
        around = self._around[v]
        if around is None:
            producers, ties = {v}, set()
            producers.update(u for u in self.problem.nodes[v].producers if u is not None)
            ties.update(self.ties_of[v])
            around = self._around[v] = (list(producers), list(ties))
        return around

    def candidate_costs(self, v: int, choice: list[int]) -> list[float]:
        """local([v], choice) with v at each of its candidates in turn, by
        the terms _local_of adds (the very same floats); choice[v] is left
        as it was. Refine weighs every candidate of every node: one call per
        node, not one per candidate."""
        producers_of, ties_of = self._around_of(v)
        producer_cost, tie_costs, assign = self.producer_cost, self._tie_costs, self._assign
        current = choice[v]
        costs = []
        for k, own in enumerate(self._node_cost[v]):
            assign(choice, v, k)
            cost = 0 + own
            cost += sum([producer_cost(u, choice) for u in producers_of])
            cost += sum([tie_costs[t][choice[t[0]]][choice[t[1]]] for t in ties_of])
            costs.append(cost)
        assign(choice, v, current)
        return costs

    def pair_costs(self, u: int, v: int, combos: Sequence[tuple[int, int]], choice: list[int],
                   bound: float = math.inf) -> list[float]:
        """local([u, v], choice) with u and v at each (u's, v's) candidate
        pair of `combos`, or infinity for a pair whose own costs alone reach
        `bound`; choice is left as it was. A term that reads only one of
        the two choices is computed once per candidate of that one."""
        nodes, assign = self.problem.nodes, self._assign
        of_u = {x for x in nodes[u].producers if x is not None}
        of_v = {x for x in nodes[v].producers if x is not None}
        terms: tuple[list[int], list[int], list[int]] = ([], [], [])  # reading u's choice, v's, both
        for x in dict.fromkeys([u, v, *of_u, *of_v]):
            reads_u, reads_v = x == u or x in of_u, x == v or x in of_v
            terms[2 if reads_u and reads_v else 0 if reads_u else 1].append(x)
        ties: tuple[list[tuple[int, int]], list[tuple[int, int]], list[tuple[int, int]]] = ([], [], [])
        for t in dict.fromkeys([*self.ties_of[u], *self.ties_of[v]]):
            ties[2 if u in t and v in t else 0 if u in t else 1].append(t)
        producer_cost, tie_costs = self.producer_cost, self._tie_costs

        def part(k: int) -> float:
            return (sum([producer_cost(x, choice) for x in terms[k]])
                    + sum([tie_costs[t][choice[t[0]]][choice[t[1]]] for t in ties[k]]))

        own_u, own_v = self._node_cost[u], self._node_cost[v]
        current = choice[u], choice[v]
        of_a: dict[int, float] = {}
        of_b: dict[int, float] = {}
        for a, b in combos:
            if a not in of_a:
                assign(choice, u, a)
                of_a[a] = own_u[a] + part(0)
            if b not in of_b:
                assign(choice, v, b)
                of_b[b] = own_v[b] + part(1)
        costs = []
        for a, b in combos:
            if of_a[a] + of_b[b] >= bound:  # the rest adds boxing, never less than nothing
                costs.append(math.inf)
                continue
            assign(choice, u, a)
            assign(choice, v, b)
            costs.append(of_a[a] + of_b[b] + part(2))
        assign(choice, u, current[0])
        assign(choice, v, current[1])
        return costs

    def _pair_move(self, u: int, v: int, choice: list[int]) -> tuple[int, int]:
        """The cheapest (u's, v's) candidates with both moved, or their
        current ones where no such pair is cheaper (where one keeps its
        choice, the single moves decide). Decided once per local situation
        (`_situation`): repeated layers repeat the same few."""
        situation = self._situation(u, v, choice)
        if situation is not None and (move := self._pair_moves.get(situation)) is not None:
            return move
        best_a, best_b = choice[u], choice[v]
        (best_cost,) = self.pair_costs(u, v, [(best_a, best_b)], choice)
        combos = [(a, b) for a, b in self._combos(u, v) if a != best_a and b != best_b]
        costs = self.pair_costs(u, v, combos, choice, best_cost - 1e-15)
        for (a, b), cost in zip(combos, costs):
            if cost < best_cost - 1e-15:
                best_a, best_b, best_cost = a, b, cost
        if situation is not None:
            self._pair_moves[situation] = (best_a, best_b)
        return best_a, best_b

    def _situation(self, u: int, v: int, choice: Sequence[int]) -> tuple | None:
        """Everything pair_costs(u, v) reads, as a key: the cost lists of u
        and v and their choices, and for each producer whose boxing it adds
        up, what that producer gives, its choice and each costly use's wants,
        mesh and choice (u and v by their role); the ties by their matrices.
        None where a producer has more uses than TRACKED_USES (a key would
        cost more than the evaluation)."""
        nodes = self.problem.nodes

        def who(n: int) -> int:
            return -1 if n == u else -2 if n == v else choice[n]

        parts: list = [id(self._node_cost[u]), id(self._node_cost[v]), choice[u], choice[v]]
        for n in (u, v):
            for x in nodes[n].producers:
                if x is None:
                    parts.append(None)
                    continue
                uses = self._uses[x]
                if len(uses) > TRACKED_USES:
                    return None
                parts.append((-1 if x == u else id(self._gives[x]), who(x),
                              tuple((id(wants), mesh, same, per, id(units), who(c))
                                    for c, wants, mesh, same, per, units in uses)))
            parts.append(tuple((self._tie_kind[t], t.index(n), who(t[1 - t.index(n)])) for t in self.ties_of[n]))
        for n in (u, v):
            if len(self._uses[n]) > TRACKED_USES:
                return None
            parts.append(tuple((id(wants), mesh, same, per, id(units), who(c))
                               for c, wants, mesh, same, per, units in self._uses[n]))
        parts.extend((id(self._gives[u]), id(self._gives[v])))
        return tuple(parts)

    def _boxes(self, n: int, choice: Sequence[int]) -> bool:
        """Whether a value n reads or gives is redistributed (on one mesh).
        A pair of nodes whose values all go unboxed moves only to box some:
        what it might save is compute, which a region's move finds; pair
        moves try only pairs where one of the two boxes something."""
        nodes = self.problem.nodes
        node = nodes[n]
        wants, gives = node.candidates[choice[n]]
        for j, x in enumerate(node.producers):
            if x is not None and nodes[x].candidates[choice[x]][1] != wants[j] and nodes[x].mesh == node.mesh:
                return True
        for v, j in self.slots[n]:
            if nodes[v].candidates[choice[v]][0][j] != gives and nodes[v].mesh == node.mesh:
                return True
        return False

    def _combos(self, u: int, v: int) -> list[tuple[int, int]]:
        """Every (u's, v's) pair of candidates, one list per pair of
        candidate lists (nodes alike share them)."""
        nodes = self.problem.nodes
        key = (len(nodes[u].candidates), len(nodes[v].candidates))
        combos = self._candidate_pairs.get(key)
        if combos is None:
            combos = self._candidate_pairs[key] = list(itertools.product(range(key[0]), range(key[1])))
        return combos

    def _pairs(self) -> list[tuple[int, int]]:
        """The pairs pair moves try: each producer with each of its
        consumers, and each tie (a parameter and its update's producer),
        where both have a choice and on the same mesh (a pipeline stage's
        boundary is priced as a transfer either way)."""
        counts = [len(node.candidates) if len(node.candidates) > 1 else PAIR_LIMIT + 1 for node in self.problem.nodes]
        mesh_id = self._mesh_id
        pairs = dict.fromkeys((u, v) for v, node in enumerate(self.problem.nodes) for u in node.producers
                              if u is not None and u != v and counts[u] * counts[v] <= PAIR_LIMIT
                              and mesh_id[u] == mesh_id[v])
        pairs.update(dict.fromkeys((u, v) for u, v in self.problem.ties
                                   if counts[u] * counts[v] <= PAIR_LIMIT and mesh_id[u] == mesh_id[v]))
        return list(pairs)

    def region(self, v: int, choice: Sequence[int], direct: bool = False) -> list[int]:
        """v and the nodes connected to it that are not replicated but could
        be; with `direct`, only through edges that need no boxing (a chain
        computed split between two redistributions, such as an optimizer
        update between its gradient's reduce-scatter and the all-gather of
        its result, without the rest of the graph it touches)."""
        nodes, replicated, mesh_id = self.problem.nodes, self.replicated, self._mesh_id

        def flippable(n: int) -> bool:
            return replicated[n] is not None and choice[n] != replicated[n]

        def unboxed(producer: int, consumer: int, operand: int) -> bool:
            produced = nodes[producer].candidates[choice[producer]][1]
            return produced == nodes[consumer].candidates[choice[consumer]][0][operand]

        if not flippable(v):
            return []
        region, todo = {v}, [v]
        while todo:
            n = todo.pop()
            neighbours = [(u, n, j) for j, u in enumerate(nodes[n].producers) if u is not None]
            neighbours += [(n, c, j) for c, j in self.slots[n]]
            for producer, consumer, j in neighbours:
                m = producer if consumer == n else consumer
                if m in region or not flippable(m) or mesh_id[m] != mesh_id[v]:
                    continue
                if direct and not unboxed(producer, consumer, j):
                    continue
                region.add(m)
                todo.append(m)
        return sorted(region)

    def relabelled(self, n: int, split: Sbp, to: Sbp) -> dict[int, int]:
        """Per candidate of n whose result is split as `split`, the candidate
        alike but with `split` read and given as `to` (a split of another
        tensor axis) wherever it stands, where n has one. One table per
        candidate list (nodes alike share them)."""
        candidates = self.problem.nodes[n].candidates
        key = (id(candidates), split, to)
        table = self._relabels.get(key)
        if table is None:
            index = {c: i for i, c in enumerate(candidates)}

            def swap(nd: PlainNd) -> PlainNd:
                return tuple(to if s == split else s for s in nd)

            table = self._relabels[key] = {
                i: j for i, (ins, out) in enumerate(candidates) if split in out
                and (j := index.get((tuple(swap(nd) for nd in ins), swap(out)), -1)) >= 0}
        return table

    def split_region(self, v: int, split: Sbp, to: Sbp, choice: Sequence[int]) -> list[int]:
        """v and the nodes joined to it by values in the `split` distribution
        that could all take `to` instead (relabelled): values passed on
        unboxed, and the uses of one redistributed value that want it split
        alike. The second kind is why this move exists: a weight's gradient
        reduce-scattered to columns for Adam's two moments stays so under
        single and pair moves, since either use moved alone to rows costs a
        second reduction (GPT 6L d512: 24 such reductions packed and their
        gathers unpacked, where rows need neither)."""
        nodes, mesh_id, relabelled = self.problem.nodes, self._mesh_id, self.relabelled
        if choice[v] not in relabelled(v, split, to):
            return []
        region, todo = {v}, [v]

        def join(m: int) -> None:
            if m not in region and mesh_id[m] == mesh_id[v] and choice[m] in relabelled(m, split, to):
                region.add(m)
                todo.append(m)

        while todo:
            n = todo.pop()
            ins, out = nodes[n].candidates[choice[n]]
            for j, u in enumerate(nodes[n].producers):
                if u is None or split not in ins[j]:
                    continue
                if nodes[u].candidates[choice[u]][1] == ins[j]:
                    join(u)
                else:
                    for w, i in self.slots[u]:
                        if nodes[w].candidates[choice[w]][0][i] == ins[j]:
                            join(w)
            for w, j in self.slots[n]:
                if nodes[w].candidates[choice[w]][0][j] == out:
                    join(w)
        return sorted(region)

    def _split_moves(self, choice: list[int], changed_at) -> bool:
        """Each region of split_region moved to the other split at once,
        where that is cheaper; whether any moved."""
        nodes, sizes, assign = self.problem.nodes, self.problem.sizes, self._assign
        changed = False
        tried: set[tuple[int, Sbp, Sbp]] = set()
        for v, node in enumerate(nodes):
            if len(node.candidates) < 2:
                continue
            rank = sizes[v][1]
            for split in dict.fromkeys(s for s in node.candidates[choice[v]][1] if s.is_split):
                for axis in range(rank):
                    to = Sbp.S(axis)
                    if to == split or (v, split, to) in tried:
                        continue
                    region = self.split_region(v, split, to, choice)
                    tried.update((n, split, to) for n in region)
                    if len(region) < 2:
                        continue
                    old = [choice[n] for n in region]
                    before = self.local(region, choice)
                    for n, k in zip(region, old):
                        assign(choice, n, self.relabelled(n, split, to)[k])
                    if self.local(region, choice) < before - 1e-15:
                        changed = True
                        for n in region:
                            changed_at(n)
                    else:
                        for n, k in zip(region, old):
                            assign(choice, n, k)
        return changed

    def _track(self, choice: list[int] | None) -> None:
        """Keep use trackers for the producers with many uses while refine
        changes `choice` (through _assign), or stop (None)."""
        self._tracked = choice
        self._trackers = {}
        self._tracked_producers = [[] for _ in self.problem.nodes]
        if choice is None:
            return
        for u, uses in enumerate(self.costly_slots):
            if len(uses) > TRACKED_USES:
                self._trackers[u] = _UseTracker(self, u, choice)
                for v in dict.fromkeys(v for v, _ in uses):
                    self._tracked_producers[v].append(u)

    def _assign(self, choice: list[int], v: int, k: int) -> None:
        if choice[v] != k:
            choice[v] = k
            for u in self._tracked_producers[v]:
                self._trackers[u].move(v, choice)

    def refine(self, choice: list[int], rounds: int = 8) -> list[int]:
        self._track(choice)
        try:
            return self._refine(choice, rounds)
        finally:
            self._track(None)

    def _near(self) -> list[list[int]]:
        """Per node n: the other nodes whose `local` cost reads n's choice,
        except the other consumers of n's producers: n's consumers, its
        producers and its tie partners. The other consumers of a producer
        are reached through the producer's stamp instead (see _refine):
        listing them per node is quadratic in a producer's uses, and the
        learning rate is read by every parameter's update."""
        nodes = self.problem.nodes
        out: list[set[int]] = [set() for _ in nodes]
        for n, node in enumerate(nodes):
            around = out[n]
            around.update(v for v, _ in self.slots[n])
            around.update(u for u in node.producers if u is not None)
            for key in self.ties_of[n]:
                around.update(key)
            around.discard(n)
        return [sorted(a) for a in out]

    def _refine(self, choice: list[int], rounds: int) -> list[int]:
        nodes = self.problem.nodes
        assign = self._assign
        near = self._near()
        producers = [sorted({u for u in node.producers if u is not None}) for node in nodes]
        # A node is tried again only when something its local cost reads has
        # changed since it was last tried: otherwise it would find the very
        # same costs and keep its choice. (Exact: the search takes the same
        # steps it took when it tried every node every round.) A change
        # marks its near nodes dirty and bumps the stamp of each of its
        # producers; a node whose producers' stamps moved since it was last
        # tried had a fellow consumer change. A pair is tried again likewise:
        # when the version of either node (bumped with its dirty mark) or
        # their producers' stamps moved.
        stamp = [0] * len(nodes)
        version = [0] * len(nodes)

        def stamps(v: int) -> int:
            return sum(stamp[u] for u in producers[v])

        def changed_at(v: int) -> None:
            for n in (v, *near[v]):
                dirty[n] = True
                version[n] += 1
            for u in producers[v]:
                stamp[u] += 1

        seen = [0] * len(nodes)
        dirty = [True] * len(nodes)
        pairs: list[tuple[int, int]] | None = None  # made when single and region moves first settle
        pair_seen: dict[tuple[int, int], tuple[int, int, int, int]] = {}

        for _ in range(rounds):
            changed = False
            for v, node in enumerate(nodes):
                if len(node.candidates) < 2 or not (dirty[v] or seen[v] != stamps(v)):
                    continue
                current = choice[v]
                costs = self.candidate_costs(v, choice)
                best, best_cost = current, costs[current]
                for k, cost in enumerate(costs):
                    if k != current and cost < best_cost - 1e-15:
                        best, best_cost = k, cost
                assign(choice, v, best)
                if best != current:
                    changed = True
                    changed_at(v)
                dirty[v], seen[v] = False, stamps(v)
            for direct in (True, False):
                tried: set[int] = set()
                for v in range(len(nodes)):
                    if v in tried:
                        continue
                    region = self.region(v, choice, direct)
                    tried.update(region)
                    if len(region) < 2:
                        continue
                    old = [choice[n] for n in region]
                    before = self.local(region, choice)
                    for n in region:
                        replicated = self.replicated[n]
                        assert replicated is not None  # a region holds only flippable nodes
                        assign(choice, n, replicated)
                    if self.local(region, choice) < before - 1e-15:
                        changed = True
                        for n, k in zip(region, old):
                            if choice[n] != k:
                                changed_at(n)
                    else:
                        for n, k in zip(region, old):
                            assign(choice, n, k)
            if changed or self._split_moves(choice, changed_at):
                continue
            if pairs is None:
                pairs = self._pairs()
            for u, v in pairs:
                key = (version[u], version[v], stamps(u), stamps(v))
                if pair_seen.get((u, v)) == key or not (self._boxes(u, choice) or self._boxes(v, choice)):
                    continue
                best_a, best_b = self._pair_move(u, v, choice)
                if (best_a, best_b) != (choice[u], choice[v]):
                    changed = True
                    for n, k in ((u, best_a), (v, best_b)):
                        if choice[n] != k:
                            assign(choice, n, k)
                            changed_at(n)
                pair_seen[u, v] = (version[u], version[v], stamps(u), stamps(v))
            if not changed:
                break
        return choice


PAIR_LIMIT = 256
"""Pair moves try pairs of up to this many candidate pairs (on a 2-D mesh a
matmul has dozens of signatures: every pair of two of them would cost more
than the rest of the search)."""

TRACKED_USES = 16
"""Producers with more uses that can cost than this get a _UseTracker in refine."""


class _UseTracker:
    """Which distribution each use of one producer wants, kept up to date as
    refine changes choices, so that ExactCost.producer_cost need not walk
    every use: refine tries each candidate of each consumer, and a value
    read by every parameter's update (the learning rate) made that
    quadratic in the parameter count. producer_cost adds, in use order, the
    boxing of every per-use use and of the first use of each distinct
    (mesh, distribution); this adds the very same terms in the same order,
    so the sum is the same float."""

    def __init__(self, exact: ExactCost, u: int, choice: list[int]):
        nodes = exact.problem.nodes
        self.exact, self.u = exact, u
        self.uses = exact.costly_slots[u]
        self.key: list[tuple] = []  # per use: (consumer mesh, wanted distribution) now
        self.of_consumer: dict[int, list[int]] = {}  # consumer -> its use indices
        self.first: dict[tuple, list[int]] = {}  # key -> sorted indices of the shared (not per-use) uses wanting it
        self.per_use = [i for i, (v, _) in enumerate(self.uses) if exact.per_use[u] or nodes[v].fixed_input]
        per_use = set(self.per_use)
        for i, (v, j) in enumerate(self.uses):
            self.of_consumer.setdefault(v, []).append(i)
            key = (nodes[v].mesh, nodes[v].candidates[choice[v]][0][j])
            self.key.append(key)
            if i not in per_use:
                self.first.setdefault(key, []).append(i)
        self.shared = [i not in per_use for i in range(len(self.uses))]

    def move(self, v: int, choice: list[int]) -> None:
        """Consumer v's choice changed."""
        nodes = self.exact.problem.nodes
        for i in self.of_consumer[v]:
            key = (nodes[v].mesh, nodes[v].candidates[choice[v]][0][self.uses[i][1]])
            old = self.key[i]
            if key == old:
                continue
            self.key[i] = key
            if self.shared[i]:
                wanting = self.first[old]
                del wanting[bisect.bisect_left(wanting, i)]
                bisect.insort(self.first.setdefault(key, []), i)

    def cost(self, choice: list[int]) -> float:
        nodes = self.exact.problem.nodes
        u = self.u
        src = nodes[u].candidates[choice[u]][1]
        free = (nodes[u].mesh, src)  # what the producer gives: no boxing
        terms = [wanting[0] for key, wanting in self.first.items() if wanting and key != free]
        terms += [i for i in self.per_use if self.key[i] != free]
        total = 0.0
        for i in sorted(terms):
            v, j = self.uses[i]
            total += self.exact.unit(u, v, j, src, self.key[i][1])
        return total
