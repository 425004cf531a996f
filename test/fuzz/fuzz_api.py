"""A fuzzer of the Python API: random programs through `sbpc.Graph` and the
op functions with wrong shapes, dtypes, axes, SBP, placements, names and
argument types among the right ones, random `compile` options, random feeds,
and `from_torch` on small random modules with random example inputs.

Every case must end in success or a clear error: a ValueError or TypeError
(TorchImportError is one) or a compiler diagnostic (PassFailedException,
whose message names the op) or a runtime failure, with a message. Any other
exception is a finding, reported with the innermost frame of sbpc's code;
so is a case that runs past its time limit (a hang).

    python test/fuzz/fuzz_api.py --count 5000 --seed 1
"""

from __future__ import annotations

import argparse
import random
import signal
import sys
import time
import traceback
import warnings
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[2]

NAMES = ["x", "y", "w", "loss", "", "a" * 300, "é", "名", "with space", "grad.x", "new.x", "lr", "x\x00", "0"]
DTYPES = ["f32", "f64", "i64", "i1", "f16", "bf16", "i32", "float32", "u8", "", "F32"]
AXES = [0, 1, -1, 2, 3, -3, 7, 2**40, -(2**40)]
BAD = [None, "x", 1.5, True, [], {}, object(), np.float32(1.0), -1, 2**70, float("nan")]


class Hang(Exception):
    pass


def _on_alarm(signum, frame):
    raise Hang()


@dataclass
class Outcome:
    verdict: str
    """ok, clear (an error a user can act on), or a finding: crash, hang, vague."""
    where: str = ""
    message: str = ""


@dataclass
class Campaign:
    verdicts: Counter = field(default_factory=Counter)
    findings: dict[tuple[str, str], tuple[Outcome, str]] = field(default_factory=dict)
    """One finding per (verdict, place), with the case that found it."""

    @property
    def failed(self) -> int:
        return sum(n for v, n in self.verdicts.items() if v not in ("ok", "clear"))


def clear_errors() -> tuple[type[BaseException], ...]:
    from xdsl.utils.exceptions import PassFailedException

    from sbpc.runtime.program import RuntimeFailure

    return (ValueError, TypeError, PassFailedException, RuntimeFailure)


def _innermost(tb) -> str:
    frames = traceback.extract_tb(tb)
    ours = [f for f in frames if "/sbpc/" in f.filename or any(
        f"/{layer}/" in f.filename for layer in ("dialects", "semantics", "perf", "codegen", "planning", "lowering",
                                                 "runtime", "tools"))]
    frame = (ours or frames or [None])[-1]
    return f"{Path(frame.filename).name}:{frame.lineno} ({frame.name})" if frame else "?"


def classify(action: Callable[[], Any], timeout: float) -> Outcome:
    old = signal.signal(signal.SIGALRM, _on_alarm)
    signal.setitimer(signal.ITIMER_REAL, timeout)
    try:
        with warnings.catch_warnings(), np.errstate(all="ignore"):
            warnings.simplefilter("ignore")
            action()
        return Outcome("ok")
    except Hang:
        return Outcome("hang", "", f"no answer in {timeout} s")
    except clear_errors() as e:
        message = str(e).strip()
        if not message:
            return Outcome("vague", _innermost(e.__traceback__), f"{type(e).__name__} without a message")
        return Outcome("clear", "", message)
    except Exception as e:  # noqa: BLE001 - the finding is the point
        return Outcome("crash", _innermost(e.__traceback__), f"{type(e).__name__}: {e}"[:300])
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


# -- random programs through the frontend --------------------------------------------------


