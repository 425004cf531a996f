"""The MPI runtime through real mpiexec: sbp-run on example models on 1, 2
and 4 ranks matches the reference interpreter; traces are valid Chrome JSON
with computation and communication overlapping; bad feeds are rejected
before anything runs; a raising kernel or a killed rank ends the job with a
message naming the rank and actor."""

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import sbpc
from sbpc.runtime.launch import rank_environment, script_command
from sbpc.semantics.reference import evaluate
from sbpc.tools.sbp_run import generated_feeds, load_program

ROOT = Path(__file__).resolve().parents[3]
SUPPORT = Path(__file__).resolve().parents[1] / "support"
EXAMPLES = ROOT / "examples"
MEGATRON = ROOT / "test" / "filecheck" / "passes" / "sbp-infer" / "megatron-mlp.mlir"

PLACEMENTS = {
    # (model, rank count) -> the placement line that replaces the model's own
    "mlp": (
        "sbp.placement @dp cpu ranks [0, 1] mesh [2]",
        {1: "[0] mesh [1]", 2: "[0, 1] mesh [2]", 4: "[0, 1, 2, 3] mesh [4]"},
    ),
    "megatron": (
        "sbp.placement @tp cpu ranks [0, 1] mesh [2]",
        {1: "[0] mesh [1]", 2: "[0, 1] mesh [2]", 4: "[0, 1, 2, 3] mesh [4]"},
    ),
    "gpt_block": (
        "sbp.placement @mesh cpu ranks [0, 1, 2, 3] mesh [2, 2]",
        {1: "[0] mesh [1, 1]", 2: "[0, 1] mesh [1, 2]", 4: "[0, 1, 2, 3] mesh [2, 2]"},
    ),
}
SOURCES = {"mlp": EXAMPLES / "mlp.mlir", "megatron": MEGATRON, "gpt_block": EXAMPLES / "gpt_block.mlir"}


def model_on(model: str, ranks: int, tmp_path: Path) -> Path:
    line, meshes = PLACEMENTS[model]
    text = SOURCES[model].read_text()
    assert line in text
    name = line.split()[1]
    path = tmp_path / f"{model}_{ranks}.mlir"
    path.write_text(text.replace(line, f"sbp.placement {name} cpu ranks {meshes[ranks]}"))
    return path


def sbp_run(*args, timeout=120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "sbpc.tools.sbp_run", *map(str, args)], capture_output=True, text=True, timeout=timeout
    )


@pytest.mark.parametrize("model, ranks", [
    # each model once and each rank count once; make test-all runs the 3 x 3
    ("mlp", 1), ("megatron", 4), ("gpt_block", 2),
    *(pytest.param(m, r, marks=pytest.mark.full) for m, r in [
        ("mlp", 2), ("mlp", 4), ("megatron", 1), ("megatron", 2), ("gpt_block", 1), ("gpt_block", 4)]),
])
def test_sbp_run_matches_the_reference(model, ranks, tmp_path):
    path = model_on(model, ranks, tmp_path)
    out = tmp_path / "out.npz"
    done = sbp_run(path, "-n", ranks, "--seed", 3, "-o", out)
    assert done.returncode == 0, done.stderr
    _, program = load_program(str(path), "compile")
    feeds = generated_feeds(program, 3)
    expected = evaluate(sbpc.parse_module(path.read_text()), feeds)
    with np.load(out) as got:
        assert set(got.files) == set(expected)
        for name in expected:
            np.testing.assert_allclose(got[name], expected[name], rtol=1e-4, atol=1e-5, err_msg=f"{model} on {ranks}")


