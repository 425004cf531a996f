"""The numpy backend's out= kernels and plan-fuse-elementwise.

- Every kernel, bound to its registers the way the executor binds it, writes
  what sbpc.semantics.local_eval's local kernel computes, on every device of a 2-rank
  plan that uses every op (split means, a row-split embedding table, losses
  over a split batch, fused chains).
- That plan runs on 1 and 2 MPI ranks and matches the reference.
- A steady-state step allocates no arrays: tracemalloc around each kernel
  firing sees no growth beyond a small bound, and sees the growth of a
  kernel that allocates (the check can fail).
- Fusion removes registers and actors and keeps the values.
"""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from support.plan_signatures import signatures_of
from xdsl.context import Context
from xdsl.dialects.builtin import f32

import sbpc
from sbpc import S
from sbpc.dialects import lg, plan
from sbpc.dialects.dtypes import numpy_dtype
from sbpc.dialects.pieces import piece_of
from sbpc.dialects.sbp import PartialAttr, ReduceKind, lookup_placement
from sbpc.lowering.compile import CompilePass
from sbpc.lowering.lg_autodiff import LgAutodiffPass
from sbpc.runtime import numpy_kernels, numpy_window_kernels
from sbpc.runtime.launch import rank_environment, script_command
from sbpc.semantics.local_eval import local_kernel
from sbpc.semantics.plan_interpreter import actor_kernel, run_plan
from sbpc.semantics.reference import evaluate
from sbpc.tools.sbp_run import generated_feeds

SUPPORT = Path(__file__).resolve().parents[1] / "support"


