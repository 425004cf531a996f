"""The Python API: the graph frontend, compile, and run on real MPI ranks
(started by this process, reused across runs), inside an mpiexec launch, and
in the explicit interpreter."""

import pathlib
import re
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import sbpc
from sbpc import B, S
from sbpc.api import RankPool
from sbpc.runtime.program import RuntimeFailure
from sbpc.semantics.reference import evaluate, initial_value


def mlp(ranks=2, mesh=None, hints=True):
    where = sbpc.placement("cpu", ranks=ranks, mesh=mesh)
    g = sbpc.Graph("mlp", placement=where)
    batch_sbp = (S(0),) + (B,) * (len(where.mesh) - 1) if hints else None
    x = g.input("x", (16, 32), sbp=list(batch_sbp) if hints else None)
    labels = g.input("labels", (16,), dtype="i64")
    w1 = g.param("w1", (32, 64), init=sbpc.normal(0.0, 0.1), seed=1)
    b1 = g.param("b1", (64,))
    w2 = g.param("w2", (64, 10), init=sbpc.uniform(-0.1, 0.1), seed=2)
    h = sbpc.gelu(x @ w1 + b1)
    logits = sbpc.layernorm(h, axis=-1) @ w2 * 2.0 - 1.0
    g.output(loss=sbpc.cross_entropy(logits, labels), logits=logits)
    return g


def feeds(seed=0):
    rng = np.random.default_rng(seed)
    return {"x": rng.normal(size=(16, 32)).astype(np.float32), "labels": rng.integers(0, 10, 16)}


def test_frontend_writes_verified_lg_ir():
    g = mlp()
    module = g.module()
    text = str(module)
    assert "lg.input \"x\" : !sbp.dtensor<16x32xf32, @cpu2_0_1, S<0>>" in text
    assert "lg.param \"w1\" init #lg.normal<0.0, 0.1> seed 1 : tensor<32x64xf32>" in text
    assert "lg.layernorm" in text and "lg.gelu" in text and "lg.cross_entropy" in text
    out = evaluate(module, feeds())
    assert out["logits"].shape == (16, 10) and out["loss"].shape == ()
    # operators and methods
    g2 = sbpc.Graph("ops")
    a = g2.input("a", (4, 6))
    c = (-a).relu().T.reshape(2, -1).sum(axes=1) / 3
    g2.output(c=c)
    got = evaluate(g2.module(), {"a": np.arange(24, dtype=np.float32).reshape(4, 6) - 12})["c"]
    expected = np.maximum(-(np.arange(24).reshape(4, 6) - 12), 0).T.reshape(2, -1).sum(axis=1) / 3
    np.testing.assert_allclose(got, expected)
    with pytest.raises(ValueError, match="lg.matmul: contracting dimensions differ"):
        a @ a


def test_compiling_twice_gives_the_same_plan():
    g = mlp()
    assert sbpc.compile(g).plan_text == sbpc.compile(g).plan_text


@pytest.mark.parametrize("ranks, mesh", [(2, None), (4, (2, 2))])
def test_run_on_real_ranks_matches_the_reference_and_reuses_them(ranks, mesh):
    g = mlp(ranks, mesh)
    expected = evaluate(g.module(), feeds())
    exe = sbpc.compile(g)
    out = exe.run(feeds())
    for name in expected:
        np.testing.assert_allclose(out[name], expected[name], rtol=1e-4, atol=1e-5)
    pool = RankPool.pools[(ranks, None)]
    pid = pool.process.pid
    again = exe.run(feeds(1))
    assert RankPool.pools[(ranks, None)].process.pid == pid, "a second run started new ranks"
    np.testing.assert_allclose(again["loss"], evaluate(g.module(), feeds(1))["loss"], rtol=1e-4)
    # only the outputs asked for come back from the ranks
    only = exe.run(feeds(1), outputs=["loss"])
    assert sorted(only) == ["loss"]
    np.testing.assert_allclose(only["loss"], again["loss"], rtol=1e-6)


