"""`sbp-run FILE -n N`: compiles (lg or sbp IR) or loads (plan IR) a
program and runs it on N MPI ranks started with the mpich wheel's mpiexec.

    sbp-run examples/mlp.mlir -n 2 --seed 0 -o out.npz --steps 3 --trace trace.json
    sbp-run examples/mlp.mlir -n 4 --hosts node0:2,node1:2    # rank 0 on this machine, node0

Feeds come from an .npz file (--feeds) or are generated from a seed; the
outputs are gathered to rank 0 and written to an .npz file. Bad input, bad
feeds and failures on any rank are reported as one message, exit code 1.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, cast

import numpy as np
from xdsl.context import Context
from xdsl.dialects.builtin import IntegerAttr
from xdsl.passes import PassPipeline
from xdsl.printer import Printer
from xdsl.utils.exceptions import DiagnosticException, ParseError

from sbpc.dialects import parse_module, plan
from sbpc.dialects.dtypes import numpy_dtype
from sbpc.dialects.lg_analysis import LEARNING_RATE, TYPICAL_LEARNING_RATE
from sbpc.lowering import PASSES
from sbpc.runtime.hosts import Hosts
from sbpc.runtime.launch import Leftovers, command, rank_environment, stop
from sbpc.runtime.program import RuntimeFailure, assemble_outputs, check_feeds, feed_types, find_program, rank_plans
from sbpc.runtime.progress import DeathWatch, describe_failure, describe_progress, reported_ranks

from .host_options import add_host_options, hosts_from


def generated_feeds(program: plan.ProgramOp, seed: int) -> dict[str, np.ndarray]:
    """Random feeds: normal floats; integers below what their consumers
    accept (class count for cross_entropy labels, rows for embedding indices);
    the optimizer's learning rate a typical one. Drawn as a normal float
    (about 1), it made a training plan diverge within a few steps into
    infinities and denormal floats, which the CPU multiplies at a fraction
    of its rate: the GPT of the throughput bench ran 70 ms a step under
    sbp-run, 30 with the learning rate at 1e-3."""
    rng = np.random.default_rng(seed)
    bounds: dict[str, int] = {}
    for device in program.devices():
        regs = {r.sym_name.data: r for r in device.registers()}
        # the feed each register holds (a piece of): feeds, and what
        # communication (a slice, a gather) makes of them
        origin = {name: r.feed.data for name, r in regs.items() if r.feed is not None}
        for actor in device.actors():
            names = [r.string_value() for r in actor.ins.data]
            if not isinstance(actor, plan.ComputeOp):
                if names and names[0] in origin:
                    for out in actor.outs.data:
                        origin[out.string_value()] = origin[names[0]]
                continue
            ins = [regs[n] for n in names]
            if actor.kernel.data in ("lg.cross_entropy", "lg.token_cross_entropy") and names[1] in origin:
                bounds[origin[names[1]]] = ins[0].value.get_shape()[-1]
            if actor.kernel.data == "lg.embedding" and names[1] in origin:
                bounds[origin[names[1]]] = ins[0].value.get_shape()[0]
            if actor.kernel.data == "lg.gather" and names[1] in origin:
                axis = actor.props.data["axis"]
                assert isinstance(axis, IntegerAttr)  # lg.gather's property
                bounds[origin[names[1]]] = ins[0].value.get_shape()[axis.value.data]
    feeds = {}
    for name, t in sorted(feed_types(program).items()):
        dtype = numpy_dtype(t.element_type)
        shape = t.get_shape()
        if name == LEARNING_RATE and dtype.kind == "f" and shape == ():
            feeds[name] = np.asarray(TYPICAL_LEARNING_RATE, dtype)
        elif dtype.kind == "f":
            feeds[name] = rng.normal(size=shape).astype(dtype)
        else:
            feeds[name] = rng.integers(0, bounds.get(name, 2), size=shape).astype(dtype)
    return feeds


def load_program(path: str, pipeline: str):
    """The module holding a plan: parsed, and compiled first if it is not one."""
    text = Path(path).read_text()
    module = parse_module(text, path)
    if not plan.programs(module):
        PassPipeline.parse_spec(PASSES, pipeline).apply(Context(), module)
        module.verify()
    return module, find_program(module)


def _run_job(argv: list[str], launcher: Path, timeout: float | None, watch: DeathWatch,
             hosts: Hosts | None = None) -> int:
    """Runs mpiexec with its stdout (where it reports a rank that died: pid
    and exit code) in `launcher`, under `watch`. On Ctrl-C or the timeout,
    mpiexec gets SIGTERM, on which it ends every rank (they ignore the
    terminal's SIGINT: the driver decides), and at worst SIGKILL."""
    before = Leftovers.now()
    with open(launcher, "w") as out_file:
        process = subprocess.Popen(argv, env=rank_environment(hosts), stdout=out_file)
        watch.start()
        try:
            code = process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            stop(process, before)
            raise RuntimeFailure(f"the job did not finish in {timeout} s and was killed") from None
        except BaseException:
            stop(process, before)
            raise
    if code != 0:  # a killed or aborted rank cannot remove MPICH's segments and files
        before.remove_new()
    return code


def main(args: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="sbp-run", description=__doc__.splitlines()[0])
    parser.add_argument("file", help="lg/sbp IR (compiled first) or plan IR")
    parser.add_argument("-n", "--ranks", type=int, required=True, help="MPI ranks to start")
    parser.add_argument("--feeds", help=".npz file of inputs (default: generated from --seed)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--params", help=".npz file of parameter values (default: their initializers)")
    parser.add_argument("-o", "--output", default="outputs.npz", help=".npz file for the fetched outputs")
    parser.add_argument("--steps", type=int, default=1)
    parser.add_argument("--trace", help="write a Chrome/Perfetto trace here")
    parser.add_argument("-p", "--pipeline", default="compile", help="passes for non-plan input (default: compile)")
    parser.add_argument("--emit-plan", help="also write the plan IR that runs here")
    parser.add_argument("--timeout", type=float, default=None, help="seconds before the job is killed")
    add_host_options(parser)
    options = parser.parse_args(args)
    try:
        hosts = hosts_from(options)
        if hosts is not None:
            hosts.ranks_per_host(options.ranks)  # a list that cannot place -n ranks is said before compiling
        module, program = load_program(options.file, options.pipeline)
        ranks = sorted(d.rank.value.data for d in program.devices())
        if ranks and ranks[-1] >= options.ranks:
            raise RuntimeFailure(
                f"@{program.sym_name.data} runs on ranks {ranks}, which -n {options.ranks} does not start"
            )
        if options.feeds:
            with np.load(options.feeds) as data:
                feeds = check_feeds(program, dict(data))
        else:
            feeds = generated_feeds(program, options.seed)
        with tempfile.TemporaryDirectory(prefix="sbp-run-") as tmp:
            if options.emit_plan:
                with open(options.emit_plan, "w") as f:
                    Printer(stream=f).print_op(module)
                    f.write("\n")
            # each rank parses its own device's plan alone (program.rank_plans)
            for rank, text in enumerate(rank_plans(module, options.ranks)):
                (Path(tmp) / f"plan.rank{rank}.mlir").write_text(text)
            feeds_path = Path(tmp) / "feeds.npz"
            # the cast quiets mypy, which rightly notes a feed named allow_pickle would set savez's flag
            np.savez(feeds_path, **cast("dict[str, Any]", feeds))
            pieces_path = Path(tmp) / "pieces.npz"
            worker = [
                str(Path(tmp) / "plan.rank{rank}.mlir"), str(feeds_path), str(pieces_path),
                "--steps", str(options.steps),
            ]
            if options.trace:
                worker += ["--trace", str(Path(options.trace).resolve())]
            if options.params:
                worker += ["--params", str(Path(options.params).resolve())]
            errors = Path(tmp) / "errors"
            errors.mkdir(mode=0o700)
            worker += ["--errors", str(errors)]
            # mpiexec reports a rank that died (its pid and exit code) on
            # stdout; it goes to a file, shown after the job and read for the
            # failure message.
            launcher = Path(tmp) / "launcher.out"
            watch = DeathWatch(errors, options.ranks)
            try:
                code = _run_job(command(options.ranks, "sbpc.runtime.worker", *worker, hosts=hosts), launcher,
                                options.timeout, watch, hosts)
            except KeyboardInterrupt:
                where = describe_progress(errors, options.ranks)
                print(f"sbp-run: interrupted; the {options.ranks} ranks were stopped" + (f": {where}" if where else ""),
                      file=sys.stderr)
                return 130
            finally:
                watch.stop()
                sys.stdout.write(launcher.read_text() if launcher.exists() else "")
            if code != 0:
                reports = "; ".join(r.read_text() for r in sorted(errors.glob("rank*.err")))
                if reports:
                    # where the ranks that did not report were (a stuck one, say)
                    others = describe_progress(errors, options.ranks, skip=reported_ranks(errors))
                    reports += f"; {others}" if others else ""
                else:
                    reports = describe_failure(errors, options.ranks, launcher.read_text(), watch.stop(),
                                               hosts.elsewhere(options.ranks) if hosts is not None else ())
                print(f"sbp-run: error: {reports}" if reports else
                      f"sbp-run: the job failed (exit code {code})", file=sys.stderr)
                return 1
            with np.load(pieces_path) as data:
                by_rank: dict[int, dict] = {}
                for key in data.files:
                    rank_name, name = key.split("/", 1)
                    by_rank.setdefault(int(rank_name.removeprefix("rank")), {})[name] = (None, data[key])
            outputs = assemble_outputs(program, sorted(by_rank.items()))
            # the cast quiets mypy, which rightly notes an output named allow_pickle would set savez's flag
            np.savez(options.output, **cast("dict[str, Any]", outputs))
        with np.load(options.output) as out:
            for name in out.files:
                print(f"{name}: {list(out[name].shape)} {out[name].dtype}")
        if options.trace:
            from sbpc.runtime.trace_stats import load_events, stats

            figures = stats(load_events(options.trace))
            idle = ", ".join(f"rank {r} {f:.0%}" for r, f in sorted(figures.idle_fraction.items()))
            print(f"trace: {options.trace}: {figures.span_us / 1e3:.1f} ms; compute idle {idle}; "
                  f"bubble fraction {figures.bubble_fraction:.2f}")
        return 0
    except (ParseError, DiagnosticException, RuntimeFailure, OSError, ValueError) as e:
        print(f"sbp-run: error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