def every_op_module(ranks: int, device: str = "cpu", batch: int = 8):
    """An lg module (forward and gradients) whose plan uses every kernel."""
    g = sbpc.Graph("ops", placement=sbpc.placement(device, ranks=ranks))
    x = g.input("x", (batch, 12), sbp=S(0))
    ids = g.input("ids", (batch, 3), dtype="i64")
    labels = g.input("labels", (batch,), dtype="i64")
    picks = g.input("picks", (batch, 2), dtype="i64")
    table = g.param("table", (10, 12), init=sbpc.normal(0.0, 0.5), sbp=S(0))  # row-split: masked gather
    w = g.param("w", (16, 6), init=sbpc.normal(0.0, 0.3))
    gamma = g.param("gamma", (16,), init=sbpc.ones())
    beta = g.param("beta", (16,))
    # (8, 12); the second gather's row 0 gets no gradient (padding_idx)
    e = (sbpc.embedding(table, ids) + sbpc.embedding(table, ids, padding_idx=0)).sum(axes=(1,))
    h = sbpc.gelu(x + e) * sbpc.rsqrt(x * x + 1.0) - sbpc.tanh(sbpc.relu(x)) / sbpc.sqrt(sbpc.exp(-x) + 2.0)
    h = sbpc.dropout(h + sbpc.erf(x) * 0.5, 0.25)
    # drop path's per-example mask, from a uniform draw split with the batch, and one whose gradient stops
    h = h * sbpc.floor(g.rand((batch, 1)).to(S(0)) + 0.75) + sbpc.stop_gradient(h) * 0.1
    # the other unary ops (log of a positive value; the roundings pass no gradient)
    h = h + sbpc.log(x * x + 1.0) * sbpc.sin(x) + sbpc.cos(x) * sbpc.atan(x) * 0.5 + (
        sbpc.floor(x) + sbpc.ceil(x) + sbpc.round(x * 2.0) + sbpc.trunc(x)) * 0.1
    # running sums over the split batch axis (partial) and along a row, as ids' positions are counted
    ranks_of = sbpc.cumsum(sbpc.cast(sbpc.compare("gt", ids, g.constant(np.asarray(4))), "i64"), 1)
    ranks_of = ranks_of + sbpc.floordiv(ranks_of - 2, -2)  # integer division rounded down
    counts = sbpc.cast(ranks_of + sbpc.argmax(ids, 1).reshape(batch, 1), "f32").sum(axes=(1,), keepdims=True)
    h = sbpc.cumsum(h, 0) * 0.1 + sbpc.cumsum(h, 1, reverse=True) * 0.1 + counts
    hc = sbpc.concat([sbpc.pad(h, [0, 1], [0, 0], -0.5), sbpc.slice(x, [0, 3], [batch, 6])], axis=1)  # (batch, 16)
    # a convolution of the rows seen as 3-channel 2x2 images (its gradients: lg.conv2d_grad_*)
    images = sbpc.conv2d(sbpc.slice(hc, [0, 0], [batch, 12]).reshape(batch, 3, 2, 2),
                         g.param("kernel", (4, 3, 2, 1), init=sbpc.normal(0.0, 0.3)), padding=(1, 0))
    pooled = g.add(lg.MaxPool2dOp(images.value, (2, 2), (1, 1), (1, 0)))  # (batch, 4, 4, 1)
    hc = hc + (images.reshape(batch, 24).sum(axes=(1,), keepdims=True)
               + pooled.reshape(batch, 16).sum(axes=(1,), keepdims=True)) * 0.01
    ln = sbpc.layernorm(hc, gamma, beta, axis=1)
    logits = ln @ w  # (8, 6)
    t = logits.transpose(1, 0).reshape(3, 2 * batch)
    b = sbpc.broadcast_to(logits.mean(axes=(0,)), (batch, 6))
    s = sbpc.softmax(logits, axis=1) + sbpc.log_softmax(logits - b, axis=0)
    # a mask computed from an input: cast to i1, a logical op, a select whose
    # chosen values carry a gradient
    keep = sbpc.logical("xor", sbpc.cast(ids, "i1"), g.constant(np.array([True, False, True])))
    picked = sbpc.where(keep, sbpc.slice(logits, [0, 0], [batch, 3]), sbpc.cast(ids, "f32"))
    # the vocabulary-parallel cross-entropy over logits split by class, its
    # mean over the labels not ignored (a comparison's count)
    # (the hints hold each op to its class-split signature)
    by_class = g.input("scores", (batch, 6), sbp=S(1)) * g.param("temperature", (6,), init=sbpc.ones(), sbp=S(0))
    row_max = sbpc.reduce_max(by_class, [1]).to(PartialAttr(ReduceKind.MAX))
    sum_exp = g.add(lg.SumExpOp(by_class.value, row_max.value)).to(sbpc.P)
    token_losses = g.add(lg.TokenCrossEntropyOp(by_class.value, labels.value, row_max.value, sum_exp.value, 0))
    counted = sbpc.cast(sbpc.compare("ne", labels, g.constant(np.asarray(0))), "f32").sum(axes=(0,))
    tokens = token_losses.to(sbpc.P).sum(axes=(0,)) / counted
    per_class = sbpc.slice(g.add(lg.OneHotOp(labels.value, 6, f32)), [0, 0], [batch, 3]).sum(axes=(0,))
    ends = sbpc.cumsum(sbpc.cast(per_class, "i64"), 0)
    loss = (sbpc.cross_entropy(logits, labels) + sbpc.mse_loss(s, b) * 0.1 + t.sum(axes=(0, 1)) * 0.01
            + picked.sum(axes=(0, 1)) * 0.01 + tokens + sbpc.gather(logits, picks, 1).sum(axes=(0, 1)) * 0.01
            # the largest two and the smallest three of each row (top-k and sort)
            + sbpc.topk(logits, 2, axis=1)[0].sum(axes=(0, 1)) * 0.01
            + sbpc.topk(logits, 3, axis=1, largest=False)[0].sum(axes=(0, 1)) * 0.01
            # the rows in groups of three experts, the groups' ends counted from the labels at run time
            # picked entries of each row overwritten (the last of repeated picks wins)
            + sbpc.scatter(logits, picks, sbpc.slice(logits * 2.0, [0, 0], [batch, 2]), 1).sum(axes=(0, 1)) * 0.01
            + sbpc.grouped_matmul(logits, g.param("experts", (3, 6, 4), init=sbpc.normal(0.0, 0.3)), ends).sum(
                axes=(0, 1)) * 0.01)
    g.output(loss=loss, s=s, top=t.max(axes=(0,)))
    module = g.module()
    LgAutodiffPass().apply(Context(), module)
    return module


def compiled(module, **options):
    module = module.clone()
    CompilePass(**options).apply(Context(), module)
    return module, next(p for p in module.ops if isinstance(p, plan.ProgramOp))


