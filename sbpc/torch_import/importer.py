"""The walk over export's graph: `_Importer` imports each node in order
(placeholders through `_StateImporter`, each ATen op through its rule in
`RULES`, ops on constants folded with PyTorch) and names the outputs."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import numpy as np

from sbpc import frontend as fe
from sbpc.frontend import Graph, Placement, Tensor

# RULES is filled by the op-family modules, which the package
# sbpc.torch_import.aten imports: importing its registry runs it first
from sbpc.torch_import.aten.registry import COMPLEX_RULES, RULES
from sbpc.torch_import.capture import _user_line
from sbpc.torch_import.core_aten import DATA_DEPENDENT, trace_decomposition
from sbpc.torch_import.precision import _FLOATS, _HALVES, _autocast_args, _widen
from sbpc.torch_import.state import _StateImporter, _updated_buffers
from sbpc.torch_import.values import (
    _DTYPES,
    PART_DTYPES,
    Complex,
    TorchImportError,
    _Const,
    _flat,
    _map,
    _op_name,
    _unwrap,
    is_complex_constant,
    to_numpy,
)
from sbpc.torch_import.weights import CheckpointFiles

UNINITIALIZED = ("empty", "empty_like", "empty_strided", "empty_permuted", "new_empty", "new_empty_strided")
"""ATen ops whose values PyTorch leaves unset: folded as zeros."""


class _Importer(_StateImporter):
    def __init__(self, program, module, sbp: dict[str, Any], placement: Placement | None, name: str,
                 checkpoint: CheckpointFiles | None = None):
        super().__init__(module, sbp, Graph(re.sub(r"\W", "_", name), placement=placement), checkpoint)
        self.program = program
        self.env: dict[Any, Any] = {}
        self.node: Any = None
        self.lifted: dict[tuple, tuple[_Const, Tensor]] = {}
        """The constants made of known values (`constant_of`), by the value's id and use, each with its value."""
        self.autocast: str | None = None
        """The lower precision of the `torch.autocast` region being imported ("bf16", "f16"), if one is on."""
        self.views: dict[Any, tuple[Any, str, tuple]] = {}
        """Each slice or select node of a node: (its base, "slice" or "select", where), so that an in-place op
        on the view writes through to the base (`shifted[:, 1:] = ids[:, :-1]`)."""

    # -- the graph ------------------------------------------------------------------

    def graph(self) -> Graph:
        from torch.export.graph_signature import InputKind

        sig = self.program.graph_signature
        specs = {spec.arg.name: spec for spec in sig.input_specs if hasattr(spec.arg, "name")}
        state = self.program.state_dict
        names = self._names()
        self.g.initial_values = {}
        self.g.state_names = {}
        self.g.buffers = {}
        nodes = list(self.program.graph.nodes)
        updated = _updated_buffers(nodes)
        for node in sorted(nodes, key=lambda n: n.op != "placeholder"):
            if node.op != "placeholder" and self.node is not None and self.node.op == "placeholder":
                self._check_patterns()
            self.node = node
            if node.op == "placeholder":
                spec = specs[node.name]
                if spec.kind == InputKind.PARAMETER and not self.module.get_parameter(spec.target).requires_grad:
                    # a frozen parameter (Whisper's sinusoidal positions): no
                    # optimizer moves it, so it is a constant, as a buffer is
                    aliases = names.get(id(self.module.get_parameter(spec.target)), [spec.target])
                    value = self.materialized(state[spec.target], aliases, f"frozen parameter {spec.target!r}")
                    self.env[node] = _Const(value)
                    for alias in aliases:
                        self.g.buffers[alias] = to_numpy(value).copy()
                elif spec.kind == InputKind.PARAMETER:
                    self.state_inputs[node] = spec.target
                    self.env[node] = self._param(spec.target, state[spec.target], names)
                elif spec.kind == InputKind.USER_INPUT:
                    self.env[node] = self._input(node)
                elif spec.kind == InputKind.BUFFER:
                    self.state_inputs[node] = spec.target
                    value = state[spec.target] if spec.target in state else self.program.constants[spec.target]
                    if node in updated:  # a batch-norm's running statistics, its count: state the graph updates
                        self.env[node] = self._state(spec.target, value)
                        continue
                    value = self.materialized(value, [spec.target], f"buffer {spec.target!r}")
                    self.env[node] = _Const(value)
                    if spec.persistent:
                        self.g.buffers[spec.target] = to_numpy(value).copy()
                else:
                    self.env[node] = _Const(self.materialized(self.program.constants[spec.target], [spec.target],
                                                              f"constant {spec.target!r}"))
            elif node.op == "get_attr":  # a higher-order op's region (a GraphModule)
                self.env[node] = getattr(self.program.graph_module, node.target)
            elif node.op == "call_function":
                self.env[node] = self._call(node)
            elif node.op == "output":
                self._outputs(node)
        if self.checkpoint is not None:
            self.g.weights = self.checkpoint.weights(self.from_checkpoint)
        return self.g

    def inline(self, region, args) -> Any:
        """A higher-order op's region (a GraphModule) imported in place, its
        placeholders bound to `args`: the values it returns."""
        outer = self.node
        bound = iter(args)
        result = None
        try:
            for node in region.graph.nodes:
                self.node = node
                if node.op == "placeholder":
                    self.env[node] = next(bound)
                elif node.op == "get_attr":  # a region of its own, or a tensor a decomposition made
                    value = getattr(region, node.target)
                    self.env[node] = _Const(value) if hasattr(value, "dtype") else value
                elif node.op == "call_function":
                    self.env[node] = self._call(node)
                elif node.op == "output":
                    result = _map(node.args[0], self._value)
        finally:
            self.node = outer
        return result

    def _outputs(self, node) -> None:
        from torch.export.graph_signature import OutputKind

        specs = self.program.graph_signature.output_specs
        mutated = [s.target for s in specs if s.kind != OutputKind.USER_OUTPUT]
        if mutated:
            raise self._error(f"forward writes to buffer {mutated[0]!r}; sbpc imports pure forwards only")
        flat = [self.env[a] if hasattr(a, "op") else a for a in node.args[0]]
        keys = self._output_keys(len(flat))
        outputs = {}
        for key, value in zip(keys, flat):
            if isinstance(value, Complex):
                raise self._error(f"{type(self.module).__name__}.forward returns a complex tensor ({key}); sbpc's "
                                  f"outputs are real: return torch.view_as_real of it, or its .real, .imag or .abs()")
            if key is None or not isinstance(value, Tensor):
                # a cache (a decoder's keys and values, returned with
                # `use_cache`) or a constant output (None, a folded tensor)
                # says nothing about training: not an output, not computed
                continue
            outputs[key] = value
        if not outputs:
            raise TorchImportError(f"{type(self.module).__name__}.forward returns no tensor computed from its inputs")
        self.g.output(**outputs, **{f"new.{name}": value for name, value in self.updates.items()})

    def _output_keys(self, count: int) -> list[str | None]:
        """The name of each flat output; None for the leaves of a cache."""
        spec = self.program.call_spec.out_spec
        if spec is None or spec.is_leaf():
            only = self._output_value(0)
            return ["loss" if only is not None and tuple(only.shape) == () else "output"]
        if isinstance(spec.type, type) and issubclass(spec.type, dict):  # a dict, or a Hugging Face ModelOutput
            keys: list[str | None] = []
            for key, child in zip(spec.context, spec.children(), strict=True):
                if isinstance(child.type, type) and child.type.__name__.endswith("Cache"):
                    keys += [None] * child.num_leaves
                else:  # a tuple under one key (hidden_states): one output per leaf
                    keys += [str(key)] if child.num_leaves == 1 else [f"{key}.{i}" for i in range(child.num_leaves)]
            return keys
        keys = [f"output{i}" for i in range(count)]
        last = self._output_value(count - 1)
        if last is not None and tuple(last.shape) == ():
            keys[-1] = "loss"
        return keys

    def _output_value(self, i: int):
        out = next(n for n in self.program.graph.nodes if n.op == "output")
        arg = out.args[0][i]
        return arg.meta.get("val") if hasattr(arg, "meta") else None

    # -- one node ------------------------------------------------------------------

    def _error(self, message: str) -> TorchImportError:
        where = _user_line(self._stack_trace(self.node)) if self.node is not None else None
        return TorchImportError(message + (f"\n  at {where}" if where else ""))

    def _stack_trace(self, node) -> str:
        """Where PyTorch recorded the node; for a higher-order op, which
        export records without one, where its region's first op was."""
        if node.meta.get("stack_trace"):
            return node.meta["stack_trace"]
        regions = [self.env[a] for a in node.args if getattr(a, "op", None) == "get_attr" and a in self.env]
        inner = (n.meta.get("stack_trace") for region in regions for n in region.graph.nodes)
        return next((trace for trace in inner if trace), "")

    def _call(self, node):
        written = _written(node)
        if hasattr(written, "op") and written in self.views and written not in self.state_inputs:
            return self._in_place_on_view(node, written)
        if hasattr(written, "op") and isinstance(self.env.get(written), Tensor | Complex) and (
                written not in self.state_inputs):
            return self._in_place(node, written)
        if hasattr(written, "op") and isinstance(self.env.get(written), _Const) and written not in self.state_inputs \
                and any(isinstance(a, Tensor) for a in _flat([_map(node.args, self._value),
                                                           _map(node.kwargs, self._value)])):
            # a constant written in place with computed values (`inv = torch.empty_like(perm);
            # inv[perm] = arange`) becomes a computed value from then on
            return self._in_place(node, written)
        if hasattr(written, "op") and isinstance(self.env.get(written), Tensor) and _op_name(node.target) == (
                "aten.add_.Tensor"):  # a state buffer's count: num_batches_tracked += 1
            current, other = self.env[written], _map(node.args[1], self._value)
            self.update(written, current + self.lift(other, current))
            return self.updates[self.state_inputs[written]]
        if hasattr(written, "op") and written in self.state_inputs:
            # export keeps in-place updates of buffers (a step counter, running
            # statistics) as ops of the graph; folding them would drop them
            raise self._error(f"forward writes to buffer {self.state_inputs[written]!r} "
                              f"({_op_name(node.target)}); sbpc imports pure forwards only")
        args = _map(node.args, self._value)
        kwargs = {k: _map(v, self._value) for k, v in node.kwargs.items()}
        name = _op_name(node.target)
        if name in ("aten.slice.Tensor", "aten.select.int") and hasattr(node.args[0], "op"):
            self.views[node] = (node.args[0], name, _view_place(name, node.args[1:]))
        flat = _flat([args, kwargs])
        if any(isinstance(a, Tensor | Complex) for a in flat) and (
                any(isinstance(a, Complex) or is_complex_constant(a) for a in flat) or _makes_complex(node)):
            return self._complex(node, name, args, kwargs)
        if not any(isinstance(a, Tensor) for a in flat):
            if not _draws_random_numbers(node.target):
                try:
                    return self._fold(node, args, kwargs)
                except Exception as error:  # noqa: BLE001 - PyTorch's own failure, reported with the op
                    raise self._error(f"{name} ({node.name}) on constants failed in PyTorch: {error}") from None
            if name not in RULES:
                # folded at import it would be one draw, the same at every step
                raise self._error(f"{name} ({node.name}) draws new random numbers at every call, which sbpc "
                                  f"does not import (its own draws: dropout, native_dropout, rand, randn, "
                                  f"randperm, rand_like and randn_like, from `lg.dropout` and `lg.uniform`)")
        rule = RULES.get(name)
        if rule is None:
            return self._decomposed(node, name, args, kwargs)
        if self.autocast is not None:
            args, kwargs = _autocast_args(name, self.autocast, args, kwargs)
        traced = _DTYPES.get(str(getattr(node.meta.get("val"), "dtype", None)))
        halves = any(isinstance(a, Tensor) and str(a.dtype) in _HALVES for a in _flat([args, kwargs]))
        narrow = halves and traced in _HALVES
        if halves and traced in _FLOATS:
            # an op on 16-bit floats computes in float32 and rounds once (to
            # a 16-bit result) or not at all (to a wider one: promotion, an
            # op autocast runs in float32), as PyTorch's CPU kernel does,
            # however many lg ops lower it (pow, gelu, silu, rms_norm)
            args, kwargs = _map(args, _widen), {k: _map(v, _widen) for k, v in kwargs.items()}
        try:
            result = rule(self, *args, **kwargs)
            if narrow:
                result = _map(result, lambda r: fe.cast(r, traced) if isinstance(r, Tensor) and str(
                    r.dtype) == "f32" else r)
            return self._as_traced(result) if self.autocast is not None else result
        except TorchImportError:
            raise
        except (ValueError, TypeError) as error:  # an argument or a shape the lowering does not take
            raise self._error(f"{name} ({node.name}): {error}") from None
        except Exception as error:  # noqa: BLE001 - a lowering bug is still reported with the op and the line
            raise self._error(f"{name} ({node.name}) could not be lowered: {type(error).__name__}: {error}") from None

    def _complex(self, node, name: str, args, kwargs):
        """An op with a complex operand or result (`aten/complex_numbers.py`):
        its complex rule (for views and sums, its real rule once per part),
        or PyTorch's decomposition of it into ops that have one."""
        rule = COMPLEX_RULES.get(name)
        if rule is None:
            return self._decomposed(node, name, args, kwargs, on_complex=True)
        try:
            return rule(self, *args, **kwargs)
        except TorchImportError:
            raise
        except (ValueError, TypeError) as error:
            raise self._error(f"{name} ({node.name}) on complex numbers: {error}") from None
        except Exception as error:  # noqa: BLE001 - a lowering bug is still reported with the op and the line
            raise self._error(f"{name} ({node.name}) on complex numbers could not be lowered: "
                              f"{type(error).__name__}: {error}") from None

    def _decomposed(self, node, name: str, args, kwargs, on_complex: bool = False):
        """An op with no rule of its own, through PyTorch's decomposition of
        it (`core_aten`): the ops it decomposes into are imported in its
        place, each by its rule (or decomposed in turn)."""
        if name in DATA_DEPENDENT:
            raise self._error(f"the ATen op {name} ({node.name}) gives an output whose shape depends on the values "
                              f"of its inputs; sbpc plans every tensor's shape ahead of the data")
        try:
            traced = trace_decomposition(node.target, args, kwargs, lambda a: isinstance(a, Tensor | Complex),
                                         _example)
        except Exception as error:  # noqa: BLE001 - PyTorch's decomposition failed on these arguments
            first = next((line for line in str(error).splitlines() if line.strip()), "")
            raise self._error(f"{name} ({node.name}): PyTorch's decomposition of it failed on these arguments "
                              f"({type(error).__name__}: {first})") from None
        if traced is None and on_complex:
            raise self._error(
                f"the ATen op {name} ({node.name}) on complex numbers has no lowering in sbpc, and PyTorch has no "
                f"decomposition of it into ops that have one (sbpc takes complex values through the FFTs, "
                f"view_as_real/view_as_complex, real/imag/abs/angle, conj, +, -, *, /, exp, matmul, and views, "
                f"sums and copies: sbpc.torch_import.aten.complex_numbers)")
        if traced is None:
            raise self._error(
                f"the ATen op {name} ({node.name}) has no lg lowering in sbpc yet, and PyTorch has no "
                f"decomposition of it into other ops (the {len(RULES)} supported ones are listed in "
                f"sbpc.torch_frontend.RULES)")
        region, tensors = traced
        for inner in region.graph.nodes:  # errors inside name the user's line of the op decomposed
            inner.meta.setdefault("stack_trace", node.meta.get("stack_trace"))
        try:
            return self.inline(region, tensors)
        except TorchImportError as error:  # an op it decomposes into is refused: say which op the user wrote
            raise TorchImportError(f"{name} ({node.name}), which has no rule of its own, through PyTorch's "
                                   f"decomposition of it: {error}") from None

    def _as_traced(self, result):
        """Under autocast, a float result in the dtype PyTorch traced for
        the node (ops that promote, or run in their inputs' precision)."""
        value = self.node.meta.get("val")
        traced = _DTYPES.get(str(getattr(value, "dtype", None)))
        if isinstance(result, Tensor) and traced in _FLOATS and str(result.dtype) in _FLOATS and (
                str(result.dtype) != traced):
            return fe.cast(result, traced)
        return result

    def _in_place(self, node, written):
        """An in-place op on a computed value (`h += residual`): its
        functional form, and the written value is the result from then on."""
        name = _op_name(node.target)
        if "_." in name:  # aten.add_.Tensor -> aten.add.Tensor
            base, overload = name.split("_.", 1)
            functional = f"{base}.{overload}"
        else:  # aten.relu_ -> aten.relu
            functional = name.removesuffix("_")
        args = _map(node.args, self._value)
        kwargs = {k: _map(v, self._value) for k, v in node.kwargs.items()}
        table = COMPLEX_RULES if any(isinstance(a, Complex) or is_complex_constant(a)
                                     for a in _flat([args, kwargs])) else RULES
        rule = table.get(functional) or table.get(name)  # resize_ has no functional form: a rule of its own
        if rule is None:
            raise self._error(f"the in-place ATen op {name} ({node.name}) has no lg lowering in sbpc yet"
                              + (" on complex numbers" if table is COMPLEX_RULES else ""))
        try:
            result = rule(self, *args, **kwargs)
        except (ValueError, TypeError) as error:
            raise self._error(f"{name} ({node.name}): {error}") from None
        self.env[written] = result
        return result

    def _in_place_on_view(self, node, view):
        """An in-place op on a slice or select of another value: the view's
        new value, scattered into its base (and the base's base), which
        later nodes read from then on."""
        root = view
        while root in self.views:
            root = self.views[root][0]
        if root in self.state_inputs:  # a parameter's or a buffer's slice written in place
            raise self._error(f"forward writes to buffer {self.state_inputs[root]!r} through a view "
                              f"({_op_name(node.target)}); sbpc imports pure forwards only")
        result = self._in_place(node, view)
        while view in self.views:
            base, kind, place = self.views[view]
            scatter = RULES["aten.slice_scatter" if kind == "aten.slice.Tensor" else "aten.select_scatter"]
            try:
                result = scatter(self, self.env[base], result, *place)
            except (ValueError, TypeError) as error:
                raise self._error(f"{_op_name(node.target)} ({node.name}) writing through a view: {error}") from None
            self.env[base] = result
            view = base
        return self.env[node.args[0]]

    def _value(self, a):
        return self.env[a] if hasattr(a, "op") and a in self.env else a

    def _fold(self, node, args, kwargs):
        """Computes a node whose operands are all known, with PyTorch. A
        tensor made on the meta device (a module built there makes its
        position ids on its weights' device) is made on the CPU: its value
        is known, and sbpc folds it."""
        kwargs = {k: ("cpu" if k == "device" and str(v) == "meta" else v) for k, v in kwargs.items()}
        result = node.target(*_map(args, _unwrap), **{k: _map(v, _unwrap) for k, v in kwargs.items()})
        if _op_name(node.target).split(".")[1:2] in [[n] for n in UNINITIALIZED] and hasattr(result, "zero_"):
            # whatever the allocator left there: folded as it is, the
            # compiled IR would differ from run to run (and 0 * inf is nan)
            result = result.zero_()
        return _map(result, lambda r: _Const(r) if hasattr(r, "shape") else r)

    def lift(self, value, like: Tensor | None = None) -> Tensor:
        """An lg value for a tensor, a constant or a Python number (in `like`'s dtype)."""
        if isinstance(value, Tensor):
            return value
        if isinstance(value, _Const):
            return self.constant_of(value, lambda: self.g.constant(_array_of(value)))
        if isinstance(value, bool | int | float):
            dtype = fe._numpy_of(like.dtype) if like is not None else np.float32
            return self.g.constant(np.asarray(value, dtype=dtype))
        raise TypeError(f"expected a tensor or a number, got {type(value).__name__}")

    def constant_of(self, value: _Const, make: Callable[[], Tensor], *use) -> Tensor:
        """The lg constant `make` gives for a known value (per `use`: a part, a
        shape and dtype), made once. The value is held beside it: held, its
        id cannot name another value. A known value the import drops (a
        buffer a write-through replaced, as T5's `_shift_right` does) frees
        its id for the next, which took the dropped one's constant."""
        key = (id(value), *use)
        if key not in self.lifted:
            self.lifted[key] = (value, make())
        return self.lifted[key][1]

    def known(self, value) -> np.ndarray | None:
        """The value as an array when it is known at import time."""
        if isinstance(value, _Const):
            return to_numpy(value.value)
        if isinstance(value, bool | int | float):
            return np.asarray(value)
        return None


