"""A faster generic verifier for sbpc's IRDL ops, with xDSL's own checks and messages.

xDSL's generic op verification (`OpDef.verify`) checks the number of
operands, results, regions and successors through its machinery for
variadic definitions, four times per op, even for an op that has none; on
a plan of a 10k-op graph (~40k registers and actors) that machinery was
over a third of module verification. `op_definition` is
`irdl_op_definition` plus a fast path for ops whose definition has no
variadic or optional operands, results or regions, no successors and no
IRDL options: the counts are compared with fixed numbers, then the very
constraints, properties, attributes and traits `OpDef.verify` checks are
checked the same way; a constraint without variables (its verdict
depends on the attribute alone) remembers the attribute objects it
passed, since passes share attributes between ops (one register name
attribute per value on every rank, one dtensor type per distribution).

The fast path only ever accepts: on any failure it hands the op to
`OpDef.verify`, which raises xDSL's own error, so every diagnostic is the
one the generic verifier gives (test_compile_speed checks that both
accept the same ops).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from xdsl.ir import Attribute
from xdsl.irdl import IRDLOperation, irdl_op_definition
from xdsl.irdl.constraints import VerificationContext
from xdsl.irdl.operations import OpDef, OptAttributeDef, OptPropertyDef, SingleBlockRegionDef, VariadicDef

OpT = TypeVar("OpT", bound=IRDLOperation)


def op_definition(cls: type[OpT]) -> type[OpT]:
    """`irdl_op_definition`, with the fast generic verifier where the
    definition allows it (see the module doc); the op's own `verify_` runs
    after it, as with xDSL."""
    custom = getattr(cls, "verify_", None)  # what irdl_op_definition chains after OpDef.verify
    cls = irdl_op_definition(cls)
    op_def = cls.get_irdl_definition()
    accepts = fast_accepts(op_def)
    if accepts is None:
        return cls

    def verify_(self: IRDLOperation) -> None:
        if not accepts(self):
            op_def.verify(self)
        if custom is not None:
            custom(self)

    # replacing the method is the point (irdl_op_definition does it with
    # setattr); mypy forbids it, and types `verify_` as taking any Operation
    # though it only ever runs on instances of `cls`
    cls.verify_ = verify_  # type: ignore[method-assign, assignment]
    return cls


def _fields_pass(fields, present: dict[str, Attribute], context: VerificationContext) -> bool:
    """Every (name, check, optional) field is present unless optional, and
    its check passes (a failing check raises)."""
    for name, check, optional in fields:
        if name not in present:
            if optional:
                continue
            return False
        check(present[name], context)
    return True


def fast_accepts(op_def: OpDef) -> Callable[[IRDLOperation], bool] | None:
    """A check that returns True only for ops `op_def.verify` accepts
    (False means: ask `op_def.verify`), or None where the definition has
    variadic parts (the generic verifier then runs alone)."""
    if op_def.options or op_def.successors:
        return None
    if any(isinstance(d, VariadicDef) for _, d in (*op_def.operands, *op_def.results, *op_def.regions)):
        return None
    operand_checks = tuple(_check(d.constr, single=True) for _, d in op_def.operands)
    result_checks = tuple(_check(d.constr, single=True) for _, d in op_def.results)
    regions = tuple((isinstance(d, SingleBlockRegionDef), d.entry_args) for _, d in op_def.regions)
    n_operands, n_results, n_regions = len(operand_checks), len(result_checks), len(regions)
    properties = tuple((name, _check(d.constr), isinstance(d, OptPropertyDef)) for name, d in op_def.properties.items())
    attributes = tuple(
        (name, _check(d.constr), isinstance(d, OptAttributeDef)) for name, d in op_def.attributes.items()
    )
    known_properties = frozenset(op_def.properties)
    traits = op_def.traits

    def accepts(op: IRDLOperation) -> bool:
        try:
            if (len(op.operands) != n_operands or len(op.results) != n_results or len(op.regions) != n_regions
                    or op.successors):
                return False
            context = VerificationContext()
            for check, value in zip(operand_checks, op.operands):
                check(value.type, context)
            for check, value in zip(result_checks, op.results):
                check(value.type, context)
            for (single_block, entry_args), region in zip(regions, op.regions):
                if single_block and len(region.blocks) != 1:
                    return False
                entry = region.first_block
                if entry is not None:
                    entry_args.verify(entry.arg_types, context)
            if not _fields_pass(properties, op.properties, context) or not known_properties.issuperset(op.properties):
                return False
            if not _fields_pass(attributes, op.attributes, context):
                return False
            for trait in traits:
                trait.verify(op)
        except Exception:  # noqa: BLE001  (the generic verifier reports it, in its words)
            return False
        return True

    return accepts


MEMO_LIMIT = 1 << 16
"""Entries a verifier's identity memo keeps before it starts over."""


def remember(memo: dict, key, entry) -> None:
    """Keeps a verifier's verdict in `memo` (keyed by attribute ids, the
    entry holding those attributes, so their ids are not reused while it
    lasts; attributes are immutable, so the verdict holds for the same
    objects), starting the memo over at MEMO_LIMIT entries."""
    if len(memo) >= MEMO_LIMIT:
        memo.clear()
    memo[key] = entry


def _check(constr, single: bool = False) -> Callable[[Attribute, VerificationContext], None]:
    """`constr.verify` of one attribute (with `single`, of a one-attribute
    range, as irdl_op_verify_arg_list checks a single operand or result).
    A constraint that binds no variables depends on the attribute alone, so
    it remembers the attribute objects it passed (by identity: an entry
    keeps its attribute alive, so its id cannot be reused)."""
    try:
        pure = not constr.variables() and not (single and constr.variables_from_length())
    except Exception:  # noqa: BLE001  (a constraint that cannot say: always check)
        pure = False

    def verify(attr: Attribute, context: VerificationContext) -> None:
        constr.verify((attr,) if single else attr, context)

    if not pure:
        return verify
    passed: dict[int, Attribute] = {}

    def check(attr: Attribute, context: VerificationContext) -> None:
        if passed.get(id(attr)) is attr:
            return
        verify(attr, context)
        remember(passed, id(attr), attr)

    return check
