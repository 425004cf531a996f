"""Graph structure: `lg.graph` and its terminator `lg.output`, the sources
a graph reads (`lg.input`, `lg.param` with its initializer attribute,
`lg.constant`), and the queries over a graph's ops."""

from __future__ import annotations

import functools
import math
from abc import ABC
from collections.abc import Sequence
from typing import ClassVar, cast

from xdsl.dialects.builtin import (
    I64,
    ArrayAttr,
    DenseIntOrFPElementsAttr,
    FloatData,
    IntegerAttr,
    ModuleOp,
    StringAttr,
    SymbolNameConstraint,
    SymbolRefAttr,
    TensorType,
    UnitAttr,
    i64,
)
from xdsl.ir import Attribute, Operation, ParametrizedAttribute, Region, SSAValue
from xdsl.irdl import (
    IRDLOperation,
    irdl_attr_definition,
    lazy_traits_def,
    opt_prop_def,
    prop_def,
    region_def,
    result_def,
    traits_def,
    var_operand_def,
)
from xdsl.parser import AttrParser, Parser
from xdsl.printer import Printer
from xdsl.traits import HasParent, IsolatedFromAbove, IsTerminator, Pure, SymbolOpInterface
from xdsl.utils.exceptions import VerifyException

from ..builders import i64_attr
from ..irdl_verify import DirectInit, op_definition
from ..sbp import (
    DTensorType,
    TensorLike,
    element_type,
    global_shape,
    lookup_placement,
    parse_verified,
    verify_distribution,
)
from .base import SbpRules, is_bool, is_float, is_index, source_signatures, verify_distributions


class InitializerAttr(ParametrizedAttribute, ABC):
    """How a parameter gets its first value (see sbpc.semantics.reference.initial_value)."""


def _parse_floats(cls, parser: AttrParser, count: int) -> Sequence[Attribute]:
    def parse():
        with parser.in_angle_brackets():
            values = parser.parse_comma_separated_list(parser.Delimiter.NONE, parser.parse_number)
        if len(values) != count:
            parser.raise_error(f"#{cls.name} takes {count} number(s), got {len(values)}")
        return tuple(FloatData(float(v)) for v in values)

    return parse_verified(cls, parser, parse)


def _print_floats(printer: Printer, values: Sequence[FloatData]) -> None:
    with printer.in_angle_brackets():
        printer.print_list(values, lambda v: printer.print_string(repr(v.data)))


@irdl_attr_definition
class ZerosInitAttr(InitializerAttr):
    name = "lg.zeros"


@irdl_attr_definition
class OnesInitAttr(InitializerAttr):
    name = "lg.ones"


@irdl_attr_definition
class FillInitAttr(InitializerAttr):
    """The constant initializer: every element is `value`."""

    name = "lg.fill"
    value: FloatData

    def __init__(self, value: float):
        super().__init__(FloatData(float(value)))

    @classmethod
    def parse_parameters(cls, parser: AttrParser) -> Sequence[Attribute]:
        return _parse_floats(cls, parser, 1)

    def print_parameters(self, printer: Printer) -> None:
        _print_floats(printer, [self.value])


@irdl_attr_definition
class NormalInitAttr(InitializerAttr):
    name = "lg.normal"
    mean: FloatData
    std: FloatData

    def __init__(self, mean: float, std: float):
        super().__init__(FloatData(float(mean)), FloatData(float(std)))

    @classmethod
    def parse_parameters(cls, parser: AttrParser) -> Sequence[Attribute]:
        return _parse_floats(cls, parser, 2)

    def print_parameters(self, printer: Printer) -> None:
        _print_floats(printer, [self.mean, self.std])

    def verify(self) -> None:
        if not self.std.data >= 0:
            raise VerifyException(f"#lg.normal needs std >= 0, got {self.std.data}")


@irdl_attr_definition
class UniformInitAttr(InitializerAttr):
    name = "lg.uniform"
    low: FloatData
    high: FloatData

    def __init__(self, low: float, high: float):
        super().__init__(FloatData(float(low)), FloatData(float(high)))

    @classmethod
    def parse_parameters(cls, parser: AttrParser) -> Sequence[Attribute]:
        return _parse_floats(cls, parser, 2)

    def print_parameters(self, printer: Printer) -> None:
        _print_floats(printer, [self.low, self.high])

    def verify(self) -> None:
        if not self.low.data < self.high.data:
            raise VerifyException(f"#lg.uniform needs low < high, got {self.low.data} and {self.high.data}")