class Program:
    """A random program's steps, recorded as text for the report."""

    def __init__(self, rng: random.Random):
        self.rng = rng
        self.steps: list[str] = []

    def maybe(self, good, bad_rate: float = 0.05):
        """`good()` mostly, else a wrong value of another kind."""
        if self.rng.random() < bad_rate:
            return self.rng.choice(BAD)
        return good()

    def shape(self, rank: int | None = None) -> Any:
        rng = self.rng
        if rng.random() < 0.05:
            return rng.choice([[-1, 4], [0, 3], [2**40, 2], [1.5], "4", None, [[2]], ()])
        if rank is None and rng.random() < 0.7:  # shapes that compose (matmul, broadcast)
            return list(rng.choice([(4, 8), (8, 4), (8,), (4,), (4, 8), (2, 4, 8), (), (8, 8)]))
        return [rng.choice([1, 2, 3, 4, 8]) for _ in range(rank if rank is not None else rng.randint(0, 3))]

    def axis(self, x=None) -> Any:
        rank = len(x.shape) if x is not None and hasattr(x, "shape") else 2
        return self.maybe(lambda: self.rng.choice([*range(-rank, rank), *AXES[:4]]))

    def axes(self, x=None) -> Any:
        return self.rng.choice([None, [self.axis(x)], (0, 1), [0, 0], [], self.axis(x)])

    def sbp(self) -> Any:
        import sbpc

        if self.rng.random() < 0.05:
            return self.rng.choice([sbpc.S(5), "S0", 3, [], sbpc.P])
        return self.rng.choice([None, None, None, None, sbpc.S(0), sbpc.S(1), sbpc.B, [sbpc.S(0), sbpc.B], (sbpc.B,)])

    def placement(self) -> Any:
        import sbpc

        rng = self.rng
        choice = rng.random()
        if choice < 0.03:
            return rng.choice(BAD)
        if choice < 0.8:
            ranks, mesh, device = rng.choice([(1, None), (2, None), (4, None), (4, [2, 2]), ([1, 0], None)]) + (
                "cpu",)
        else:
            ranks = rng.choice([1, 2, 4, 0, -1, [0, 1], [1, 0], [0, 0], 3])
            mesh = rng.choice([None, None, [2, 2], [4], [3], [0], [1, 2]])
            device = rng.choice(["cpu", "cpu", "cuda", "tpu", ""])
        self.steps.append(f"placement({device!r}, {ranks!r}, {mesh!r})")
        return sbpc.placement(device, ranks, mesh)

    def tensor(self, tensors: list) -> Any:
        if tensors and self.rng.random() > 0.03:
            return self.rng.choice(tensors)
        return self.rng.choice(BAD + [np.zeros(3, np.float32)])


