"""Train an existing PyTorch model: `sbpc.from_torch(module, args)` captures
`module` with `torch.export` and builds the same computation as an `lg` graph.

    graph = sbpc.from_torch(model, (idx, targets), sbp={"idx": S(0)}, placement=mesh)
    exe = sbpc.compile(graph, optimizer=sbpc.optim.AdamW(lr=3e-4, weight_decay=0.1))
    for batch in data:
        exe.train_step({"idx": x, "targets": y})
    model.load_state_dict(exe.state_dict())

What is imported is export's ATen graph before decomposition (`aten.linear`,
`aten.layer_norm`, `aten.scaled_dot_product_attention`, `aten.cross_entropy_loss`
...): those map onto lg ops that keep their meaning for SBP inference and the
kernels, where the core ATen set would have spelt them in gathers and
`where`s. The rules:

- Inputs are `forward`'s parameter names with the example's shapes and
  dtypes. Parameters keep their `state_dict()` names and PyTorch's layout (a
  Linear weight is `(out, in)`, applied with `lg.matmul ... transpose_rhs`);
  their values are the parameters' initial values. A parameter shared by
  several modules (GPT-2's tied `lm_head` and `wte`) is one lg parameter,
  returned under all its names by `Executable.state_dict()`.
- Buffers, constants and everything computed only from them (causal masks,
  `arange` positions, rotary tables) are folded here, with PyTorch, into
  `lg.constant`s.
- The training objective is the output named `loss`: `forward` returns the
  loss alone, a dict with the key `loss`, or a tuple whose last element is a
  scalar (nanoGPT's `(logits, loss)`); the other outputs keep their dict keys
  or are named `output<i>` by position.
- `sbp` maps glob patterns over input and parameter names to hints.

What cannot be imported (data-dependent control flow, an ATen op with no
lowering, a pattern that matches nothing) raises `TorchImportError` naming
the op or the name, and the user's source line where PyTorch recorded it.
"""

from __future__ import annotations

import contextlib
import fnmatch
import io
import logging
import math
import operator
import os
import re
import sys
import warnings
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from sbpc import frontend as fe
from sbpc.dialects import lg
from sbpc.frontend import Graph, Placement, Tensor


class TorchImportError(ValueError):
    """A PyTorch module that sbpc cannot import, and why."""


_DTYPES = {"torch.float32": "f32", "torch.float64": "f64", "torch.float16": "f16", "torch.bfloat16": "bf16",
           "torch.int64": "i64", "torch.int32": "i32", "torch.bool": "i1"}


def from_torch(module, args, kwargs: Mapping[str, Any] | None = None, *, sbp: Mapping[str, Any] | None = None,
               placement: Placement | None = None, name: str | None = None) -> Graph:
    """`module` (a `torch.nn.Module`) as an `sbpc.Graph`, captured with
    `torch.export` on the example `args` (and `kwargs`)."""
    import torch

    args = tuple(args) if isinstance(args, tuple | list) else (args,)
    try:
        with _quiet_torch():
            program = torch.export.export(module, args, kwargs=dict(kwargs or {}))
    except Exception as error:  # export's failures come in many classes; each becomes one message
        raise TorchImportError(_export_failure(module, error)) from None
    return _Importer(program, module, dict(sbp or {}), placement, name or type(module).__name__).graph()


@contextlib.contextmanager
def _quiet_torch():
    """Export logs and prints its graph and guesses on failure; the error says what matters."""
    logger = logging.getLogger("torch")
    level = logger.level
    logger.setLevel(logging.CRITICAL)
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()), \
                warnings.catch_warnings():
            # torch's own deprecations inside export (pytree internals), not the user's
            warnings.simplefilter("ignore", FutureWarning)
            yield
    finally:
        logger.setLevel(level)


def _export_failure(module, error: Exception) -> str:
    """torch.export's reason in a sentence, with the user's line."""
    text = str(error)
    first = next((line.strip() for line in text.splitlines() if line.strip()), type(error).__name__)
    where = _user_line(text)
    kind = ("data-dependent control flow (a Python branch on a tensor's value)"
            if "data-dependent" in text or "data dependent" in text else "torch.export failed")
    return f"cannot capture {type(module).__name__} with torch.export: {kind}: {first}" + (
        f"\n  at {where}" if where else "")


_FRAME = re.compile(r'File "([^"]+)", line (\d+), in (\S+)\n\s*(.*)')


def _user_line(trace: str) -> str | None:
    """The last frame of a PyTorch stack trace outside torch and sbpc: the user's line."""
    frames = [m for m in _FRAME.finditer(trace or "") if not _is_library_file(m.group(1))]
    if not frames:
        return None
    file, line, func, code = frames[-1].groups()
    return f"{file}:{line} in {func}: {code.strip()}"


def _is_library_file(file: str) -> bool:
    """Whether a frame's file is torch's or sbpc's own code (or generated:
    `<eval_with_key>`), decided by where those packages are installed: a
    user's code under a folder that happens to be named `sbpc` or `torch` (a
    clone of this repository, a virtual environment in it) is the user's."""
    if file.startswith("<"):
        return True
    folder = os.path.dirname(os.path.realpath(file))
    return any(folder == d or folder.startswith(d + os.sep) for d in _library_dirs())


def _library_dirs() -> set[str]:
    """The directory of the installed torch package and those of sbpc's
    loaded modules (sbpc's layers live in folders of their own: sbpc.dialects
    in dialects/, and so on; a frame in a trace is of a loaded module)."""
    files = [getattr(module, "__file__", None) for name, module in list(sys.modules.items())
             if name.partition(".")[0] == "sbpc"]
    files.append(getattr(sys.modules.get("torch"), "__file__", None))
    return {os.path.realpath(os.path.dirname(file)) for file in files if file}


def _updated_buffers(nodes) -> set:
    """The buffer placeholders the forward updates in a way sbpc imports:
    the running statistics of a batch-norm in training mode, and a count
    increased in place (`num_batches_tracked += 1`)."""
    found: set[Any] = set()
    for node in nodes:
        name = _op_name(node.target) if node.op == "call_function" else ""
        if name == "aten.batch_norm" and len(node.args) > 5 and node.args[5] is True:
            found.update(a for a in node.args[3:5] if getattr(a, "op", None) == "placeholder")
        elif name == "aten.add_.Tensor" and getattr(node.args[0], "op", None) == "placeholder":
            found.add(node.args[0])
    return found


class _Const:
    """A value known at import time (a buffer, a constant, or folded from them)."""

    def __init__(self, value):
        self.value = value


