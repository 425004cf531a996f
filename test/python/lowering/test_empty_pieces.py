"""Splits over more devices than elements: `S<0>` of 3 rows on 4 ranks, or
of 1 row on 2, leaves some pieces empty. PyTorch DTensor accepts such
layouts and small batches on many devices need them; sbp-infer keeps the
hint, every kernel and collective handles the empty piece (a mean adds
nothing, a max contributes the identity -inf, MPI gets no aliased empty
buffers), and the result equals the single-device reference on the plan
interpreter and on real MPI ranks."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
from xdsl.context import Context

import sbpc
from sbpc.lowering.compile import CompilePass
from sbpc.semantics.plan_interpreter import run_plan
from sbpc.semantics.reference import evaluate


def graph(rows: int, mesh: list[int], x_sbp: str, w_sbp: str) -> str:
    ranks = list(range(int(np.prod(mesh))))
    return f"""
sbp.placement @m cpu ranks {ranks} mesh {mesh}
lg.graph @g on @m {{
  %x = lg.input "x" : !sbp.dtensor<{rows}x4xf32, @m, {x_sbp}>
  %labels = lg.input "labels" : tensor<{rows}xi64>
  %w = lg.param "w" init #lg.normal<0.0, 0.5> : !sbp.dtensor<4x3xf32, @m, {w_sbp}>
  %y = lg.matmul %x, %w : (!sbp.dtensor<{rows}x4xf32, @m, {x_sbp}>, !sbp.dtensor<4x3xf32, @m, {w_sbp}>)
      -> tensor<{rows}x3xf32>
  %r = lg.relu %y : tensor<{rows}x3xf32>
  %n = lg.layernorm %r axis 1 eps 1.0e-05 : tensor<{rows}x3xf32>
  %mx = lg.reduce_max %y axes [0] : tensor<{rows}x3xf32> -> tensor<3xf32>
  %mean = lg.reduce_mean %n axes [0, 1] : tensor<{rows}x3xf32> -> tensor<f32>
  %loss = lg.cross_entropy %y, %labels : (tensor<{rows}x3xf32>, tensor<{rows}xi64>) -> tensor<f32>
  lg.output ["max", "mean", "loss", "y"] %mx, %mean, %loss, %y
      : tensor<3xf32>, tensor<f32>, tensor<f32>, tensor<{rows}x3xf32>
}}
"""


def feeds(rows: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(rows)
    return {"x": rng.normal(size=(rows, 4)).astype(np.float32), "labels": rng.integers(0, 3, rows)}


CASES = [
    (1, [2], "S<0>", "B"),
    (3, [4], "S<0>", "B"),
    (2, [4], "S<0>", "S<1>"),
    (3, [2, 2], "[S<0>, S<0>]", "[B, S<1>]"),
    (1, [2, 2], "[S<0>, B]", "[S<1>, S<1>]"),
]


@pytest.mark.parametrize("strategy", ["auto", "greedy"])
@pytest.mark.parametrize(("rows", "mesh", "x_sbp", "w_sbp"), CASES)
def test_empty_pieces_on_the_plan_interpreter(rows, mesh, x_sbp, w_sbp, strategy):
    text = graph(rows, mesh, x_sbp, w_sbp)
    module = sbpc.parse_module(text)
    expected = evaluate(module, feeds(rows))
    CompilePass(strategy=strategy).apply(Context(), module)
    # the hint that leaves pieces empty is kept, as written
    assert f"feed \"x\" of !sbp.dtensor<{rows}x4xf32, @m, {x_sbp}>" in str(module)
    got = run_plan(module, feeds(rows))
    for name, value in expected.items():
        np.testing.assert_allclose(got[name], value, rtol=1e-5, atol=1e-6, err_msg=name)


def test_empty_pieces_on_mpi_ranks(tmp_path):
    path, feed_file, out = tmp_path / "g.mlir", tmp_path / "feeds.npz", tmp_path / "out.npz"
    path.write_text(graph(3, [4], "S<0>", "S<1>"))
    np.savez(feed_file, **feeds(3))
    done = subprocess.run(
        [sys.executable, "-m", "sbpc.tools.sbp_run", str(path), "-n", "4", "--feeds", str(feed_file), "-o", str(out)],
        capture_output=True, text=True, timeout=120,
    )
    assert done.returncode == 0, done.stderr
    expected = evaluate(sbpc.parse_module(path.read_text()), feeds(3))
    with np.load(out) as got:
        for name, value in expected.items():
            np.testing.assert_allclose(got[name], value, rtol=1e-5, atol=1e-6, err_msg=name)