def _ops(p: Program, t: list) -> list[tuple[str, Callable[[], Any]]]:
    """The calls a step may make, each a name and a thunk."""
    import sbpc

    r = p.rng
    x = lambda: p.tensor(t)  # noqa: E731
    tensor = lambda: r.choice([v for v in t if isinstance(v, sbpc.Tensor)] or [sbpc.Graph("h").input("h", [2])])  # noqa: E731
    return [
        ("unary", lambda: r.choice([sbpc.relu, sbpc.gelu, sbpc.tanh, sbpc.exp, sbpc.sqrt, sbpc.erf, sbpc.neg])(x())),
        ("binary", lambda: r.choice([sbpc.add, sbpc.sub, sbpc.mul, sbpc.div, sbpc.matmul])(x(), x())),
        ("operator", lambda: r.choice([lambda a, b: a + b, lambda a, b: a @ b, lambda a, b: a * b,
                                       lambda a, b: a / b, lambda a, b: a - b])(x(), r.choice([x(), 2.0, 0, None]))),
        ("softmax", lambda: (a := x(), sbpc.softmax(a, p.axis(a)))[1]),
        ("log_softmax", lambda: (a := x(), sbpc.log_softmax(a, p.axis(a)))[1]),
        ("layernorm", lambda: sbpc.layernorm(x(), r.choice([None, x()]), r.choice([None, x()]))),
        ("reduce", lambda: (a := x(), r.choice([sbpc.reduce_sum, sbpc.reduce_mean, sbpc.reduce_max])(
            a, p.axes(a), r.choice([False, True])))[1]),
        ("argmax", lambda: (a := x(), sbpc.argmax(a, p.axis(a)))[1]),
        ("reshape", lambda: sbpc.reshape(x(), p.shape())),
        ("transpose", lambda: (a := x(), sbpc.transpose(a, r.choice([[1, 0], [0], [0, 0], list(range(
            len(getattr(a, "shape", ()))))[::-1], [2, 0, 1], None])))[1]),
        ("broadcast_to", lambda: sbpc.broadcast_to(x(), p.shape())),
        ("cast", lambda: sbpc.cast(x(), r.choice(DTYPES))),
        ("compare", lambda: sbpc.compare(r.choice(["lt", "eq", "ge", "xx"]), x(), x())),
        ("logical", lambda: sbpc.logical(r.choice(["and", "or", "nand"]), x(), x())),
        ("where", lambda: sbpc.where(x(), x(), x())),
        ("concat", lambda: sbpc.concat(r.choice([[x(), x()], [x()], [], x()]), p.axis())),
        ("slice", lambda: sbpc.slice(x(), p.shape(), p.shape(), r.choice([None, p.shape()]))),
        ("pad", lambda: sbpc.pad(x(), p.shape(), p.shape(), r.choice([0.0, 1.5, "x"]))),
        ("dropout", lambda: sbpc.dropout(x(), r.choice([0.0, 0.5, 1.0, -0.1, 2.0, "x"]), r.choice([True, False]))),
        ("cumsum", lambda: (a := x(), sbpc.cumsum(a, p.axis(a), r.choice([False, True])))[1]),
        ("gather", lambda: sbpc.gather(x(), x(), p.axis())),
        ("embedding", lambda: sbpc.embedding(x(), x(), r.choice([None, 0, -1, 100]))),
        ("cross_entropy", lambda: sbpc.cross_entropy(x(), x())),
        ("token_cross_entropy", lambda: sbpc.token_cross_entropy(x(), x(), r.choice([None, -100, 0]))),
        ("mse_loss", lambda: sbpc.mse_loss(x(), x())),
        ("conv2d", lambda: sbpc.conv2d(x(), x(), r.choice([1, 2, 0, (1, 2), -1]), r.choice([0, 1, (1, 0), -1]),
                                       r.choice([1, 2, 0]), r.choice([1, 2, 0]))),
        ("method", lambda: r.choice([lambda a: a.sum(), lambda a: a.mean(p.axes(a)), lambda a: a.max(0),
                                     lambda a: a.reshape(*p.shape()), lambda a: a.transpose(1, 0), lambda a: a.T,
                                     lambda a: a.relu(), lambda a: -a])(tensor())),
        ("to", lambda: tensor().to(*[s for s in [p.sbp()] if s is not None],
                              placement=r.choice([None, None, p.placement()]))),
    ]