class _Importer:
    def __init__(self, program, module, sbp: dict[str, Any], placement: Placement | None, name: str):
        self.program = program
        self.module = module
        self.sbp = sbp
        self.g = Graph(re.sub(r"\W", "_", name), placement=placement)
        self.env: dict[Any, Any] = {}
        self.node: Any = None
        self.lifted: dict[tuple, Tensor] = {}
        self.matched: set[str] = set()
        self.params: dict[str, Tensor] = {}
        self.inputs: dict[str, Any] = {}
        self.state_inputs: dict[Any, str] = {}
        """The placeholders of parameters and buffers, and their names."""
        self.updates: dict[str, Tensor] = {}
        """Each state buffer's value after the step (its `new.<name>` output)."""
        self.autocast: str | None = None
        """The lower precision of the `torch.autocast` region being imported ("bf16", "f16"), if one is on."""

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
                if spec.kind == InputKind.PARAMETER:
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
                    self.env[node] = _Const(value)
                    if spec.persistent:
                        self.g.buffers[spec.target] = to_numpy(value).copy()
                else:
                    self.env[node] = _Const(self.program.constants[spec.target])
            elif node.op == "get_attr":  # a higher-order op's region (a GraphModule)
                self.env[node] = getattr(self.program.graph_module, node.target)
            elif node.op == "call_function":
                self.env[node] = self._call(node)
            elif node.op == "output":
                self._outputs(node)
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
                elif node.op == "get_attr":
                    self.env[node] = getattr(region, node.target)
                elif node.op == "call_function":
                    self.env[node] = self._call(node)
                elif node.op == "output":
                    result = _map(node.args[0], self._value)
        finally:
            self.node = outer
        return result

    def _check_patterns(self) -> None:
        unmatched = sorted(set(self.sbp) - self.matched)
        if unmatched:
            inputs = [name for name, t in self.inputs.items()]
            raise TorchImportError(
                f"sbp pattern {unmatched[0]!r} matches no input or parameter of {type(self.module).__name__} "
                f"(inputs: {inputs}; parameters such as {list(self.g.state_names)[:4]})"
            )

    def _names(self) -> dict[int, list[str]]:
        """Every state_dict name of each parameter object (tied weights have several)."""
        names: dict[int, list[str]] = {}
        for key, p in self.module.named_parameters(remove_duplicate=False):
            names.setdefault(id(p), []).append(key)
        return names

    def _hint(self, name: str):
        hint = None
        for pattern, value in self.sbp.items():
            if fnmatch.fnmatchcase(name, pattern):
                self.matched.add(pattern)
                hint = hint if hint is not None else value
        if hint is not None and self.g.placement is None:
            raise TorchImportError(f"an sbp hint for {name!r} needs a placement: pass placement=")
        return hint

    def _dtype(self, tensor, what: str) -> str:
        dtype = _DTYPES.get(str(tensor.dtype))
        if dtype is None:
            raise TorchImportError(f"{what} has dtype {tensor.dtype}, which sbpc does not support "
                                   f"(supported: {', '.join(_DTYPES)})")
        return dtype

    def _param(self, target: str, value, names: dict[int, list[str]]) -> Tensor:
        # export lifts a tied weight once per name; sbpc keeps one parameter
        # under its first name, as named_parameters() does
        aliases = names.get(id(self.module.get_parameter(target)), [target])
        key = aliases[0]
        if key in self.params:
            return self.params[key]
        hint = next((h for h in (self._hint(n) for n in aliases) if h is not None), None)
        t = self.g.param(key, tuple(value.shape), dtype=self._dtype(value, f"parameter {key!r}"), sbp=hint)
        self.g.initial_values[key] = to_numpy(value).copy()
        for alias in aliases:
            self.g.state_names[alias] = key
        self.params[key] = t
        return t

    def _state(self, name: str, value) -> Tensor:
        """A buffer the forward updates, as an lg parameter marked `state`:
        its value lives across steps, `state_dict()` returns it, and the
        graph's `new.<name>` output is its next value."""
        t = self.g.param(name, tuple(value.shape), dtype=self._dtype(value, f"buffer {name!r}"), state=True)
        self.g.initial_values[name] = to_numpy(value).copy()
        self.g.state_names[name] = name
        return t

    def update(self, node, value: Tensor) -> None:
        """Records `value` as the next value of the state buffer `node`."""
        name = self.state_inputs[node]
        if name in self.updates:
            raise ValueError(f"buffer {name!r} updated twice in one forward")
        self.updates[name] = value

    def _input(self, node) -> Tensor:
        value = node.meta.get("val")
        if value is None or not hasattr(value, "shape"):
            raise TorchImportError(f"input {node.name!r} is not a tensor; sbpc takes tensor inputs only")
        self.inputs[node.name] = value
        return self.g.input(node.name, tuple(int(d) for d in value.shape),
                            self._dtype(value, f"input {node.name!r}"), sbp=self._hint(node.name))

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
            if not isinstance(value, Tensor):
                continue  # a constant output (None, a folded tensor) says nothing about training
            outputs[key] = value
        if not outputs:
            raise TorchImportError(f"{type(self.module).__name__}.forward returns no tensor computed from its inputs")
        self.g.output(**outputs, **{f"new.{name}": value for name, value in self.updates.items()})

    def _output_keys(self, count: int) -> list[str]:
        spec = self.program.call_spec.out_spec
        if spec is None or spec.is_leaf():
            only = self._output_value(0)
            return ["loss" if only is not None and tuple(only.shape) == () else "output"]
        if isinstance(spec.type, type) and issubclass(spec.type, dict):  # a dict, or a Hugging Face ModelOutput
            return [str(k) for k in spec.context]
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
        written = node.args[0] if node.args and getattr(getattr(node.target, "_schema", None), "is_mutable",
                                                          False) else None
        if hasattr(written, "op") and isinstance(self.env.get(written), Tensor) and written not in self.state_inputs:
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
        if not any(isinstance(a, Tensor) for a in _flat([args, kwargs])):
            try:
                return self._fold(node, args, kwargs)
            except Exception as error:  # noqa: BLE001 - PyTorch's own failure, reported with the op
                raise self._error(f"{name} ({node.name}) on constants failed in PyTorch: {error}") from None
        rule = RULES.get(name)
        if rule is None:
            raise self._error(
                f"the ATen op {name} ({node.name}) has no lg lowering in sbpc yet "
                f"(the {len(RULES)} supported ones are listed in sbpc.torch_frontend.RULES)"
            )
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
        rule = RULES.get(functional) if functional != name else RULES.get(name)
        if rule is None:
            raise self._error(f"the in-place ATen op {name} ({node.name}) has no lg lowering in sbpc yet")
        args = _map(node.args, self._value)
        kwargs = {k: _map(v, self._value) for k, v in node.kwargs.items()}
        try:
            result = rule(self, *args, **kwargs)
        except (ValueError, TypeError) as error:
            raise self._error(f"{name} ({node.name}): {error}") from None
        self.env[written] = result
        return result

    def _value(self, a):
        return self.env[a] if hasattr(a, "op") and a in self.env else a

    def _fold(self, node, args, kwargs):
        """Computes a node whose operands are all known, with PyTorch."""
        result = node.target(*_map(args, _unwrap), **{k: _map(v, _unwrap) for k, v in kwargs.items()})
        return _map(result, lambda r: _Const(r) if hasattr(r, "shape") else r)

    def lift(self, value, like: Tensor | None = None) -> Tensor:
        """An lg value for a tensor, a constant or a Python number (in `like`'s dtype)."""
        if isinstance(value, Tensor):
            return value
        if isinstance(value, _Const):
            key = (id(value),)
            if key not in self.lifted:
                array = to_numpy(value.value)
                if array.dtype == np.bool_:
                    array = array.astype(np.float32)
                self.lifted[key] = self.g.constant(array)
            return self.lifted[key]
        if isinstance(value, bool | int | float):
            dtype = fe._numpy_of(like.dtype) if like is not None else np.float32
            return self.g.constant(np.asarray(value, dtype=dtype))
        raise TypeError(f"expected a tensor or a number, got {type(value).__name__}")

    def known(self, value) -> np.ndarray | None:
        """The value as an array when it is known at import time."""
        if isinstance(value, _Const):
            return to_numpy(value.value)
        if isinstance(value, bool | int | float):
            return np.asarray(value)
        return None