def kernel_names(program) -> set[str]:
    return {a.kernel.data for d in program.devices() for a in d.actors() if isinstance(a, plan.ComputeOp)}


ALL_KERNELS = {op.name for op in numpy_kernels.NUMPY.ops() if hasattr(op, "name") and isinstance(op.name, str)} - {
    "lg.neg", "lg.tanh", "lg.erf", "lg.exp", "lg.sqrt", "lg.rsqrt", "lg.gelu", "lg.relu", "lg.step", "lg.div",
    "lg.stop_gradient", "lg.log", "lg.sin", "lg.cos", "lg.atan", "lg.floor", "lg.ceil", "lg.round", "lg.trunc",
    "lg.floordiv", "plan.fused"}
"""Kernels that must appear as actors (the elementwise ones may all be fused)."""


@pytest.fixture(scope="module")
def every_op():
    return every_op_module(2)


def test_the_plan_uses_every_kernel(every_op):
    _, program = compiled(every_op)
    names = kernel_names(program)
    assert ALL_KERNELS - {"lg.matmul"} <= names | {"lg.add", "lg.sub", "lg.mul"}, ALL_KERNELS - names
    assert "plan.fused" in names
    _, unfused = compiled(every_op, fuse=False)
    assert {"lg.gelu", "lg.rsqrt", "lg.tanh", "lg.erf", "lg.exp", "lg.sqrt", "lg.relu", "lg.div", "lg.log",
            "lg.sin", "lg.cos", "lg.atan", "lg.floor", "lg.ceil", "lg.round", "lg.trunc",
            "lg.one_hot", "lg.embedding_grad", "lg.floordiv"} <= kernel_names(unfused)


def _device_inputs(rng, registers, actor):
    ins = [registers[r.string_value()] for r in actor.ins.data]
    values = []
    for reg in ins:
        dtype = numpy_dtype(reg.type.element_type)
        shape = reg.type.get_shape()
        if dtype.kind == "f":
            values.append(rng.normal(size=shape).astype(dtype))
        else:
            # (a scatter's indices in [0, 2): they repeat, and the last write must win)
            bound = {"lg.cross_entropy": 6, "lg.one_hot": 6, "lg.token_cross_entropy": 6,
                     "lg.token_cross_entropy_grad": 6, "lg.gather": 6, "lg.scatter_add": 6,
                     "lg.scatter": 2}.get(actor.kernel.data, 10)
            values.append(rng.integers(0, bound, size=shape).astype(dtype))
    return values


def test_the_cross_entropy_of_the_plan_runs_split_by_class(every_op):
    text = str(compiled(every_op)[0])
    by_class = "!sbp.dtensor<8x6xf32, @cpu2_0_1, S<1>>"
    assert (by_class, "!sbp.dtensor<8xf32, @cpu2_0_1, P<max>>") in signatures_of(text, "lg.reduce_max")
    for kernel in ("lg.sum_exp", "lg.token_cross_entropy"):
        assert signatures_of(text, kernel) == {(by_class, "!sbp.dtensor<8xf32, @cpu2_0_1, P>")}
    assert signatures_of(text, "lg.token_cross_entropy_grad") == {(by_class, by_class)}


@pytest.mark.parametrize("fuse", [True, False])
def test_out_kernels_write_what_local_kernels_compute(every_op, fuse):
    seen = _check_out_kernels(every_op, fuse)
    fused_only = set() if fuse else {"lg.layernorm_grad"}  # (sbp-fuse-norms makes it, with `fuse`)
    assert ALL_KERNELS - {"lg.add", "lg.sub", "lg.mul"} - fused_only <= seen | {"lg.matmul"}


def test_the_embedding_gradient_scatters_as_its_gemm_computes(every_op, monkeypatch):
    # a table too large for the one-hot GEMM (a real vocabulary) scatters
    monkeypatch.setattr(numpy_kernels, "ONE_HOT_ELEMENTS", 0)
    assert "lg.embedding_grad" in _check_out_kernels(every_op, fuse=True, kinds={"lg.embedding_grad"})