def build_graph(p: Program) -> tuple[Any, list]:
    import sbpc

    r = p.rng
    where = None if r.random() < 0.25 else p.placement()
    name = r.choice(["g"] * 8 + ["", "1bad", "a b", 5])
    p.steps.append(f"Graph({name!r}, {where!r})")
    g = sbpc.Graph(name, placement=where)
    tensors: list = []
    for _ in range(r.randint(1, 4)):
        kind = r.random()
        shape, dtype, sbp = p.shape(), r.choice(["f32"] * 12 + DTYPES), p.sbp()
        nm = r.choice(NAMES) if r.random() < 0.2 else f"t{len(tensors)}"
        if kind < 0.5:
            p.steps.append(f"input({nm!r}, {shape!r}, {dtype!r}, {sbp!r})")
            tensors.append(g.input(nm, shape, dtype=dtype, sbp=sbp))
        elif kind < 0.85:
            init = r.choice([None, sbpc.normal(0.0, 1.0), sbpc.ones(), sbpc.uniform(-1.0, 1.0), sbpc.normal(0.0, 0.1),
                             "zeros" if r.random() < 0.2 else None])
            if r.random() < 0.02:
                init = sbpc.uniform(1.0, -1.0)
            p.steps.append(f"param({nm!r}, {shape!r}, {init!r}, {dtype!r}, {sbp!r})")
            tensors.append(g.param(nm, shape, init=init, seed=r.choice([0, 1, -1, 2**70]), dtype=dtype, sbp=sbp))
        else:
            value = r.choice([np.ones((2, 2), np.float32), np.arange(4), 1.5, [[1, 2], [3]], np.zeros(0), "x",
                              np.ones(3, np.complex64), np.array([True, False])])
            p.steps.append(f"constant({value!r})")
            tensors.append(g.constant(value, dtype=r.choice([None, None, "f64", "i64", "x"])))
    for _ in range(r.randint(0, 8)):
        name, thunk = r.choice(_ops(p, tensors))
        p.steps.append(name)
        tensors.append(thunk())
    return g, tensors


def random_case(rng: random.Random, run_rate: float = 0.5) -> tuple[Program, Callable[[], Any]]:
    """A case: build a random graph, output some of its tensors, compile it
    with random options and (sometimes) run it with random feeds."""
    import sbpc

    p = Program(rng)

    def case():
        g, tensors = build_graph(p)
        outs = {rng.choice(["loss", "y", "out"] * 3 + NAMES) or "out": rng.choice(tensors)
                for _ in range(rng.randint(0, 2) if rng.random() < 0.1 else rng.randint(1, 2))}
        p.steps.append(f"output({sorted(outs)})")
        g.output(**outs)
        options: dict[str, Any] = {"mode": "interpret"}
        for key, values in {
            "pipeline": ["compile", "compile", "sbp-infer", "lg-autodiff,compile", "nonsense", "compile{x=1}", ""],
            "plan": ["manual", "manual", "auto", "best"],
            "stages": [1, 1, 2, 0, -1, 1.5],
            "seed": [None, 0, -1, 2**64, "x"],
            "memory_budget": [None, None, 10**9, 0, 1],
            "optimizer": [None, None, sbpc.optim.SGD(lr=0.1), sbpc.optim.Adam(lr=0.01, zero=True), "adam"],
            "mode": ["interpret", "interpret", "interpret", "bogus"],
            "cluster": ["cpu", "cpu", "h100-node", "nope"],
        }.items():
            if rng.random() < 0.4:
                options[key] = rng.choice(values)
        p.steps.append(f"compile({options})")
        exe = sbpc.compile(g, **options)
        if rng.random() < run_rate:
            from sbpc.dialects.dtypes import numpy_dtype
            from sbpc.runtime.program import feed_types

            feeds: dict[str, Any] = {}
            for name, t in feed_types(exe.program).items():
                shape = list(t.get_shape())
                dtype = numpy_dtype(t.element_type)
                value = np.ones(shape, dtype)
                wrong = rng.random()
                if wrong < 0.1:
                    value = np.ones([*shape, 2], dtype)
                elif wrong < 0.2:
                    value = np.ones(shape, np.float64 if dtype.kind != "f" else np.int64)
                elif wrong < 0.25:
                    continue
                feeds[name] = value
            if rng.random() < 0.1:
                feeds["extra"] = np.zeros(1)
            p.steps.append(f"run({sorted(feeds)})")
            exe.run(feeds, steps=rng.choice([1, 1, 2, 0, "1"]))

    return p, case