@op_definition
class GraphOp(IRDLOperation):
    """One graph: its inputs, parameters, computation and outputs. `on @mesh`
    names the default placement that SBP inference distributes it over."""

    name = "lg.graph"

    sym_name = prop_def(SymbolNameConstraint())
    placement = opt_prop_def(SymbolRefAttr)
    body = region_def("single_block")

    traits = traits_def(SymbolOpInterface(), IsolatedFromAbove())

    assembly_format = "$sym_name (`on` $placement^)? attr-dict-with-keyword $body"

    def __init__(self, name: str, body: Region, placement: str | None = None):
        props: dict[str, Attribute] = {"sym_name": StringAttr(name)}
        if placement is not None:
            props["placement"] = SymbolRefAttr(placement)
        super().__init__(properties=props, regions=[body])

    def output(self) -> OutputOp:
        terminator = self.body.block.last_op
        assert isinstance(terminator, OutputOp)
        return terminator

    def verify_(self) -> None:
        if self.placement is not None:
            lookup_placement(self, self.placement)
        seen: dict[str, str] = {}
        # the values made so far, by id (an SSAValue hashes in Python; they
        # all live in the graph while it is verified)
        defined: set[int] = {id(arg) for arg in self.body.block.args}
        last = self.body.block.last_op
        op: Operation
        for op in self.body.block.ops:
            # passes read a graph in program order: every operand is made
            # above its use (xDSL's parser takes a forward reference)
            for i, operand in enumerate(op.operands):
                if id(operand) not in defined:
                    raise VerifyException(f"'{op.name}': operand #{i} is used before the op that makes it "
                                          "(an lg graph is in program order)")
            results = op.results
            defined.update(map(id, results))
            in_graph, named = _graph_facts(type(op))
            # Passes read every op before the terminator as one value of the
            # graph; a placement or a plan op put here by mistake has none.
            if op is not last and (len(results) != 1 or not in_graph):
                raise VerifyException(
                    f"'{op.name}' cannot stand in graph @{self.sym_name.data}: its body holds lg and sbp ops "
                    f"of one result each (placements belong at module level)"
                )
            for r in results:
                t = r.type
                if type(t) is not DTensorType and isinstance(t, TensorType) and any(d < 0 for d in t.get_shape()):
                    raise VerifyException(f"'{op.name}': result #{r.index} has the dynamic shape {t}; sbpc "
                                          "plans static shapes only")
            if named:
                key = cast(InputOp | ParamOp, op).key.data  # (what _graph_facts said)
                if key in seen:
                    raise VerifyException(
                        f"'{op.name}': name \"{key}\" is already used by an {seen[key]} of graph @{self.sym_name.data}"
                    )
                seen[key] = op.name


@functools.cache
def _graph_facts(op_class: type[Operation]) -> tuple[bool, bool]:
    """What GraphOp's verifier asks of an op's class, once per class: is it
    an lg or sbp op, and is it an input or a parameter (named in the graph)."""
    return op_class.dialect_name() in ("lg", "sbp"), issubclass(op_class, InputOp | ParamOp)


@op_definition
class OutputOp(IRDLOperation):
    """The graph's named results (what a run fetches)."""

    name = "lg.output"

    names = prop_def(ArrayAttr[StringAttr])
    values = var_operand_def(TensorLike)

    traits = lazy_traits_def(lambda: (IsTerminator(), HasParent(GraphOp)))

    assembly_format = "$names ($values^ `:` type($values))? attr-dict"

    def __init__(self, values: Sequence[SSAValue], names: Sequence[str]):
        super().__init__(operands=[values], properties={"names": ArrayAttr([StringAttr(n) for n in names])})

    def verify_(self) -> None:
        names = [n.data for n in self.names.data]
        if len(names) != len(self.values):
            raise VerifyException(f"'{self.name}': {len(names)} names for {len(self.values)} values")
        if len(set(names)) != len(names):
            repeated = sorted({n for n in names if names.count(n) > 1})
            raise VerifyException(f"'{self.name}': output names must be distinct, got {', '.join(map(repr, repeated))} "
                                  "more than once")
        for i, value in enumerate(self.values):
            verify_distribution(self, value.type, f"operand #{i}")


def _verify_source(op: IRDLOperation, float_only: bool) -> None:
    elem = element_type(op.results[0].type)
    if float_only and not is_float(elem):
        raise VerifyException(f"'{op.name}': a parameter must have a float element type, got {elem}")
    if not (is_float(elem) or is_index(elem) or is_bool(elem)):
        raise VerifyException(f"'{op.name}': element type {elem} is not supported (float, i32, i64 or i1)")
    verify_distributions(op)


@op_definition
class InputOp(SbpRules, DirectInit):
    """A named feed."""

    FLOPS_PER_ELEMENT: ClassVar[float] = 0.0

    @classmethod
    def sbp_rule(cls, in_shapes, out_shape, p, **params):
        return source_signatures(out_shape, p)

    name = "lg.input"

    key = prop_def(StringAttr)
    result = result_def(TensorLike)

    assembly_format = "$key attr-dict `:` type($result)"

    def __init__(self, key: str, type: Attribute):
        super().__init__(operands=[], properties={"key": StringAttr(key)}, result_types=[type])

    def verify_(self) -> None:
        _verify_source(self, float_only=False)


