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
The traits whose verifiers walk a whole body per op (SymbolTable and
IsolatedFromAbove on a plan device or program, ~20k ops each) or import
per call (SymbolOpInterface) are checked by plain functions of the same
conditions: a tenth of verifying a 10k-op graph's plan.

The fast path only ever accepts: on any failure it hands the op to
`OpDef.verify`, which raises xDSL's own error, so every diagnostic is the
one the generic verifier gives (test_compile_speed checks that both
accept the same ops).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import ClassVar, TypeVar

from xdsl.dialects.builtin import UNKNOWN_LOC, ArrayAttr, ArrayOfConstraint, StringAttr, SymbolNameConstraint
from xdsl.ir import Attribute, Operation, Region, SSAValue
from xdsl.irdl import IRDLOperation, irdl_op_definition
from xdsl.irdl.constraints import (
    AnyAttr,
    AnyOf,
    BaseAttr,
    EqIntConstraint,
    RangeLengthConstraint,
    RangeOf,
    VerificationContext,
)
from xdsl.irdl.operations import (
    OpDef,
    OptAttributeDef,
    OptionalDef,
    OptPropertyDef,
    SingleBlockRegionDef,
    VariadicDef,
)
from xdsl.traits import IsolatedFromAbove, OpTrait, SymbolOpInterface, SymbolTable

OpT = TypeVar("OpT", bound=IRDLOperation)


def op_definition(cls: type[OpT]) -> type[OpT]:
    """`irdl_op_definition`, with the fast generic verifier where the
    definition allows it (see the module doc); the op's own `verify_` runs
    after it, as with xDSL."""
    custom = getattr(cls, "verify_", None)  # what irdl_op_definition chains after OpDef.verify
    cls = irdl_op_definition(cls)
    op_def = cls.get_irdl_definition()
    cls.__post_init__ = _defaults_filler(op_def)  # type: ignore[method-assign]  # as verify_ below
    if issubclass(cls, DirectInit):
        cls.PLAIN_ARITY = _plain_arity(op_def)  # on this class alone: DirectInit reads its own __dict__
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


class DirectInit(IRDLOperation):
    """A base for op classes built by the thousand (lg compute ops, sbp
    boxing): where an op is built with exactly one SSA value per operand,
    one type per result, and no regions or successors, and its class has no
    variadic or optional operands or results, no regions, successors or
    IRDL options (`op_definition` records its arity), it is built directly,
    as irdl_op_init would (properties and attributes given as None left
    out); anything else goes through IRDLOperation's builder. That
    builder's four argument-list passes were a sixth of building and
    differentiating a 10k-op graph."""

    PLAIN_ARITY: ClassVar[tuple[int, int] | None] = None

    def __init__(self, *, operands=None, result_types=None, properties=None, attributes=None, successors=None,
                 regions=None) -> None:
        arity = type(self).__dict__.get("PLAIN_ARITY")
        if (arity is not None and not successors and not regions
                and operands is not None and len(operands) == arity[0]
                and all(isinstance(o, SSAValue) for o in operands)
                and result_types is not None and len(result_types) == arity[1]
                and all(isinstance(t, Attribute) for t in result_types)):
            Operation.__init__(
                self, operands=operands, result_types=result_types,
                properties={} if not properties else {k: v for k, v in properties.items() if v is not None},
                attributes={} if not attributes else {k: v for k, v in attributes.items() if v is not None})
            return
        super().__init__(operands=operands, result_types=result_types, properties=properties, attributes=attributes,
                         successors=successors, regions=regions)


def bare_op(cls: type[OpT], properties: dict[str, Attribute]) -> OpT:
    """`cls.create(properties=properties, location=UNKNOWN_LOC)` for an op
    with no operands, results, successors, regions or attributes (a plan
    register or actor: sbp-to-plan builds ~20k for a 10k-op graph), taking
    `properties` as its own. Operation's dataclass fields hold their
    defaults on the class (empty tuples, None), so such an op needs only
    its properties, attributes and location set, and its `__post_init__`
    (defaults, as op_definition installs it): 0.6 us against 3.1 us.
    test_compile_speed compares every op of compiled plans built both ways."""
    op = cls.__new__(cls)
    op.properties = properties
    op.attributes = {}
    op.location = UNKNOWN_LOC
    op.__post_init__()
    return op


def _plain_arity(op_def: OpDef) -> tuple[int, int] | None:
    """(operands, results) of a definition DirectInit may build directly."""
    if op_def.options or op_def.successors or op_def.regions:
        return None
    if any(isinstance(d, VariadicDef) for _, d in (*op_def.operands, *op_def.results)):
        return None
    return len(op_def.operands), len(op_def.results)


