"""Where users meet the simulator from the command line: sbp-sim
(`tools/sbp_sim.py`) prints a prediction, names the field of a bad
cluster file, and compares with a real trace (--compare)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from sbpc.tools.sbp_sim import main

ROOT = Path(__file__).resolve().parents[3]


TRAIN = str(ROOT / "examples" / "mlp_train.mlir")


def test_sbp_sim_prints_a_prediction(capsys):
    assert main([TRAIN, "--cluster", "cpu", "-n", "4"]) == 0
    out = capsys.readouterr().out
    assert "predicted step" in out and "critical path" in out and "exposed-comm" in out


def test_sbp_sim_names_the_field_of_a_bad_cluster(tmp_path, capsys):
    bad = tmp_path / "c.json"
    data = json.loads(json.dumps(__import__("sbpc.perf.cluster", fromlist=["CPU"]).CPU.to_json()))
    data["levels"][0]["bandwidth"] = -1
    bad.write_text(json.dumps(data))
    assert main([TRAIN, "--cluster", str(bad)]) == 1
    assert "levels[0].bandwidth" in capsys.readouterr().err
    assert main([TRAIN, "--cluster", "no-such-preset"]) == 1
    assert "neither a preset" in capsys.readouterr().err


def test_compare_with_a_real_trace(tmp_path, capsys):
    trace = tmp_path / "trace.json"
    done = subprocess.run([sys.executable, "-m", "sbpc.tools.sbp_run", TRAIN, "-n", "4", "--steps", "3",
                           "--trace", str(trace), "-o", str(tmp_path / "out.npz"), "--timeout", "120"],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert main([TRAIN, "--cluster", "cpu", "-n", "4", "--compare", str(trace)]) == 0
    out = capsys.readouterr().out
    assert "measured step" in out and "kernels in total" in out and "lg.matmul" in out


def test_compare_measures_the_steady_state_as_the_prediction(tmp_path, capsys):
    """A trace's first step pays what a run pays once (a kernel's first call
    took 1.5 ms where the next took 0.1): the comparison measures the steps
    after it, as the prediction is of the steps after its first."""
    from sbpc.dialects import plan
    from sbpc.tools.sbp_sim import load_plan

    module = load_plan(TRAIN, "compile")
    actor = next(a for p in plan.programs(module) for d in p.devices() for a in d.actors()
                 if isinstance(a, plan.ComputeOp) and a.kernel.data == "lg.matmul")
    name = actor.sym_name.data
    starts_and_lengths = [(0, 1500), (1500, 100), (1600, 100)]  # microseconds: a slow first step, then two
    events = [{"name": name, "ph": "X", "pid": 0, "tid": 0, "ts": ts, "dur": dur, "args": {"kernel": "lg.matmul"}}
              for ts, dur in starts_and_lengths]
    trace = tmp_path / "trace.json"
    trace.write_text(json.dumps({"traceEvents": events}))
    assert main([TRAIN, "--cluster", "cpu", "-n", "4", "--compare", str(trace)]) == 0
    out = capsys.readouterr().out
    assert "measured step 0.100 ms (2 steps in the trace after its first" in out, out
    row = next(line for line in out.splitlines() if line.strip().startswith("lg.matmul"))
    assert float(row.split()[1]) == 0.1, row  # one rank's 0.1 ms a step, the first step's 1.5 left out


def test_a_collective_costs_the_step_what_no_kernel_covers_and_once():
    """A collective's trace event runs from its issue to where the thread
    found it complete, over kernels the thread ran meanwhile: the comparison
    counts the rest, and a stretch two collectives in flight together were
    waited for in counts once."""
    from sbpc.tools.sbp_sim import exposed

    kernels = [(100.0, 400.0), (500.0, 900.0)]
    assert exposed(kernels, [(0.0, 1000.0)]) == [300.0]  # 0-100, 400-500, 900-1000
    assert exposed(kernels, [(150.0, 350.0)]) == [0.0]  # issued and completed inside one kernel's time
    # two in flight over the same gaps: the first issued is given them, the
    # second only what lies past the first's end; answers in the spans' order
    assert exposed(kernels, [(420.0, 1100.0), (0.0, 1000.0)]) == [100.0, 300.0]
    assert exposed([], [(0.0, 10.0), (5.0, 20.0)]) == [10.0, 10.0]