def test_large_feeds_reach_the_ranks_through_shared_memory():
    """A feed of 64 KiB or more is copied into a shared-memory block the
    command names (not pickled through rank 0): every rank reads its piece,
    the next step's values replace the block's, a plan with a larger feed
    gets a new block, and closing the pool unlinks them all."""
    from multiprocessing import shared_memory

    from sbpc.runtime.shared_feeds import SharedArray

    def summed(rows):
        g = sbpc.Graph("sum", placement=sbpc.placement("cpu", ranks=2))
        x = g.input("x", (rows, 128), sbp=S(0))
        g.output(total=sbpc.reduce_sum(x * x, axes=[1]), small=sbpc.reduce_sum(g.input("s", (4,)), axes=[0]))
        return sbpc.compile(g)

    rng = np.random.default_rng(0)
    small = np.arange(4, dtype=np.float32)
    blocks = []
    for rows in (256, 256, 1024):  # 128 KiB twice (one block, new values), then 512 KiB (a new block)
        exe = summed(rows)
        x = rng.standard_normal((rows, 128)).astype(np.float32)
        out = exe.run({"x": x, "s": small})
        np.testing.assert_allclose(out["total"], (x * x).sum(axis=1), rtol=1e-5)
        assert out["small"] == pytest.approx(6.0)
        pool = RankPool.pools[(2, None)]
        command = pool.feeds.put({"x": x, "s": small})
        assert isinstance(command["x"], SharedArray) and isinstance(command["s"], np.ndarray)
        blocks.append(command["x"].block)
    assert blocks[0] == blocks[1] != blocks[2]
    pool.close()
    for name in blocks:
        with pytest.raises(FileNotFoundError):
            shared_memory.SharedMemory(name=name)


def test_parameters_read_and_write_as_global_arrays():
    g = mlp()
    exe = sbpc.compile(g)
    param = next(op for op in g.module().ops.last.body.ops if getattr(op, "key", None) and op.key.data == "w1")
    np.testing.assert_array_equal(exe.params["w1"], initial_value(param))
    exe.params["w2"] = np.zeros((64, 10), np.float32)
    out = exe.run(feeds())
    np.testing.assert_allclose(out["logits"], -np.ones((16, 10)), atol=1e-6)
    assert out["loss"] == pytest.approx(np.log(10), rel=1e-5)
    with pytest.raises(KeyError, match="no parameter 'nope'"):
        exe.params["nope"]


def test_interpret_is_an_explicit_mode():
    g = mlp()
    expected = evaluate(g.module(), feeds())
    out = sbpc.compile(g, mode="interpret").run(feeds())
    np.testing.assert_allclose(out["loss"], expected["loss"], rtol=1e-5)
    with pytest.raises(ValueError, match="mode must be one of"):
        sbpc.compile(g, mode="guess")


def test_bad_feeds_fail_before_running():
    exe = sbpc.compile(mlp())
    with pytest.raises(RuntimeFailure, match="feed 'x': expected shape \\[16, 32\\], got \\[16, 31\\]"):
        exe.run({"x": np.zeros((16, 31), np.float32), "labels": np.zeros(16, np.int64)})


def test_the_same_script_runs_inside_mpiexec(tmp_path):
    script = tmp_path / "inside.py"
    script.write_text(textwrap.dedent("""
        import numpy as np, sbpc
        from sbpc import S
        g = sbpc.Graph("tiny", placement=sbpc.placement("cpu", ranks=2))
        x = g.input("x", (8, 4), sbp=S(0))
        w = g.param("w", (4, 3), init=sbpc.ones())
        g.output(y=(x @ w).sum())
        out = sbpc.compile(g).run({"x": np.ones((8, 4), np.float32)})
        from mpi4py import MPI
        print(f"rank {MPI.COMM_WORLD.rank}: {float(out['y'])}")
    """))
    from sbpc.runtime.launch import rank_environment, script_command

    done = subprocess.run(
        script_command(2, str(script)), capture_output=True, text=True, timeout=120, env=rank_environment()
    )
    assert done.returncode == 0, done.stderr
    # both ranks print; their lines may interleave
    assert sorted(re.findall(r"rank (\d): ([\d.]+)", done.stdout)) == [("0", "96.0"), ("1", "96.0")]


