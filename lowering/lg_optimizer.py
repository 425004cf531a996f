"""`lg-optimizer`: appends the parameter update to a differentiated graph.

Reads the `grad.<param>` outputs that lg-autodiff added and replaces them by
`new.<name>` outputs: the updated parameters and optimizer state. The state
(momentum buffers, Adam's moments and its step count `adam.step`, from which
the bias corrections 1 - beta**t are computed in double precision each step,
as PyTorch does) is persistent parameters of the graph, so it is placed and
distributed like any parameter. The learning rate is an input (`lr`, a
scalar), so schedules are the caller's. Options:

    algorithm     sgd | momentum | adam | adamw
    momentum      momentum factor (momentum)
    beta1, beta2, eps   Adam's
    weight_decay  AdamW's decoupled decay
    decay_groups  per-parameter decay, PyTorch's parameter groups:
                  "pattern:decay;pattern:decay" with glob patterns over
                  parameter keys; the first match wins, else weight_decay
    clip          clip the gradients to this global norm (0: off)
    zero          ZeRO: hint the optimizer state split S<0> over the first
                  (data) mesh axis of the parameter's placement, so each rank
                  keeps and updates 1/p of it; the update is gathered back
                  into the parameter's own distribution. Without it, the state
                  of a hinted parameter is hinted like the parameter.

A training step runs the graph and writes every `new.<name>` output back
into the parameter `<name>` (Executable.train_step does this).
"""

from __future__ import annotations

import fnmatch
import math
from collections.abc import Sequence
from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects.builtin import (
    BFloat16Type,
    DenseIntOrFPElementsAttr,
    Float16Type,
    ModuleOp,
    SymbolRefAttr,
    TensorType,
    f32,
    f64,
    i64,
)
from xdsl.ir import Attribute, SSAValue
from xdsl.passes import ModulePass
from xdsl.utils.exceptions import PassFailedException

from sbpc.dialects import lg
from sbpc.dialects.lg_analysis import ADAM_STEP_KEY, LEARNING_RATE, OPTIMIZER_STATE_PREFIXES
from sbpc.dialects.sbp import (
    PLACEMENT_ATTR,
    BroadcastAttr,
    DTensorType,
    SplitAttr,
    element_type,
    global_shape,
    lookup_placement,
)

from .lg_autodiff import Emitter

ALGORITHMS = ("sgd", "momentum", "adam", "adamw")
STATE_PREFIXES = OPTIMIZER_STATE_PREFIXES
ADAM_STEP = ADAM_STEP_KEY


def _computed_in(elem: Attribute) -> Attribute:
    """The element type an update of `elem` values computes in: float32 for the 16-bit floats."""
    return f32 if isinstance(elem, Float16Type | BFloat16Type) else elem


