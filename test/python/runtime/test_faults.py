"""Faults at run time, on real MPI ranks: a rank killed mid-step, a rank
stuck (the collective watchdog), a kernel raising on one rank, the driver
interrupted with Ctrl-C, a checkpoint save killed half-way. Each ends every
rank within 30 s with a message naming the rank, the step and the actor,
leaves no MPI process behind, and the Python API compiles and runs again in
the same process afterwards. A rank that hangs when the pool stops it at
the driver's exit is ended too, with nothing left behind."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

from sbpc.runtime.launch import orphaned_segments, segments

ROOT = Path(__file__).resolve().parents[3]
MLP_TRAIN = ROOT / "examples" / "mlp_train.mlir"


def no_rank_left(jobs: Path) -> bool:
    """No rank of a job the test started is running: a rank whose command
    line names a path under `jobs`, the TMPDIR the test gave the job's
    driver (its plan, its pool folder). Other jobs on the machine (another
    test run, a user's) are not the test's to judge."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if not _ranks_of(jobs):
            return True
        time.sleep(0.2)
    return False


def _ranks_of(jobs: Path) -> list[int]:
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            args = cmdline.read_bytes().split(b"\0")
        except OSError:
            continue
        if any(a in (b"sbpc.runtime.worker", b"sbpc.runtime.pool") for a in args) and \
                any(a.startswith(f"{jobs}/".encode()) for a in args):
            found.append(int(cmdline.parent.name))
    return found


def no_segment_left(before: set[str]) -> bool:
    """No MPICH shared-memory segment made since `before` is orphaned (mapped
    by no process: the failed job's killed ranks could not remove theirs, the
    driver must). A live job's segments, another test run's say, are mapped."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if not orphaned_segments() - before:
            return True
        time.sleep(0.2)
    return False


def sbp_run(tmp_path: Path, fault: str, **env: str) -> tuple[subprocess.CompletedProcess, float]:
    start = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "sbpc.tools.sbp_run", str(MLP_TRAIN), "-n", "4", "--steps", "5",
         "-o", str(tmp_path / "out.npz")],
        capture_output=True, text=True, timeout=60,
        env={**os.environ, "SBPC_TEST_FAULT": fault, "TMPDIR": str(tmp_path), **env},
    )
    return done, time.monotonic() - start


def error_line(done: subprocess.CompletedProcess) -> str:
    return next(ln for ln in done.stderr.splitlines() if ln.startswith("sbp-run: error: "))


def wait_until_in_step(jobs: Path, pattern: str, ranks: int, step: int, timeout: float = 60) -> None:
    """Waits until every rank of the job whose folder matches `pattern` in
    `jobs` (the driver's TMPDIR) is in `step` or later, by their progress
    records: an interrupt sent then finds them there, however loaded the
    machine (a fixed sleep did not, under load)."""
    from sbpc.runtime.progress import records

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for folder in jobs.glob(pattern):
            found = records(folder, ranks)
            if len(found) == ranks and all(s >= step for _, s, _ in found.values()):
                return
        time.sleep(0.05)
    raise AssertionError(f"the ranks did not reach step {step} in {timeout} s")


def test_a_rank_killed_mid_step_is_named_with_its_signal_step_and_actor(tmp_path):
    before = segments()
    done, seconds = sbp_run(tmp_path, "kill:1:2:5")
    assert done.returncode == 1 and seconds < 30
    line = error_line(done)
    # rank 1, and no other, is named as the one that died: mpiexec reports
    # one of the four SIGKILLs, often one it sent itself afterwards, and the
    # death watch knows which rank ended first
    assert re.search(r"rank 1 \(pid \d+\) died (of signal 9 \(SIGKILL\)|first \(mpiexec reports signal 9 "
                     r"\(SIGKILL\) for rank [023], which it ended after rank 1\)) in step 2, at actor @", line), line
    assert not re.search(r"rank [023] \(pid", line), line
    # and where the others were: each at an actor of step 2, or of step 1's
    # tail (no collective holds the ranks in step there: after the last
    # gradient bucket's all-reduce, rank 1 may start step 2 while another
    # still unpacks the bucket)
    assert all(re.search(rf"rank {r} was in step [12], at actor @", line) for r in (0, 2, 3)), line
    assert no_rank_left(tmp_path)
    assert no_segment_left(before)


def test_segments_no_process_maps_are_removed_and_mapped_or_new_ones_kept(tmp_path, monkeypatch):
    import mmap

    from sbpc.runtime import launch
    from sbpc.runtime.launch import remove_orphaned_segments

    monkeypatch.setattr(launch, "SEGMENT_GRACE_S", 30.0)
    def segment(name: str, age: float) -> Path:
        path = tmp_path / name
        path.write_bytes(b"\0" * 4096)
        os.utime(path, (time.time() - age, time.time() - age))
        return path

    orphan, new, other = segment("mpich_shm_dead_0", 60), segment("mpich_shm_starting_0", 0), segment("x_0", 60)
    in_use = segment("mpich_shm_live_0", 60)
    with open(in_use, "r+b") as f, mmap.mmap(f.fileno(), 4096):
        assert remove_orphaned_segments(tmp_path, wait=0) == ["mpich_shm_dead_0"]
        assert not orphan.exists() and new.exists() and other.exists() and in_use.exists()
        # a failed job's segment still mapped (its ranks exiting) is waited for, up to `wait`
        start = time.monotonic()
        assert remove_orphaned_segments(tmp_path, before=["mpich_shm_starting_0"], wait=0.3) == []
        assert 0.3 <= time.monotonic() - start < 2
    os.utime(new, (time.time() - 60, time.time() - 60))
    assert sorted(remove_orphaned_segments(tmp_path, wait=0)) == ["mpich_shm_live_0", "mpich_shm_starting_0"]


def test_hydra_topology_files_a_job_left_are_removed_and_older_ones_kept(tmp_path):
    """hydra's proxy writes /tmp/hydra_hwloc_xmlfile_XXXXXX and a job ended by
    MPI_Abort or a signal leaves it: the driver removes those that appeared
    while its job ran (Leftovers.remove_new), not one that was there before."""
    from sbpc.runtime.launch import hydra_topology_files, remove_hydra_topology_files

    older = tmp_path / "hydra_hwloc_xmlfile_older1"
    older.write_text("<topology/>")
    before = hydra_topology_files(tmp_path)
    assert before == {"hydra_hwloc_xmlfile_older1"}
    (tmp_path / "hydra_hwloc_xmlfile_job123").write_text("<topology/>")
    (tmp_path / "unrelated.xml").write_text("<topology/>")
    assert remove_hydra_topology_files(before, tmp_path) == ["hydra_hwloc_xmlfile_job123"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hydra_hwloc_xmlfile_older1", "unrelated.xml"]
    assert remove_hydra_topology_files(before, tmp_path) == []


def test_a_stuck_rank_ends_the_job_by_the_watchdog(tmp_path):
    done, seconds = sbp_run(tmp_path, "stall:2:1:3", SBPC_WATCHDOG_S="3")
    assert done.returncode == 1 and seconds < 30
    line = error_line(done)
    assert "step 1: actor @" in line and "did not complete in 3 s (watchdog, SBPC_WATCHDOG_S)" in line, line
    assert "rank 2 was in step 1, at actor @" in line, line  # the stuck one, from its record
    assert no_rank_left(tmp_path)


def test_a_bad_watchdog_setting_is_refused(tmp_path):
    done, _ = sbp_run(tmp_path, "", SBPC_WATCHDOG_S="soon")
    assert done.returncode == 1
    assert "SBPC_WATCHDOG_S must be a positive number of seconds, got 'soon'" in error_line(done)
    assert no_rank_left(tmp_path)


STARTED: list[subprocess.Popen] = []
"""Drivers a test started; whatever a failing test leaves running is ended."""


@pytest.fixture(autouse=True)
def _no_driver_left():
    yield
    while STARTED:
        _end(STARTED.pop())


def _as_in_a_terminal() -> None:
    """In the child: SIGINT as a terminal's process has it. A shell's
    background job (a CI step, `make test &`) starts with SIGINT ignored,
    which its children inherit, and Python then installs no KeyboardInterrupt."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _end(job: subprocess.Popen) -> None:
    """Ends a driver a failed test left running: SIGTERM to its group
    reaches mpiexec too, which ends the ranks."""
    if job.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(job.pid, signal.SIGTERM)
        try:
            job.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(job.pid, signal.SIGKILL)


def test_ctrl_c_stops_sbp_run_and_its_ranks(tmp_path):
    job = subprocess.Popen(
        [sys.executable, "-m", "sbpc.tools.sbp_run", str(MLP_TRAIN), "-n", "4", "--steps", "1000000",
         "-o", str(tmp_path / "out.npz")],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
        preexec_fn=_as_in_a_terminal, env={**os.environ, "TMPDIR": str(tmp_path)},
    )
    STARTED.append(job)
    wait_until_in_step(tmp_path, "sbp-run-*/errors", 4, step=1)
    start = time.monotonic()
    os.killpg(job.pid, signal.SIGINT)
    _, err = job.communicate(timeout=60)
    assert time.monotonic() - start < 30
    assert job.returncode == 130, err
    assert re.search(r"sbp-run: interrupted; the 4 ranks were stopped: rank 0 was in step \d+, "
                     r"(at actor @|before its first actor).*; rank 3 was in step \d+", err), err
    assert "Traceback" not in err, err
    assert no_rank_left(tmp_path)


API_SCRIPT = """
import os, sys, time
sys.path.insert(0, {examples!r})
import numpy as np
import pytest
import models
import sbpc
from sbpc.api import RankPool
from sbpc.runtime.program import RuntimeFailure

module = models.mlp("dp", 2)
data = models.mlp_batches()
feeds = next(data)


def train_until_failure(fault, label, steps=10):
    os.environ["SBPC_TEST_FAULT"] = fault
    if (2, None) in RankPool.pools:  # ranks read the fault when they start: a new pool
        RankPool.pools[(2, None)].close()
    exe = sbpc.compile(module)
    try:
        for _ in range(steps):
            exe.train_step(feeds)
    except RuntimeFailure as e:
        print(label, e, flush=True)
    del os.environ["SBPC_TEST_FAULT"]
    print("AGAIN:", float(sbpc.compile(module).train_step(feeds)["loss"]), flush=True)

{body}
"""


def run_script(tmp_path: Path, body: str, **kw) -> subprocess.Popen:
    """The driver script, its jobs' folders in tmp_path (its TMPDIR)."""
    script = tmp_path / "driver.py"
    script.write_text(API_SCRIPT.format(examples=str(ROOT / "examples"), body=textwrap.dedent(body)))
    driver = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, start_new_session=True, preexec_fn=_as_in_a_terminal,
                              env={**os.environ, "TMPDIR": str(tmp_path)}, **kw)
    STARTED.append(driver)
    return driver


def test_the_api_reports_a_killed_rank_then_runs_again(tmp_path):
    before = segments()
    driver = run_script(tmp_path, """
        train_until_failure("kill:0:3:2", "FAILED:")
    """)
    out, err = driver.communicate(timeout=120)
    assert driver.returncode == 0, err
    failed = next(ln for ln in out.splitlines() if ln.startswith("FAILED:"))
    assert "rank 0 (pid " in failed and "SIGKILL)" in failed and " in step 3, at actor @" in failed, failed
    assert np.isfinite(float(next(ln for ln in out.splitlines() if ln.startswith("AGAIN:")).split()[1]))
    assert "Traceback" not in err, err
    assert no_rank_left(tmp_path)
    assert no_segment_left(before)


def test_ctrl_c_in_the_driver_stops_the_ranks_and_the_api_runs_again(tmp_path):
    # Rank 1 stalls in step 3, so the interrupt finds the driver inside a
    # command (between two train_steps it would be the user's own
    # KeyboardInterrupt, with the ranks idle and nothing to stop).
    driver = run_script(tmp_path, """
        os.environ["SBPC_TEST_FAULT"] = "stall:1:3:2"
        exe = sbpc.compile(module)
        exe.train_step(feeds)
        print("READY", flush=True)
        try:
            while True:
                exe.train_step(feeds)
        except KeyboardInterrupt:
            print("INTERRUPTED", flush=True)
        del os.environ["SBPC_TEST_FAULT"]
        again = sbpc.compile(module)
        print("AGAIN:", float(again.train_step(feeds)["loss"]), flush=True)
    """)
    assert driver.stdout is not None
    assert driver.stdout.readline().strip() == "READY"
    wait_until_in_step(tmp_path, "sbpc-pool-*", 2, step=3)
    start = time.monotonic()
    os.killpg(driver.pid, signal.SIGINT)  # what a terminal's Ctrl-C does: to the driver's process group
    out, err = driver.communicate(timeout=60)
    assert time.monotonic() - start < 30
    assert driver.returncode == 0, err
    assert "INTERRUPTED" in out and "AGAIN:" in out, out
    assert "sbpc: interrupted; the 2 MPI ranks were stopped: rank 0 was in step 3" in err, err
    assert "Traceback" not in err, err
    assert no_rank_left(tmp_path)


def test_a_pool_whose_rank_hangs_at_stop_is_ended_at_exit_with_nothing_left(tmp_path):
    # At the driver's exit the pool tells its ranks to stop; rank 1 hangs
    # there instead, so the wait runs out and the pool must end the job
    # itself: every rank gone and no MPICH segment left mapped by no one.
    before = segments()
    driver = run_script(tmp_path, """
        os.environ["SBPC_TEST_FAULT"] = "stall:1:-1:0"
        from sbpc.runtime import pool_client
        pool_client.STOP_WAIT_S = 2.0  # the wait runs out all the same, sooner
        print("LOSS:", float(sbpc.compile(module).train_step(feeds)["loss"]), flush=True)
    """)
    start = time.monotonic()
    out, err = driver.communicate(timeout=120)
    assert driver.returncode == 0, err
    assert "LOSS:" in out, out
    assert time.monotonic() - start < 60
    assert "Traceback" not in err, err
    assert no_rank_left(tmp_path)
    assert no_segment_left(before)


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM], ids=["SIGKILL", "SIGTERM"])
def test_a_driver_killed_mid_training_leaves_nothing_behind(tmp_path, sig):
    """The driver alone is killed (the OOM killer's SIGKILL, a scheduler's
    SIGTERM), mid-training: its ranks end as if told to stop, MPICH removes
    its segment as they finalize, and rank 0 removes the job's folder."""
    before = segments()
    driver = run_script(tmp_path, """
        exe = sbpc.compile(module)
        exe.train_step(feeds)
        print("READY", flush=True)
        while True:
            exe.train_step(feeds)
    """)
    assert driver.stdout is not None
    assert driver.stdout.readline().strip() == "READY"
    assert list(tmp_path.glob("sbpc-pool-*"))
    os.kill(driver.pid, sig)
    driver.wait(timeout=30)
    assert no_rank_left(tmp_path)
    assert no_segment_left(before)
    deadline = time.monotonic() + 10
    while list(tmp_path.glob("sbpc-pool-*")) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not list(tmp_path.glob("sbpc-pool-*"))