def to_numpy(tensor) -> np.ndarray:
    """A CPU torch tensor as a numpy array; bfloat16 (which numpy lacks) as
    ml_dtypes' bfloat16, exactly (every bfloat16 is a float32)."""
    import torch

    tensor = tensor.detach()
    if tensor.dtype == torch.bfloat16:
        import ml_dtypes

        return tensor.float().numpy().astype(ml_dtypes.bfloat16)
    return tensor.numpy()


def _unwrap(a):
    return a.value if isinstance(a, _Const) else a


def _map(value, fn: Callable):
    if isinstance(value, list | tuple):
        return type(value)(_map(v, fn) for v in value)
    if isinstance(value, dict):
        return {k: _map(v, fn) for k, v in value.items()}
    return fn(value)


def _flat(value) -> list:
    if isinstance(value, list | tuple):
        return [x for v in value for x in _flat(v)]
    if isinstance(value, dict):
        return _flat(list(value.values()))
    return [value]


def _op_name(target) -> str:
    if target is operator.getitem:
        return "getitem"
    name = getattr(target, "name", None)
    text = name() if callable(name) else str(target)
    return text.replace("::", ".").removesuffix(".default")


# -- the lowering of each ATen op -------------------------------------------------------

RULES: dict[str, Callable[..., Any]] = {}


def rule(*names: str):
    def register(fn):
        for n in names:
            RULES[n] = fn
        return fn

    return register


def _axis(dim: int, rank: int) -> int:
    return dim + rank if dim < 0 else dim


def _dims(dim, rank: int) -> list[int]:
    if dim is None or dim == []:
        return list(range(rank))
    return [_axis(d, rank) for d in ([dim] if isinstance(dim, int) else dim)]


@rule("aten.linear")
def _linear(im: _Importer, x, weight, bias=None):
    # (16-bit operands arrive widened: _Importer._call rounds the sum with the bias once)
    y = fe.matmul(im.lift(x), im.lift(weight), transpose_b=True)
    return y if bias is None else y + im.lift(bias)


def _pair(v) -> tuple[int, int]:
    """PyTorch's int-or-pair argument of 2-D convolutions and pooling."""
    if isinstance(v, int):
        return v, v
    if len(v) == 1:
        return int(v[0]), int(v[0])
    return int(v[0]), int(v[1])


def _images(im: _Importer, x, what: str) -> Tensor:
    x = im.lift(x)
    if len(x.shape) != 4:
        raise ValueError(f"{what} of a {len(x.shape)}-D input (sbpc takes batched NCHW images)")
    return x