def _array_of(value: _Const) -> np.ndarray:
    """A known value as an lg constant's array (booleans as 0.0 and 1.0)."""
    array = to_numpy(value.value)
    return array.astype(np.float32) if array.dtype == np.bool_ else array


_TORCH_DTYPES = {lg: torch_name.removeprefix("torch.") for torch_name, lg in _DTYPES.items()}

UPDATES_ITS_OWN_STATE = frozenset({"aten._native_batch_norm_legit"})
"""Mutable ops whose rule updates what they write itself (the running
statistics, as state where they are buffers) and returns other values."""


def _written(node):
    """The operand an in-place op writes (its schema's first written
    argument, `Tensor(a!)`), or None."""
    schema = getattr(node.target, "_schema", None)
    if schema is None or not schema.is_mutable or _op_name(node.target) in UPDATES_ITS_OWN_STATE:
        return None
    writes = [i for i, a in enumerate(schema.arguments) if a.alias_info is not None and a.alias_info.is_write]
    return node.args[writes[0]] if writes and writes[0] < len(node.args) else None


def _makes_complex(node) -> bool:
    """Whether PyTorch traced a complex result for the node."""
    traced = node.meta.get("val")
    return any(str(getattr(t, "dtype", "")) in PART_DTYPES for t in (traced if isinstance(traced, list | tuple)
                                                                      else [traced]))


def _example(t: Tensor | Complex):
    """A PyTorch tensor of `t`'s shape and dtype, to trace a decomposition on."""
    import torch

    if isinstance(t, Complex):
        return torch.zeros(t.shape, dtype=torch.complex128 if t.part_dtype == "f64" else torch.complex64)
    return torch.zeros(t.shape, dtype=getattr(torch, _TORCH_DTYPES[str(t.dtype)]))


def _draws_random_numbers(target) -> bool:
    """Whether an ATen op draws from a random generator (`rand`, `randn`, `bernoulli`, ...)."""
    import torch

    return torch.Tag.nondeterministic_seeded in getattr(target, "tags", ())


def _view_place(name: str, args) -> tuple:
    """Where a slice (dim, start, end, step) or a select (dim, index) view lies in its base."""
    if name == "aten.slice.Tensor":
        dim, start, end, step = (list(args) + [0, None, None, 1][len(args):])[:4]
        return dim, start, end, step
    return tuple(args[:2])
