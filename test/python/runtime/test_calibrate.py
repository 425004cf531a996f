"""sbp-calibrate where ranks outnumber the cores they run on."""

import json
import os
import subprocess
import sys

import pytest


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="needs CPU affinity")
def test_kernels_are_timed_on_one_rank_of_each_core(tmp_path):
    # Two ranks confined to one CPU: the calibration times its kernels on
    # rank 0 alone, the other asleep (two ranks taking turns computing on a
    # core ran a GEMM up to 3x slower than one alone), and says so, so that
    # the simulator crowds the rates itself where a plan's ranks compute at once.
    cpu = sorted(os.sched_getaffinity(0))[0]
    cluster = tmp_path / "cluster.json"
    done = subprocess.run([sys.executable, "-m", "sbpc.tools.sbp_calibrate", "-n", "2", "--quick", "-o", str(cluster)],
                          capture_output=True, text=True, timeout=300,
                          preexec_fn=lambda: os.sched_setaffinity(0, {cpu}))
    assert done.returncode == 0, done.stderr
    data = json.loads(cluster.read_text())
    assert data["levels"][0]["cores"] == 1
    assert data["device"]["timed_ranks_per_cpu"] == 1