@rule("aten.conv2d", "aten.conv2d.padding")
def _conv2d(im: _Importer, x, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
    x, weight = _images(im, x, "conv2d"), im.lift(weight)
    pair = _pair
    dilation = pair(dilation)
    if padding == "valid":
        padding = 0
    elif padding == "same":
        total = [dilation[a] * (weight.shape[2 + a] - 1) for a in range(2)]
        if any(t % 2 for t in total):
            raise ValueError("conv2d padding='same' with an even kernel extent (PyTorch pads one side more)")
        padding = [t // 2 for t in total]
    y = fe.conv2d(x, weight, pair(stride), pair(padding), dilation, groups)
    return y if bias is None else y + fe.reshape(im.lift(bias), [weight.shape[0], 1, 1])


@rule("aten.max_pool2d")
def _max_pool2d(im: _Importer, x, kernel_size, stride=(), padding=0, dilation=1, ceil_mode=False):
    if _pair(dilation) != (1, 1) or ceil_mode:
        raise ValueError("max_pool2d with dilation or ceil_mode")
    kernel = _pair(kernel_size)
    x = _images(im, x, "max_pool2d")
    return x.graph.add(lg.MaxPool2dOp(x.value, kernel, _pair(stride) if stride else kernel, _pair(padding)))


@rule("aten.avg_pool2d")
def _avg_pool2d(im: _Importer, x, kernel_size, stride=(), padding=0, ceil_mode=False, count_include_pad=True,
                divisor_override=None):
    """A depthwise convolution by a constant 1 / (kh * kw): PyTorch's average
    with the padding counted (its default)."""
    if ceil_mode or divisor_override is not None or (not count_include_pad and _pair(padding) != (0, 0)):
        raise ValueError("avg_pool2d with ceil_mode, divisor_override or count_include_pad=False over padding")
    x = _images(im, x, "avg_pool2d")
    kernel = _pair(kernel_size)
    return _average(im, x, kernel, _pair(stride) if stride else kernel, _pair(padding))


def _average(im: _Importer, x: Tensor, kernel, stride, padding) -> Tensor:
    channels = x.shape[1]
    weights = np.full((channels, 1, *kernel), 1.0 / (kernel[0] * kernel[1]), fe._numpy_of(x.dtype))
    return fe.conv2d(x, im.g.constant(weights), stride, padding, 1, channels)


@rule("aten.adaptive_avg_pool2d", "aten._adaptive_avg_pool2d")
def _adaptive_avg_pool2d(im: _Importer, x, output_size):
    x = _images(im, x, "adaptive_avg_pool2d")
    sizes = [output_size] * 2 if isinstance(output_size, int) else list(output_size) * (3 - len(output_size))
    out = tuple(x.shape[2 + a] if s is None else int(s) for a, s in enumerate(sizes[:2]))
    if out == (1, 1):  # ResNet's global average: a mean over the image
        return fe.reduce_mean(x, [2, 3], keepdims=True)
    if any(x.shape[2 + a] % out[a] for a in range(2)):
        raise ValueError(f"adaptive_avg_pool2d from {list(x.shape[2:])} to {list(out)}, which is not a whole "
                         "number of rows and columns per output")
    kernel = (x.shape[2] // out[0], x.shape[3] // out[1])
    return _average(im, x, kernel, kernel, (0, 0))


@rule("aten.batch_norm")
def _batch_norm(im: _Importer, x, weight, bias, running_mean, running_var, training, momentum, eps,
                cudnn_enabled=True):
    """Training: the statistics of the whole logical batch (reductions over
    the batch and the spatial axes: partial sums across a split batch, so
    every plan computes what one device does, as SyncBatchNorm), and the
    running statistics updated as state (the unbiased variance, as PyTorch).
    Evaluation: the running statistics."""
    x = im.lift(x)
    rank = len(x.shape)
    if rank < 2:
        raise ValueError(f"batch_norm of a {rank}-D input")
    channels = x.shape[1]
    per_channel = [1, channels, *[1] * (rank - 2)]
    axes = [0, *range(2, rank)]
    if training:
        if momentum is None:
            raise ValueError("batch_norm with momentum=None (a cumulative average)")
        mean = fe.reduce_mean(x, axes, keepdims=True)
        centered = x - mean
        var = fe.reduce_mean(centered * centered, axes, keepdims=True)
        count = math.prod(x.shape[a] for a in axes)
        for node, stat, scale in ((im.node.args[3], mean, 1.0), (im.node.args[4], var, count / max(count - 1, 1))):
            running = im.env.get(node) if getattr(node, "op", None) == "placeholder" else None
            if isinstance(running, Tensor):  # track_running_stats=False has none
                im.update(node, running * (1.0 - momentum) + fe.reshape(stat, [channels]) * (momentum * scale))
    else:
        if running_mean is None or running_var is None:
            raise ValueError("batch_norm in evaluation without running statistics")
        mean, var = (fe.reshape(im.lift(v, x), per_channel) for v in (running_mean, running_var))
        centered = x - mean
    y = centered * fe.rsqrt(var + float(eps))
    if weight is not None:
        y = y * fe.reshape(im.lift(weight, x), per_channel)
    if bias is not None:
        y = y + fe.reshape(im.lift(bias, x), per_channel)
    return y


@rule("aten.matmul", "aten.mm", "aten.bmm")
def _matmul(im: _Importer, a, b):
    a, b = im.lift(a), im.lift(b)
    if len(a.shape) < 2 or len(b.shape) < 2:
        raise ValueError("matmul of a vector: reshape it to a matrix first")
    return fe.matmul(a, b)


@rule("aten.addmm")
def _addmm(im: _Importer, bias, a, b, beta=1, alpha=1):
    if beta != 1 or alpha != 1:
        raise ValueError("addmm with beta or alpha other than 1")
    return fe.matmul(im.lift(a), im.lift(b)) + im.lift(bias)


def _binary(fn: Callable[[Tensor, Tensor], Tensor], swap: bool = False):
    def lower(im: _Importer, a, b, alpha=1, rounding_mode=None):
        if rounding_mode is not None:
            raise ValueError(f"rounding_mode={rounding_mode!r}")
        # in the dtype PyTorch computes in (an int mask times 0.5 is float;
        # int / int divides as floats)
        # (a 16-bit result computes in float32, with a Python number at float32
        # precision as PyTorch's opmath has it; _Importer._call rounds it once)
        dtype = _result_dtype(im)
        a, b = _operands(im, a, b, "f32" if dtype in _HALVES else dtype)
        if swap:  # rsub(a, b, alpha) = b - alpha * a
            a, b = b, a
        if alpha != 1:  # add/sub(a, b, alpha) = a +/- alpha * b
            b = b * im.lift(alpha, b)
        return fn(a, b)

    return lower


def _result_dtype(im: _Importer) -> str:
    """The dtype of the node being lowered, as PyTorch traced it."""
    value = im.node.meta.get("val")
    dtype = _DTYPES.get(str(getattr(value, "dtype", None)))
    if dtype is None:
        raise ValueError(f"a result of dtype {getattr(value, 'dtype', 'unknown')}")
    return dtype


def _operands(im: _Importer, a, b, dtype: str) -> tuple[Tensor, Tensor]:
    """Both operands of an elementwise op as lg values of `dtype`: tensors
    cast where PyTorch promotes them, constants compacted (`_compact`)."""
    like = a if isinstance(a, Tensor) else b
    if not isinstance(like, Tensor):
        raise TypeError("an elementwise op of two constants")
    out = []
    for v in (a, b):
        if isinstance(v, Tensor):
            out.append(v if str(v.dtype) == dtype else fe.cast(v, dtype))
            continue
        known = im.known(v)
        if known is None:
            raise TypeError(f"expected a tensor or a number, got {type(v).__name__}")
        key = (id(v), tuple(like.shape), dtype)
        if not isinstance(v, _Const) or key not in im.lifted:  # a buffer's constant is made once per use shape
            value = im.g.constant(_compact(np.asarray(known).astype(fe._numpy_of(fe.element(dtype))), like))
            if not isinstance(v, _Const):
                out.append(value)
                continue
            im.lifted[key] = value
        out.append(im.lifted[key])
    return out[0], out[1]


RULES["aten.add.Tensor"] = RULES["aten.add.Scalar"] = _binary(fe.add)
RULES["aten.sub.Tensor"] = RULES["aten.sub.Scalar"] = _binary(fe.sub)
RULES["aten.rsub.Scalar"] = RULES["aten.rsub.Tensor"] = _binary(fe.sub, swap=True)
RULES["aten.mul.Tensor"] = RULES["aten.mul.Scalar"] = _binary(fe.mul)
RULES["aten.div.Tensor"] = RULES["aten.div.Scalar"] = RULES["aten.div.Tensor_mode"] = _binary(fe.div)


def _unary(fn: Callable[[Tensor], Tensor]):
    return lambda im, x: fn(im.lift(x))


for _name, _fn in (("neg", fe.neg), ("relu", fe.relu), ("tanh", fe.tanh), ("exp", fe.exp), ("sqrt", fe.sqrt),
                   ("rsqrt", fe.rsqrt)):
    RULES[f"aten.{_name}"] = _unary(_fn)


@rule("aten.abs")
def _abs(im: _Importer, x):
    x = im.lift(x)
    return fe.relu(x) + fe.relu(-x)  # its gradient is sign(x), 0 at 0 as PyTorch's


def _sigmoid(x: Tensor) -> Tensor:
    # 1 / (1 + exp(-x)): exp overflows to inf for very negative x, giving 0 as it should
    return 1.0 / (fe.exp(-x) + 1.0)


@rule("aten.sigmoid")
def _sigmoid_rule(im: _Importer, x):
    return _sigmoid(im.lift(x))


@rule("aten.silu")
def _silu(im: _Importer, x):
    x = im.lift(x)
    return x * _sigmoid(x)


@rule("aten.gelu")
def _gelu(im: _Importer, x, approximate="none"):
    x = im.lift(x)
    if approximate == "tanh":
        return fe.gelu(x)
    if approximate != "none":
        raise ValueError(f"approximate={approximate!r}")
    return x * (fe.erf(x * (1.0 / math.sqrt(2.0))) + 1.0) * 0.5


@rule("aten.pow.Tensor_Scalar")
def _pow(im: _Importer, x, exponent):
    x = im.lift(x)
    if exponent == 2:
        return x * x
    if exponent == 3:
        return x * x * x
    if exponent == 0.5:
        return fe.sqrt(x)
    if exponent == -0.5:
        return fe.rsqrt(x)
    if exponent == 1:
        return x
    if exponent == -1:
        return 1.0 / x
    raise ValueError(f"power {exponent} (supported: -1, -0.5, 0.5, 1, 2, 3)")


@rule("aten.square")
def _square(im: _Importer, x):
    x = im.lift(x)
    return x * x


def _reduction(fn: Callable[..., Tensor]):
    def lower(im: _Importer, x, dim=None, keepdim=False, dtype=None):
        x = im.lift(x)
        wanted = _result_dtype(im)  # a sum of booleans counts in int64; `dtype=` converts first
        return fn(x if str(x.dtype) == wanted else fe.cast(x, wanted), _dims(dim, len(x.shape)), keepdim)

    return lower


RULES["aten.mean.dim"] = RULES["aten.mean"] = _reduction(fe.reduce_mean)
RULES["aten.sum.dim_IntList"] = RULES["aten.sum"] = _reduction(fe.reduce_sum)
RULES["aten.amax"] = _reduction(fe.reduce_max)


@rule("aten.argmax")
def _argmax(im: _Importer, x, dim=None, keepdim=False):
    """lg.argmax along `dim`; over every element (dim None) of the flattened
    tensor; `keepdim` keeps the axis as 1."""
    x = im.lift(x)
    if dim is None:
        x, dim = fe.reshape(x, [-1]), 0
    axis = _axis(dim, len(x.shape))
    picked = fe.argmax(x, axis)
    if keepdim:
        picked = fe.reshape(picked, [*x.shape[:axis], 1, *x.shape[axis + 1:]])
    return picked


@rule("aten.softmax.int", "aten._softmax")
def _softmax(im: _Importer, x, dim, dtype_or_half=None):
    x = im.lift(x)
    return fe.softmax(x, _axis(dim, len(x.shape)))


@rule("aten.log_softmax.int", "aten._log_softmax")
def _log_softmax(im: _Importer, x, dim, dtype_or_half=None):
    x = im.lift(x)
    return fe.log_softmax(x, _axis(dim, len(x.shape)))


@rule("aten.layer_norm")
def _layer_norm(im: _Importer, x, normalized_shape, weight=None, bias=None, eps=1e-5, cudnn_enable=True):
    if len(normalized_shape) != 1:
        raise ValueError(f"layer_norm over {len(normalized_shape)} axes (sbpc normalizes one, the last)")
    x = im.lift(x)
    if weight is not None and bias is not None:
        return fe.layernorm(x, im.lift(weight), im.lift(bias), axis=len(x.shape) - 1, eps=eps)
    # lg.layernorm is plain or affine with both; LayerNorm(bias=False) scales after
    y = fe.layernorm(x, axis=len(x.shape) - 1, eps=eps)
    y = y if weight is None else y * im.lift(weight)
    return y if bias is None else y + im.lift(bias)


@rule("aten.rms_norm")
def _rms_norm(im: _Importer, x, normalized_shape, weight=None, eps=None):
    if len(normalized_shape) != 1:
        raise ValueError(f"rms_norm over {len(normalized_shape)} axes (sbpc normalizes one, the last)")
    x = im.lift(x)
    eps = float(np.finfo(fe._numpy_of(x.dtype)).eps) if eps is None else eps
    y = x * fe.rsqrt(fe.reduce_mean(x * x, [len(x.shape) - 1], True) + eps)
    return y if weight is None else y * im.lift(weight)


@rule("aten.view", "aten.reshape", "aten._unsafe_view")
def _reshape(im: _Importer, x, shape):
    return fe.reshape(im.lift(x), [int(d) for d in shape])


@rule("aten.flatten.using_ints")
def _flatten(im: _Importer, x, start_dim=0, end_dim=-1):
    x = im.lift(x)
    s, e = _axis(start_dim, len(x.shape)), _axis(end_dim, len(x.shape))
    return fe.reshape(x, [*x.shape[:s], math.prod(x.shape[s:e + 1]), *x.shape[e + 1:]])


@rule("aten.unsqueeze")
def _unsqueeze(im: _Importer, x, dim):
    x = im.lift(x)
    d = _axis(dim, len(x.shape) + 1)
    return fe.reshape(x, [*x.shape[:d], 1, *x.shape[d:]])


@rule("aten.squeeze.dim", "aten.squeeze.dims", "aten.squeeze")
def _squeeze(im: _Importer, x, dim=None):
    x = im.lift(x)
    drop = set(_dims(dim, len(x.shape)))
    return fe.reshape(x, [d for i, d in enumerate(x.shape) if not (i in drop and d == 1)])


@rule("aten.transpose.int")
def _transpose(im: _Importer, x, d0, d1):
    x = im.lift(x)
    perm = list(range(len(x.shape)))
    a, b = _axis(d0, len(perm)), _axis(d1, len(perm))
    perm[a], perm[b] = perm[b], perm[a]
    return x if a == b else fe.transpose(x, perm)


@rule("aten.t")
def _t(im: _Importer, x):
    return _transpose(im, x, 0, -1)


@rule("aten.permute")
def _permute(im: _Importer, x, dims):
    x = im.lift(x)
    return fe.transpose(x, [_axis(d, len(x.shape)) for d in dims])


@rule("aten.expand")
def _expand(im: _Importer, x, size, implicit=False):
    x = im.lift(x)
    lead = len(size) - len(x.shape)
    shape = [x.shape[i - lead] if d == -1 else int(d) for i, d in enumerate(size)]
    return x if tuple(shape) == x.shape else fe.broadcast_to(x, shape)


@rule("aten.broadcast_tensors")
def _broadcast_tensors(im: _Importer, tensors):
    values = [im.lift(t) for t in tensors]
    shape = np.broadcast_shapes(*(v.shape for v in values))
    return [v if v.shape == shape else fe.broadcast_to(v, shape) for v in values]


@rule("aten.contiguous", "aten.clone", "aten.alias", "aten.lift_fresh_copy")
def _identity(im: _Importer, x, memory_format=None):
    return x


@rule("aten._to_copy", "aten.to.dtype", "aten.to.dtype_layout", "aten.to.device", "aten.type_as")
def _to(im: _Importer, x, *args, **kwargs):
    """`.to(dtype)`, `.to(device, dtype)`, `.type_as(other)`: a cast where the
    dtype changes (lg.cast), the value itself where it does not; the device
    is the placement's business."""
    import torch

    x = im.lift(x)
    wanted = None
    for a in (*args, kwargs.get("dtype")):
        if isinstance(a, Tensor):
            wanted = str(a.dtype)
        elif isinstance(a, torch.dtype):
            if str(a) not in _DTYPES:
                raise ValueError(f"a cast to {a}, which sbpc does not support (supported: {', '.join(_DTYPES)})")
            wanted = _DTYPES[str(a)]
        if wanted is not None:
            break
    return x if wanted is None or wanted == str(x.dtype) else fe.cast(x, wanted)


def _boolean(im: _Importer, value, what: str, truth: bool = False) -> Tensor:
    """An i1 tensor of a value: a computed i1 tensor (or, with `truth`, any
    computed tensor's `!= 0`, as torch.logical_* take it), or a constant's truth."""
    if isinstance(value, Tensor):
        if str(value.dtype) != "i1":
            if truth:
                return fe.cast(value, "i1")
            raise ValueError(f"{what} of a {value.dtype} tensor (sbpc takes bool tensors here)")
        return value
    known = im.known(value)
    if known is None:
        raise TypeError(f"expected a tensor or a number, got {type(value).__name__}")
    return im.g.constant(known.astype(bool))


def _logical_rule(kind: str, truth: bool):
    def lower(im: _Importer, a, b):
        return fe.logical(kind, _boolean(im, a, f"'{kind}'", truth), _boolean(im, b, f"'{kind}'", truth))

    return lower


for _kind in ("and", "or", "xor"):
    # &, |, ^ on bool tensors (on integers they are bitwise, which lg has not);
    # torch.logical_* take any tensor's truth
    rule(f"aten.__{_kind}__.Tensor", f"aten.bitwise_{_kind}.Tensor")(_logical_rule(_kind, truth=False))
    rule(f"aten.logical_{_kind}")(_logical_rule(_kind, truth=True))


def _compare_rule(kind: str):
    def lower(im: _Importer, a, b):
        # PyTorch compares in the promoted dtype: an integer tensor against a
        # fractional number, or against a float tensor, compares as floats
        import torch

        traced = [x.meta.get("val") if hasattr(x, "meta") else x for x in im.node.args[:2]]
        dtype = _DTYPES.get(str(torch.result_type(*traced)))
        if dtype is None:
            raise ValueError(f"a comparison in dtype {torch.result_type(*traced)}")
        return fe.compare(kind, *_operands(im, a, b, dtype))

    return lower


for _kind in ("eq", "ne", "lt", "le", "gt", "ge"):
    rule(f"aten.{_kind}.Tensor", f"aten.{_kind}.Scalar")(_compare_rule(_kind))


@rule("aten.bitwise_not")
def _not(im: _Importer, x):
    return fe.logical("xor", _boolean(im, x, "'not'"), im.g.constant(np.asarray(True)))


@rule("aten.logical_not")
def _logical_not(im: _Importer, x):
    return fe.logical("xor", _boolean(im, x, "'not'", truth=True), im.g.constant(np.asarray(True)))


@rule("aten.index.Tensor")
def _index(im: _Importer, x, indices):
    """Advanced indexing. Index tensors known at import time that only
    insert and broadcast axes (transformers' masks index a padding mask with
    broadcast `arange`s): a reshape and a broadcast. One index tensor
    computed from the inputs, after whole axes (`x[:, idx]`): a selection
    along that axis. `x[torch.arange(n), idx]` over a whole first axis (a
    classification head's last token per row): a gather."""
    x = im.lift(x)
    known = [None if i is None else im.known(i) for i in indices]
    computed = [d for d, (i, k) in enumerate(zip(indices, known)) if i is not None and k is None]
    if computed:
        return _index_computed(im, x, indices, known, computed)
    where = np.arange(math.prod(x.shape)).reshape(x.shape)[
        tuple(slice(None) if k is None else k for k in known)]
    spread = [axis for axis in range(where.ndim)
              if np.all(where == where.take([0], axis=axis))]  # the same element all along: broadcast
    core = where[tuple(slice(0, 1) if axis in spread else slice(None) for axis in range(where.ndim))]
    if not np.array_equal(core.ravel(), np.arange(math.prod(x.shape))):
        raise ValueError("indexing that gathers with indices known at import time (sbpc imports such indexing "
                         "where it only adds and broadcasts axes)")
    reshaped = fe.reshape(x, list(core.shape)) if tuple(core.shape) != tuple(x.shape) else x
    return fe.broadcast_to(reshaped, list(where.shape)) if core.shape != where.shape else reshaped


def _index_computed(im: _Importer, x: Tensor, indices, known, computed: list[int]) -> Tensor:
    used = [d for d, i in enumerate(indices) if i is not None]
    if len(used) == 1 and used == computed:  # x[:, ..., idx]
        return _take(x, computed[0], im.lift(indices[computed[0]]))
    rows = known[0]
    if (used == [0, 1] and computed == [1] and rows is not None and rows.ndim == 1
            and np.array_equal(rows, np.arange(x.shape[0]))):  # x[arange(n), idx]
        picks = im.lift(indices[1])
        if tuple(picks.shape) != (x.shape[0],):
            raise ValueError(f"x[arange({x.shape[0]}), idx] with idx of shape {list(picks.shape)}")
        along = [x.shape[0], 1, *x.shape[2:]]
        spread = fe.broadcast_to(fe.reshape(picks, [x.shape[0], *[1] * (len(x.shape) - 1)]), along)
        return fe.reshape(fe.gather(x, spread, 1), [x.shape[0], *x.shape[2:]])
    raise ValueError("indexing with indices computed from the inputs other than x[..., idx] after whole axes "
                     "and x[torch.arange(n), idx]")


def _take(x: Tensor, axis: int, index: Tensor) -> Tensor:
    """`x` at `index` (any shape) along `axis`: the axis replaced by the
    index's axes. A 2-D table along its rows is an embedding lookup (which
    splits by rows); otherwise a gather with the index broadcast."""
    if not lg.is_index(index.dtype):
        raise ValueError(f"indices of dtype {index.dtype} (sbpc takes int32 and int64 indices)")
    if axis == 0 and len(x.shape) == 2 and lg.is_float(x.dtype):
        return fe.embedding(x, index)
    flat = fe.reshape(index, [math.prod(index.shape)]) if len(index.shape) != 1 else index
    count = flat.shape[0]
    lined = fe.reshape(flat, [count if d == axis else 1 for d in range(len(x.shape))])
    picked = fe.gather(x, fe.broadcast_to(lined, [count if d == axis else n for d, n in enumerate(x.shape)]), axis)
    shape = [*x.shape[:axis], *index.shape, *x.shape[axis + 1:]]
    return picked if list(picked.shape) == shape else fe.reshape(picked, shape)


@rule("aten.index_select")
def _index_select(im: _Importer, x, dim, index):
    x = im.lift(x)
    return _take(x, _axis(dim, len(x.shape)), im.lift(index))


@rule("aten.gather")
def _gather(im: _Importer, x, dim, index, sparse_grad=False):
    x, index = im.lift(x), im.lift(index)
    axis = _axis(dim, len(x.shape))
    if len(index.shape) != len(x.shape) or any(a != b for d, (a, b) in enumerate(zip(x.shape, index.shape))
                                                if d != axis):
        raise ValueError(f"gather with index shape {list(index.shape)} smaller than the input's {list(x.shape)} "
                         f"off axis {axis} (sbpc takes an index shaped as the input but on the gathered axis)")
    return fe.gather(x, index, axis)


@rule("aten.cumsum")
def _cumsum(im: _Importer, x, dim, dtype=None):
    """Running sums; PyTorch sums integers and booleans as int64 unless told a dtype."""
    x = im.lift(x)
    wanted = _DTYPES.get(str(dtype)) if dtype is not None else str(x.dtype) if lg.is_float(x.dtype) else "i64"
    if wanted is None or wanted == "i1":
        raise ValueError(f"cumsum to dtype {dtype}")
    return fe.cumsum(x if str(x.dtype) == wanted else fe.cast(x, wanted), _axis(dim, len(x.shape)))


@rule("aten._assert_tensor_metadata")
def _assert_metadata(im: _Importer, x, size=None, stride=None, dtype=None, **where):
    """export's check that a value has the dtype it was traced with: true of
    every lg value by construction (a cast to another dtype is refused)."""
    x = im.lift(x)
    if dtype is not None and _DTYPES.get(str(dtype)) != str(x.dtype):
        raise ValueError(f"a value of dtype {x.dtype} where {dtype} was traced")
    return None


@rule("aten.pad", "aten.constant_pad_nd")
def _pad(im: _Importer, x, pad, mode="constant", value=None):
    """Constant padding (F.pad's list names the last axis first: (left,
    right, top, bottom, ...)); a negative width crops, a slice."""
    if mode != "constant":
        raise ValueError(f"pad with mode '{mode}' (only 'constant' is supported)")
    x = im.lift(x)
    rank = len(x.shape)
    if len(pad) % 2 or len(pad) // 2 > rank:
        raise ValueError(f"pad of {len(pad)} widths for a {rank}-D tensor")
    low, high = [0] * rank, [0] * rank
    for i in range(len(pad) // 2):
        low[rank - 1 - i], high[rank - 1 - i] = pad[2 * i], pad[2 * i + 1]
    if any(w < 0 for w in (*low, *high)):
        x = fe.slice(x, [max(-w, 0) for w in low], [d - max(-w, 0) for d, w in zip(x.shape, high)])
    return fe.pad(x, [max(w, 0) for w in low], [max(w, 0) for w in high], 0 if value is None else value)


@rule("wrap_with_set_grad_enabled")
def _grad_mode_region(im: _Importer, enabled, region, *args):
    """A `torch.no_grad()` / `torch.enable_grad()` region (LLaMA's rotary
    embedding is computed under no_grad). One on constants was folded; one on
    computed values is imported in place when gradients stay on. With them
    off, gradients must not flow through it, which lg cannot yet say."""
    if not enabled and any(isinstance(a, Tensor) for a in args):
        raise ValueError("a torch.no_grad() region over values computed from the inputs or parameters "
                         "(sbpc has no stop-gradient yet)")
    return im.inline(region, args)


_FLOATS = ("f32", "f64", "f16", "bf16")
_HALVES = ("f16", "bf16")


def _widen(v):
    """A 16-bit float tensor in float32 (exact); anything else as it is."""
    return fe.cast(v, "f32") if isinstance(v, Tensor) and str(v.dtype) in _HALVES else v


AUTOCAST_LOWER = frozenset(f"aten.{op}" for op in (
    "conv1d", "conv2d", "conv3d", "bmm", "mm", "linalg_vecdot", "baddbmm", "addmm", "addbmm", "linear", "matmul",
    "conv_transpose1d", "conv_transpose2d", "conv_transpose3d", "prelu", "scaled_dot_product_attention"))
"""The ops CPU autocast runs in its lower precision (PyTorch's
autocast_mode.cpp, `lower_precision_fp` for CPU): their float inputs are
cast to it."""


def _autocast_args(name: str, dtype: str, args, kwargs):
    """The arguments of an op inside an autocast region as autocast casts
    them: a matmul's, linear's or convolution's float inputs to its lower
    precision. (Those of the ops it runs in float32 are widened as any
    16-bit input of an op traced wider is: _Importer._call.)"""
    base = name.rsplit(".", 1)[0] if name.count(".") > 1 else name
    if base not in AUTOCAST_LOWER:
        return args, kwargs

    def cast(v):
        return fe.cast(v, dtype) if isinstance(v, Tensor) and str(v.dtype) in ("f32", "f64") else v

    return _map(args, cast), {k: _map(v, cast) for k, v in kwargs.items()}


@rule("wrap_with_autocast")
def _autocast_region(im: _Importer, device_type, dtype, enabled, cache_enabled, region, *args):
    """A `torch.autocast` region, imported in place. One that is on casts as
    PyTorch's CPU autocast does: the inputs of matmuls, linears and
    convolutions to its lower precision, and every other op's result to
    the dtype PyTorch traced (promotion; the ops it runs in float32). One
    that is off (models force float32 so, around rotary embeddings and
    norms) computes what its ops say."""
    lower = _DTYPES.get(str(dtype))
    if enabled and lower not in ("bf16", "f16"):
        raise ValueError(f"a torch.autocast region to {dtype} (sbpc's lower precisions: bfloat16, float16)")
    outer, im.autocast = im.autocast, lower if enabled else None
    try:
        return im.inline(region, args)
    finally:
        im.autocast = outer


@rule("aten.dropout")
def _dropout(im: _Importer, x, p, train):
    """lg.dropout: its mask is sbpc's own draw (from `compile(seed=...)`),
    the same under every plan, not PyTorch's generator's."""
    if not train or p == 0:
        return x
    return fe.dropout(im.lift(x), float(p))


@rule("aten.chunk")
def _chunk(im: _Importer, x, chunks, dim=0):
    x = im.lift(x)
    return _split(im, x, math.ceil(x.shape[_axis(dim, len(x.shape))] / chunks), dim)


@rule("aten.split.Tensor", "aten.split_with_sizes")
def _split(im: _Importer, x, sizes, dim=0):
    x = im.lift(x)
    d = _axis(dim, len(x.shape))
    n = x.shape[d]
    bounds = list(range(0, n, sizes)) + [n] if isinstance(sizes, int) else list(np.cumsum([0, *sizes]))
    return [_slice_axis(x, d, int(a), int(b)) for a, b in zip(bounds, bounds[1:])]


def _slice_axis(x: Tensor, d: int, start: int, end: int, step: int = 1) -> Tensor:
    if (start, end, step) == (0, x.shape[d], 1):
        return x
    starts = [0] * len(x.shape)
    limits = list(x.shape)
    strides = [1] * len(x.shape)
    starts[d], limits[d], strides[d] = start, end, step
    return fe.slice(x, starts, limits, strides)


@rule("getitem")
def _getitem(im: _Importer, seq, index):
    return seq[index]


@rule("aten.slice.Tensor")
def _slice(im: _Importer, x, dim=0, start=None, end=None, step=1):
    x = im.lift(x)
    d = _axis(dim, len(x.shape))
    begin, stop, _ = slice(start, end).indices(x.shape[d])
    return _slice_axis(x, d, begin, max(begin, stop), step)


@rule("aten.select.int")
def _select(im: _Importer, x, dim, index):
    x = im.lift(x)
    d = _axis(dim, len(x.shape))
    i = index + x.shape[d] if index < 0 else index
    return fe.reshape(_slice_axis(x, d, i, i + 1), [s for k, s in enumerate(x.shape) if k != d])


@rule("aten.cat")
def _cat(im: _Importer, tensors, dim=0):
    values = [im.lift(t) for t in tensors]
    return fe.concat(values, _axis(dim, len(values[0].shape)))


@rule("aten.embedding")
def _embedding(im: _Importer, weight, indices, padding_idx=-1, scale_grad_by_freq=False, sparse=False):
    if scale_grad_by_freq:
        raise ValueError("embedding with scale_grad_by_freq")
    weight = im.lift(weight)
    padding = None if padding_idx in (-1, None) else _axis(padding_idx, weight.shape[0])
    return fe.embedding(weight, im.lift(indices), padding_idx=padding)


def _additive_mask(im: _Importer, mask: np.ndarray, value: float, like: Tensor) -> Tensor:
    """`value` where `mask` is true, 0 elsewhere: masked_fill as an add (exact
    for finite inputs, and for -inf, softmax's use)."""
    fill = np.where(mask, np.asarray(value, fe._numpy_of(like.dtype)), 0).astype(fe._numpy_of(like.dtype))
    return im.g.constant(_compact(fill, like))


def _compact(constant: np.ndarray, other: Tensor) -> np.ndarray:
    """A constant operand of an elementwise op with `other`, with each axis it
    only repeats along, and that `other` spans already, cut to 1 (the op
    broadcasts it back): a causal mask expanded over the batch is one mask
    for every example, whose size then no longer follows the batch (which
    micro-batches and batch splits leave alone)."""
    lead = constant.ndim - len(other.shape)
    for axis in range(max(lead, 0), constant.ndim):
        if (constant.shape[axis] > 1 and other.shape[axis - lead] == constant.shape[axis]
                and (constant == constant.take([0], axis=axis)).all()):
            constant = constant.take([0], axis=axis)
    return constant


@rule("aten.masked_fill.Scalar", "aten.masked_fill.Tensor")
def _masked_fill(im: _Importer, x, mask, value):
    mask_value, fill = im.known(mask), im.known(value)
    if mask_value is None or fill is None:
        raise ValueError("masked_fill whose mask or value is computed from the inputs "
                         "(sbpc folds masks made from buffers and constants, such as causal masks)")
    x = im.lift(x)
    return x + _additive_mask(im, mask_value.astype(bool), float(fill), x)


@rule("aten.where.self", "aten.where.ScalarOther", "aten.where.ScalarSelf", "aten.where.Scalar")
def _where(im: _Importer, condition, a, b):
    cond = im.known(condition)
    if cond is not None:  # a mask known at import time: an additive mask, no select
        cond = cond.astype(bool)
        for kept, other, choose in ((a, b, ~cond), (b, a, cond)):
            fill = im.known(other)
            if isinstance(kept, Tensor) and fill is not None and fill.size == 1:
                return kept + _additive_mask(im, choose, float(fill), kept) if choose.any() else kept
    dtype = _DTYPES.get(str(im.node.meta["val"].dtype)) if "val" in im.node.meta else None
    if dtype is None:
        raise ValueError("where whose result dtype is not known")
    values = [v if isinstance(v, Tensor) else im.g.constant(np.asarray(im.known(v), fe._numpy_of(
        fe.element(dtype)))) for v in (a, b)]
    values = [v if str(v.dtype) == dtype else fe.cast(v, dtype) for v in values]
    return fe.where(_boolean(im, condition, "where's condition"), *values)


@rule("aten.scaled_dot_product_attention")
def _sdpa(im: _Importer, q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    if enable_gqa:
        raise ValueError("grouped-query attention (enable_gqa): repeat the key and value heads instead")
    q, k, v = im.lift(q), im.lift(k), im.lift(v)
    length, source = q.shape[-2], k.shape[-2]
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    scores = fe.matmul(q, k, transpose_b=True) * scale
    if is_causal:
        scores = scores + _additive_mask(im, ~np.tril(np.ones((length, source), bool)), -math.inf, scores)
    if attn_mask is not None:
        mask = im.known(attn_mask)
        if mask is None:
            scores = scores + im.lift(attn_mask)
        elif mask.dtype == np.bool_:
            scores = scores + _additive_mask(im, ~mask, -math.inf, scores)
        else:
            scores = scores + im.lift(attn_mask)
    return fe.matmul(fe.dropout(fe.softmax(scores, len(scores.shape) - 1), float(dropout_p)), v)


@rule("aten.cross_entropy_loss")
def _cross_entropy(im: _Importer, logits, target, weight=None, reduction=1, ignore_index=-100,
                   label_smoothing=0.0):
    """Megatron's vocabulary-parallel cross-entropy (fe.token_cross_entropy):
    the class axis may be split, and no one-hot of the classes is formed."""
    if weight is not None or label_smoothing:
        raise ValueError("cross_entropy with class weights or label smoothing")
    logits, target = im.lift(logits), im.lift(target)
    if len(logits.shape) != 2:
        raise ValueError(f"cross_entropy of {len(logits.shape)}-D logits: flatten them to (N, C) as nanoGPT does")
    losses = fe.token_cross_entropy(logits, target, ignore_index)
    if reduction == 0:  # 'none': each row's loss, 0 where ignored
        return losses
    total = fe.reduce_sum(losses, [0])
    if reduction == 2:
        return total
    # PyTorch's mean is over the targets not ignored, a count only the data
    # knows: a reduction of its own (a partial sum when the batch is split)
    counted = fe.compare("ne", target, im.g.constant(np.asarray(ignore_index, fe._numpy_of(target.dtype))))
    return total / fe.reduce_sum(fe.cast(counted, str(logits.dtype)), [0])


@rule("aten.mse_loss")
def _mse(im: _Importer, a, b, reduction=1):
    if reduction != 1:
        raise ValueError("mse_loss with reduction other than 'mean'")
    return fe.mse_loss(im.lift(a), im.lift(b))
