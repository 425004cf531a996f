"""The malformed-input fuzzer (test/fuzz/fuzz_ir.py) in `make test`: a fixed
slice of mutants must all end in success or a located diagnostic, and the
fuzzer itself must catch what it claims to (a traceback, a hang, a silent
failure), or a clean run would prove nothing."""

from __future__ import annotations

import importlib.util
import random
import sys
import time
from pathlib import Path

import pytest

FUZZ = Path(__file__).resolve().parents[2] / "test" / "fuzz" / "fuzz_ir.py"


@pytest.fixture(scope="module")
def fuzz_ir():
    spec = importlib.util.spec_from_file_location("fuzz_ir", FUZZ)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules["fuzz_ir"] = module
    spec.loader.exec_module(module)
    return module


def test_a_slice_of_mutants_gets_only_located_diagnostics(fuzz_ir):
    start = time.perf_counter()
    campaign = fuzz_ir.fuzz(count=400, seed=2026)
    text = fuzz_ir.report(campaign, time.perf_counter() - start)
    assert campaign.failed == 0, text
    # The slice reaches both ends: inputs that still compile and inputs rejected.
    assert campaign.verdicts["ok"] > 20 and campaign.verdicts["diagnostic"] > 200, text


def test_every_mutation_changes_a_typical_input(fuzz_ir):
    seed = next(s for s in fuzz_ir.seeds() if s.name.startswith("examples/mlp_train.mlir"))
    rng = random.Random(0)
    for name, mutation in fuzz_ir.MUTATIONS.items():
        changed = [mutation(seed.text, rng) for _ in range(5)]
        assert any(c is not None and c != seed.text for c in changed), name


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