def test_a_new_pool_removes_the_folders_of_jobs_whose_driver_is_gone(tmp_path):
    """A job killed with its ranks (a whole process group) leaves its folder;
    a live driver's folder, and one with no record, are kept."""
    from sbpc.runtime.launch import DRIVER_FILE, mark_job_folder, process_identity, remove_dead_jobs

    ended = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    identity = process_identity(ended.pid)
    ended.kill()
    ended.wait()
    dead, live, unknown = (tmp_path / f"sbpc-pool-{n}" for n in ("dead", "live", "unknown"))
    for folder in (dead, live, unknown):
        folder.mkdir()
    (dead / DRIVER_FILE).write_text(str(identity))
    mark_job_folder(live)
    reused = tmp_path / "sbpc-pool-reused"  # this process's pid, another start time: a reused pid
    reused.mkdir()
    (reused / DRIVER_FILE).write_text(f"{os.getpid()} 1")
    zombie = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])  # killed, not yet reaped
    (tmp_path / "sbpc-pool-zombie").mkdir()
    (tmp_path / "sbpc-pool-zombie" / DRIVER_FILE).write_text(str(process_identity(zombie.pid)))
    zombie.kill()
    deadline = time.monotonic() + 10
    while Path(f"/proc/{zombie.pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
        assert time.monotonic() < deadline
        time.sleep(0.01)
    try:
        assert sorted(remove_dead_jobs(tmp_path)) == ["sbpc-pool-dead", "sbpc-pool-reused", "sbpc-pool-zombie"]
    finally:
        zombie.wait()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["sbpc-pool-live", "sbpc-pool-unknown"]


def test_a_checkpoint_save_killed_half_way_leaves_the_previous_one_intact(tmp_path):
    driver = run_script(tmp_path, f"""
        exe = sbpc.compile(module, mode="interpret")
        exe.train_step(feeds)
        exe.save({str(tmp_path / "ckpt.npz")!r})
        print("SAVED", flush=True)
        exe.train_step(feeds)
        real_savez = np.savez
        def slow_savez(f, **arrays):
            f.write(b"PK half a zip file")
            f.flush()
            print("WRITING", flush=True)
            time.sleep(60)
        np.savez = slow_savez
        exe.save({str(tmp_path / "ckpt.npz")!r})
    """)
    assert driver.stdout is not None
    assert driver.stdout.readline().strip() == "SAVED"
    with np.load(tmp_path / "ckpt.npz") as first:
        saved = {k: first[k].copy() for k in first.files}
    assert driver.stdout.readline().strip() == "WRITING"
    driver.kill()
    driver.communicate(timeout=30)
    with np.load(tmp_path / "ckpt.npz") as after:
        assert set(after.files) == set(saved)
        for key, value in saved.items():
            np.testing.assert_array_equal(after[key], value)


def test_a_rank_killed_mid_save_leaves_the_previous_sharded_checkpoint_loadable(tmp_path):
    before = segments()
    ckpt = tmp_path / "ckpt"
    driver = run_script(tmp_path, f"""
        exe = sbpc.compile(module)
        exe.train_step(feeds)
        exe.save({str(ckpt)!r})
        first = {{key: exe.params[key] for key in exe.param_keys()}}
        os.environ["SBPC_TEST_FAULT"] = "kill:1:-2:0"  # rank 1 dies once it has written its pieces
        RankPool.pools[(2, None)].close()
        exe = sbpc.compile(module)
        exe.load({str(ckpt)!r})
        exe.train_step(feeds)
        try:
            exe.save({str(ckpt)!r})
        except RuntimeFailure as e:
            print("FAILED:", e, flush=True)
        del os.environ["SBPC_TEST_FAULT"]
        again = sbpc.compile(module)
        again.load({str(ckpt)!r})
        same = all(np.array_equal(again.params[key], value) for key, value in first.items())
        print("PREVIOUS:", same, flush=True)
    """)
    out, err = driver.communicate(timeout=120)
    assert driver.returncode == 0, err
    failed = next(ln for ln in out.splitlines() if ln.startswith("FAILED:"))
    assert "rank 1 (pid " in failed and "SIGKILL" in failed, failed
    assert "PREVIOUS: True" in out, out
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.startswith("sbpc-pool-")) == ["ckpt", "driver.py"]
    assert no_rank_left(tmp_path)
    assert no_segment_left(before)


