"""A malformed-input fuzzer for `sbp-opt`.

It takes every lit input (`test/filecheck/**/*.mlir`, split at `// -----`),
every IR example (`examples/*.mlir`) and graphs generated from the op
definitions (test/python/support/random_graphs.py: well typed by construction, on
1-D and 2-D meshes), applies one to three random mutations (element types,
integers turned to 0, -1 or values beyond int64, shape dimensions, SBP
entries, nd-SBP lists of other lengths, nested and foreign types, attribute
dictionaries, placements and meshes, dense literals, result counts, regions
and blocks, unicode and very long names, op names, symbol names, deleted,
duplicated and truncated lines, swapped operands, flipped bits that may leave
invalid UTF-8), and runs `sbp-opt` on the mutant with no passes, with
`-p compile`, or with the pipeline of the input's own RUN line.

Each run must end in one of two ways: success, or exit code 1 with a
diagnostic that names the op or points at a location in the input. A Python
exception escaping `sbp-opt` (what a user would see as a traceback), a run
longer than `--timeout` seconds, a failure with no message, or a message
naming neither op nor location is a finding. Findings are printed once per
distinct place in the code, and `--save DIR` writes each one's input there,
ready to become a lit test.

    python test/fuzz/fuzz_ir.py --count 5000 --seed 1 --save /tmp/findings

`test/python/tools/test_fuzz.py` runs a small fixed-seed campaign in `make test`.
The runs are in-process (`sbpc.tools.sbp_opt.main`): a process per mutant
would spend most of its time importing xDSL.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import random
import re
import shlex
import signal
import sys
import tempfile
import time
import traceback
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

ELEMENT_TYPES = ["f32", "f16", "bf16", "f64", "i1", "i8", "i32", "i64", "ui8", "index", "complex<f32>", "none",
                 "tensor<2xf32>", "!sbp.unknown"]
INTEGERS = ["0", "-1", "1", "3", "-7", "2147483648", "-2147483649", "9223372036854775807",
            "9223372036854775808", "-9223372036854775809", "340282366920938463463374607431768211456"]
SBP_ENTRIES = ["B", "P", "P<max>", "S<0>", "S<1>", "S<2>", "S<7>", "S<-1>", "[B, B]", "[S<0>, S<1>]", "[P, S<0>]"]
OP_NAMES = ["lg.relu", "lg.exp", "lg.add", "lg.mul", "lg.matmul", "lg.softmax", "lg.reduce_sum", "lg.reshape",
            "lg.transpose", "lg.layer_norm", "lg.gelu", "lg.broadcast_to", "lg.unknown_op", "sbp.all_reduce",
            "sbp.all_gather", "sbp.reduce_scatter", "sbp.all_to_all", "sbp.send", "plan.compute", "plan.collective"]


ATTRIBUTE_DICTS = ["{}", "{a = 1 : i64}", "{sbp.placement = @nowhere}", '{sbp.signature = "bogus"}',
                   "{lg.micro_batch = \"x\"}", "{lg.recompute}", "{plan.x = [1, 2]}", "{sbp.placement = 3}",
                   '{"q" = dense<1.0> : tensor<2xf32>}', "{sbp.autoplan = @m}", "{a = {b = {c = []}}}"]
NESTED_TYPES = ["tensor<tensor<2xf32>>", "tensor<?x4xf32>", "tensor<*xf32>", "vector<4xf32>", "memref<4xf32>",
                "tensor<4x!sbp.dtensor<4xf32, @m, B>>", "tuple<f32>", "tensor<0xf32>", "tensor<4xcomplex<f32>>",
                "!sbp.dtensor<4xf32, @m, [B, [S<0>]]>", "tensor<4xf32, #sbp.broadcast>", "tensor<>", "tensor<4x>"]
ND_SBP_LISTS = ["[]", "[B, B, B]", "[S<0>, S<0>]", "[P<max>, P]", "[S<0>]", "[B, S<9>]", "[[B]]", "[B,]"]
PLACEMENTS = ["shape []", "ranks []", "ranks [0, 0]", "shape [2, 0]", "ranks [-1]", "shape [1000000]", "on @nowhere",
              "shape [2, 2, 2, 2, 2, 2, 2, 2, 2, 2]", "ranks [9223372036854775807]", "on @0"]
DENSE_LITERALS = ["dense<>", "dense<[1.0, 2.0]>", 'dense<"0xDEAD">', "dense<nan>", "dense<1e400>",
                  "dense<[[1], [2, 3]]>", "dense<true>", "dense<[]>", "dense<-0x7FC00000>", "dense<1.0"]
NAMES = ["%é", "@名", '"' + "x" * 5000 + '"', "@" + "a" * 10000, "%\U0001F642", '"\u200b"', "%" + "v" * 3000,
         '"\\"', '"\\n"']


@dataclass(frozen=True)
class Seed:
    """One input before mutation: its name and the pipelines its RUN lines use."""

    name: str
    text: str
    pipelines: tuple[tuple[str, ...], ...]


@dataclass
class Outcome:
    verdict: str
    """ok, diagnostic, or a finding: crash, hang, silent, vague."""
    message: str = ""
    where: str = ""
    """For a crash, the innermost frame of sbpc's code (or xDSL's when none)."""


FINDINGS = ("crash", "hang", "silent", "vague")


def _run_pipelines(text: str) -> tuple[tuple[str, ...], ...]:
    found = []
    for line in text.splitlines():
        if "RUN:" not in line or "sbp-opt %s" not in line:
            continue
        args = shlex.split(line.split("RUN:", 1)[1].split("|")[0])
        keep: list[str] = []
        for i, arg in enumerate(args):
            if args[i - 1] in ("-p", "-t") and i > 0 and "%" not in arg:
                keep += [args[i - 1], arg]
        if keep:
            found.append(tuple(keep))
    return tuple(dict.fromkeys(found))


def generated_seeds(count: int = 60, seed: int = 0) -> list[Seed]:
    """Graphs generated from the op definitions (random_graphs.py's
    strategy, drawn from a seeded byte stream), on 1-D and 2-D meshes."""
    sys.path.insert(0, str(ROOT / "test" / "python"))
    from hypothesis.errors import StopTest
    from hypothesis.internal.conjecture.data import ConjectureData
    from support.random_graphs import random_graphs, text

    rng = random.Random(seed)
    out: list[Seed] = []
    strategy = random_graphs(meshes=((2,), (4,), (2, 2)))
    while len(out) < count:
        data = ConjectureData(random=random.Random(rng.randrange(2**32)))
        try:
            case = data.draw(strategy)
        except StopTest:
            continue
        out.append(Seed(f"generated#{len(out)}", text(case.module), (("-p", "compile"),)))
    return out


def seeds(source: str = "all") -> list[Seed]:
    """The inputs to mutate: `lit` (the lit inputs and IR examples),
    `generated` (graphs from the op definitions) or `all`."""
    out = generated_seeds() if source in ("all", "generated") else []
    if source == "generated":
        return out
    paths = sorted((ROOT / "test" / "filecheck").rglob("*.mlir")) + sorted((ROOT / "examples").glob("*.mlir"))
    for path in paths:
        text = path.read_text()
        pipelines = _run_pipelines(text)
        for i, part in enumerate(text.split("// -----")):
            body = "\n".join(line for line in part.splitlines() if "RUN:" not in line)
            if re.search(r"\b(lg|sbp|plan)\.", body):
                out.append(Seed(f"{path.relative_to(ROOT)}#{i}", body, pipelines))
    return out


def _replace_one(text: str, pattern: str, rng: random.Random, choices: list[str]) -> str | None:
    spots = list(re.finditer(pattern, text))
    if not spots:
        return None
    m = rng.choice(spots)
    return text[: m.start()] + rng.choice(choices) + text[m.end():]


def _swap_operands(text: str, rng: random.Random) -> str | None:
    spots = list(re.finditer(r"(%[\w.]+), (%[\w.]+)", text))
    if not spots:
        return None
    m = rng.choice(spots)
    return text[: m.start()] + f"{m.group(2)}, {m.group(1)}" + text[m.end():]


def _lines(text: str, rng: random.Random, how: str) -> str | None:
    lines = text.splitlines()
    if not lines:
        return None
    i = rng.randrange(len(lines))
    if how == "delete":
        lines = lines[:i] + lines[i + 1:]
    elif how == "duplicate":
        lines = lines[: i + 1] + lines[i:]
    else:
        j = rng.randrange(len(lines))
        lines[i], lines[j] = lines[j], lines[i]
    return "\n".join(lines)


def _insert_attributes(text: str, rng: random.Random) -> str | None:
    """An attribute dictionary on an op (before its ` : ` type)."""
    spots = list(re.finditer(r"(?m)^\s*(%[\w.:, %]+ = )?(lg|sbp|plan)\.[a-z_]+[^\n]*?(?= : )", text))
    if not spots:
        return None
    m = rng.choice(spots)
    return text[: m.end()] + " " + rng.choice(ATTRIBUTE_DICTS) + text[m.end():]


def _flip_bit(text: str, rng: random.Random) -> str | None:
    """One flipped bit of the UTF-8 bytes: the result may not be UTF-8 (kept
    as surrogate escapes here, written back as the raw bytes)."""
    data = bytearray(text.encode("utf-8", "surrogateescape"))
    if not data:
        return None
    i = rng.randrange(len(data))
    data[i] ^= 1 << rng.randrange(8)
    return data.decode("utf-8", "surrogateescape")


def _result_count(text: str, rng: random.Random) -> str | None:
    spots = list(re.finditer(r"(?m)^(\s*)(%[\w.]+) = ", text))
    if not spots:
        return None
    m = rng.choice(spots)
    name = m.group(2)
    new = rng.choice([f"{name}, %extra = ", f"{name}:2 = ", "", f"{name}, {name} = "])
    return text[: m.start()] + m.group(1) + new + text[m.end():]


def _block_structure(text: str, rng: random.Random) -> str | None:
    lines = text.splitlines()
    if not lines:
        return None
    i = rng.randrange(len(lines))
    extra = rng.choice(["^bb1:", "^bb0(%a: f32):", "{", "}", "}) : () -> ()", '"test.op"() ({', "module {",
                        "lg.graph @inner {", "^bb1(%x: tensor<4xf32>):"])
    return "\n".join(lines[:i] + [extra] + lines[i:])


MUTATIONS: dict[str, Callable[[str, random.Random], str | None]] = {
    "element type": lambda t, r: _replace_one(t, r"\b(f16|f32|f64|bf16|i1|i8|i32|i64|index)\b", r, ELEMENT_TYPES),
    "integer": lambda t, r: _replace_one(t, r"(?<![%@\w.#])-?\d+(?![\w.])", r, INTEGERS),
    "dimension": lambda t, r: _replace_one(t, r"(?<=[<x])\d+(?=x)", r, ["0", "1", "3", "5", "9223372036854775808"]),
    "sbp": lambda t, r: _replace_one(t, r"\bS<\d+>|\bP(<max>)?(?=[,>\]])|\bB(?=[,>\]])", r, SBP_ENTRIES),
    "op name": lambda t, r: _replace_one(t, r"\b(lg|sbp|plan)\.[a-z_]+(?= )", r, OP_NAMES),
    "symbol": lambda t, r: _replace_one(t, r"@[\w.]+", r, ["@unknown", "@0", "@g", "@dp"]),
    "string": lambda t, r: _replace_one(t, r'"[\w.]*"', r, ['""', '"x"', '"loss"', '"unknown"']),
    "swap operands": _swap_operands,
    "delete line": lambda t, r: _lines(t, r, "delete"),
    "duplicate line": lambda t, r: _lines(t, r, "duplicate"),
    "swap lines": lambda t, r: _lines(t, r, "swap"),
    "truncate": lambda t, r: t[: r.randrange(len(t) + 1)],
    "attribute dictionary": _insert_attributes,
    "nested type": lambda t, r: _replace_one(t, r"tensor<[^<>]*>", r, NESTED_TYPES),
    "nd-sbp list": lambda t, r: _replace_one(t, r"\[(?:S<\d+>|B|P(?:<max>)?)(?:, (?:S<\d+>|B|P(?:<max>)?))*\]", r,
                                            ND_SBP_LISTS),
    "placement": lambda t, r: _replace_one(t, r"\b(shape|ranks|mesh) ?\[[^\]]*\]|\bon @[\w.]+", r, PLACEMENTS),
    "dense literal": lambda t, r: _replace_one(t, r"dense<[^>]*>", r, DENSE_LITERALS),
    "result count": _result_count,
    "block structure": _block_structure,
    "unicode or long name": lambda t, r: _replace_one(t, r"%[\w.]+|@[\w.]+|\"[\w.]*\"", r, NAMES),
    "bit flip": _flip_bit,
}


def mutate(text: str, rng: random.Random) -> tuple[str, list[str]]:
    """One to three mutations of `text`; returns the mutant and their names."""
    applied = []
    for _ in range(rng.choice((1, 1, 2, 3))):
        for _attempt in range(5):
            name = rng.choice(list(MUTATIONS))
            changed = MUTATIONS[name](text, rng)
            if changed is not None and changed != text:
                text = changed
                applied.append(name)
                break
    return text, applied


class _Timeout(Exception):
    pass


def _on_alarm(signum, frame):
    raise _Timeout()


# A diagnostic names an op ('lg.matmul', "lg.graph" @g), a place in the input
# (file:line:col, or the printed IR with the failing op underlined), or, for
# a problem with the pipeline or the whole graph, the pass
# ("sbp-infer: unknown strategy", "sbp-autoplan{...}: no plan fits").
_NAMES_OP_OR_PLACE = re.compile(
    r"'[a-z_]+\.[a-z_.]+'|\"[a-z_]+\.[a-z_.]+\"|:\d+:\d+|\^\^\^|^sbp-opt: error: |^(lg|sbp|plan)-[a-z-]+[:{]", re.M
)


def run_sbp_opt(text: str, args: list[str], timeout: float) -> Outcome:
    """Runs `sbp-opt` in this process on `text` with `args` and classifies the result."""
    from sbpc.tools import sbp_opt

    fd, path = tempfile.mkstemp(suffix=".mlir")
    with os.fdopen(fd, "w", encoding="utf-8", errors="surrogateescape") as f:  # a flipped bit's raw bytes
        f.write(text)
    out, err = io.StringIO(), io.StringIO()
    previous = signal.signal(signal.SIGALRM, _on_alarm)
    signal.setitimer(signal.ITIMER_REAL, timeout)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = sbp_opt.main([path, *args])
    except _Timeout:
        return Outcome("hang", f"no result after {timeout} s")
    except SystemExit as e:  # argparse
        code = e.code if isinstance(e.code, int) else 1
    except BaseException as e:  # noqa: BLE001 - every escaping exception is the finding
        frames = traceback.extract_tb(e.__traceback__)
        ours = [f for f in frames if "site-packages" not in f.filename] or frames
        where = f"{Path(ours[-1].filename).name}:{ours[-1].lineno} ({ours[-1].name})"
        return Outcome("crash", "".join(traceback.format_exception(e)), where + f" {type(e).__name__}")
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        os.unlink(path)
    message = err.getvalue().replace(path, "<input>")
    if code == 0:
        return Outcome("ok")
    if not message.strip():
        return Outcome("silent", f"exit code {code}, nothing on stderr")
    if not _NAMES_OP_OR_PLACE.search(message):
        return Outcome("vague", message, message.strip().splitlines()[0][:80])
    return Outcome("diagnostic", message)


@dataclass
class Campaign:
    runs: int = 0
    verdicts: Counter = field(default_factory=Counter)
    findings: dict[str, tuple[Outcome, Seed, str, list[str], list[str]]] = field(default_factory=dict)
    """One finding per distinct (verdict, place): its outcome, seed, mutant, mutations and arguments."""

    @property
    def failed(self) -> int:
        return sum(self.verdicts[v] for v in FINDINGS)


def fuzz(count: int, seed: int = 0, timeout: float = 20.0, on_run: Callable[[int], None] | None = None,
         source: str = "all") -> Campaign:
    rng = random.Random(seed)
    inputs = seeds(source)
    campaign = Campaign()
    for n in range(count):
        chosen = rng.choice(inputs)
        mutant, applied = mutate(chosen.text, rng)
        args = list(rng.choice([(), ("-p", "compile"), *chosen.pipelines]))
        outcome = run_sbp_opt(mutant, args, timeout)
        campaign.runs += 1
        campaign.verdicts[outcome.verdict] += 1
        if outcome.verdict in FINDINGS:
            campaign.findings.setdefault(f"{outcome.verdict}: {outcome.where}",
                                         (outcome, chosen, mutant, applied, args))
        if on_run:
            on_run(n)
    return campaign


def report(campaign: Campaign, seconds: float, save: Path | None = None) -> str:
    lines = [f"{campaign.runs} mutants in {seconds:.1f} s: "
             + ", ".join(f"{v} {n}" for v, n in sorted(campaign.verdicts.items()))
             + f"; {campaign.failed} findings at {len(campaign.findings)} places"]
    for i, (key, (outcome, seed_, mutant, applied, args)) in enumerate(sorted(campaign.findings.items())):
        lines.append(f"\n== {key}\n   from {seed_.name} by {', '.join(applied)}; sbp-opt {shlex.join(args)}")
        lines += ["   " + line for line in outcome.message.strip().splitlines()[-4:]]
        if save is not None:
            save.mkdir(parents=True, exist_ok=True)
            (save / f"finding-{i}.mlir").write_text(f"// sbp-opt {shlex.join(args)}\n// {key}\n{mutant}\n")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=1000, help="mutants to run (default 1000)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timeout", type=float, default=20.0, help="seconds before a run counts as a hang")
    parser.add_argument("--save", type=Path, help="write each finding's input to this folder")
    parser.add_argument("--source", choices=("all", "lit", "generated"), default="all",
                        help="what to mutate: lit inputs and examples, generated graphs, or both")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    start = time.perf_counter()
    campaign = fuzz(args.count, args.seed, args.timeout, source=args.source)
    print(report(campaign, time.perf_counter() - start, args.save))
    return 1 if campaign.failed else 0


if __name__ == "__main__":
    sys.exit(main())