@op_definition
class ParamOp(SbpRules, DirectInit):
    """A named tensor that lives across steps and how it is first
    initialized: trained (lg-autodiff gives it a gradient, lg-optimizer an
    update) or, marked `state`, updated by the graph itself through its
    `new.<key>` output, with no gradient and no optimizer update (a
    batch-norm's running statistics and count, which may be integers)."""

    FLOPS_PER_ELEMENT: ClassVar[float] = 0.0

    @classmethod
    def sbp_rule(cls, in_shapes, out_shape, p, **params):
        return source_signatures(out_shape, p)

    name = "lg.param"

    key = prop_def(StringAttr)
    init = prop_def(InitializerAttr)
    seed = prop_def(IntegerAttr[I64], default_value=IntegerAttr(0, i64))
    state = opt_prop_def(UnitAttr)
    result = result_def(TensorLike)

    assembly_format = "$key `init` $init (`seed` $seed^)? (`state` $state^)? attr-dict `:` type($result)"

    def __init__(self, key: str, type: Attribute, init: InitializerAttr, seed: int = 0, state: bool = False):
        props: dict[str, Attribute] = {"key": StringAttr(key), "init": init, "seed": i64_attr(seed)}
        if state:
            props["state"] = UnitAttr()
        super().__init__(operands=[], properties=props, result_types=[type])

    @property
    def trained(self) -> bool:
        """Whether lg-autodiff and lg-optimizer train it (not `state`)."""
        return self.state is None

    def verify_(self) -> None:
        _verify_source(self, float_only=self.trained)


@op_definition
class ConstantOp(SbpRules, DirectInit):
    """A literal tensor: `lg.constant dense<1.0> : tensor<4xf32>`; after SBP
    inference its distributed type follows `->`."""

    FLOPS_PER_ELEMENT: ClassVar[float] = 0.0

    @classmethod
    def sbp_rule(cls, in_shapes, out_shape, p, **params):
        return source_signatures(out_shape, p)

    name = "lg.constant"

    value = prop_def(DenseIntOrFPElementsAttr)
    result = result_def(TensorLike)

    traits = traits_def(Pure())

    def __init__(self, value: DenseIntOrFPElementsAttr, type: Attribute | None = None):
        super().__init__(operands=[], properties={"value": value}, result_types=[type or value.type])

    @classmethod
    def parse(cls, parser: Parser) -> ConstantOp:
        start = parser.pos
        try:
            value = parser.parse_attribute()
        except AssertionError:  # xDSL 0.74 asserts on a real literal given a complex type
            parser.raise_error("lg.constant: the literal does not match its element type", start, parser.pos)
        if not isinstance(value, DenseIntOrFPElementsAttr):
            parser.raise_error("lg.constant expects a dense<...> : tensor<...> literal")
        result_type = parser.parse_type() if parser.parse_optional_punctuation("->") else None
        attrs = parser.parse_optional_attr_dict()
        op = cls(value, result_type)
        op.attributes.update(attrs)
        return op

    def print(self, printer: Printer) -> None:
        printer.print_string(" ")
        printer.print_attribute(self.value)
        if self.result.type != self.value.type:
            printer.print_string(" -> ")
            printer.print_attribute(self.result.type)
        printer.print_op_attributes(self.attributes)

    def verify_(self) -> None:
        value_type = self.value.type
        if not isinstance(value_type, TensorType):
            raise VerifyException(f"'{self.name}': the literal must be a tensor")
        if (global_shape(value_type), value_type.element_type) != (
            global_shape(self.result.type),
            element_type(self.result.type),
        ):
            raise VerifyException(f"'{self.name}': result type does not match the literal's type {value_type}")
        _verify_source(self, float_only=False)


def graphs(module: ModuleOp) -> list[GraphOp]:
    """The graphs of a module, in order (a list: a pass may add ops to the
    module while it goes through them)."""
    return [op for op in module.ops if isinstance(op, GraphOp)]


def ancestors(values: Sequence[SSAValue]) -> set[Operation]:
    """The ops that make `values` and everything they depend on."""
    seen: set[Operation] = set()
    todo = [v.owner for v in values]
    while todo:
        op = todo.pop()
        if isinstance(op, Operation) and op not in seen:
            seen.add(op)
            todo.extend(o.owner for o in op.operands)
    return seen


def op_flops(op: Operation) -> float:
    """The arithmetic of one lg op of a graph, at its global shapes (at least
    1: an op without a flop count, a source or a reshape, weighs one per
    result element, as moving it does)."""
    try:
        shapes = [global_shape(o.type) for o in op.operands]
        flops = float(type(op).flops(shapes, global_shape(op.results[0].type), **op.params()))  # type: ignore[attr-defined]
    except Exception:  # noqa: BLE001 - sources and ops without rules have no flop count
        flops = float(sum(math.prod(global_shape(r.type)) for r in op.results))
    return max(flops, 1.0)
