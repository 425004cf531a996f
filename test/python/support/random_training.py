"""Random training graphs for the end-to-end property test: a batch-major
chain of ops ending in a loss, on a 1-D, 2-D or 3-D mesh, with random SBP
hints (splits over more devices than elements included), optionally cut
into two pipeline stages on disjoint ranks, and run with 1, 2 or 3
micro-batches. Written as IR text, the form a user writes."""

from __future__ import annotations

import math

import numpy as np
from hypothesis import strategies as st

MESHES = ((2,), (3,), (4,), (2, 2), (1, 2), (2, 2, 2))
UNARY = ("relu", "tanh", "gelu", "neg", "exp", "erf")


def _t(shape) -> str:
    return f"tensor<{'x'.join(map(str, shape))}{'x' if shape else ''}f32>"


class Case:
    def __init__(self, text: str, feeds: dict[str, np.ndarray], micro_batches: int, stages: int):
        self.text, self.feeds, self.micro_batches, self.stages = text, feeds, micro_batches, stages

    def __repr__(self) -> str:
        return f"micro-batches {self.micro_batches}, stages {self.stages}:\n{self.text}"


@st.composite
def training_graphs(draw) -> Case:
    mesh = draw(st.sampled_from(MESHES))
    size = math.prod(mesh)
    stages = draw(st.sampled_from((1, 1, 2))) if size <= 4 else 1
    names = ["@s0", "@s1"][:stages]
    placements = [f"sbp.placement {n} cpu ranks {list(range(i * size, (i + 1) * size))} mesh {list(mesh)}"
                  for i, n in enumerate(names)]
    k = draw(st.sampled_from((1, 1, 2, 3)))
    batch = k * draw(st.integers(1, 3))
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    feeds: dict[str, np.ndarray] = {}
    lines: list[str] = []
    counter = iter(range(10**6))

    def fresh() -> str:
        return f"%v{next(counter)}"

    def nd_hint(rank: int) -> str:
        choices = ["B", *(f"S<{i}>" for i in range(rank))]
        entries = [draw(st.sampled_from(choices)) for _ in mesh]
        return entries[0] if len(mesh) == 1 else f"[{', '.join(entries)}]"

    ops = draw(st.integers(1, 5))
    cut = draw(st.integers(1, ops)) if stages == 2 else ops + 1
    where = names[0]

    def place(i: int) -> str:
        return f" {{sbp.placement = {names[1] if i >= cut else names[0]}}}" if stages == 2 else ""

    width = draw(st.integers(1, 4))
    x = fresh()
    feeds["x"] = rng.normal(size=(batch, width)).astype(np.float32)
    x_t = f"!sbp.dtensor<{batch}x{width}xf32, {where}, {nd_hint(2)}>" if draw(st.booleans()) else _t((batch, width))
    lines.append(f'{x} = lg.input "x" : {x_t}')
    cur, shape, cur_t = x, (batch, width), x_t
    for i in range(ops):
        # the first op is a matmul: a training graph needs a parameter
        kinds = ("matmul", "matmul", "unary", "bias", "softmax", "layernorm", "mul_input")
        kind = "matmul" if i == 0 else draw(st.sampled_from(kinds))
        out = fresh()
        at = place(i)
        if kind == "matmul":
            n = draw(st.integers(1, 4))
            w = fresh()
            wt = _t((shape[1], n))
            if draw(st.integers(0, 3)) == 0:
                wt = f"!sbp.dtensor<{shape[1]}x{n}xf32, {names[1] if i >= cut else names[0]}, {nd_hint(2)}>"
            lines.append(f'{w} = lg.param "w{i}" init #lg.normal<0.0, 0.5> seed {i}{at} : {wt}')
            lines.append(f"{out} = lg.matmul {cur}, {w}{at} : ({cur_t}, {wt}) -> {_t((shape[0], n))}")
            shape = (shape[0], n)
        elif kind == "unary":
            lines.append(f"{out} = lg.{draw(st.sampled_from(UNARY))} {cur}{at} : {cur_t}")
        elif kind == "bias":
            b = fresh()
            lines.append(f'{b} = lg.param "b{i}" init #lg.uniform<-0.5, 0.5> seed {i}{at} : {_t(shape[1:])}')
            lines.append(f"{out} = lg.add {cur}, {b}{at} : ({cur_t}, {_t(shape[1:])}) -> {_t(shape)}")
        elif kind == "softmax":
            lines.append(f"{out} = lg.softmax {cur} axis 1{at} : {cur_t}")
        elif kind == "layernorm":
            g, b = fresh(), fresh()
            lines.append(f'{g} = lg.param "g{i}" init #lg.ones{at} : {_t(shape[1:])}')
            lines.append(f'{b} = lg.param "c{i}" init #lg.zeros{at} : {_t(shape[1:])}')
            lines.append(f"{out} = lg.layernorm {cur} weight {g} : {_t(shape[1:])} bias {b} : {_t(shape[1:])} "
                         f"axis 1 eps 1.0e-05{at} : {cur_t}")
        else:
            other = fresh()
            key = f"z{i}"
            feeds[key] = rng.normal(size=shape).astype(np.float32)
            lines.append(f'{other} = lg.input "{key}" : {_t(shape)}')
            lines.append(f"{out} = lg.mul {cur}, {other}{at} : ({cur_t}, {_t(shape)}) -> {_t(shape)}")
        cur, cur_t = out, _t(shape)
    loss = fresh()
    at = place(ops)
    kind = draw(st.sampled_from(("mean", "mse", "cross_entropy")))
    if kind == "mean":
        lines.append(f"{loss} = lg.reduce_mean {cur} axes [0, 1]{at} : {cur_t} -> tensor<f32>")
    elif kind == "mse":
        target = fresh()
        feeds["target"] = rng.normal(size=shape).astype(np.float32)
        lines.append(f'{target} = lg.input "target" : {_t(shape)}')
        lines.append(f"{loss} = lg.mse_loss {cur}, {target}{at} : ({cur_t}, {_t(shape)}) -> tensor<f32>")
    else:
        labels = fresh()
        feeds["labels"] = rng.integers(0, shape[1], size=shape[0]).astype(np.int64)
        lines.append(f'{labels} = lg.input "labels" : tensor<{shape[0]}xi64>')
        lines.append(f"{loss} = lg.cross_entropy {cur}, {labels}{at} : ({cur_t}, tensor<{shape[0]}xi64>) "
                     "-> tensor<f32>")
    lines.append(f'lg.output ["loss"] {loss} : tensor<f32>')
    body = "\n".join("  " + line for line in lines)
    text = "\n".join(placements) + f"\nlg.graph @train on {names[0]} {{\n{body}\n}}\n"
    return Case(text, feeds, k, stages)