def _check_out_kernels(module, fuse: bool, kinds: set[str] | None = None) -> set[str]:
    """Each kernel (of `kinds`, or all) of the module's plan, bound as the
    executor binds it, against its local kernel: the kernels it checked."""
    _, program = compiled(module, fuse=fuse)
    ctx = sbpc.make_context()
    rng = np.random.default_rng(0)
    seen = set()
    for device in program.devices():
        registers = {r.sym_name.data: r for r in device.registers()}
        rank = device.rank.value.data

        def piece_here(t, device=device, rank=rank):
            return piece_of(t, lookup_placement(device, t.placement).mesh(), rank)

        for actor in device.actors():
            if not isinstance(actor, plan.ComputeOp) or (kinds is not None and actor.kernel.data not in kinds):
                continue
            op, local = actor_kernel(ctx, actor, registers, piece_here)
            inputs = _device_inputs(rng, registers, actor)
            out_reg = registers[actor.outs.data[0].string_value()]
            dtype = numpy_dtype(out_reg.type.element_type)
            out = np.full(out_reg.type.get_shape(), np.nan if dtype.kind == "f" else 77, dtype)  # written over?
            fire = numpy_kernels.bind(op, local, inputs, out)
            with np.errstate(all="ignore"):
                expected = local_kernel(op, local, *inputs)
                for _ in range(2):  # scratch is reused: a second firing gives the same
                    fire(inputs, out)
            np.testing.assert_allclose(out, expected.astype(out.dtype), rtol=1e-5, atol=1e-6,
                                       err_msg=f"@{actor.sym_name.data} ({actor.kernel.data}) on rank {rank}")
            seen.add(actor.kernel.data)
    return seen


def test_an_in_place_chain_may_write_over_its_input():
    # relu -> gelu -> add written into the bytes of its input
    g = sbpc.Graph("ip", placement=sbpc.placement("cpu", ranks=1))
    x = g.input("x", (4, 8))
    g.output(y=sbpc.gelu(sbpc.relu(x) * 2.0) + x)
    module, program = compiled(g.module())
    feeds = {"x": np.random.default_rng(1).normal(size=(4, 8)).astype(np.float32)}
    np.testing.assert_allclose(run_plan(module, feeds)["y"], evaluate(g.module(), feeds)["y"], rtol=1e-6)


def test_fusion_keeps_values_and_drops_registers(every_op):
    fused_module, fused = compiled(every_op)
    plain_module, plain = compiled(every_op, fuse=False)
    feeds = generated_feeds(fused, 4)
    assert len(list(fused.devices()[0].registers())) < len(list(plain.devices()[0].registers()))
    assert len(fused.devices()[0].actors()) < len(plain.devices()[0].actors())
    # fewer bytes in all; the peak may grow a little, since a fused actor keeps
    # every input of its chain live until the chain ends
    assert fused.devices()[0].no_reuse.value.data < plain.devices()[0].no_reuse.value.data
    expected = evaluate(every_op, feeds)
    got = run_plan(fused_module, feeds)
    for name in expected:
        np.testing.assert_allclose(got[name], expected[name], rtol=1e-4, atol=1e-5, err_msg=name)


@pytest.mark.parametrize("ranks", [1, 2])
def test_every_op_runs_on_mpi_ranks_and_matches_the_reference(ranks, tmp_path):
    module = every_op_module(ranks)
    path = tmp_path / f"ops{ranks}.mlir"
    path.write_text(str(module))
    _, program = compiled(module)
    feeds = generated_feeds(program, 5)
    np.savez(tmp_path / "feeds.npz", **feeds)
    done = subprocess.run([sys.executable, "-m", "sbpc.tools.sbp_run", str(path), "-n", str(ranks), "--feeds",
                           str(tmp_path / "feeds.npz"), "-o", str(tmp_path / "out.npz")],
                          capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr
    expected = evaluate(module, feeds)
    with np.load(tmp_path / "out.npz") as got:
        assert set(got.files) == set(expected)
        for name in expected:
            np.testing.assert_allclose(got[name], expected[name], rtol=1e-4, atol=1e-5, err_msg=f"{name} on {ranks}")


BOUND = 40 * 1024
"""What a firing may allocate: numpy's ufunc machinery keeps an iteration
buffer of at most 8192 elements (32 KiB of f32) where it broadcasts. With a
batch of 8192 every batch-sized tensor is 64 KiB or more, so a kernel that
allocates one exceeds the bound."""


def test_a_steady_state_step_allocates_no_arrays(tmp_path):
    path = tmp_path / "ops.mlir"
    path.write_text(str(every_op_module(1, batch=8192)))
    done = subprocess.run(script_command(1, str(SUPPORT / "alloc_probe.py"), str(path)), capture_output=True,
                          text=True, timeout=180, env=rank_environment())
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout.strip().splitlines()[-1])
    # the probe sees the allocating path (local kernel, then a copy): the check can fail
    assert report["allocating_kernel"] >= report["biggest_output"] > BOUND, report
    assert len(report["per_kernel"]) > 40
    worst = max(report["per_kernel"].items(), key=lambda kv: kv[1])
    assert worst[1] <= BOUND, f"{worst[0]} allocated {worst[1]} bytes in a steady-state firing"


