"""Starting MPI ranks: the `mpiexec` that the mpich wheel installs next to
the Python interpreter, one thread of BLAS per rank (ranks share cores)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path


def mpiexec() -> str:
    here = Path(sys.executable).parent / "mpiexec"
    if here.exists():
        return str(here)
    found = shutil.which("mpiexec")
    if found is None:
        raise RuntimeError("no mpiexec: install the mpich wheel (pip install mpich) into this environment")
    return found


def rank_environment() -> dict[str, str]:
    env = dict(os.environ)
    for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        env.setdefault(var, "1")
    return env


def command(n: int, module: str, *args: str) -> list[str]:
    """mpiexec running `python -m module args` on n ranks."""
    return [mpiexec(), "-n", str(n), sys.executable, "-m", module, *args]


def script_command(n: int, script: str, *args: str) -> list[str]:
    """mpiexec running `python script args` on n ranks."""
    return [mpiexec(), "-n", str(n), sys.executable, script, *args]


def stop(process: subprocess.Popen) -> None:
    """Ends an mpiexec now: SIGTERM, on which it ends every rank (they
    ignore the terminal's SIGINT: the driver decides), and at worst SIGKILL."""
    process.terminate()
    try:
        process.wait(timeout=20)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
