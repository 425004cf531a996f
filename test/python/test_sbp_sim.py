"""Where users meet the simulator: sbp-sim (with --compare against a real
trace), Executable.predict, and plans lowered for one device per class."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from xdsl.context import Context

from sbpc.dialects import parse_module, plan
from sbpc.dialects.plan import REPRESENTATIVES
from sbpc.lowering.compile import CompilePass
from sbpc.perf.step_time import simulate_plan
from sbpc.runtime.program import RuntimeFailure, find_program
from sbpc.tools.sbp_sim import main

ROOT = Path(__file__).resolve().parents[2]
TRAIN = str(ROOT / "examples" / "mlp_train.mlir")

STAGES = """
sbp.placement @s0 cpu ranks [0, 1, 2, 3] mesh [4]
sbp.placement @s1 cpu ranks [4, 5, 6, 7] mesh [4]
lg.graph @g on @s0 {
  %x = lg.input "x" : !sbp.dtensor<16x8xf32, @s0, S<0>>
  %w = lg.param "w" init #lg.normal<0.0, 0.1> : tensor<8x8xf32>
  %y = lg.matmul %x, %w : (!sbp.dtensor<16x8xf32, @s0, S<0>>, tensor<8x8xf32>) -> tensor<16x8xf32>
  %z = sbp.annotate %y : tensor<16x8xf32> -> !sbp.dtensor<16x8xf32, @s1, S<0>>
  %v = lg.param "v" init #lg.normal<0.0, 0.1> : !sbp.dtensor<8x8xf32, @s1, B>
  %o = lg.matmul %z, %v : (!sbp.dtensor<16x8xf32, @s1, S<0>>, !sbp.dtensor<8x8xf32, @s1, B>) -> tensor<16x8xf32>
  %s = lg.reduce_sum %o axes [0, 1] : tensor<16x8xf32> -> tensor<f32>
  %b = sbp.annotate %s : tensor<f32> -> !sbp.dtensor<f32, @s1, B>
  lg.output ["s"] %b : !sbp.dtensor<f32, @s1, B>
}
"""


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


def test_representatives_plan_one_device_per_class_and_cannot_run():
    full = parse_module(STAGES)
    CompilePass().apply(Context(), full)
    reps = parse_module(STAGES)
    CompilePass(representatives=True).apply(Context(), reps)
    program = plan.programs(reps)[0]
    assert [d.rank.value.data for d in program.devices()] == [0, 4]
    assert REPRESENTATIVES in program.attributes
    with pytest.raises(RuntimeFailure, match="one device per equivalence class"):
        find_program(reps)
    exact = simulate_plan(full, __import__("sbpc.perf.cluster", fromlist=["preset"]).preset("h100-node"))
    classes = simulate_plan(reps, __import__("sbpc.perf.cluster", fromlist=["preset"]).preset("h100-node"))
    assert exact.simulated == 8 and classes.simulated == 2 and classes.total_devices == 8
    assert classes.step_time == pytest.approx(exact.step_time, rel=1e-6)
    assert sorted(d.represents for d in classes.devices) == [4, 4]


def test_executable_predict():
    import sbpc

    exe = sbpc.compile(parse_module(STAGES))
    p = exe.predict("h100-node")
    assert p.step_time > 0 and p.fits and p.total_devices == 8
    assert exe.predict("cpu", devices=8).step_time > p.step_time  # a CPU is slower than an H100


def test_compare_with_a_real_trace(tmp_path, capsys):
    trace = tmp_path / "trace.json"
    done = subprocess.run([sys.executable, "-m", "sbpc.tools.sbp_run", TRAIN, "-n", "4", "--steps", "3",
                           "--trace", str(trace), "-o", str(tmp_path / "out.npz"), "--timeout", "120"],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert main([TRAIN, "--cluster", "cpu", "-n", "4", "--compare", str(trace)]) == 0
    out = capsys.readouterr().out
    assert "measured step" in out and "kernels in total" in out and "lg.matmul" in out


GATHER = """
sbp.placement @p cpu ranks [0, 1] mesh [2]
lg.graph @g on @p {
  %x = lg.input "x" : !sbp.dtensor<512x512xf32, @p, SPLIT>
  %y = sbp.annotate %x : !sbp.dtensor<512x512xf32, @p, SPLIT> -> !sbp.dtensor<512x512xf32, @p, B>
  lg.output ["y"] %y : !sbp.dtensor<512x512xf32, @p, B>
}
"""


def test_a_gather_the_runtime_unpacks_costs_its_copy():
    """An all_gather of columns is received into a buffer and copied into
    place (runtime/collectives.py); one of rows lands in place. The same
    bytes cross, so the prediction differs by that copy alone."""
    from sbpc.perf.cluster import preset
    from sbpc.perf.step_time import copy_time

    cpu = preset("cpu")
    times = {}
    for split in ("S<0>", "S<1>"):
        module = parse_module(GATHER.replace("SPLIT", split))
        CompilePass().apply(Context(), module)
        times[split] = simulate_plan(module, cpu).step_time
    assert times["S<1>"] - times["S<0>"] == pytest.approx(copy_time(512 * 512 * 4, cpu), rel=1e-3)


def test_ranks_bound_to_shared_cpus_compute_faster_while_their_cpu_mates_wait():
    """Two pipeline stages of 4 ranks on 4 CPUs, bound round robin: rank i
    of stage 0 and rank i of stage 1 share a CPU. The calibrated rates were
    timed with both computing; while one stage waits for the other the
    other runs alone, faster (perf/step_time._shared_processors). Where the
    binding is not known, every task keeps its calibrated time."""
    from dataclasses import replace

    from sbpc.perf.cluster import preset

    module = parse_module(STAGES.replace("16x8", "1024x256").replace("8x8", "256x256"))  # compute-bound
    CompilePass().apply(Context(), module)
    cpu = preset("cpu").resized(8)
    unbound = replace(cpu, levels=(replace(cpu.levels[0], cores=0),))
    bound = replace(cpu, levels=(replace(cpu.levels[0], cores=4),))
    assert bound.ranks_per_cpu() == 2 and bound.cpu_of(0) == bound.cpu_of(4) == (0, 0)
    assert unbound.ranks_per_cpu() == 1 and unbound.cpu_of(0) is None
    alone, shared = simulate_plan(module, unbound), simulate_plan(module, bound)
    # the stages compute one after the other (one input, no micro-batches):
    # each kernel runs alone on its CPU, at twice the calibrated rate; the
    # transfer between them does not shrink (0.71 of the time when written)
    assert 0.5 < shared.step_time / alone.step_time < 0.8