def valid_case(rng: random.Random) -> tuple[Program, Callable[[], Any]]:
    """A case that is right by construction (shapes chained op by op, on a
    placement with hints that fit), so that it reaches compile, autodiff,
    the optimizer and the run, with at most one argument made wrong."""
    import sbpc

    p = Program(rng)

    def case():
        ranks = rng.choice([1, 2, 4])
        where = sbpc.placement("cpu", ranks, rng.choice([None, [2, 2]]) if ranks == 4 else None)
        p.steps.append(f"placement(cpu, {ranks}, {where.mesh})")
        g = sbpc.Graph("g", placement=where)
        batch, width = rng.choice([2, 4, 8]), rng.choice([2, 4, 8])
        split = sbpc.S(0) if len(where.mesh) == 1 else [sbpc.S(0), sbpc.B]
        x = g.input("x", (batch, width), sbp=rng.choice([None, split]))
        labels = g.input("labels", (batch,), dtype="i64")
        h, k = x, 0
        for _ in range(rng.randint(1, 6)):
            kind = rng.choice(["linear", "unary", "norm", "residual", "softmax", "transpose2", "dropout", "scale"])
            p.steps.append(kind)
            if kind == "linear":
                out = rng.choice([2, 4, 8])
                hint = rng.choice([None, None, sbpc.S(1), sbpc.S(0), sbpc.B]) if len(where.mesh) == 1 else None
                w = g.param(f"w{k}", (h.shape[-1], out), init=sbpc.normal(0.0, 0.5), seed=k, sbp=hint)
                h, k = h @ w, k + 1
            elif kind == "unary":
                h = rng.choice([sbpc.relu, sbpc.gelu, sbpc.tanh, sbpc.neg])(h)
            elif kind == "norm":
                gain = g.param(f"g{k}", (h.shape[-1],), init=sbpc.ones())
                h = sbpc.layernorm(h, gain, g.param(f"b{k}", (h.shape[-1],)))
                k += 1
            elif kind == "residual":
                h = h + rng.choice([h, 1.0, sbpc.relu(h)])
            elif kind == "softmax":
                h = sbpc.softmax(h, -1)
            elif kind == "transpose2":
                h = h.T.T
            elif kind == "dropout":
                h = sbpc.dropout(h, rng.choice([0.0, 0.1, 0.5]))
            else:
                h = h * rng.choice([0.5, 2.0])
        head = g.param("head", (h.shape[-1], 4), init=sbpc.normal(0.0, 0.5), seed=99)
        loss = sbpc.cross_entropy(h @ head, labels)
        g.output(loss=loss)
        optimizer = rng.choice([None, sbpc.optim.SGD(lr=0.1), sbpc.optim.Adam(lr=0.01),
                                sbpc.optim.AdamW(lr=0.01), sbpc.optim.Adam(lr=0.01, zero=True)])
        options: dict[str, Any] = {"mode": "interpret", "optimizer": optimizer}
        if rng.random() < 0.2:
            options["pipeline"] = rng.choice(["compile{fuse=false}", "compile{bucket=false}",
                                              "compile{strategy=greedy}", "lg-micro-batch{count=2},compile"])
        if rng.random() < 0.1:
            options["seed"] = rng.randrange(2**63)
        p.steps.append(f"compile({options})")
        exe = sbpc.compile(g, **options)
        feeds = {"x": np.random.default_rng(0).normal(size=(batch, width)).astype(np.float32),
                 "labels": np.arange(batch) % 4}
        if rng.random() < 0.2:  # one thing wrong
            feeds[rng.choice(["x", "labels"])] = rng.choice([np.zeros((batch + 1, width), np.float32),
                                                            np.full(batch, 7), np.zeros(batch, np.float32)])
        p.steps.append("run")
        for _ in range(rng.choice([1, 2])):
            (exe.train_step if optimizer is not None else exe.run)(feeds)

    return p, case


# -- from_torch on small random modules ----------------------------------------------------


