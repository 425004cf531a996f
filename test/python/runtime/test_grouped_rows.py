"""Rows grouped by expert (G) on MPI ranks: every collective into and out of
them, sized from group ends computed at run time, gives what the reference
interpreter computes, on 2 and 4 ranks, with the experts' load even, lopsided
and with rows in no group; the plan and sbp interpreters agree."""

import json
import subprocess
from pathlib import Path

import numpy as np
import pytest
from xdsl.context import Context

import sbpc
from sbpc.dialects import plan as plan_dialect
from sbpc.lowering.sbp_infer import SbpInferPass
from sbpc.lowering.sbp_insert_boxing import SbpInsertBoxingPass
from sbpc.runtime.launch import rank_environment, script_command
from sbpc.semantics.reference import evaluate
from sbpc.semantics.sbp_interpreter import evaluate_distributed

ROWS, DIM, EXPERTS = 16, 8, 4
SUPPORT = Path(__file__).resolve().parents[1] / "support"


def graph(ranks: int, x_sbp: str, out_sbp: str, partial_input: bool = False, rows: int = ROWS, dim: int = DIM) -> str:
    """Two experts' layers between rows distributed as `x_sbp` and a result
    asked for as `out_sbp`: sbp-infer groups the rows between the layers and
    insert-boxing moves them in and out. With `partial_input` the rows are a
    matmul's partial sums (S(1) times S(0))."""
    first = f'%x = lg.input "x" : !sbp.dtensor<{rows}x{dim}xf32, @m, {x_sbp}>'
    if partial_input:
        first = (f'%a = lg.input "a" : !sbp.dtensor<{rows}x{dim}xf32, @m, S<1>>\n'
                 f'  %b = lg.input "b" : !sbp.dtensor<{dim}x{dim}xf32, @m, S<0>>\n'
                 f'  %x = lg.matmul %a, %b : (!sbp.dtensor<{rows}x{dim}xf32, @m, S<1>>, '
                 f'!sbp.dtensor<{dim}x{dim}xf32, @m, S<0>>) -> !sbp.dtensor<{rows}x{dim}xf32, @m, P>')
    x_type = f"!sbp.dtensor<{rows}x{dim}xf32, @m, {'P' if partial_input else x_sbp}>"
    w = f"!sbp.dtensor<{EXPERTS}x{dim}x{dim}xf32, @m, S<0>>"
    ends = f"tensor<{EXPERTS}xi32>"
    rows_type = f"tensor<{rows}x{dim}xf32>"
    return f"""
sbp.placement @m cpu ranks [{", ".join(map(str, range(ranks)))}] mesh [{ranks}]
lg.graph @experts on @m {{
  {first}
  %counts = lg.input "counts" : tensor<{EXPERTS}xi32>
  %ends = lg.cumsum %counts axis 0 : tensor<{EXPERTS}xi32> -> tensor<{EXPERTS}xi32>
  %w1 = lg.param "w1" init #lg.normal<0.0, 0.5> seed 1 : {w}
  %w2 = lg.param "w2" init #lg.normal<0.0, 0.5> seed 2 : {w}
  %h = lg.grouped_matmul %x, %w1, %ends : ({x_type}, {w}, {ends}) -> {rows_type}
  %g = lg.tanh %h : {rows_type}
  %y = lg.grouped_matmul %g, %w2, %ends : ({rows_type}, {w}, {ends}) -> {rows_type}
  %z = lg.mul %y, %y : ({rows_type}, {rows_type}) -> {rows_type}
  %out = sbp.annotate %z : {rows_type} -> !sbp.dtensor<{rows}x{dim}xf32, @m, {out_sbp}>
  lg.output ["z"] %out : !sbp.dtensor<{rows}x{dim}xf32, @m, {out_sbp}>
}}
"""


LOADS = {
    "even": [4, 4, 4, 4],
    "lopsided": [0, 13, 0, 3],  # experts with no rows, one device with none
    "rows in no group": [2, 5, 0, 4],  # 11 of 16 rows routed: the rest are zeros
}


