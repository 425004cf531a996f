"""Ranks on several hosts (runtime/hosts.py, runtime/rank_auth.py), tried as
far as one machine allows: hydra's fork launcher with two host entries
starts every rank here, and MPI then sees two nodes (ranks that share no
node with rank 0 cannot open the driver's folder or shared memory, and take
the several-host path: plans and feeds over MPI, sealed pickles)."""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import sbpc
from sbpc import S
from sbpc.runtime.hosts import Hosts, HostsError, is_this_machine
from sbpc.runtime.launch import command, rank_environment, script_command
from sbpc.runtime.pool_client import RankPool
from sbpc.runtime.rank_auth import SECRET_VARIABLE, UnauthenticatedMessage, sealed_pickles

ROOT = Path(__file__).resolve().parents[3]
TWO_HOSTS = "localhost:1,127.0.0.1:1"
"""Two host entries that are both this machine: with the fork launcher, two nodes to MPI."""


# -- the host list ------------------------------------------------------------------


def test_a_host_list_places_ranks_node_major():
    hosts = Hosts.parse("a:2, b:2")
    assert hosts.ranks_per_host(4) == [2, 2]
    assert hosts.host_of_rank(4) == [0, 0, 1, 1]
    assert hosts.mpiexec_options(4) == ["-hosts", "a:2,b:2"]
    assert hosts.elsewhere(4) == [2, 3]
    assert Hosts.parse("a,b,c").ranks_per_host(8) == [3, 3, 2]
    assert Hosts.parse("a:1,b").ranks_per_host(4) == [1, 3]
    assert Hosts.parse("a,b", launcher="fork").mpiexec_options(2) == ["-hosts", "a:1,b:1", "-launcher", "fork"]
    assert str(Hosts.parse("a:2,b")) == "a:2,b"
    assert Hosts.of(["a", "b:3"]) == Hosts(("a", "b"), (None, 3))
    with pytest.raises(HostsError, match="hosts must be"):
        Hosts.of(5)  # type: ignore[arg-type]


@pytest.mark.parametrize("text, ranks, message", [
    ("a:2,b:2", 3, "its counts add up to 4"),
    ("a:1,b:1", 4, "its counts add up to 2"),
    ("a,b,c", 2, "2 ranks left for 3 hosts"),
    ("a:0", 1, "takes 0 ranks"),
    ("a:x", 1, "must be a whole number"),
    ("a,,b", 1, "is not a host list"),
])
def test_a_host_list_that_cannot_place_the_ranks_says_why(text, ranks, message):
    with pytest.raises(HostsError, match=message):
        Hosts.parse(text).ranks_per_host(ranks)


def test_a_hostfile_is_read_as_hydra_reads_one(tmp_path):
    path = tmp_path / "hosts"
    path.write_text("# the cluster\nnode0:4\n\nnode1:4  # the second\n")
    assert Hosts.from_file(path) == Hosts(("node0", "node1"), (4, 4))
    with pytest.raises(HostsError, match="names no host"):
        Hosts.from_file(_write(tmp_path / "empty", "# nothing\n"))
    with pytest.raises(HostsError, match="cannot read the hostfile"):
        Hosts.from_file(tmp_path / "missing")
    with pytest.raises(HostsError, match="unknown launcher"):
        Hosts.parse("a", launcher="telnet")


def test_rank_0_runs_on_this_machine():
    assert is_this_machine("localhost") and is_this_machine("127.0.0.1")
    Hosts.parse("localhost,node9").check_driver_host()
    with pytest.raises(HostsError, match="the first host, node9.invalid, must be this machine"):
        Hosts.parse("node9.invalid,localhost").check_driver_host()
    with pytest.raises(HostsError, match="must be this machine"):
        sbpc.compile(_graph(), hosts="node9.invalid:1,localhost:1")
    with pytest.raises(HostsError, match="cannot place 2 ranks"):
        sbpc.compile(_graph(), hosts="localhost:1")


def test_the_launch_names_the_hosts_and_opens_the_network_only_across_hosts():
    argv = command(4, "m", hosts=Hosts.parse("localhost:2,127.0.0.1:2", launcher="fork"))
    assert argv[1:6] == ["-hosts", "localhost:2,127.0.0.1:2", "-launcher", "fork", "-n"]
    env = {k: v for k, v in os.environ.items() if k != "UCX_TLS"}
    os.environ.pop("UCX_TLS", None)
    try:
        assert rank_environment()["UCX_TLS"] == "self,sm"
        assert "UCX_TLS" not in rank_environment(Hosts.parse(TWO_HOSTS))
        assert rank_environment()[SECRET_VARIABLE] != rank_environment()[SECRET_VARIABLE]  # one per job
    finally:
        os.environ.clear()
        os.environ.update(env)