def torch_case(rng: random.Random) -> tuple[Program, Callable[[], Any]]:
    p = Program(rng)

    def case():
        import torch

        import sbpc

        torch.manual_seed(rng.randrange(1000))
        width = rng.choice([2, 3, 4])
        layers: list = []
        for _ in range(rng.randint(1, 4)):
            layers.append(rng.choice([
                lambda: torch.nn.Linear(width, rng.choice([width, width, 3])),
                lambda: torch.nn.ReLU(), lambda: torch.nn.GELU(), lambda: torch.nn.Tanh(),
                lambda: torch.nn.LayerNorm(width), lambda: torch.nn.Dropout(rng.choice([0.0, 0.5])),
                lambda: torch.nn.Softmax(dim=-1), lambda: torch.nn.Flatten(),
                lambda: torch.nn.Conv2d(width, width, 1), lambda: torch.nn.BatchNorm1d(width),
                lambda: torch.nn.Embedding(5, width), lambda: torch.nn.Identity(),
            ])())
        model = torch.nn.Sequential(*layers)
        if rng.random() < 0.5:
            model.eval()
        if rng.random() < 0.2:
            model = model.double()
        shape = rng.choice([(2, width), (4, width), (2, width, 1, 1), (2,), (0, width), (2, 3)])
        example = rng.choice([torch.randn(*shape), torch.randint(0, 5, shape), torch.randn(*shape).double(),
                              "x", None, (torch.randn(*shape),), [torch.randn(*shape)]])
        p.steps.append(f"{model} on {getattr(example, 'shape', example)!r}")
        graph = sbpc.from_torch(model, example if isinstance(example, tuple) else (example,),
                                placement=rng.choice([None, sbpc.placement("cpu", rng.choice([1, 2]))]))
        if rng.random() < 0.5:
            sbpc.compile(graph, mode="interpret",
                         optimizer=rng.choice([None, sbpc.optim.SGD(lr=0.1)]))

    return p, case


# -- campaigns ------------------------------------------------------------------------------


def fuzz(count: int, seed: int = 0, timeout: float = 30.0, torch_share: float = 0.2, valid_share: float = 0.3,
         on_run: Callable[[int], None] | None = None) -> Campaign:
    campaign = Campaign()
    try:
        import torch  # noqa: F401

        have_torch = True
    except ImportError:
        have_torch = False
    for i in range(count):
        rng = random.Random(seed * 1_000_003 + i)
        draw = rng.random()
        if have_torch and draw < torch_share:
            program, case = torch_case(rng)
        elif draw < torch_share + valid_share:
            program, case = valid_case(rng)
        else:
            program, case = random_case(rng)
        outcome = classify(case, timeout)
        campaign.verdicts[outcome.verdict] += 1
        if outcome.verdict not in ("ok", "clear"):
            key = (outcome.verdict, outcome.where)
            if key not in campaign.findings:
                campaign.findings[key] = (outcome, f"case {i} (seed {seed}): " + " ; ".join(program.steps))
        if on_run:
            on_run(i)
    return campaign


def report(campaign: Campaign, seconds: float) -> str:
    lines = [f"{sum(campaign.verdicts.values())} cases in {seconds:.1f} s: " +
             ", ".join(f"{v} {n}" for v, n in sorted(campaign.verdicts.items()))]
    for (verdict, where), (outcome, case) in sorted(campaign.findings.items()):
        lines.append(f"- {verdict} at {where}: {outcome.message}\n    {case[:600]}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timeout", type=float, default=30.0)
    parser.add_argument("--torch-share", type=float, default=0.2, help="share of from_torch cases")
    parser.add_argument("--valid-share", type=float, default=0.3,
                        help="share of cases right by construction (they reach compile and the run)")
    options = parser.parse_args(argv)
    start = time.perf_counter()
    campaign = fuzz(options.count, options.seed, options.timeout, options.torch_share, options.valid_share)
    print(report(campaign, time.perf_counter() - start))
    return 1 if campaign.failed else 0


if __name__ == "__main__":
    sys.exit(main())
