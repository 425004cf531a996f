"""The benchmarks in bench/ still run: each script with tiny arguments exits
0 and prints its one summary line (they are never timed here). The scripts
that start MPI ranks run one after another: side by side, their ranks (which
poll while they wait) starve each other on two cores. The others, one
process each, run meanwhile in a second lane. A missing peer (torch, jax)
must be reported, not fail."""

from __future__ import annotations

import importlib.util
import os
import platform
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from support import FULL

BENCH = Path(__file__).resolve().parents[3] / "bench"
WITH_RANKS = {
    "runtime_overhead.py": ["--quick"],
    "host_kernels.py": ["--quick"],
}
"""Scripts that start MPI ranks (a rank pool, sbp-run, a calibration)."""
IN_ONE_PROCESS = {
    "compile_time.py": ["--quick", "--no-jax"],
    "memory_plan.py": ["--quick"],
    "gpu_kernels.py": ["--quick"],
    "sbp_infer_scaling.py": ["--sizes", "100", "200"],
    "conv.py": ["--quick"],
    "dropout.py": ["--quick"],
}
SLOW = {
    # 4-27 s each even with --quick (a calibration, a search, communication's
    # 16 s of measured collectives); make test-all
    # (SBPC_FULL=1) runs them, with ranks in the first lane
    "communication.py": ["--quick"],
    "train_throughput.py": ["--quick"],
    "simulator_accuracy.py": ["--quick"],
    "autoplan.py": ["--quick"],
    "simulator_scale.py": ["--quick"],
    "autoplan_scale.py": ["--quick"],
    "hf_gpt2.py": ["--quick"],
    "hf_resnet.py": ["--quick"],
    "adam_drift.py": ["--quick"],
    "moe.py": ["--quick"],
    "meta_import.py": ["--quick"],
    "checkpoint.py": ["--quick"],
}
if FULL:
    WITH_RANKS.update({k: SLOW[k] for k in ("communication.py", "train_throughput.py", "simulator_accuracy.py",
                                            "autoplan.py", "hf_gpt2.py", "hf_resnet.py", "adam_drift.py",
                                            "moe.py", "meta_import.py", "checkpoint.py")})
    IN_ONE_PROCESS.update({k: SLOW[k] for k in ("simulator_scale.py", "autoplan_scale.py")})
TIMEOUT_S = 300
"""Per script: each took under 30 s on the 2-core machine (hf_gpt2.py, moe.py: 15-28 s beside a busy load); a
hang is what runs past it (a PyTorch peer's teardown once did, one run in nine)."""
SCRIPTS = {**WITH_RANKS, **IN_ONE_PROCESS, **SLOW}


def _run_each(scripts: dict[str, list[str]], out: dict) -> None:
    """Runs each script in a process group of its own: one that runs past
    its time is killed with every process it started (its ranks, mpiexec),
    and what it printed so far is kept (its stdout unbuffered, so the tail
    says where it stopped)."""
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1",
               PYTHONUNBUFFERED="1")
    for name, args in scripts.items():
        job = subprocess.Popen([sys.executable, str(BENCH / name), *args], stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True, env=env, start_new_session=True)
        try:
            text, _ = job.communicate(timeout=TIMEOUT_S)
            out[name] = (job.returncode, text)
        except subprocess.TimeoutExpired:
            os.killpg(job.pid, signal.SIGKILL)
            text, _ = job.communicate()
            out[name] = (-1, text + f"\n(timed out after {TIMEOUT_S} s)")


@pytest.fixture(scope="module")
def runs():
    out: dict = {}
    second_lane = threading.Thread(target=_run_each, args=(IN_ONE_PROCESS, out))
    second_lane.start()
    _run_each(WITH_RANKS, out)
    second_lane.join()
    return out


def test_every_benchmark_is_tested():
    assert sorted(SCRIPTS) == sorted(p.name for p in BENCH.glob("*.py") if not p.name.startswith("_"))


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.full) if n in SLOW else n for n in sorted(SCRIPTS)])
def test_benchmark_runs_and_summarizes(runs, name):
    rc, text = runs[name]
    assert rc == 0, text[-3000:]
    summaries = [line for line in text.splitlines() if line.startswith("summary: ")]
    assert len(summaries) == 1, text[-3000:]
    if name == "train_throughput.py" and importlib.util.find_spec("torch") is None:
        assert "peer missing: torch" in text


@pytest.mark.parametrize("core", ["Haswell", "Sandybridge"])
def test_blas_kernels_names_what_openblas_loaded(core):
    """bench/_common.blas_kernels reads the kernel set from the OpenBLAS
    that numpy loaded: one pinned by OPENBLAS_CORETYPE is named as pinned,
    next to OpenBLAS's own choice (asked of a process without the pin)."""
    if platform.machine() not in ("x86_64", "AMD64"):
        pytest.skip("the kernel sets named here are x86's")
    code = f"import sys; sys.path.insert(0, {str(BENCH)!r}); import _common; print(_common.blas_kernels())"
    pinned = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                            env=dict(os.environ, OPENBLAS_CORETYPE=core))
    assert pinned.returncode == 0, pinned.stderr
    if "not an OpenBLAS" in pinned.stdout:
        pytest.skip("numpy's BLAS here is not an OpenBLAS that names its kernels")
    assert f"OpenBLAS kernels {core}, pinned by OPENBLAS_CORETYPE={core}" in pinned.stdout
    own = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                         env={k: v for k, v in os.environ.items() if k != "OPENBLAS_CORETYPE"})
    assert own.returncode == 0, own.stderr
    chosen = own.stdout.split("OpenBLAS kernels ", 1)[1].split(" ", 1)[0]
    assert f"OpenBLAS's own choice for this CPU: {chosen};" in pinned.stdout
