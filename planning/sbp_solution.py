"""Writing an answer of the SBP choice problem (sbp_problem.py) back into
the graph: every value typed `!sbp.dtensor`, every op's choice recorded in
`sbp.signature`, and an `sbp.annotate` requesting each redistribution a
consumer needs (sbp-insert-boxing lowers them). sbp-infer and the autoplan
profiler's layers both end here."""

from __future__ import annotations

from xdsl.dialects.builtin import ArrayAttr, FloatAttr, StringAttr, f64
from xdsl.ir import Attribute, Operation, SSAValue

from sbpc.dialects import lg
from sbpc.dialects.sbp import (
    SIGNATURE_ATTR,
    AnnotateOp,
    DTensorType,
    PlainNd,
    dtensor_of,
    element_type,
    format_nd,
    global_shape,
    retype,
    signature_of,
)

from .sbp_problem import NdSignature, Problem


def format_signature(sig: NdSignature) -> str:
    ins, out = sig
    return f"({', '.join(format_nd(nd) for nd in ins)}) -> ({format_nd(out)})"


def apply_solution(graph: lg.GraphOp, problem: Problem, choice: list[int], strategy: str, explain: bool) -> None:
    nodes = problem.nodes
    # (id of a type, placement, nd-SBP) -> (the type, the dtensor of its shape
    # and element type there): values alike share type objects, so each
    # distinct type is placed once (the entry keeps it alive)
    placed_as: dict[tuple[int, str, PlainNd], tuple[Attribute, DTensorType]] = {}

    def placed(t: Attribute, placement: str, nd: PlainNd) -> DTensorType:
        key = (id(t), placement, nd)
        known = placed_as.get(key)
        if known is None or known[0] is not t:
            known = placed_as[key] = (t, dtensor_of(global_shape(t), element_type(t), placement, nd))
        return known[1]

    for v, node in enumerate(nodes):
        ins, out = node.candidates[choice[v]]
        result = node.op.results[0]
        old_type = result.type
        new_type = placed(old_type, node.mesh.name, out)
        # types alike are one shared object (dtensor_of): identity settles most comparisons
        if old_type is not new_type and old_type != new_type:
            retype(result, new_type)
        if isinstance(node.op, lg.SbpRules):
            node.op.attributes[SIGNATURE_ATTR] = signature_of(ins, [out])
        if explain:
            node.op.attributes["sbp.explain"] = _explanation(problem, v, choice)

    # Where a consumer needs another distribution, request it with an annotation
    # right after the producer, shared by every consumer with the same need.
    # A parameter is the exception: it is always there, so its redistribution
    # is made right before each use (the cost model charges every use anyway).
    # A parameter stored split and gathered for a use is then gathered again
    # for the next (forward, backward) and each gathered copy dies at its use:
    # FSDP / ZeRO-3.
    requests: dict[tuple[SSAValue, DTensorType], SSAValue] = {}
    for v, node in enumerate(nodes):
        if node.fixed_input:
            continue
        ins, _ = node.candidates[choice[v]]
        operands = list(node.op.operands)
        changed = False
        for j, operand in enumerate(operands):
            have = operand.type
            if not isinstance(have, DTensorType):
                continue
            want = placed(have, node.mesh.name, ins[j])
            if have is want or have == want:
                continue
            changed = True
            owner = operand.owner
            assert isinstance(owner, Operation)
            if isinstance(owner, lg.ParamOp):
                annotate = AnnotateOp(operand, want)
                block = node.op.parent_block()
                assert block is not None  # node.op is an op of the graph
                block.insert_op_before(annotate, node.op)
                operands[j] = annotate.result
                continue
            key = (operand, want)
            if key not in requests:
                annotate = AnnotateOp(operand, want)
                block = owner.parent_block()
                assert block is not None  # owner is an op of the graph
                block.insert_op_after(annotate, owner)
                requests[key] = annotate.result
            operands[j] = requests[key]
        if changed:
            node.op.operands = operands

    # Updated parameters are fetched in their parameter's distribution.
    output = graph.output()
    operands = list(output.operands)  # set once at the end: each setting re-registers every use
    positions: dict[SSAValue, list[int]] = {}  # where each value is fetched (a scan per update was quadratic)
    for j, value in enumerate(operands):
        positions.setdefault(value, []).append(j)
    # (build_problem tied each updated parameter to its parameter, in output order)
    for param_node, producer_node in problem.ties:
        fetched_as = nodes[param_node].op.results[0].type
        assert isinstance(fetched_as, DTensorType)  # every value is distributed once inference ran
        produced = nodes[producer_node].op.results[0]
        for j in positions.get(produced, ()):
            value = operands[j]
            if value is produced and value.type != fetched_as:
                annotate = AnnotateOp(value, fetched_as)
                graph.body.block.insert_op_before(annotate, output)
                operands[j] = annotate.result
    output.operands = operands

    graph.attributes["sbp.strategy"] = StringAttr(strategy)
    graph.attributes["sbp.total_cost"] = FloatAttr(problem.exact().total(choice), f64)


def _explanation(problem: Problem, v: int, choice: list[int]) -> ArrayAttr:
    node = problem.nodes[v]
    boxing = problem.boxing_of(v, choice)
    lines = []
    for k, sig in enumerate(node.candidates):
        mark = "* " if k == choice[v] else ""
        total = node.compute[k] + node.memory[k] + boxing[k]
        lines.append(
            StringAttr(
                f"{mark}{format_signature(sig)}: compute {node.compute[k]:.3g} boxing {boxing[k]:.3g} "
                f"memory {node.memory[k]:.3g} total {total:.3g}"
            )
        )
    return ArrayAttr(lines)