def _defaults_filler(op_def: OpDef) -> Callable[[IRDLOperation], None]:
    """IRDLOperation.__post_init__ (run by every op's construction): fills
    in the default values of the properties and attributes an op was built
    without, from a list made once per op class, where xDSL's scans every
    field definition per op (fourteen on a plan register; sbp-to-plan
    builds ~40k registers and actors for a 10k-op graph)."""
    properties = tuple((name, d.default_value) for name, d in op_def.properties.items()
                       if not isinstance(d, OptionalDef) and d.default_value is not None)
    attributes = tuple((name, d.default_value) for name, d in op_def.attributes.items()
                       if not isinstance(d, OptionalDef) and d.default_value is not None)

    def __post_init__(self: IRDLOperation) -> None:
        if properties:
            own = self.properties
            for name, default in properties:
                if name not in own:
                    own[name] = default
        if attributes:
            own = self.attributes
            for name, default in attributes:
                if name not in own:
                    own[name] = default
        Operation.__post_init__(self)

    return __post_init__


def _binds_variables(constr, single: bool = False) -> bool:
    """Whether a constraint binds type variables (its verdict then depends
    on what was checked before it), or cannot say; with `single`, as the
    constraint of a one-attribute range (an operand or a result)."""
    try:
        return bool(constr.variables()) or (single and bool(constr.variables_from_length()))
    except Exception:  # noqa: BLE001  (a constraint that cannot say: assume it binds)
        return True


def fast_accepts(op_def: OpDef) -> Callable[[IRDLOperation], bool] | None:
    """A check that returns True only for ops `op_def.verify` accepts
    (False means: ask `op_def.verify`), or None where the definition has
    variadic parts or properties or attributes whose constraints bind
    variables (the generic verifier then runs alone)."""
    if op_def.options or op_def.successors:
        return None
    if any(isinstance(d, VariadicDef) for _, d in (*op_def.operands, *op_def.results, *op_def.regions)):
        return None
    fields = (*op_def.properties.values(), *op_def.attributes.values())
    if any(_binds_variables(d.constr) for d in fields):
        return None
    operand_checks = tuple(_check(d.constr, single=True) for _, d in op_def.operands)
    result_checks = tuple(_check(d.constr, single=True) for _, d in op_def.results)
    regions = tuple((isinstance(d, SingleBlockRegionDef), d.entry_args) for _, d in op_def.regions)
    n_operands, n_results, n_regions = len(operand_checks), len(result_checks), len(regions)
    # No field binds a variable, so the fields may be checked in any order:
    # the properties an op has, each by name (a plan register has a handful
    # of its fourteen), and the defined attributes it has (others are free).
    property_checks = {name: _check(d.constr) for name, d in op_def.properties.items()}
    required_properties = frozenset(name for name, d in op_def.properties.items()
                                    if not isinstance(d, OptPropertyDef))
    attribute_checks = {name: _check(d.constr) for name, d in op_def.attributes.items()}
    required_attributes = frozenset(name for name, d in op_def.attributes.items()
                                    if not isinstance(d, OptAttributeDef))
    trait_checks = tuple(_trait_check(trait) for trait in op_def.traits)

    # Where no constraint binds a variable (a plan's registers and actors,
    # ~40k of a 10k-op graph's plan, and most lg ops), no check writes to
    # the context: every op's checks share one, not a new one per op.
    binds = (any(_binds_variables(d.constr, single=True) for _, d in op_def.operands)
             or any(_binds_variables(d.constr, single=True) for _, d in op_def.results)
             or any(_binds_variables(d.entry_args) for _, d in op_def.regions))
    shared_context = None if binds else VerificationContext()

    def accepts(op: IRDLOperation) -> bool:
        try:
            operands, results, op_regions = op.operands, op.results, op.regions
            if (len(operands) != n_operands or len(results) != n_results or len(op_regions) != n_regions
                    or op.successor_uses):  # (one use per successor, without building a view)
                return False
            context = VerificationContext() if shared_context is None else shared_context
            if n_operands:  # (a plan's registers and actors have none of these three)
                for check, value in zip(operand_checks, operands):
                    check(value.type, context)
            if n_results:
                for check, value in zip(result_checks, results):
                    check(value.type, context)
            if n_regions:
                for (single_block, entry_args), region in zip(regions, op_regions):
                    if single_block and len(region.blocks) != 1:
                        return False
                    entry = region.first_block
                    if entry is not None:
                        entry_args.verify(entry.arg_types, context)
            properties = op.properties
            if not required_properties <= properties.keys():
                return False
            for name, attr in properties.items():
                property_check = property_checks.get(name)
                if property_check is None:  # a property the op does not define
                    return False
                property_check(attr, context)
            if attribute_checks:
                attributes = op.attributes
                if not required_attributes <= attributes.keys():
                    return False
                for name, attr in attributes.items():
                    attribute_check = attribute_checks.get(name)
                    if attribute_check is not None:
                        attribute_check(attr, context)
            for trait_check in trait_checks:
                if trait_check(op) is False:
                    return False
        except Exception:  # noqa: BLE001  (the generic verifier reports it, in its words)
            return False
        return True

    return accepts


def _trait_check(trait: OpTrait) -> Callable[[Operation], bool | None]:
    """The trait's verifier for the fast path: for the traits whose generic
    verifiers walk every op of a large body (a plan device holds ~20k) or
    import per call, a check of the same conditions that answers False
    where the trait's verifier would raise (and may answer False where it
    would not: the generic verifier then decides); for any other trait its
    own `verify`, which raises."""
    kind = type(trait)
    if kind is SymbolOpInterface:  # exactly it: subclasses (optional symbols) differ
        return _is_symbol
    if kind is SymbolTable:
        return _has_unique_symbols
    if kind is IsolatedFromAbove:
        return _is_isolated_from_above
    return trait.verify