def test_trace_is_chrome_json_and_shows_overlap(tmp_path):
    """Two gradient all_reduces, each issued as its gradient is ready (not
    bucketed: in one bucket they would wait for the last), overlap the
    backward's kernels."""
    trace = tmp_path / "trace.json"
    done = sbp_run(EXAMPLES / "mlp_train.mlir", "-n", 4, "--steps", 6, "--trace", trace, "-o", tmp_path / "o.npz",
                   "-p", "compile{bucket=false}")
    assert done.returncode == 0, done.stderr
    data = json.loads(trace.read_text())
    slices = [e for e in data["traceEvents"] if e["ph"] == "X"]
    assert {e["pid"] for e in slices} == {0, 1, 2, 3}
    assert all({"name", "ts", "dur", "tid"} <= e.keys() for e in slices)
    comm = [e for e in slices if e["tid"] == 1]
    compute = [e for e in slices if e["tid"] == 0]
    assert all(e["args"]["bytes"] > 0 for e in comm if e["args"]["kind"] == "all_reduce")
    overlapping = [
        (c, k) for c in comm for k in compute
        if c["pid"] == k["pid"] and k["ts"] < c["ts"] + c["dur"] and c["ts"] < k["ts"] + k["dur"]
    ]
    assert overlapping, "no compute slice ran while a collective was in flight"
    # the ranks share their host's clock: no rank completes an all_reduce
    # before every rank has issued it
    for name in {c["name"] for c in comm if c["args"]["kind"] == "all_reduce"}:
        per_rank = [sorted((c for c in comm if c["name"] == name and c["pid"] == r), key=lambda c: c["ts"])
                    for r in range(4)]
        for together in zip(*per_rank, strict=True):
            last_issue = max(c["ts"] for c in together)
            assert all(c["ts"] + c["dur"] >= last_issue for c in together), (name, together)


RESHAPE_IN_PLACE = """
sbp.placement @one cpu ranks [0] mesh [1]
lg.graph @g on @one {
  %x = lg.input "x" : tensor<4x6xf32>
  %y = lg.exp %x : tensor<4x6xf32>
  %r = lg.reshape %y : tensor<4x6xf32> -> tensor<24xf32>
  %z = lg.tanh %r : tensor<24xf32>
  lg.output ["z"] %z : tensor<24xf32>
}
"""


def _run_one_rank_traced(tmp_path, text: str):
    """`text` run by sbp-run on one rank for 2 steps: the names of its trace
    slices, its compiled program, its generated feeds and its outputs."""
    path, trace, out = tmp_path / "g.mlir", tmp_path / "trace.json", tmp_path / "out.npz"
    path.write_text(text)
    done = sbp_run(path, "-n", 1, "--steps", 2, "--trace", trace, "-o", out, "--seed", 1)
    assert done.returncode == 0, done.stderr
    names = [e["name"] for e in json.loads(trace.read_text())["traceEvents"] if e["ph"] == "X"]
    _, program = load_program(str(path), "compile")
    with np.load(out) as got:
        outputs = dict(got)
    return names, program, generated_feeds(program, 1), outputs


def test_a_reshape_written_over_its_input_runs_nothing(tmp_path):
    """The memory plan puts the reshape's output on its dying input's bytes:
    the runtime skips the actor (no trace slice), the result is right, and
    the simulator prices it at nothing."""
    from sbpc.dialects import plan
    names, program, feeds, got = _run_one_rank_traced(tmp_path, RESHAPE_IN_PLACE)
    assert names == ["y.exp", "z.tanh"] * 2, names
    device = program.devices()[0]
    reshape = next(a for a in device.actors() if a.sym_name.data == "r.reshape")
    assert plan.does_nothing(reshape)
    np.testing.assert_allclose(got["z"], np.tanh(np.exp(feeds["x"])).reshape(24), rtol=1e-6)
    kernels = sbpc.compile(RESHAPE_IN_PLACE).predict("cpu").devices[0].kernels
    assert kernels.get("lg.reshape", 0.0) == 0.0 and kernels["lg.exp"] > 0, kernels


SLICES_IN_PLACE = """
sbp.placement @one cpu ranks [0] mesh [1]
lg.graph @g on @one {
  %x = lg.input "x" : tensor<6x8xf32>
  %y = lg.exp %x : tensor<6x8xf32>
  %a = lg.slice %y starts [2, 0] limits [4, 8] strides [1, 1] : tensor<6x8xf32> -> tensor<2x8xf32>
  %c = lg.slice %y starts [0, 2] limits [6, 6] strides [1, 1] : tensor<6x8xf32> -> tensor<6x4xf32>
  %z = lg.tanh %a : tensor<2x8xf32>
  %w = lg.neg %c : tensor<6x4xf32>
  lg.output ["z", "w"] %z, %w : tensor<2x8xf32>, tensor<6x4xf32>
}
"""