def feeds_for(text: str, counts, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    feeds = {"counts": np.asarray(counts, np.int32)}
    for key, shape in (("x", (ROWS, DIM)), ("a", (ROWS, DIM)), ("b", (DIM, DIM))):
        if f'"{key}"' in text:
            feeds[key] = rng.normal(size=shape).astype(np.float32)
    return feeds


def grouped_kinds(exe) -> set[str]:
    program = next(op for op in exe.module.ops if isinstance(op, plan_dialect.ProgramOp))
    return {a.kind.data for d in program.devices() for a in d.actors()
            if isinstance(a, plan_dialect.CommOp) and len(a.ins.data) == 2}


# (S<1>: rows reach their groups in two steps, through S<0>, each reading
# the ends of the value boxed)
CASES = [(2, "B", "B", False), (2, "S<0>", "S<0>", False), (2, "B", "B", True), (4, "S<0>", "B", False),
         (2, "S<1>", "B", False)]


@pytest.mark.parametrize("ranks, x_sbp, out_sbp, partial", CASES)
def test_grouped_rows_move_on_mpi_ranks_as_the_reference_computes(ranks, x_sbp, out_sbp, partial):
    text = graph(ranks, x_sbp, out_sbp, partial)
    exe = sbpc.compile(sbpc.parse_module(text))
    # the layers run on grouped rows, moved in and out by collectives that read the ends
    assert grouped_kinds(exe), exe.plan_text
    for load, counts in LOADS.items():
        feeds = feeds_for(text, counts)
        expected = evaluate(sbpc.parse_module(text), feeds)["z"]
        np.testing.assert_allclose(exe.run(feeds)["z"], expected, rtol=1e-5, atol=1e-6, err_msg=load)


def test_every_collective_into_and_out_of_grouped_rows_is_planned_somewhere():
    """The cases above, together, exercise each kind of grouped collective:
    B -> G (a local slice), S(0) <-> G (all_to_all), P -> G (reduce_scatter),
    G -> B (all_gather) and G -> P (make_partial) or another."""
    kinds = set()
    for ranks, x_sbp, out_sbp, partial in CASES:
        kinds |= grouped_kinds(sbpc.compile(sbpc.parse_module(graph(ranks, x_sbp, out_sbp, partial)),
                                            mode="interpret"))
    assert {"all_to_all", "reduce_scatter"} <= kinds and kinds & {"all_gather", "make_partial"}, kinds


@pytest.mark.parametrize("load", LOADS)
def test_the_interpreters_move_grouped_rows_as_the_reference(load):
    """The sbp interpreter (device by device, after insert-boxing) and the
    plan interpreter compute the reference's values."""
    text = graph(2, "S<0>", "S<0>")
    feeds = feeds_for(text, LOADS[load])
    expected = evaluate(sbpc.parse_module(text), feeds)["z"]
    boxed = sbpc.parse_module(text)
    SbpInferPass().apply(Context(), boxed)
    SbpInsertBoxingPass().apply(Context(), boxed)
    got = evaluate_distributed(boxed, feeds, rng=np.random.default_rng(0)).outputs["z"]
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)
    exe = sbpc.compile(sbpc.parse_module(text), mode="interpret")
    np.testing.assert_allclose(exe.run(feeds)["z"], expected, rtol=1e-5, atol=1e-6)


def _probe(tmp_path, text: str) -> dict[str, int]:
    """What each collective into or out of rows owned at run time allocated
    at its steady-state issue (support/alloc_probe.py on 2 ranks)."""
    path = tmp_path / "experts.mlir"
    path.write_text(text)
    done = subprocess.run(script_command(2, str(SUPPORT / "alloc_probe.py"), str(path)), capture_output=True,
                          text=True, timeout=180, env=rank_environment())
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout.strip().splitlines()[-1])
    return {name: rise for name, rise in report["per_comm"].items() if name.endswith(" grouped)")}


def test_a_grouped_collective_allocates_nothing_the_rows_would_need(tmp_path):
    """Grouped rows move in place, sized at each issue: in a steady-state
    step no collective into or out of them allocates more than a few
    counts, against 128 KiB of rows (the bound each rank stores)."""
    grouped = _probe(tmp_path, graph(2, "B", "B", partial_input=True, rows=1024, dim=32))
    assert {name.split("(")[1].split()[0] for name in grouped} >= {"all_gather", "reduce_scatter"}, grouped
    worst = max(grouped.items(), key=lambda kv: kv[1])
    assert worst[1] <= 4096, f"{worst[0]} allocated {worst[1]} bytes in a steady-state issue"