def test_a_failing_rank_is_reported_by_run():
    g = sbpc.Graph("lookup", placement=sbpc.placement("cpu", ranks=2))
    table = g.param("table", (4, 8), init=sbpc.normal())
    ids = g.input("ids", (6,), dtype="i64")
    g.output(s=sbpc.embedding(table.to(B), ids).sum())
    exe = sbpc.compile(g)
    failure = r"rank \d: step 0: actor @\S+ \(lg.embedding\).*index out of range \[0, 4\)"
    with pytest.raises(RuntimeFailure, match=failure):
        exe.run({"ids": np.array([0, 1, 2, 3, 9, 1])})
    # the next run starts fresh ranks
    np.testing.assert_allclose(exe.run({"ids": np.array([0, 1, 2, 3, 3, 1])})["s"],
                               evaluate(g.module(), {"ids": np.array([0, 1, 2, 3, 3, 1])})["s"], rtol=1e-5)


def test_stages_cut_an_unhinted_graph_into_pipeline_stages():
    def mlp(hinted=False):
        g = sbpc.Graph("staged", placement=sbpc.placement("cpu", 4))
        x = g.input("x", (8, 6), sbp=S(0) if hinted else None)
        h = sbpc.gelu(x @ g.param("w1", (6, 16), init=sbpc.normal(0.0, 0.5), seed=1))
        g.output(loss=(h @ g.param("w2", (16, 3), init=sbpc.normal(0.0, 0.5), seed=2)).mean())
        return g

    feeds = {"x": np.random.default_rng(0).normal(size=(8, 6)).astype(np.float32)}
    whole = sbpc.compile(mlp(), optimizer=sbpc.optim.SGD(lr=0.1), mode="interpret")
    staged = sbpc.compile(mlp(), optimizer=sbpc.optim.SGD(lr=0.1), mode="interpret", stages=2,
                          pipeline="lg-micro-batch{count=2},compile")
    assert "@stage0" in staged.plan_text and "@stage1" in staged.plan_text
    for _ in range(2):
        assert float(staged.train_step(feeds)["loss"]) == pytest.approx(float(whole.train_step(feeds)["loss"]),
                                                                        rel=1e-6)
    with pytest.raises(Exception, match="4 ranks do not make 3 stages of equal size"):
        sbpc.compile(mlp(), mode="interpret", stages=3)
    with pytest.raises(Exception, match="'lg.input': pipeline stages are cut from a graph without sbp hints"):
        sbpc.compile(mlp(hinted=True), mode="interpret", stages=2)
    with pytest.raises(ValueError, match="stages= cuts a graph by hand: not with plan='auto'"):
        sbpc.compile(mlp(), plan="auto", stages=2)


@pytest.mark.parametrize("name", ["neg", "relu", "gelu", "tanh", "erf", "exp", "sqrt", "rsqrt", "add", "sub", "mul",
                                  "div"])
def test_each_op_function_builds_the_op_of_its_name(name):
    g = sbpc.Graph("named")
    x = g.input("x", (2,))
    fn = getattr(sbpc, name)
    y = fn(x) if name not in ("add", "sub", "mul", "div") else fn(x, x)
    assert y.value.owner.name == f"lg.{name}"


def test_a_hand_plan_is_priced_on_the_cluster_given():
    """compile(cluster=...) prices a hand plan's remaining choices on that
    cluster, as compile{device=...} does (it was read by plan="auto" alone):
    the GPT with its batch split over 16 ranks reduces every gradient in
    one bucket on this CPU preset, and is laid out otherwise for two H100
    nodes. Naming two different clusters is an error."""
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[3] / "examples"))
    import models

    def collectives(pipeline="compile", **options) -> list[str]:
        """Rank 0's collectives, in order."""
        module = models.gpt("dp", 16, 65, batch=64, seq=16, dim=32, heads=4, layers=2)
        exe = sbpc.compile(module, pipeline=pipeline, **options)
        rank0 = exe.plan_text.split("plan.device @rank1 ")[0]
        return [line.split(" id ")[0] for line in rank0.splitlines() if "plan.comm" in line]

    cpu, gpu = collectives(), collectives(cluster="h100-2nodes")
    assert len(cpu) == 1 and '"all_reduce"' in cpu[0]  # every gradient in one bucket
    assert gpu != cpu and gpu == collectives("compile{device=h100-2nodes}")
    with pytest.raises(ValueError, match="name different clusters"):
        collectives("compile{device=h100-node}", cluster="h100-2nodes")