def test_a_slice_on_one_run_of_its_input_runs_nothing(tmp_path):
    """Rows 2..3 are one run of the input's bytes: the memory plan puts the
    slice's output there and the runtime skips it (no trace slice); the
    columns are no run and are copied. Both results are right."""
    from sbpc.dialects import plan
    names, program, feeds, got = _run_one_rank_traced(tmp_path, SLICES_IN_PLACE)
    assert names == ["y.exp", "c.slice", "z.tanh", "w.neg"] * 2, names
    actors = {a.sym_name.data: a for a in program.devices()[0].actors()}
    assert plan.does_nothing(actors["a.slice"]) and not plan.does_nothing(actors["c.slice"])
    y = np.exp(feeds["x"])
    np.testing.assert_allclose(got["z"], np.tanh(y[2:4]), rtol=1e-6)
    np.testing.assert_allclose(got["w"], -y[:, 2:6], rtol=1e-6)


CONCAT_IN_PLACE = """
sbp.placement @one cpu ranks [0] mesh [1]
lg.graph @g on @one {
  %x = lg.input "x" : tensor<4x8xf32>
  %z = lg.input "z" : tensor<16xf32>
  %y = lg.exp %x : tensor<4x8xf32>
  %r = lg.reshape %y : tensor<4x8xf32> -> tensor<32xf32>
  %t = lg.tanh %z : tensor<16xf32>
  %c = lg.concat %t, %r axis 0 : (tensor<16xf32>, tensor<32xf32>) -> tensor<48xf32>
  %n = lg.neg %c : tensor<48xf32>
  lg.output ["n"] %n : tensor<48xf32>
}
"""


def test_a_concatenation_of_runs_of_its_output_runs_nothing(tmp_path):
    """The memory plan puts the concatenation's inputs (the tanh's result,
    and the exp's through its reshape) on their runs of its output: the
    kernels computing them write there, the concatenation is skipped, and
    the result is right."""
    from sbpc.dialects import plan
    names, program, feeds, got = _run_one_rank_traced(tmp_path, CONCAT_IN_PLACE)
    assert names == ["y.exp", "t.tanh", "n.neg"] * 2, names
    actors = {a.sym_name.data: a for a in program.devices()[0].actors()}
    assert plan.does_nothing(actors["c.concat"])
    want = -np.concatenate([np.tanh(feeds["z"]), np.exp(feeds["x"]).reshape(32)])
    np.testing.assert_allclose(got["n"], want, rtol=1e-6)


def test_bad_feeds_are_rejected_before_running(tmp_path):
    feeds = tmp_path / "feeds.npz"
    np.savez(feeds, x=np.zeros((32, 64), np.float32), label=np.zeros(32, np.int64))
    done = sbp_run(EXAMPLES / "mlp.mlir", "-n", 2, "--feeds", feeds)
    assert done.returncode == 1
    assert "feed 'label' is not an input of @mlp" in done.stderr
    np.savez(feeds, x=np.zeros((32, 65), np.float32), labels=np.zeros(32, np.int64))
    done = sbp_run(EXAMPLES / "mlp.mlir", "-n", 2, "--feeds", feeds)
    assert "feed 'x': expected shape [32, 64], got [32, 65]" in done.stderr
    np.savez(feeds, x=np.zeros((32, 64), np.float32), labels=np.zeros(32, np.float32))
    done = sbp_run(EXAMPLES / "mlp.mlir", "-n", 2, "--feeds", feeds)
    assert "feed 'labels': expected int64 values, got float32" in done.stderr
    assert "Traceback" not in done.stderr


def test_checking_feeds_does_not_walk_the_plan_each_step():
    """train_step checks its feeds on the driver and on every rank each step;
    walking every register of the plan there cost ~10 ms of CPU per step on
    a 2-layer GPT (the API at 0.84x of in-rank speed)."""
    from sbpc.runtime.program import check_feeds, feed_types

    exe = sbpc.compile(sbpc.parse_module((EXAMPLES / "mlp.mlir").read_text()), mode="interpret")
    first = feed_types(exe.program)
    assert set(first) == {"x", "labels"} and feed_types(exe.program) is first
    checked = check_feeds(exe.program, {"x": np.zeros((32, 64), np.float32), "labels": np.zeros(32, np.int64)})
    assert checked["x"].shape == (32, 64) and feed_types(exe.program) is first