def _is_symbol(op: Operation) -> bool:
    """SymbolOpInterface.verify's condition: a `sym_name` string."""
    return isinstance(op.get_attr_or_prop("sym_name"), StringAttr)


def _has_unique_symbols(op: Operation) -> bool:
    """SymbolTable.verify's conditions: one region of one block, whose ops'
    string `sym_name`s differ (compared by text, which is stricter than
    attribute equality only for string attributes of different classes)."""
    if len(op.regions) != 1 or len(op.regions[0].blocks) != 1:
        return False
    names: set[str] = set()
    count = 0
    for child in op.regions[0].blocks.first.ops:  # type: ignore[union-attr]  # one block, checked above
        name = child.get_attr_or_prop("sym_name")
        if isinstance(name, StringAttr):
            names.add(name.data)
            count += 1
    return len(names) == count


def _is_isolated_from_above(op: Operation) -> bool:
    """IsolatedFromAbove.verify's condition: no op inside (down to nested
    ops that are isolated themselves) uses a value defined outside `op` or
    by `op`. Reads each op's traits once per class."""
    regions: list[Region] = list(op.regions)
    while regions:
        for block in regions.pop().blocks:
            for child in block.ops:
                for operand in child.operands:
                    owner = operand.owner
                    if owner is op or not op.is_ancestor(owner):
                        return False
                if child.regions and not class_has_trait(type(child), IsolatedFromAbove):
                    regions += child.regions
    return True


_CLASS_TRAITS: dict[tuple[type, type], bool] = {}


def class_has_trait(cls: type[Operation], trait: type[OpTrait]) -> bool:
    """`cls.has_trait(trait)`, memoized per op class: an op class's traits
    are fixed, and verifiers ask it of every op of a large body (xDSL scans
    the trait list each time; that was a sixth of verifying a large graph)."""
    key = (cls, trait)
    found = _CLASS_TRAITS.get(key)
    if found is None:
        found = _CLASS_TRAITS[key] = cls.has_trait(trait)
    return found


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
    A constraint that binds no variables depends on the attribute alone:
    where `accepted_by` gives a predicate for it (a test of the class), an
    attribute the predicate accepts passes without the constraint's
    machinery; other such constraints remember the attribute objects they
    passed (by identity: an entry keeps its attribute alive, so its id
    cannot be reused). Whatever fails these goes to the constraint itself,
    which raises its own error."""
    pure = not _binds_variables(constr, single)

    def verify(attr: Attribute, context: VerificationContext) -> None:
        constr.verify((attr,) if single else attr, context)

    if not pure:
        return verify
    accepted = accepted_by(constr)
    if accepted is not None:
        def check_by_predicate(attr: Attribute, context: VerificationContext) -> None:
            if not accepted(attr):
                verify(attr, context)

        return check_by_predicate
    passed: dict[int, Attribute] = {}

    def check(attr: Attribute, context: VerificationContext) -> None:
        if passed.get(id(attr)) is attr:
            return
        verify(attr, context)
        remember(passed, id(attr), attr)

    return check


def accepted_by(constr) -> Callable[[Attribute], bool] | None:
    """A plain predicate that accepts only attributes `constr.verify`
    accepts (of a one-attribute range, for a range constraint), for the
    constraints that test an attribute's class alone: any attribute, a
    base class, a string symbol name, a choice of base classes, arrays of
    these, and a range of length one of these. None for any other kind
    (parametrized attributes, equality: those attributes are shared
    between ops, and the identity memo answers faster). Names and the
    register lists of actors are unique to their op, so the memo missed
    them and verified and remembered each: a fifth of verifying a plan."""
    kind = type(constr)
    if kind is AnyAttr:
        return lambda attr: True
    if kind is BaseAttr:
        base = constr.attr
        return lambda attr: isinstance(attr, base)
    if kind is SymbolNameConstraint:
        return lambda attr: isinstance(attr, StringAttr)
    if kind is AnyOf and all(type(c) is BaseAttr for c in constr.attr_constrs):
        # AnyOf picks the alternative by the attribute's exact class
        classes = frozenset(c.attr for c in constr.attr_constrs)
        return lambda attr: type(attr) in classes
    if kind is ArrayOfConstraint and type(constr.elem_range_constraint) is RangeOf \
            and type(constr.elem_range_constraint.constr) is BaseAttr:
        element = constr.elem_range_constraint.constr.attr
        return lambda attr: isinstance(attr, ArrayAttr) and all(isinstance(a, element) for a in attr.data)
    if kind is RangeLengthConstraint and type(constr.length) is EqIntConstraint and constr.length.value == 1:
        return accepted_by(constr.constraint)  # a single operand or result: a range of one
    if kind is RangeOf:
        return accepted_by(constr.constr)
    return None
