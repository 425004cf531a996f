"""The malformed-input fuzzer (test/fuzz/fuzz_ir.py) in `make test`: a fixed
slice of mutants must all end in success or a located diagnostic, and the
fuzzer itself must catch what it claims to (a traceback, a hang, a silent
failure), or a clean run would prove nothing."""

from __future__ import annotations

import importlib.util
import random
import re
import sys
import time
from pathlib import Path

import pytest
from support import FULL

FUZZ = Path(__file__).resolve().parents[3] / "test" / "fuzz" / "fuzz_ir.py"


def load(path: Path):
    """A fuzzer script (test/fuzz/ is not a package) as a module."""
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[path.stem] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def fuzz_ir():
    return load(FUZZ)


def test_a_slice_of_mutants_gets_only_located_diagnostics(fuzz_ir):
    start = time.perf_counter()
    count = 400 if FULL else 120  # make test-all runs the longer slice
    campaign = fuzz_ir.fuzz(count=count, seed=2026)
    text = fuzz_ir.report(campaign, time.perf_counter() - start)
    assert campaign.failed == 0, text
    # The slice reaches both ends: inputs that still compile and inputs rejected.
    assert campaign.verdicts["ok"] > count // 20 and campaign.verdicts["diagnostic"] > count // 2, text


def test_every_mutation_changes_a_typical_input(fuzz_ir):
    typical = [s for s in fuzz_ir.seeds() if s.name.split("#")[0] in (
        "examples/mlp_train.mlir", "examples/mlp_train_zero.mlir", "examples/gpt_block.mlir",
        "test/filecheck/sbp/attrs.mlir")]
    assert len(typical) >= 3
    rng = random.Random(0)
    for name, mutation in fuzz_ir.MUTATIONS.items():
        changed = [(seed.text, mutation(seed.text, rng)) for seed in typical for _ in range(5)]
        assert any(c is not None and c != text for text, c in changed), name


def test_the_seeds_carry_their_run_line_pipelines(fuzz_ir):
    by_name = {s.name: s for s in fuzz_ir.seeds()}
    assert ("-p", "sbp-infer") in by_name["test/filecheck/passes/sbp-infer/hints-and-options.mlir#0"].pipelines
    assert len(by_name) > 200


GOOD = "lg.graph @g {\n  %x = lg.input \"x\" : tensor<4xf32>\n  lg.output [\"x\"] %x : tensor<4xf32>\n}\n"


def test_the_classifier_catches_a_traceback_a_hang_and_vague_or_missing_messages(fuzz_ir, monkeypatch):
    from sbpc.tools import sbp_opt

    assert fuzz_ir.run_sbp_opt(GOOD, [], 10).verdict == "ok"
    assert fuzz_ir.run_sbp_opt(GOOD.replace("4xf32>\n  lg", "5xf32>\n  lg"), [], 10).verdict == "diagnostic"

    def crash(self, prog):
        raise KeyError("boom")

    monkeypatch.setattr(sbp_opt.SbpOptMain, "apply_passes", crash)
    outcome = fuzz_ir.run_sbp_opt(GOOD, [], 10)
    assert outcome.verdict == "crash" and "KeyError" in outcome.where and "crash" in outcome.where

    def hang(self, prog):
        time.sleep(5)

    monkeypatch.setattr(sbp_opt.SbpOptMain, "apply_passes", hang)
    assert fuzz_ir.run_sbp_opt(GOOD, [], 0.3).verdict == "hang"

    monkeypatch.setattr(sbp_opt, "main", lambda args: 1)
    assert fuzz_ir.run_sbp_opt(GOOD, [], 10).verdict == "silent"

    def vague(args):
        print("something went wrong", file=sys.stderr)
        return 1

    monkeypatch.setattr(sbp_opt, "main", vague)
    assert fuzz_ir.run_sbp_opt(GOOD, [], 10).verdict == "vague"


FUZZ_API = Path(__file__).resolve().parents[3] / "test" / "fuzz" / "fuzz_api.py"


@pytest.fixture(scope="module")
def fuzz_api():
    return load(FUZZ_API)


def test_a_slice_of_api_cases_gets_only_clear_errors(fuzz_api):
    # random programs through sbpc.Graph, compile options, feeds and
    # from_torch on small random modules: success or a ValueError/TypeError
    # (or a compiler diagnostic) with a message, never another exception
    start = time.perf_counter()
    count = 600 if FULL else 150  # make test-all runs the longer slice
    campaign = fuzz_api.fuzz(count=count, seed=2026, torch_share=0.2)
    text = fuzz_api.report(campaign, time.perf_counter() - start)
    assert campaign.failed == 0, text
    assert campaign.verdicts["ok"] > count // 40 and campaign.verdicts["clear"] > count // 2, text