GATHER = """
sbp.placement @m cpu ranks [0, 1] mesh [2]
lg.graph @lookup on @m {
  %t = lg.param "table" init #lg.normal<0.0, 1.0> : tensor<4x8xf32>
  %tb = sbp.annotate %t : tensor<4x8xf32> -> !sbp.dtensor<4x8xf32, @m, B>
  %ids = lg.input "ids" : tensor<6xi64>
  %e = lg.embedding %tb, %ids : (!sbp.dtensor<4x8xf32, @m, B>, tensor<6xi64>) -> tensor<6x8xf32>
  %s = lg.reduce_sum %e axes [0, 1] : tensor<6x8xf32> -> tensor<f32>
  lg.output ["s"] %s : tensor<f32>
}
"""


def test_a_raising_kernel_ends_every_rank_with_its_place(tmp_path):
    path = tmp_path / "lookup.mlir"
    path.write_text(GATHER)
    feeds = tmp_path / "feeds.npz"
    np.savez(feeds, ids=np.array([0, 1, 2, 3, 9, 1], np.int64))  # 9 is no row of the table
    start = time.monotonic()
    done = sbp_run(path, "-n", 2, "--feeds", feeds, timeout=60)
    assert time.monotonic() - start < 30
    assert done.returncode == 1
    assert "sbpc: rank " in done.stderr
    # (the table it reads is the parameter or a piece of it, as sbp-infer chose)
    assert re.search(r"actor @e\.embedding \(lg\.embedding\) reading \[@\w+, @ids\] writing \[@e\]", done.stderr)
    assert "index out of range [0, 4)" in done.stderr
    # the driver's own line, from the failing rank's error file (mpiexec's
    # forwarded stderr may be cut off by the abort)
    line = next(ln for ln in done.stderr.splitlines() if ln.startswith("sbp-run: error: "))
    assert "actor @e.embedding (lg.embedding)" in line and "index out of range [0, 4)" in line


def test_flat_range_agrees_with_numpy_on_every_region():
    """A collective reads or writes a piece in place only where the piece is
    one contiguous run of its register: checked against the flat indices
    numpy gives for every region of a few small shapes."""
    import itertools

    from sbpc.dialects.pieces import flat_range, in_order

    for full in [(), (5,), (3, 4), (2, 3, 4), (1, 4, 1)]:
        ranges = [[slice(a, b) for a in range(n) for b in range(a + 1, n + 1)] for n in full]
        index = np.arange(int(np.prod(full))).reshape(full)
        for region in itertools.product(*ranges):
            flat = index[region].reshape(-1)
            contiguous = bool(np.all(np.diff(flat) == 1))
            got = flat_range(region, full)
            assert (got is not None) == contiguous, (full, region)
            if got is not None:
                assert got == (int(flat[0]), int(flat[-1]) + 1)
    rows = [(slice(0, 2), slice(0, 4)), (slice(2, 3), slice(0, 4))]
    assert in_order(rows, (3, 4))
    assert not in_order(rows[::-1], (3, 4))
    assert not in_order([(slice(0, 3), slice(0, 2)), (slice(0, 3), slice(2, 4))], (3, 4))


def test_staged_elements_count_what_the_runtime_packs_and_unpacks():
    """What a rank copies around MPI for a communication (the simulator
    prices it): nothing where the pieces lie back to back in the buffer MPI
    reads or writes, every element where they do not."""
    from sbpc.dialects.pieces import staged_elements

    rows = {0: (slice(0, 4), slice(0, 6)), 1: (slice(4, 8), slice(0, 6))}
    columns = {0: (slice(0, 8), slice(0, 3)), 1: (slice(0, 8), slice(3, 6))}
    whole = {0: (slice(0, 8), slice(0, 6)), 1: (slice(0, 8), slice(0, 6))}
    group = (0, 1)
    assert staged_elements("all_gather", rows, whole, group, 0) == (0, 0)
    assert staged_elements("all_gather", columns, whole, group, 1) == (0, 48)  # unpacked into columns
    assert staged_elements("reduce_scatter", whole, rows, group, 0) == (0, 0)
    assert staged_elements("reduce_scatter", whole, columns, group, 0) == (48, 0)  # packed by columns
    # its own quarter straight from its piece to its result, the other's
    # quarter packed; unpacked: only what the other sent
    assert staged_elements("all_to_all", rows, columns, group, 0) == (24, 12)
    assert staged_elements("all_reduce", whole, whole, group, 0) == (0, 0)
    # a transfer: rank 0 keeps its rows and sends nothing; rank 1 sends its rows to 0
    assert staged_elements("transfer", rows, {0: whole[0]}, group, 0) == (24, 24)
    assert staged_elements("transfer", rows, {0: whole[0]}, group, 1) == (24, 0)