# -- sealed pickles ---------------------------------------------------------------


def test_a_sealed_pickle_is_unpickled_only_with_the_jobs_secret():
    dumps, loads = sealed_pickles(b"k" * 32)
    message = dumps({"w": np.arange(3)})
    assert loads(message)["w"].tolist() == [0, 1, 2]
    forged = bytearray(message)
    forged[-2] ^= 1
    with pytest.raises(UnauthenticatedMessage, match="nothing of it was unpickled"):
        loads(bytes(forged))
    with pytest.raises(UnauthenticatedMessage):
        sealed_pickles(b"x" * 32)[1](message)
    with pytest.raises(UnauthenticatedMessage):  # an attacker's plain pickle
        loads(pickle.dumps(("run", "code")))
    with pytest.raises(UnauthenticatedMessage):
        loads(b"short")


RANKS_SCRIPT = textwrap.dedent("""
    import sys
    from mpi4py import MPI
    from sbpc.runtime.hosts import on_driver_node
    from sbpc.runtime.rank_auth import authenticate_messages
    world = MPI.COMM_WORLD
    try:
        authenticate_messages(world)
        here, several = on_driver_node(world)
        got = world.bcast({"from": 0} if world.rank == 0 else None, root=0)
        print(f"rank {world.rank}: here={here} several={several} got={got}", flush=True)
    except Exception as e:
        print(f"rank {world.rank}: {type(e).__name__}: {e}", flush=True)
""")


def _ranks(tmp_path, env_of_rank1: dict[str, str] | None = None, hosts: str = TWO_HOSTS, ranks: int = 2,
           secret: str | None = "ab" * 32) -> str:
    """What each rank of RANKS_SCRIPT printed, on `hosts` (fork launcher)."""
    script = _write(tmp_path / "ranks.py", RANKS_SCRIPT)
    env = rank_environment(Hosts.parse(hosts))
    if secret is None:
        del env[SECRET_VARIABLE]
    else:
        env[SECRET_VARIABLE] = secret
    argv = script_command(ranks, str(script), hosts=Hosts.parse(hosts, launcher="fork"))
    if env_of_rank1:  # MPMD: rank 1 gets its own environment
        at = argv.index(sys.executable)
        extra = [a for k, v in env_of_rank1.items() for a in ("-env", k, v)]
        argv = [*argv[:at - 2], "-n", "1", *argv[at:], ":", "-n", "1", *extra, *argv[at:]]
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120)
    return done.stdout


def test_two_host_entries_are_two_nodes_to_the_ranks(tmp_path):
    out = _ranks(tmp_path, hosts="localhost:2,127.0.0.1:2", ranks=4)
    for rank, here in [(0, True), (1, True), (2, False), (3, False)]:
        assert f"rank {rank}: here={here} several=True got={{'from': 0}}" in out, out


def test_ranks_across_hosts_refuse_a_message_without_the_jobs_secret(tmp_path):
    out = _ranks(tmp_path, env_of_rank1={SECRET_VARIABLE: "cd" * 32})
    assert "rank 1: UnauthenticatedMessage: an MPI message without the job's secret was refused" in out, out
    out = _ranks(tmp_path, secret=None)
    assert "the ranks run on several hosts and SBPC_JOB_SECRET is not set" in out, out


# -- running on the hosts ----------------------------------------------------------


def _graph():
    g = sbpc.Graph("m", placement=sbpc.placement("cpu", ranks=2))
    x = g.input("x", (64, 512), sbp=S(0))  # 128 KiB: a feed past SHARED_MIN_BYTES (inline across hosts)
    w = g.param("w", (512, 8), init=sbpc.normal(0.0, 0.1), seed=1)
    g.output(loss=sbpc.reduce_mean(sbpc.gelu(x @ w)))
    return g