def test_the_api_reports_a_kernel_raising_on_one_rank_and_a_stuck_rank_then_runs_again(tmp_path):
    driver = run_script(tmp_path, """
        lookup = sbpc.parse_module('''
        sbp.placement @m cpu ranks [0, 1] mesh [2]
        lg.graph @lookup on @m {
          %t = lg.param "table" init #lg.normal<0.0, 1.0> : tensor<4x8xf32>
          %ids = lg.input "ids" : !sbp.dtensor<6xi64, @m, S<0>>
          %e = lg.embedding %t, %ids : (tensor<4x8xf32>, !sbp.dtensor<6xi64, @m, S<0>>) -> tensor<6x8xf32>
          %s = lg.reduce_sum %e axes [0, 1] : tensor<6x8xf32> -> tensor<f32>
          lg.output ["s"] %s : tensor<f32>
        }''')
        exe = sbpc.compile(lookup)
        try:
            exe.run({"ids": np.array([0, 1, 2, 3, 9, 1])})  # 9 is no row of the table; it is rank 1's
        except RuntimeFailure as e:
            print("RAISED:", e, flush=True)
        print("AGAIN:", float(sbpc.compile(lookup).run({"ids": np.array([0, 1, 2, 3, 3, 1])})["s"]), flush=True)
        os.environ["SBPC_WATCHDOG_S"] = "3"
        train_until_failure("stall:1:1:2", "STUCK:", steps=5)
    """)
    out, err = driver.communicate(timeout=120)
    assert driver.returncode == 0, err
    lines = out.splitlines()
    raised = next(ln for ln in lines if ln.startswith("RAISED:"))
    assert "rank 1: step 0: actor @e.embedding (lg.embedding)" in raised and "index out of range [0, 4)" in raised
    stuck = next(ln for ln in lines if ln.startswith("STUCK:"))
    assert "rank 0: step 1: " in stuck and "(watchdog, SBPC_WATCHDOG_S)" in stuck, stuck
    assert "rank 1 was in step 1, at actor @" in stuck, stuck
    assert len([ln for ln in lines if ln.startswith("AGAIN:")]) == 2, out
    assert "Traceback" not in err, err
    assert no_rank_left(tmp_path)