def test_staging_lends_the_smallest_free_buffer_that_holds_a_take():
    """A take reuses the smallest free buffer that holds it (a new one where
    none does), shaped and typed as asked; given back, its bytes are free
    again."""
    from sbpc.runtime.collectives import Staging

    staging = Staging()
    first: list[np.ndarray] = []
    big = staging.take((4, 8), np.dtype(np.float32), first)  # 128 bytes
    small = staging.take((3,), np.dtype(np.float64), first)  # 24 bytes
    assert big.shape == (4, 8) and big.dtype == np.float32 and small.shape == (3,) and small.dtype == np.float64
    assert not np.shares_memory(big, small)
    staging.give_back(first)
    assert first == [] and staging.bytes_held == 128 + 24
    second: list[np.ndarray] = []
    again = staging.take((5,), np.dtype(np.int32), second)  # 20 bytes: the 24-byte buffer
    assert np.shares_memory(again, small) and again.shape == (5,) and again.dtype == np.int32
    larger = staging.take((40,), np.dtype(np.float32), second)  # 160 bytes: none free holds it
    assert not np.shares_memory(larger, big)
    assert staging.bytes_held == 128


def resharded_chain(links: int, n: int) -> str:
    """x (n x n, split by rows) squared `links` times, each product hinted
    split the other way: an all_to_all before each."""
    def t(axis: int) -> str:
        return f"!sbp.dtensor<{n}x{n}xf32, @m, S<{axis}>>"

    lines = ["sbp.placement @m cpu ranks [0, 1] mesh [2]", "lg.graph @g on @m {", f'  %v0 = lg.input "x" : {t(0)}']
    for i in range(links):
        a, b = i % 2, (i + 1) % 2
        lines.append(f"  %v{i + 1} = lg.mul %v{i}, %v{i} : ({t(a)}, {t(a)}) -> {t(b)}")
    lines += [f'  lg.output ["y"] %v{links} : {t(links % 2)}', "}"]
    return "\n".join(lines)


def test_collectives_share_their_packing_buffers_and_allocate_none_in_a_steady_step(tmp_path):
    """Five all_to_alls in a chain (each rank sends a quarter of a 256x256
    tensor and receives a quarter) pack into buffers of the rank's Staging,
    taken at issue and given back once unpacked: one collective is in
    flight at a time, so a rank holds one send and one receive buffer
    (128 KiB), not a pair per collective (640 KiB), and a steady-state
    issue allocates none (what it does allocate, a few KiB, is the
    request's Python objects)."""
    path = tmp_path / "resharded.mlir"
    path.write_text(resharded_chain(5, 256))
    done = subprocess.run(script_command(2, str(SUPPORT / "alloc_probe.py"), str(path)), capture_output=True,
                          text=True, timeout=180, env=rank_environment())
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout.strip().splitlines()[-1])
    moves = {name: rise for name, rise in report["per_comm"].items() if "(all_to_all)" in name}
    assert len(moves) == 5, report["per_comm"]
    quarter = 256 * 256 // 4 * 4
    assert report["staging_held"] == 2 * quarter, report
    worst = max(moves.items(), key=lambda kv: kv[1])
    assert worst[1] <= 8192, f"{worst[0]} allocated {worst[1]} bytes in a steady-state issue"


RESHAPE_VIEW = """
sbp.placement @one cpu ranks [0] mesh [1]
lg.graph @g on @one {
  %x = lg.input "x" : tensor<4x6xf32>
  %y = lg.exp %x : tensor<4x6xf32>
  %r = lg.reshape %y : tensor<4x6xf32> -> tensor<24xf32>
  %a = lg.tanh %r : tensor<24xf32>
  %b = lg.neg %y : tensor<4x6xf32>
  %c = lg.reshape %b : tensor<4x6xf32> -> tensor<24xf32>
  %d = lg.add %a, %c : (tensor<24xf32>, tensor<24xf32>) -> tensor<24xf32>
  lg.output ["d"] %d : tensor<24xf32>
}
"""