@pytest.mark.parametrize("ta", [False, True])
@pytest.mark.parametrize("tb", [False, True])
@pytest.mark.parametrize("batch", [(), (3,)])
def test_matmul_in_column_blocks_equals_one_call(monkeypatch, ta, tb, batch):
    """A long matmul run in column blocks (so MPI can progress between them)
    writes exactly what one call writes, for every transpose and a batch."""
    monkeypatch.setattr(plan, "MATMUL_BLOCK_FLOPS", 500)
    monkeypatch.setattr(plan, "MIN_BLOCK_COLUMNS", 8)
    rng = np.random.default_rng(0)
    m, k, n = 6, 5, 40
    a = rng.standard_normal((*batch, k, m) if ta else (*batch, m, k), dtype=np.float32)
    b = rng.standard_normal((n, k) if tb else (k, n), dtype=np.float32)
    lhs = plan_free_value(a.shape)
    rhs = plan_free_value(b.shape)
    op = sbpc.dialects.lg.MatmulOp(lhs, rhs, transpose_lhs=ta, transpose_rhs=tb)
    out = np.full((*batch, m, n), np.nan, np.float32)
    parts = numpy_kernels.bind_parts(op, [a, b], out)
    assert parts is not None
    blocks = sum(1 for _ in parts([a, b], out))
    assert blocks >= 2
    expected = np.matmul(np.swapaxes(a, -1, -2) if ta else a, b.T if tb else b)
    np.testing.assert_allclose(out, expected, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize(("rows", "k", "columns", "blocks"), [
    (512, 768, 3072, 1),  # GPT-2 small's MLP on a rank: 2.4 GFLOP, but only 3072 columns
    (4096, 128, 4096, 2),  # the MLP's weight gradient: two blocks of 2048
    (512, 768, 50257, 24),  # GPT-2 small's vocabulary projection: 98 blocks of 400 MFLOP would be 513 wide
    (64, 64, 65536, 1),  # wide but short: 537 MFLOP
])
def test_long_matmuls_run_in_blocks_only_as_wide_as_blas_keeps_its_rate(rows, k, columns, blocks):
    """Blocks exist for MPI's progress, and each costs a repacking of the
    left operand: narrow ones ran GPT-2's GEMMs at 0.59-0.94x one call's
    rate (plan.MIN_BLOCK_COLUMNS), so a matmul is cut only into blocks of at
    least 2048 columns and about 400 MFLOP."""
    assert plan.matmul_blocks(2.0 * rows * k * columns, columns) == blocks
    a = np.zeros((rows, k), np.float32)
    b = np.zeros((k, columns), np.float32)
    op = sbpc.dialects.lg.MatmulOp(plan_free_value(a.shape), plan_free_value(b.shape))
    parts = numpy_kernels.bind_parts(op, [a, b], np.empty((rows, columns), np.float32))
    assert (parts is None) == (blocks == 1)


@pytest.mark.parametrize("tb", [False, True])
@pytest.mark.parametrize("contiguous", [True, False])
def test_matmul_of_a_stack_times_a_matrix_is_one_gemm(tb, contiguous):
    """[batch, seq, k] @ [k, n] runs as one GEMM of batch*seq rows (gemm_operands)
    and writes what numpy's per-index loop writes; a strided output (or
    input), which a reshape would copy, keeps the loop."""
    rng = np.random.default_rng(1)
    a = rng.standard_normal((3, 5, 4), dtype=np.float32)
    b = rng.standard_normal((6, 4) if tb else (4, 6), dtype=np.float32)
    folded = numpy_kernels.gemm_operands(a, b.T if tb else b, np.empty((3, 5, 6), np.float32))
    assert [x.ndim for x in folded] == [2, 2, 2]
    op = sbpc.dialects.lg.MatmulOp(plan_free_value(a.shape), plan_free_value(b.shape), transpose_rhs=tb)
    wide = np.full((3, 5, 12), np.nan, np.float32)
    out = np.full((3, 5, 6), np.nan, np.float32) if contiguous else wide[..., ::2]
    lhs = a if contiguous else np.repeat(a, 2, axis=2)[..., ::2]
    numpy_kernels.bind(op, None, [lhs, b], out)([lhs, b], out)
    np.testing.assert_allclose(out, np.matmul(a, b.T if tb else b), rtol=1e-6, atol=1e-6)
    if not contiguous:
        assert np.isnan(wide[..., 1::2]).all()  # nothing written between the output's columns


def plan_free_value(shape):
    """An SSA value of a float32 tensor type, to build an lg op on."""
    from xdsl.dialects.builtin import TensorType, f32
    from xdsl.ir import Block

    return Block(arg_types=[TensorType(f32, shape)]).args[0]


@pytest.mark.parametrize("rows", [3, 4, 7])
def test_fused_chain_in_blocks_of_rows_equals_whole(monkeypatch, rows):
    """A long fused chain runs block of rows by block of rows (its
    intermediates stay in cache): same result as the whole chain, with
    inputs that broadcast along the rows, a last block shorter than the
    others, and the output written in place over an input."""
    from xdsl.dialects.builtin import TensorType, f32
    from xdsl.ir import Block

    from sbpc.dialects import lg
    from sbpc.semantics.local_eval import Fused

    n, d = 10, 6
    full, row, scalar = TensorType(f32, (n, d)), TensorType(f32, (d,)), TensorType(f32, ())
    x, b, s = Block(arg_types=[full, row, scalar]).args
    add = lg.AddOp(x, b)  # broadcast of a row
    mul = lg.MulOp(add.results[0], s)  # of a scalar
    gelu = lg.GeluOp(mul.results[0])
    sub = lg.SubOp(x, gelu.results[0])
    op = Fused(((add, (0, 1)), (mul, (3, 2)), (gelu, (4,)), (sub, (0, 5))))
    rng = np.random.default_rng(1)
    ins = [rng.standard_normal((n, d), dtype=np.float32), rng.standard_normal(d, dtype=np.float32),
           np.float32(0.7)]
    whole = np.empty((n, d), np.float32)
    numpy_kernels.bind(op, None, ins, whole)(ins, whole)
    monkeypatch.setattr(numpy_kernels, "FUSED_TILE_ELEMENTS", rows * d)
    assert numpy_kernels._bind_fused_rows(op, None, ins, whole) is not None
    out = np.full((n, d), np.nan, np.float32)
    numpy_kernels.bind(op, None, ins, out)(ins, out)
    np.testing.assert_array_equal(out, whole)
    in_place = ins[0].copy()  # the output over the input x, which it reads
    numpy_kernels.bind(op, None, [in_place, *ins[1:]], in_place)([in_place, *ins[1:]], in_place)
    np.testing.assert_array_equal(in_place, whole)


@pytest.mark.parametrize("shape, axis", [((5, 7, 3), 1), ((9, 4), 0), ((2, 3, 40), 2), ((6, 5), 1)])
def test_topk_in_blocks_writes_what_one_sort_writes(monkeypatch, shape, axis):
    """The numpy top-k sorts a few lines at a time (TOPK_BLOCK elements, so a
    steady step allocates little): with a block smaller than a line, or
    than the lines across an inner axis, it writes the indices one sort of
    the whole tensor gives, ties and NaN included."""
    from sbpc.semantics.local_eval import LocalContext
    from sbpc.semantics.reference import topk_indices

    monkeypatch.setattr(numpy_kernels, "TOPK_BLOCK", 8)
    x = np.round(np.random.default_rng(2).standard_normal(shape), 1).astype(np.float32)  # ties
    x.flat[3] = np.nan
    whole = tuple(slice(0, d) for d in shape)
    for smallest in (False, True):
        k = shape[axis] - 1
        op = lg.TopkOp(plan_free_value(shape), k, axis, smallest=smallest)
        out_shape = tuple(k if i == axis else d for i, d in enumerate(shape))
        local = LocalContext((shape,), out_shape, (whole,), tuple(slice(0, d) for d in out_shape), ())
        out = np.full(out_shape, -1, np.int64)
        numpy_kernels.bind(op, local, [x], out)([x], out)
        np.testing.assert_array_equal(out, topk_indices(x, k, axis, smallest))


CONVOLUTIONS = [  # (kernel, stride, padding, dilation, groups): the gradient for the input as a forward
    ((3, 3), (1, 1), (1, 1), (1, 1), 1),  # convolution (stride 1, padding within the kernel's reach)
    ((3, 3), (1, 1), (0, 0), (1, 1), 2),
    ((3, 2), (1, 1), (2, 1), (1, 1), 1),
    ((1, 1), (1, 1), (0, 0), (1, 1), 1),
    ((3, 3), (1, 1), (1, 1), (1, 1), 4),  # depthwise
    ((3, 3), (1, 1), (3, 3), (1, 1), 1),  # and by the windows' shares added back: padding past the reach,
    ((3, 3), (2, 2), (1, 1), (1, 1), 1),  # stride, dilation
    ((3, 3), (1, 1), (1, 1), (2, 1), 2),
]


@pytest.mark.parametrize("gemm", ["per image", "over every image", "over every image, gathered"])
@pytest.mark.parametrize("kernel, stride, padding, dilation, groups", CONVOLUTIONS)
def test_convolution_kernels_compute_what_the_reference_computes(kernel, stride, padding, dilation, groups, gemm,
                                                                 monkeypatch):
    from xdsl.dialects.builtin import TensorType
    from xdsl.ir import Block

    from sbpc.semantics.reference import REFERENCE

    monkeypatch.setattr(numpy_window_kernels, "ONE_GEMM_BELOW", 0 if gemm == "per image" else 10**9)
    # the windows copied into the GEMM's layout, or gathered by their positions (short output rows)
    monkeypatch.setattr(numpy_window_kernels, "GATHER_ROWS_UP_TO", 10**9 if gemm.endswith("gathered") else 0)
    rng = np.random.default_rng(3)
    x = rng.standard_normal((2, 4, 7, 6), dtype=np.float32)
    w = rng.standard_normal((4, 4 // groups, *kernel), dtype=np.float32)
    conv = {"stride": stride, "padding": padding, "dilation": dilation, "groups": groups}
    block = Block(arg_types=[TensorType(f32, x.shape), TensorType(f32, w.shape)])
    forward = lg.Conv2dOp(block.args[0], block.args[1], **conv)
    g = rng.standard_normal(forward.result.type.get_shape(), dtype=np.float32)
    grads = Block(arg_types=[TensorType(f32, g.shape), TensorType(f32, w.shape), TensorType(f32, x.shape)])
    for op, ins, shape in ((forward, [x, w], g.shape),
                           (lg.Conv2dGradInputOp(grads.args[0], grads.args[1], x.shape[2:], **conv), [g, w], x.shape),
                           (lg.Conv2dGradWeightOp(grads.args[2], grads.args[0], kernel, **conv), [x, g], w.shape)):
        out = np.full(shape, np.nan, np.float32)
        fire = numpy_kernels.NUMPY[type(op)](op, None, ins, out)
        for _ in range(2):  # scratch kept from the first firing must not leak into the second
            fire(ins, out)
            np.testing.assert_allclose(out, REFERENCE[type(op)](op, *ins), rtol=1e-5, atol=1e-5, err_msg=op.name)


@pytest.mark.parametrize("gemm", ["per image", "over every image"])
def test_a_piece_of_no_images_has_no_share_of_the_weights_gradient(gemm, monkeypatch):
    """A batch split unevenly leaves a device no images: its partial sum of
    the weight's gradient is zero, whatever its output held before."""
    from xdsl.dialects.builtin import TensorType
    from xdsl.ir import Block

    monkeypatch.setattr(numpy_window_kernels, "ONE_GEMM_BELOW", 0 if gemm == "per image" else 10**9)
    x, g = np.zeros((0, 4, 7, 6), np.float32), np.zeros((0, 4, 7, 6), np.float32)
    block = Block(arg_types=[TensorType(f32, x.shape), TensorType(f32, g.shape)])
    op = lg.Conv2dGradWeightOp(block.args[0], block.args[1], (3, 3), (1, 1), (1, 1))
    out = np.full((4, 4, 3, 3), np.nan, np.float32)
    numpy_kernels.NUMPY[type(op)](op, None, [x, g], out)([x, g], out)
    np.testing.assert_array_equal(out, 0)


POOLINGS = [  # (kernel, stride, padding)
    ((3, 3), (2, 2), (1, 1)),  # ResNet's
    ((2, 2), (2, 2), (0, 0)),
    ((3, 2), (1, 1), (1, 1)),  # overlapping windows: a position in several
    ((2, 3), (1, 2), (1, 0)),
]


@pytest.mark.parametrize("kernel, stride, padding", POOLINGS)
def test_max_pooling_kernels_compute_what_the_reference_computes(kernel, stride, padding):
    """Forward and backward against the reference, with ties (the first
    maximum of a window takes its gradient), a NaN (the first NaN does) and
    an infinite gradient (to its window's maximum, nowhere else)."""
    from xdsl.dialects.builtin import TensorType
    from xdsl.ir import Block

    from sbpc.semantics.reference import REFERENCE

    x = np.round(np.random.default_rng(4).standard_normal((2, 3, 7, 6)), 0).astype(np.float32)  # ties
    x[1, 2, 3, 4] = np.nan
    block = Block(arg_types=[TensorType(f32, x.shape)])
    forward = lg.MaxPool2dOp(block.args[0], kernel, stride, padding)
    g = np.random.default_rng(5).standard_normal(forward.result.type.get_shape()).astype(np.float32)
    g[0, 1, 1, 1] = np.inf  # to its window's first maximum alone
    grads = Block(arg_types=[TensorType(f32, x.shape), TensorType(f32, g.shape)])
    backward = lg.MaxPool2dGradOp(grads.args[0], grads.args[1], kernel, stride, padding)
    for op, ins, shape in ((forward, [x], g.shape), (backward, [x, g], x.shape)):
        out = np.full(shape, -7, np.float32)
        fire = numpy_kernels.NUMPY[type(op)](op, None, ins, out)
        for _ in range(2):  # scratch kept from the first firing must not leak into the second
            fire(ins, out)
            np.testing.assert_allclose(out, REFERENCE[type(op)](op, *ins), rtol=1e-6, atol=1e-6, err_msg=op.name)


@pytest.mark.parametrize("shape, axes", [((4, 3, 5, 6), (0, 2, 3)), ((4, 3, 5, 6), (0, 1, 3)), ((3, 4, 20), (0, 2)),
                                         ((4, 3, 5, 6), (1, 2, 3)), ((4, 3, 5, 6), (0, 2)),
                                         ((4, 3, 5, 6), (0, 1, 2, 3))])
@pytest.mark.parametrize("keepdims", [True, False])
def test_sums_and_means_over_trailing_and_leading_axes_compute_numpys(shape, axes, keepdims):
    """A GEMV over the trailing axes, then np.sum over the leading ones
    (batch normalization's statistics over N, H and W); numpy's own sum
    where no trailing axis is reduced."""
    from xdsl.dialects.builtin import TensorType
    from xdsl.ir import Block

    from sbpc.semantics.local_eval import LocalContext

    x = np.random.default_rng(6).standard_normal(shape).astype(np.float32)
    block = Block(arg_types=[TensorType(f32, shape)])
    for op, want in ((lg.ReduceSumOp(block.args[0], axes, keepdims), np.sum(x, axis=axes, keepdims=keepdims)),
                     (lg.ReduceMeanOp(block.args[0], axes, keepdims), np.mean(x, axis=axes, keepdims=keepdims))):
        out = np.full(want.shape, np.nan, np.float32)
        local = LocalContext((shape,), want.shape, (tuple(slice(0, d) for d in shape),),
                             tuple(slice(0, d) for d in want.shape), ())
        fire = numpy_kernels.NUMPY[type(op)](op, local, [x], out)
        for _ in range(2):
            fire([x], out)
            np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5, err_msg=op.name)