def test_the_api_classifier_catches_a_crash_a_hang_and_a_silent_error(fuzz_api):
    import sbpc

    def crash():
        return sbpc.Graph("g").input("x", [2]).no_such_method()

    def hang():
        while True:
            pass

    assert fuzz_api.classify(crash, 5).verdict == "crash"
    assert fuzz_api.classify(hang, 0.2).verdict == "hang"
    assert fuzz_api.classify(lambda: (_ for _ in ()).throw(ValueError()), 5).verdict == "vague"
    assert fuzz_api.classify(lambda: sbpc.relu(3), 5).verdict == "clear"
    assert "sbpc.relu: x must be a Tensor, got int 3" in fuzz_api.classify(lambda: sbpc.relu(3), 5).message


@pytest.mark.parametrize("call, message", [
    (lambda sbpc, g: sbpc.softmax(3), "sbpc.softmax: x must be a Tensor"),
    (lambda sbpc, g: g.input("x", [2, -1]), "a shape's sizes are at least 0"),
    (lambda sbpc, g: g.input("x", [2], dtype="F32"), "unknown dtype 'F32'"),
    (lambda sbpc, g: sbpc.cast(g.input("x", [2]), "u8"), "unknown dtype 'u8'"),
    (lambda sbpc, g: g.constant("x"), "a constant of <U1 values"),
    (lambda sbpc, g: sbpc.add(g.input("x", [2]), sbpc.Graph("other").input("y", [2])), "different graphs"),
    (lambda sbpc, g: sbpc.argmax(g.input("x", [])), "axis -1 is out of range for a tensor of rank 0"),
    (lambda sbpc, g: sbpc.reshape(g.input("x", [0, 2]), [-1, 0]), "no size for -1"),
    (lambda sbpc, g: sbpc.concat([]), "concat needs at least one tensor"),
    (lambda sbpc, g: sbpc.matmul(g.input("x", [2, 3]), g.input("y", [2, 3])),
     "lg.matmul: contracting dimensions differ"),
    (lambda sbpc, g: sbpc.placement("cpu", 2, [4]), "mesh shape [4] holds 4 devices but 2 ranks are given"),
    (lambda sbpc, g: sbpc.uniform(1.0, -1.0), "sbpc.uniform: #lg.uniform needs low < high"),
    (lambda sbpc, g: g.input("x", [2], sbp="S0"), "an sbp hint is sbpc.S(axis), sbpc.B or sbpc.P"),
    (lambda sbpc, g: sbpc.compile(g, optimizer="adam"), "compile: optimizer must be an Optimizer or None"),
])
def test_api_findings_are_clear_errors(call, message):
    # each was a traceback (AttributeError, KeyError, ZeroDivisionError,
    # IndexError, xDSL's VerifyException or struct.error) before the
    # arguments were checked at the door (sbpc/arguments.py)
    import sbpc

    g = sbpc.Graph("g", placement=sbpc.placement("cpu", 2))
    with pytest.raises((ValueError, TypeError), match=re.escape(message)):
        call(sbpc, g)


def test_an_update_of_a_parameter_the_graph_lacks_is_refused_at_compile():
    import sbpc

    g = sbpc.Graph("g", placement=sbpc.placement("cpu", 1))
    x = g.input("x", [4])
    g.output(**{"new.x": x + x})
    with pytest.raises(ValueError, match="output 'new.x' is the update of parameter 'x', which the graph does not"):
        sbpc.compile(g, mode="interpret")


MULTI_BLOCK_DEVICE = """
plan.program @p {
  plan.device @rank0 rank 0 arena 8192 persistent 0 {
    plan.register @x : tensor<16x32xf32> bytes 2048 offset 0 feed "x" of !sbp.dtensor<32x32xf32, @dp, S<0>>
    plan.register @g : tensor<4x!sbp.dtensor<4xf32, @m, B>> bytes 4096 offset 2048 of !sbp.dtensor<32x32xf32, @dp, B>
^bb0(%a: f32):
    plan.comm @c0 "all_gather" id 0 [@x] -> [@g] group [0, 1] over [0]
      from !sbp.dtensor<32x32xf32, @dp, S<0>> to !sbp.dtensor<32x32xf32, @dp, B>
  }
}
"""


def test_a_device_split_into_two_blocks_gets_a_diagnostic_under_plan_verify(fuzz_ir):
    # the widened fuzzer's block-structure mutant (seed 12): plan-verify's
    # placement lookup read the region's single block and raised xDSL's
    # ValueError for a region of two
    outcome = fuzz_ir.run_sbp_opt(MULTI_BLOCK_DEVICE, ["-p", "plan-verify"], 20)
    assert outcome.verdict == "diagnostic", outcome.message