@dataclass(frozen=True)
class LgOptimizerPass(ModulePass):
    name = "lg-optimizer"

    algorithm: str = "sgd"
    momentum: float = 0.9
    beta1: float = 0.9
    beta2: float = 0.999
    eps: float = 1e-8
    weight_decay: float = 0.01
    decay_groups: str = ""
    clip: float = 0.0
    zero: bool = False

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        if self.algorithm not in ALGORITHMS:
            raise PassFailedException(
                f"lg-optimizer: unknown algorithm '{self.algorithm}' (choose {', '.join(ALGORITHMS)})"
            )
        groups = self._groups()
        for graph in lg.graphs(op):
            self.update(graph, groups)

    def _groups(self) -> list[tuple[str, float]]:
        groups = []
        for rule in filter(None, self.decay_groups.split(";")):
            pattern, _, value = rule.rpartition(":")
            try:
                groups.append((pattern, float(value)))
            except ValueError:
                pattern = ""
            if not pattern:
                raise PassFailedException(
                    f"lg-optimizer: decay_groups rule {rule!r} is not 'pattern:decay' (for example '*.bias:0.0')"
                )
        return groups

    def update(self, graph: lg.GraphOp, groups: Sequence[tuple[str, float]] = ()) -> None:
        output = graph.output()
        names = [n.data for n in output.names.data]
        params = {o.key.data: o for o in graph.body.ops if isinstance(o, lg.ParamOp) and o.trained}
        grads = {n.removeprefix("grad."): v for n, v in zip(names, output.values) if n.startswith("grad.")}
        updated = sorted((n.removeprefix("new.") for n in names if n.startswith("new.") and n[4:] in params),
                         key=lambda key: (key.startswith(STATE_PREFIXES), key))  # a parameter's name first
        if updated:
            raise PassFailedException(
                f"'lg.graph' @{graph.sym_name.data} is a training step already: it updates {updated[0]!r} "
                f"(output new.{updated[0]}); an optimizer runs once (a graph built for training needs no "
                f"optimizer= in compile)"
            )
        if not grads:
            raise PassFailedException(
                f"'lg.graph' @{graph.sym_name.data}: no grad.<param> outputs: run lg-autodiff first, on a loss "
                f"computed from a trained parameter"
            )
        first_param = next(iter(params.values()))
        first = first_param.result
        e = Emitter(output)
        # the learning rate is a scalar input, so schedules stay outside the graph
        existing = [o for o in graph.body.ops if isinstance(o, lg.InputOp) and o.key.data == LEARNING_RATE]
        lr = existing[0].result if existing else self._source(
            graph, lg.InputOp(LEARNING_RATE, TensorType(_computed_in(element_type(first.type)), []))
        )
        lr.name_hint = lr.name_hint or LEARNING_RATE
        scalars: dict[tuple[SSAValue, Attribute], SSAValue] = {}

        def scalar_in(value: SSAValue, elem: Attribute) -> SSAValue:
            """A scalar of the update (lr, a bias correction) in `elem`, cast once per element type."""
            if element_type(value.type) == elem:
                return value
            if (value, elem) not in scalars:
                scalars[(value, elem)] = e.emit(lg.CastOp(value, elem))
            return scalars[(value, elem)]

        if self.clip > 0:
            grads = self._clip(e, grads, first)
        kept = [(n, v) for n, v in zip(names, output.values) if not n.startswith("grad.")]
        new: list[tuple[str, SSAValue]] = []
        if self.algorithm in ("adam", "adamw"):
            # PyTorch's bias corrections: from the step count, in double
            # precision, 1 - beta**t = 1 - exp(t log beta), then folded into
            # the update's scalars (lr / (1 - beta1**t), sqrt(1 - beta2**t))
            count = self._state(graph, ADAM_STEP, (), lg.ZerosInitAttr(), first_param, i64, counter=True)
            one = e.emit(lg.ConstantOp(DenseIntOrFPElementsAttr.from_list(TensorType(i64, []), [1])))
            step = e.emit(lg.AddOp(count, one))
            new.append((ADAM_STEP, step))
            t = e.emit(lg.CastOp(step, f64))

            def correction(beta: float) -> SSAValue:
                power = e.emit(lg.ExpOp(e.emit(lg.MulOp(t, e.scalar(math.log(beta), t)))))
                return e.emit(lg.SubOp(e.scalar(1.0, t), power))

            step_size = e.emit(lg.DivOp(scalar_in(lr, f64), correction(self.beta1)))
            bias2_sqrt = e.emit(lg.SqrtOp(correction(self.beta2)))
        for key, g in grads.items():
            e.place_like(params[key])
            stored = element_type(params[key].result.type)
            computed = _computed_in(stored)

            # a 16-bit float parameter and its state are updated in float32,
            # each new value rounded once (PyTorch's fused update ops)
            def wide(v: SSAValue) -> SSAValue:
                return v if computed == stored else e.emit(lg.CastOp(v, computed))  # noqa: B023 - this key's

            def narrow(v: SSAValue) -> SSAValue:
                return v if computed == stored else e.emit(lg.CastOp(v, stored))  # noqa: B023 - this key's

            w, g = wide(params[key].result), wide(g)
            shape = global_shape(w.type)
            if self.algorithm == "sgd":
                step = g
            elif self.algorithm == "momentum":
                v = wide(self._state(graph, f"momentum.{key}", shape, lg.ZerosInitAttr(), params[key]))
                v_new = e.emit(lg.AddOp(e.emit(lg.MulOp(v, e.scalar(self.momentum, v))), g))
                new.append((f"momentum.{key}", narrow(v_new)))
                step = v_new
            else:
                m = wide(self._state(graph, f"adam.m.{key}", shape, lg.ZerosInitAttr(), params[key]))
                v = wide(self._state(graph, f"adam.v.{key}", shape, lg.ZerosInitAttr(), params[key]))
                m_new = e.emit(lg.AddOp(e.emit(lg.MulOp(m, e.scalar(self.beta1, m))),
                                        e.emit(lg.MulOp(g, e.scalar(1 - self.beta1, g)))))
                v_new = e.emit(lg.AddOp(e.emit(lg.MulOp(v, e.scalar(self.beta2, v))),
                                        e.emit(lg.MulOp(e.emit(lg.MulOp(g, g)), e.scalar(1 - self.beta2, g)))))
                new += [(f"adam.m.{key}", narrow(m_new)), (f"adam.v.{key}", narrow(v_new))]
                # PyTorch's order: denom = sqrt(v) / sqrt(1 - beta2**t) + eps,
                # w -= (lr / (1 - beta1**t)) * m / denom, AdamW's decay first
                denom = e.emit(lg.AddOp(e.emit(lg.DivOp(e.emit(lg.SqrtOp(v_new)), scalar_in(bias2_sqrt, computed))),
                                        e.scalar(self.eps, v_new)))
                decay = next((d for pattern, d in groups if fnmatch.fnmatchcase(key, pattern)), self.weight_decay)
                if self.algorithm == "adamw" and decay:  # w *= 1 - lr * decay, the factor in double
                    kept_share = e.emit(lg.SubOp(e.scalar(1.0, t), e.emit(lg.MulOp(scalar_in(lr, f64),
                                                                                 e.scalar(decay, t)))))
                    w = e.emit(lg.MulOp(w, e.emit(lg.CastOp(kept_share, computed)) if computed != f64
                                        else kept_share))
                update = e.emit(lg.MulOp(e.emit(lg.DivOp(m_new, denom)), scalar_in(step_size, computed)))
                new.append((key, narrow(e.emit(lg.SubOp(w, update)))))
                continue
            new.append((key, narrow(e.emit(lg.SubOp(w, e.emit(lg.MulOp(step, scalar_in(lr, computed))))))))
        for key, value in new:
            value.name_hint = key.replace(".", "_") + "_new"
        values = [v for _, v in kept] + [v for _, v in new]
        out_names = [n for n, _ in kept] + [f"new.{n}" for n, _ in new]
        replacement = lg.OutputOp(values, out_names)
        graph.body.block.insert_op_before(replacement, output)
        output.detach()
        output.erase()

    def _source(self, graph: lg.GraphOp, op) -> SSAValue:
        first = graph.body.block.first_op
        assert first is not None  # a graph holds at least its lg.output
        graph.body.block.insert_op_before(op, first)
        return op.results[0]

    def _state(self, graph, key, shape, init, param: lg.ParamOp, elem: Attribute | None = None,
               counter: bool = False) -> SSAValue:
        """A persistent state parameter, placed where `param` is (of
        `param`'s element type, or `elem`; a `counter` is integer `state`)."""
        like = param.result
        t: TensorType | DTensorType = TensorType(elem or element_type(like.type), list(shape))
        placed = param.attributes.get(PLACEMENT_ATTR)
        where = (like.type.placement if isinstance(like.type, DTensorType) else placed) or graph.placement
        if self.zero and shape and isinstance(where, SymbolRefAttr):
            mesh = lookup_placement(graph, where).mesh()
            if shape[0] >= mesh.shape[0]:
                t = DTensorType(shape, t.element_type, mesh.name,
                                [SplitAttr(0), *(BroadcastAttr() for _ in mesh.shape[1:])])
        elif shape and isinstance(like.type, DTensorType):
            # a hinted parameter's state is distributed as the parameter is, so
            # the update is local (the cost model's memory term would otherwise
            # often shard state on its own: ZeRO is asked for with zero=true)
            t = like.type
        state = lg.ParamOp(key, t, init, state=counter)
        if placed is not None and shape:
            state.attributes[PLACEMENT_ATTR] = placed
        value = self._source(graph, state)
        value.name_hint = key.replace(".", "_")
        return value

    def _clip(self, e: Emitter, grads: dict[str, SSAValue], like: SSAValue) -> dict[str, SSAValue]:
        """Scales every gradient by min(1, clip / global norm)."""
        total: SSAValue | None = None
        for g in grads.values():
            rank = len(global_shape(g.type))
            sq = e.emit(lg.MulOp(g, g))
            part = e.emit(lg.ReduceSumOp(sq, list(range(rank)))) if rank else sq
            total = part if total is None else e.emit(lg.AddOp(total, part))
        assert total is not None  # lg-optimizer runs only where a gradient is
        ratio = e.emit(lg.DivOp(e.emit(lg.SqrtOp(total)), e.scalar(self.clip, like)))
        # max(1, r) = (1 + r + |r - 1|) / 2, with |d| = sqrt(d * d)
        d = e.emit(lg.SubOp(ratio, e.scalar(1.0, like)))
        larger = e.emit(lg.MulOp(e.emit(lg.AddOp(e.emit(lg.AddOp(ratio, e.scalar(1.0, like))),
                                                 e.emit(lg.SqrtOp(e.emit(lg.MulOp(d, d)))))), e.scalar(0.5, like)))
        return {k: e.emit(lg.DivOp(g, larger)) for k, g in grads.items()}
