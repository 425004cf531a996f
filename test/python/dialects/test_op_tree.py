"""Op trees (dialects/op_tree.py): what the rank pool sends each rank is the
plan its text would parse to, and IR that is not attributes alone is refused."""

import pickle
from pathlib import Path

import pytest
from xdsl.context import Context

import sbpc
from sbpc.dialects import plan, verify_module
from sbpc.dialects.op_tree import build_module, op_tree
from sbpc.lowering.compile import CompilePass
from sbpc.runtime.program import rank_plan_pickles, rank_plans

EXAMPLES = Path(__file__).parents[3] / "examples"


@pytest.mark.parametrize("example", ["mlp_train.mlir", "mlp_train_zero.mlir", "gpt_block.mlir"])
def test_each_ranks_op_tree_rebuilds_the_plan_its_text_parses_to(example):
    module = sbpc.parse_module((EXAMPLES / example).read_text())
    CompilePass().apply(Context(), module)
    ranks = 1 + max(d.rank.value.data for d in plan.programs(module)[0].devices()) + 1  # the last rank holds none
    texts = rank_plans(module, ranks)
    pickles = rank_plan_pickles(module, ranks)
    assert len(pickles) == len(texts) == ranks
    for text, pickled in zip(texts, pickles, strict=True):
        rebuilt = build_module(pickle.loads(pickled))
        verify_module(rebuilt)
        assert str(rebuilt) == str(sbpc.parse_module(text))
    # the module handed in is left as it was
    assert str(module) == str(sbpc.parse_module(str(module)))


def test_ir_with_values_is_refused_by_name():
    module = sbpc.parse_module((EXAMPLES / "mlp.mlir").read_text())
    with pytest.raises(ValueError, match=r"^lg\.\w+ has operands, results or successors"):
        op_tree(module)


def test_a_tree_of_another_op_is_not_a_module():
    module = sbpc.parse_module((EXAMPLES / "mlp_train.mlir").read_text())
    CompilePass().apply(Context(), module)
    placement = next(iter(module.ops))
    with pytest.raises(ValueError, match=r"holds a sbp\.placement, not a builtin\.module"):
        build_module(op_tree(placement))


@pytest.mark.parametrize("example", ["mlp.mlir", "mlp_train.mlir", "gpt_block.mlir"])
def test_structure_keys_are_equal_exactly_where_the_texts_are(example):
    """What the planner compares layouts' inferred IR by: equal for a clone
    and a reparse, different for a changed use, name or attribute."""
    from xdsl.dialects.builtin import StringAttr

    from sbpc.dialects import lg
    from sbpc.dialects.op_tree import structure_key
    from sbpc.lowering.sbp_infer import SbpInferPass

    module = sbpc.parse_module((EXAMPLES / example).read_text())
    SbpInferPass().apply(Context(), module)
    key = structure_key(module)
    assert structure_key(module.clone()) == key and structure_key(sbpc.parse_module(str(module))) == key
    hash(key)

    def changed(edit) -> tuple[str, tuple]:
        other = module.clone()
        edit(other)
        return str(other), structure_key(other)

    ops = lambda m: [op for op in m.walk() if isinstance(op, lg.LgOp) and op.operands]  # noqa: E731
    binary = lambda m: next(op for op in ops(m) if len(op.operands) == 2 and op.operands[0] != op.operands[1])  # noqa: E731

    def swap_uses(m):
        op = binary(m)
        a, b = op.operands
        op.operands = (b, a)

    def rename(m):
        ops(m)[0].results[0].name_hint = "renamed"

    def annotate(m):
        ops(m)[0].attributes["note"] = StringAttr("x")

    edits = [swap_uses, rename, annotate]
    found = {str(module): key}
    for edit in edits:
        text, other_key = changed(edit)
        assert text != str(module) and other_key != key, edit.__name__
        found[text] = other_key
    assert len(set(found.values())) == len(found)
