"""Attributes that passes build by the thousand, built fast.

xDSL verifies every attribute as it is constructed (MLIR's `getChecked`);
MLIR's plain `get` trusts its caller. A pass that lowers a 10k-op graph
builds ~20k symbol references and thousands of integer attributes from
parts that are already attributes of the right kinds, and verifying those
parts again was most of their cost (a SymbolRefAttr: 3.5 us checked, 0.4 us
not; an i64 IntegerAttr: 4.8 us against 1 us). The builders here construct
exactly what the checked constructors would, where the parts are known
good, and fall back to the checked constructors otherwise; `i64_array`
shares one (immutable) attribute per list of values.

Tests (test_compile_speed) compare each with its checked constructor.
"""

from __future__ import annotations

from collections.abc import Sequence

from xdsl.dialects.builtin import I64, ArrayAttr, DenseArrayBase, IntAttr, IntegerAttr, StringAttr, SymbolRefAttr, i64

from .irdl_verify import remember

_SYMBOL_REF_FIELDS = tuple(name for name, _ in SymbolRefAttr.get_irdl_definition().parameters)
_INTEGER_FIELDS = tuple(name for name, _ in IntegerAttr.get_irdl_definition().parameters)
_NO_NESTED_REFERENCES: ArrayAttr[StringAttr] = ArrayAttr(())
_I64_MIN, _I64_END = -(2**63), 2**63


def flat_symbol_ref(name: StringAttr) -> SymbolRefAttr:
    """`SymbolRefAttr(name)`: a StringAttr root and the one shared (verified)
    empty nested path are what its verifier accepts."""
    if type(name) is not StringAttr:
        return SymbolRefAttr(name)  # the checked way, which raises its own error
    ref = SymbolRefAttr.__new__(SymbolRefAttr)
    root, nested = _SYMBOL_REF_FIELDS
    object.__setattr__(ref, root, name)
    object.__setattr__(ref, nested, _NO_NESTED_REFERENCES)
    return ref


def i64_attr(n: int) -> IntegerAttr[I64]:
    """`IntegerAttr(n, i64)`: a Python int in i64's signed range is what its
    verifier accepts, and what the constructor's normalization leaves as it
    is (it maps only [2^63, 2^64) to negatives)."""
    if type(n) is not int or not _I64_MIN <= n < _I64_END:
        return IntegerAttr(n, i64)  # normalized, or refused, by the checked constructor
    attr = IntegerAttr.__new__(IntegerAttr)
    value, kind = _INTEGER_FIELDS
    object.__setattr__(attr, value, IntAttr(n))
    object.__setattr__(attr, kind, i64)
    return attr


_I64_ARRAYS: dict[tuple[int, ...], DenseArrayBase[I64]] = {}


def i64_array(values: Sequence[int]) -> DenseArrayBase[I64]:
    """`DenseArrayBase.from_list(i64, values)`, one shared attribute per
    list of values (collective groups and mesh axes repeat on every op and
    rank that has them)."""
    key = tuple(values)
    if not all(type(v) is int for v in key):  # (True == 1 as a key)
        return DenseArrayBase.from_list(i64, values)
    attr = _I64_ARRAYS.get(key)
    if attr is None:
        attr = DenseArrayBase.from_list(i64, key)
        remember(_I64_ARRAYS, key, attr)
    return attr