def test_a_rank_pool_on_two_hosts_trains_as_on_one(tmp_path):
    x = np.random.default_rng(0).standard_normal((64, 512)).astype(np.float32)
    results = []
    for hosts in (None, Hosts.parse(TWO_HOSTS, launcher="fork")):
        exe = sbpc.compile(_graph(), optimizer=sbpc.optim.SGD(0.5), hosts=hosts)
        losses = [float(exe.train_step({"x": x})["loss"]) for _ in range(3)]
        exe.params["w"] = exe.params["w"] * 2.0
        results.append((losses, exe.params["w"], float(exe.run({"x": x})["loss"])))
        pool = RankPool.pools[(2, hosts)]
        assert ("-hosts" in pool.process.args) == (hosts is not None)
        assert bool(pool.feeds.blocks) == (hosts is None), "a feed in shared memory that another host cannot open"
    (one, w_one, after_one), (two, w_two, after_two) = results
    assert one == two and after_one == after_two
    np.testing.assert_array_equal(w_one, w_two)


def _sbp_run(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "sbpc.tools.sbp_run", *map(str, args)], capture_output=True,
                          text=True, timeout=120)


def test_sbp_run_on_two_hosts_gets_the_same_outputs(tmp_path):
    outs = []
    for name, hosts in (("one", []), ("two", ["--hosts", "localhost:2,127.0.0.1:2", "--launcher", "fork"])):
        out = tmp_path / f"{name}.npz"
        done = _sbp_run(ROOT / "examples" / "mlp_train.mlir", "-n", 4, "--steps", 2, "-o", out, *hosts)
        assert done.returncode == 0, done.stderr
        outs.append(dict(np.load(out)))
    assert outs[0].keys() == outs[1].keys()
    for key in outs[0]:
        np.testing.assert_array_equal(outs[0][key], outs[1][key])
    done = _sbp_run(ROOT / "examples" / "mlp.mlir", "-n", 3, "--hosts", TWO_HOSTS)
    assert done.returncode == 1 and "cannot place 3 ranks: its counts add up to 2" in done.stderr


def test_a_rank_on_another_host_that_dies_is_reported(tmp_path):
    env = dict(os.environ, SBPC_TEST_FAULT="kill:1:1:3")
    done = subprocess.run([sys.executable, "-m", "sbpc.tools.sbp_run", str(ROOT / "examples" / "mlp.mlir"), "-n", "2",
                           "--steps", "2", "--hosts", TWO_HOSTS, "--launcher", "fork", "-o", str(tmp_path / "o.npz")],
                          capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 1
    # rank 1 keeps no record on the driver's host: rank 0's (anywhere up to step 1: ranks that
    # meet no collective do not wait for each other) is what there is
    assert "a rank ended the job without a report" in done.stderr and "; rank 0 was " in done.stderr, \
        done.stderr
    assert "rank 1 was" not in done.stderr and "rank 1 (pid" not in done.stderr, done.stderr
    assert "rank 1 runs on another host and keeps no record here" in done.stderr, done.stderr


def test_calibration_on_two_hosts_writes_a_two_level_cluster_the_planner_reads(tmp_path):
    cluster = tmp_path / "cluster.json"
    done = subprocess.run([sys.executable, "-m", "sbpc.tools.sbp_calibrate", "-n", "4", "--quick", "--hosts",
                           "localhost:2,127.0.0.1:2", "--launcher", "fork", "-o", str(cluster)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "host all_reduce GB/s" in done.stdout and "network all_reduce GB/s" in done.stdout
    data = json.loads(cluster.read_text())
    assert [(level["name"], level["size"]) for level in data["levels"]] == [("host", 2), ("network", 2)]
    # kernels timed on one rank of each core, the others asleep (runtime/calibrate.one_rank_per_core)
    assert data["device"]["timed_ranks_per_cpu"] == 1
    assert all(level["collectives"]["all_reduce"]["bandwidth"] > 0 for level in data["levels"])

    from sbpc.perf.cluster import load_cluster

    loaded = load_cluster(str(cluster))
    assert loaded.level_of([0, 1]) == 0 and loaded.level_of([1, 2]) == 1
    g = sbpc.Graph("m", placement=sbpc.placement("cpu", ranks=4))
    x = g.input("x", (64, 64))
    w = g.param("w", (64, 64), init=sbpc.normal(0.0, 0.1), seed=1)
    g.output(loss=sbpc.reduce_mean(sbpc.gelu(x @ w)))
    exe = sbpc.compile(g, plan="auto", cluster=str(cluster), optimizer=sbpc.optim.SGD(0.1), mode="interpret")
    assert "sbp-autoplan chose" in exe.explain()


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path