def test_gathered_rows_travel_in_buffers_made_at_load(tmp_path):
    """Rows gathered by an index move packed in buffers of the bound made
    when the plan loads: an issue allocates the lists of which rows go where
    (integers, two per row at most), never the rows (128 KiB here)."""
    rows = 1024
    moved = _probe(tmp_path, str(dispatch_graph(2, tokens=rows // 2, dim=32, hidden=32).module()))
    assert any("all_to_all" in name for name in moved), moved
    worst = max(moved.items(), key=lambda kv: kv[1])
    assert worst[1] <= 2 * 8 * rows + 4096, f"{worst[0]} allocated {worst[1]} bytes in a steady-state issue"


def dispatch_graph(ranks: int, tokens: int = 8, dim: int = 16, hidden: int = 32, experts: int = 4, k: int = 2):
    """A mixture's experts as transformers runs them, its tokens split over
    the ranks (S(0)): each routed copy of a token gathered by the sorted
    copies' token ids (`embedding`), its expert's two layers, and a loss.
    The tokens are a parameter here, so training reaches them back through
    the gather's gradient."""
    from sbpc import frontend as fe

    g = fe.Graph("dispatch", sbpc.placement("cpu", ranks))
    table = g.param("tokens", (tokens, dim), sbpc.normal(0, 1.0), seed=1, sbp=sbpc.S(0))
    ids = g.input("ids", (tokens * k,), "i32")
    ends = fe.cumsum(g.input("counts", (experts,), "i32"), 0)
    w1 = g.param("w1", (experts, dim, hidden), sbpc.normal(0, 0.3), seed=2, sbp=sbpc.S(0))
    w2 = g.param("w2", (experts, hidden, dim), sbpc.normal(0, 0.3), seed=3, sbp=sbpc.S(0))
    rows = fe.embedding(fe.tanh(table), ids)
    y = fe.grouped_matmul(fe.gelu(fe.grouped_matmul(rows, w1, ends)), w2, ends)
    g.output(loss=(y * y).mean())
    return g


def indexed_kinds(exe) -> set[str]:
    """The collectives into or out of rows gathered by an index (I)."""
    program = next(op for op in exe.module.ops if isinstance(op, plan_dialect.ProgramOp))
    return {a.kind.data for d in program.devices() for a in d.actors()
            if isinstance(a, plan_dialect.CommOp) and a.reads_index()}


@pytest.mark.parametrize("ranks", [2, 4])
def test_tokens_go_to_their_experts_by_an_all_to_all_and_train_as_on_one_device(ranks):
    """Tokens split over the ranks reach their experts' ranks by an
    all_to_all whose counts the gather's index and the group ends give at
    run time (I -> G), and their gradients come back the same way (G -> I),
    each rank adding up its own tokens' rows: 3 SGD steps on MPI ranks give
    the one-device run's losses and parameters, under loads that change
    from step to step (an expert with no rows among them). The experts are
    4x as wide as the tokens, and the tokens many, as in a transformer: on
    a few tokens, gathering them all to every rank costs less than routing
    each copy, and sbp-infer does that."""
    sizes = {"tokens": 256, "dim": 64, "hidden": 256}
    tokens = sizes["tokens"]
    rng = np.random.default_rng(0)
    batches = [{"ids": rng.integers(0, tokens, 2 * tokens).astype(np.int32),
                "counts": rng.multinomial(2 * tokens, p).astype(np.int32)}
               for p in ([0.1, 0.5, 0.1, 0.3], [0.25] * 4, [0.0, 0.6, 0.4, 0.0])]

    def train(exe):
        losses = [float(exe.train_step(b)["loss"]) for b in batches]
        return losses, {key: exe.params[key] for key in exe.params.keys()}  # noqa: SIM118 - no dict

    one = train(sbpc.compile(dispatch_graph(1, **sizes), optimizer=sbpc.optim.SGD(lr=0.1), mode="interpret"))
    for mode in ("auto", "interpret"):  # the MPI ranks, and the plan interpreter
        exe = sbpc.compile(dispatch_graph(ranks, **sizes), optimizer=sbpc.optim.SGD(lr=0.1), mode=mode)
        assert indexed_kinds(exe) == {"all_to_all"}, exe.plan_text
        losses, params = train(exe)
        np.testing.assert_allclose(losses, one[0], rtol=1e-5, err_msg=mode)
        for key, value in one[1].items():
            np.testing.assert_allclose(params[key], value, rtol=1e-5, atol=1e-6, err_msg=f"{mode}: {key}")