def test_a_reshape_whose_input_lives_on_is_a_view_and_runs_nothing(tmp_path):
    """The memory plan makes a reshape's result a view of its input's bytes
    even where the input is read again: the runtime skips both reshapes
    (no trace slices), nothing writes over the view while its input is
    still read, and the result is numpy's."""
    names, _, feeds, got = _run_one_rank_traced(tmp_path, RESHAPE_VIEW)
    assert "r.reshape" not in names and "c.reshape" not in names, names
    y = np.exp(feeds["x"]).reshape(24)
    # tanh(y) - y cancels: an ulp of exp's or tanh's result (which the CPU's
    # vector kernels may round either way) is an error of about eps * y in d
    # (1e-6 of d on a 2-core Intel Xeon, 2026-12-01), so the bound is that.
    bound = 1e-6 * np.abs(np.tanh(y) - y) + 4 * np.finfo(np.float32).eps * y
    assert np.all(np.abs(got["d"] - (np.tanh(y) - y)) <= bound), (got["d"], np.tanh(y) - y)

BOXING = ROOT / "test" / "filecheck" / "passes" / "sbp-insert-boxing"


@pytest.mark.parametrize("name", ["one-d.mlir", "two-d.mlir", "uneven-and-placements.mlir"])
def test_every_boxing_of_the_lit_tests_runs_on_mpi_ranks_as_the_reference(name):
    """Each graph of the boxing lit tests (one redistribution each: slices,
    make_partial, the collectives, transfers between placements, uneven
    pieces) compiled and run on MPI ranks: its output is the reference's.
    The lit tests check which collectives are planned, this what the
    runtime makes of them. A graph whose input is partial cannot be fed
    and is refused by name."""
    from sbpc.dialects import lg

    ran = 0
    for i, chunk in enumerate((BOXING / name).read_text().split("// -----")):
        text = "\n".join(line for line in chunk.splitlines() if not line.lstrip().startswith("//"))
        if "lg.graph" not in text:
            continue
        graph = next(op for op in sbpc.parse_module(text).ops if isinstance(op, lg.GraphOp))
        rng = np.random.default_rng(i)
        feeds = {op.key.data: rng.normal(size=op.result.type.get_shape()).astype(np.float32)
                 for op in graph.body.ops if isinstance(op, lg.InputOp)}
        try:
            exe = sbpc.compile(sbpc.parse_module(text))
        except ValueError as e:
            assert "'lg.input': the hint" in str(e) and "P" in str(e).split("the hint")[1].split("on its")[0], str(e)
            continue
        expected = evaluate(sbpc.parse_module(text), feeds)
        got = exe.run(feeds)
        for key, value in expected.items():
            np.testing.assert_allclose(got[key], value, rtol=1e-5, atol=1e-6, err_msg=f"{name} graph {i}: {key}")
        ran += 1
    assert ran >= 3


def test_updates_the_memory_plan_could_not_alias_are_copied_over_their_parameters(tmp_path):
    """compile{in_place=false} gives every update its own bytes, so after each
    step the runtime copies it over its parameter (Executor._write_back)
    instead of the optimizer writing in place: three steps of momentum SGD
    on 2 ranks end with the same weights, momenta and loss either way."""
    outputs = {}
    for in_place in ("true", "false"):
        out, emitted = tmp_path / f"o_{in_place}.npz", tmp_path / f"plan_{in_place}.mlir"
        done = sbp_run(EXAMPLES / "mlp.mlir", "-n", 2, "--steps", 3, "-o", out, "--emit-plan", emitted, "-p",
                       f"lg-autodiff,lg-optimizer{{algorithm=momentum}},compile{{in_place={in_place}}}")
        assert done.returncode == 0, done.stderr
        outputs[in_place] = dict(np.load(out))
        assert (" alias @" in emitted.read_text()) == (in_place == "true")
    assert {k for k in outputs["true"] if k.startswith("new.")} >= {"new.w1", "new.momentum.w1"}
    for key, value in outputs["true"].items():
        np.testing.assert_array_equal(outputs["false"][key], value, err_msg=key)
