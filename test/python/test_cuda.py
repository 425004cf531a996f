"""The CUDA path: every generated kernel compiles to PTX with NVRTC (and
passes ptxas for sm_90 where ptxas exists) on any machine; launches compare
with the numpy local kernels and are skipped, with the reason, where there
is no GPU."""

import numpy as np
import pytest
from xdsl.context import Context

import sbpc
from sbpc import B, S
from sbpc.dialects import lg, plan
from sbpc.dialects.pieces import numpy_dtype, piece
from sbpc.dialects.sbp import PartialAttr, ReduceKind, lookup_placement, nd_to_plain
from sbpc.lowering.compile import CompilePass
from sbpc.lowering.plan_codegen import PlanCodegenPass
from sbpc.runtime import cuda
from sbpc.semantics.local_eval import LocalContext, local_kernel

nvrtc = pytest.importorskip("cuda.bindings.nvrtc", reason="the NVRTC binding is part of sbpc[test]")


def kernels_graph():
    """One graph with every kind of kernel the generator covers, on 2 CUDA devices."""
    g = sbpc.Graph("kernels", placement=sbpc.placement("cuda", ranks=2))
    x = g.input("x", (8, 6, 16), sbp=S(0))
    v = g.input("v", (16,), sbp=B)
    w = g.param("w", (16, 12), init=sbpc.normal(0.0, 0.2))
    wt = g.param("wt", (12, 16), init=sbpc.normal(0.0, 0.2))
    y = x @ w
    yt = sbpc.matmul(x, wt, transpose_b=True)  # (8,6,16) @ (16,12)
    b = sbpc.matmul(x, x, transpose_b=True)  # batched (8,6,6)
    e = sbpc.gelu(x + v) * 0.5 - sbpc.exp(-x) / (sbpc.sqrt(x * x + 1.0))
    r = sbpc.rsqrt(x * x + 2.0) + sbpc.tanh(sbpc.relu(x))
    s = sbpc.softmax(y, axis=2) + sbpc.log_softmax(y, axis=1)
    ln = sbpc.layernorm(e, g.param("g", (16,), init=sbpc.ones()), g.param("b", (16,)), axis=2)
    ln0 = sbpc.layernorm(r, axis=1)
    red = e.sum(axes=(1, 2)) + ln0.mean(axes=(1, 2)) + ln.max(axes=(1, 2), keepdims=False)
    t = x.transpose(0, 2, 1).reshape(8, 96)
    scans = sbpc.cumsum(x, 0) + sbpc.cumsum(x, 2, reverse=True)
    picks = g.input("picks", (8, 6, 4), sbp=S(0), dtype="i64")
    scattered = g.add(lg.ScatterAddOp(sbpc.gather(x, picks, 2).value, picks.value, 2, 16))
    padded = sbpc.pad(r, [0, 1, 2], [1, 0, 0], -0.5)
    conv = {"stride": (2, 1), "padding": (1, 0), "dilation": (1, 2), "groups": 2}
    filters = g.param("filters", (6, 2, 3, 2), init=sbpc.normal(0.0, 0.3))
    images = g.input("images", (8, 4, 5, 7), sbp=S(0))
    back = g.input("back", (8, 6, 3, 5), sbp=S(0))
    convs = [sbpc.conv2d(images, filters, **conv),
             g.add(lg.Conv2dGradInputOp(back.value, filters.value, (5, 7), **conv)),
             g.add(lg.Conv2dGradWeightOp(images.value, back.value, (3, 2), **conv))]
    pooled = g.add(lg.MaxPool2dOp(images.value, (3, 2), (2, 2), (1, 1)))
    convs.append(g.add(lg.MaxPool2dGradOp(images.value, pooled.value, (3, 2), (2, 2), (1, 1))))
    # the vocabulary-parallel cross-entropy over logits split by class (the hints hold the split)
    logits = g.input("logits", (8, 13), sbp=S(1))
    labels = g.input("labels", (8,), sbp=B, dtype="i64")
    row_max = sbpc.reduce_max(logits, [1]).to(PartialAttr(ReduceKind.MAX))
    sum_exp = g.add(lg.SumExpOp(logits.value, row_max.value)).to(sbpc.P)
    tokens = g.add(lg.TokenCrossEntropyOp(logits.value, labels.value, row_max.value, sum_exp.value, -100))
    grad = g.add(lg.TokenCrossEntropyGradOp(logits.value, labels.value, row_max.value, sum_exp.value,
                                            tokens.value, -100))
    dropped = sbpc.dropout(x, 0.3) + sbpc.dropout(logits, 0.5).to(S(1)).sum(axes=(1,)).reshape(8, 1, 1)
    # masks: comparisons of floats and of integers, casts both ways, a logical op, a select, broadcasting
    positive = sbpc.compare("gt", x, v)
    high = sbpc.compare("ge", picks, g.constant(np.int64(7)))
    either = sbpc.logical("or", positive, sbpc.compare("le", x, g.constant(np.float32(-1.0))))
    masked = (sbpc.where(either, x, sbpc.cast(sbpc.cast(x * 3.0, "i64"), "f32"))
              + sbpc.cast(high, "f32").sum(axes=(2,), keepdims=True))
    counts = sbpc.cast(high, "i64").sum(axes=(2,)) * picks.sum(axes=(2,))  # integer sums and products
    counts = counts + sbpc.argmax(x, 2) + sbpc.argmax(picks, 1).sum(axes=(1,), keepdims=True)  # (8, 6)
    g.output(yt=yt, b=b, s=s, red=red, t=t, scans=scans, padded=padded, scattered=scattered, dropped=dropped,
             masked=masked, counts=counts,
             tokens=tokens.to(sbpc.P), grad=grad.to(S(1)), conv=convs[0], conv_input=convs[1], conv_weight=convs[2],
             pool_back=convs[3])
    module = g.module()
    CompilePass().apply(Context(), module)
    PlanCodegenPass().apply(Context(), module)
    return module


@pytest.fixture(scope="module")
def module():
    return kernels_graph()


def actors(module):
    for program in [p for p in module.ops if isinstance(p, plan.ProgramOp)]:
        for device in program.devices():
            registers = {r.sym_name.data: r for r in device.registers()}
            for actor in device.actors():
                if isinstance(actor, plan.ComputeOp):
                    yield device, registers, actor


def test_every_kernel_compiles_to_ptx(module):
    seen = set()
    for device, _, actor in actors(module):
        if device.rank.value.data != 0:
            continue
        source = actor.attributes["cuda.source"].data
        entry = actor.attributes["cuda.entry"].data
        ptx = cuda.compile_ptx(source, f"{entry}.cu")
        assert f".entry {entry}(".encode() in ptx
        assert b".target sm_90" in ptx
        if cuda.ptxas():
            cuda.check_ptx(ptx)
        seen.add(actor.kernel.data)
    assert {"lg.matmul", "lg.add", "plan.fused", "lg.softmax", "lg.log_softmax", "lg.layernorm", "lg.reduce_sum",
            "lg.reduce_mean", "lg.reduce_max", "lg.transpose", "lg.reshape", "lg.cumsum", "lg.pad", "lg.sum_exp",
            "lg.token_cross_entropy", "lg.token_cross_entropy_grad", "lg.gather", "lg.scatter_add", "lg.conv2d",
            "lg.conv2d_grad_input", "lg.conv2d_grad_weight", "lg.max_pool2d", "lg.max_pool2d_grad",
            "lg.dropout", "lg.compare", "lg.cast", "lg.logical", "lg.select", "lg.argmax"} <= seen


def test_ptx_is_cached_by_source(module, tmp_path, monkeypatch):
    monkeypatch.setenv("SBPC_CACHE", str(tmp_path))
    _, _, actor = next(actors(module))
    source = actor.attributes["cuda.source"].data
    first = cuda.compile_ptx(source)
    assert len(list((tmp_path / "ptx").glob("*.ptx"))) == 1
    assert cuda.compile_ptx(source) == first


def test_a_kernel_that_does_not_compile_reports_nvrtc_log():
    with pytest.raises(RuntimeError, match="NVRTC could not compile"):
        cuda.compile_ptx('extern "C" __global__ void k() { undefined_thing(); }')


def test_unsupported_kernels_are_diagnosed():
    g = sbpc.Graph("e", placement=sbpc.placement("cuda", ranks=1))
    t = g.param("t", (4, 3), init=sbpc.normal())
    i = g.input("i", (2,), dtype="i64")
    g.output(e=sbpc.embedding(t, i))
    module = g.module()
    CompilePass().apply(Context(), module)
    with pytest.raises(Exception, match="no CUDA kernel for kernel lg.embedding"):
        PlanCodegenPass().apply(Context(), module)


def gpu_or_skip():
    try:
        cuda.driver()
    except cuda.CudaUnavailable as e:
        pytest.skip(f"no GPU here: {e}")


def random_input(register, rng) -> np.ndarray:
    shape, dtype = register.type.get_shape(), numpy_dtype(register.type.element_type)
    if dtype.kind == "b":
        return rng.random(shape) < 0.5
    if dtype.kind == "i":  # of 13 classes or elements: labels (1-D) some ignored (-100), indices all in range
        ignored = rng.random(shape) < (0.2 if len(shape) == 1 else 0)
        return np.where(ignored, -100, rng.integers(0, 13, shape)).astype(dtype)
    return rng.normal(size=shape).astype(dtype)


def test_kernels_launch_and_match_numpy(module):
    gpu_or_skip()
    rng = np.random.default_rng(0)
    for device, registers, actor in actors(module):
        if device.rank.value.data != 0:
            continue
        ins = [registers[r.string_value()] for r in actor.ins.data]
        out = registers[actor.outs.data[0].string_value()]
        inputs = [random_input(r, rng) for r in ins]
        op = sbpc.make_context().get_op(actor.kernel.data).create(properties=dict(actor.props.data),
                                                                   result_types=[out.type])
        def piece_of(t, device=device):
            mesh = lookup_placement(device, t.placement).mesh()
            return piece(t.get_shape(), nd_to_plain(t.nd_sbp), mesh.shape, (0,))

        local = LocalContext(tuple(r.value.get_shape() for r in ins), out.value.get_shape(),
                             tuple(piece_of(r.value) for r in ins), piece_of(out.value), nd_to_plain(out.value.nd_sbp))
        expected = local_kernel(op, local, *inputs)
        got = cuda.launch(actor.attributes["cuda.source"].data, actor.attributes["cuda.entry"].data,
                          list(actor.attributes["cuda.launch"].get_values()), inputs, out.type.get_shape(),
                          numpy_dtype(out.type.element_type))
        np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5, err_msg=actor.sym_name.data)


# -- the CUDA execution backend ------------------------------------------------------
#
# Host logic (pointers, staging, copies) is checked on CPU: plain functions
# directly, and the whole CudaExecutor on EmulatedGpu, which keeps device
# memory in a numpy array and runs each actor's numpy kernel at the pointers
# the executor passes (no CUDA code runs). The same MLP training plan runs
# for real only where a GPU and PyCUDA are present.

import os  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

from sbpc.semantics.reference import evaluate  # noqa: E402
from sbpc.tools.sbp_run import generated_feeds  # noqa: E402

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def mlp_train_text(ranks: int, device: str = "cuda") -> str:
    text = (EXAMPLES / "mlp_train.mlir").read_text()
    line = "sbp.placement @dp cpu ranks [0, 1, 2, 3] mesh [4]"
    assert line in text
    ranks_text = ", ".join(map(str, range(ranks)))
    return text.replace(line, f"sbp.placement @dp {device} ranks [{ranks_text}] mesh [{ranks}]")


def cuda_plan(ranks: int):
    module = sbpc.parse_module(mlp_train_text(ranks))
    CompilePass().apply(Context(), module)
    return module, next(p for p in module.ops if isinstance(p, plan.ProgramOp))


def test_launch_pointers_and_staging_follow_the_memory_plan():
    from sbpc.runtime import cuda_backend as cb

    module, program = cuda_plan(2)
    assert cb.is_cuda_program(program)
    for device in program.devices():
        registers = {r.sym_name.data: r for r in device.registers()}
        arena, persistent = cb.region_sizes(device)
        bases = (1 << 32, 1 << 40)
        limits = {bases[0]: arena, bases[1]: persistent}
        comm_seen = 0
        for actor in device.actors():
            for step in (0, 1, 2):
                if isinstance(actor, plan.ComputeOp):
                    refs = [*actor.ins.data, actor.outs.data[0]]
                    args = cb.launch_arguments(actor, registers, step, bases)
                    assert len(args) == len(refs)
                    for ref, address in zip(refs, args):
                        reg = registers[ref.string_value()]
                        base = bases[1] if reg.is_persistent is not None else bases[0]
                        slot = step % reg.slots.value.data
                        assert address == base + reg.offset.value.data + slot * reg.bytes.value.data
                        assert base <= address and address + reg.bytes.value.data <= base + limits[base]
                else:
                    down, up = cb.staging(actor, registers, step)
                    assert [s.nbytes for s in down] == [
                        registers[r.string_value()].bytes.value.data for r in actor.ins.data
                    ]
                    assert [s.nbytes for s in up] == [
                        registers[r.string_value()].bytes.value.data for r in actor.outs.data
                    ]
                    comm_seen += 1
        assert comm_seen, "a 2-rank data-parallel step has collectives to stage"


def test_the_backend_runs_on_an_emulated_gpu_in_process():
    from mpi4py import MPI

    from sbpc.runtime.cuda_backend import CudaExecutor, EmulatedGpu
    from sbpc.runtime.executor import Executor

    module, program = cuda_plan(1)
    feeds = generated_feeds(program, 2)
    gpu = EmulatedGpu()
    results = []
    executors = (CudaExecutor(module, program, MPI.COMM_WORLD, gpu=gpu), Executor(module, program, MPI.COMM_WORLD))
    for executor in executors:
        executor.initialize()
        executor.feed(feeds)
        results.append({k: v[2] for k, v in executor.run(2).items()})  # two steps: parameters written back on the GPU
    on_gpu, on_cpu = results
    for name in on_cpu:
        np.testing.assert_array_equal(on_gpu[name], on_cpu[name], err_msg=name)
    launched = {name for name, _ in gpu.launches}
    generated = {a.sym_name.data for a in program.devices()[0].actors()
                 if isinstance(a, plan.ComputeOp) and "cuda.source" in a.attributes}
    assert generated and launched == generated
    kinds = {kind for kind, _, _ in gpu.copies}
    assert {"htod", "dtoh"} <= kinds  # parameters and feeds up, fetches down
    assert ("dtod" in kinds) == bool(executors[0].updates)  # updated parameters, in place on the GPU


def run_mlp_and_compare(ranks: int, tmp_path, env: dict, rtol: float, atol: float) -> None:
    """sbp-run trains the MLP on `ranks` CUDA ranks; its outputs match the reference."""
    path = tmp_path / "mlp.mlir"
    path.write_text(mlp_train_text(ranks))
    done = subprocess.run([sys.executable, "-m", "sbpc.tools.sbp_run", str(path), "-n", str(ranks), "--seed", "3",
                           "-o", str(tmp_path / "o.npz")], capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr
    _, program = cuda_plan(ranks)
    expected = evaluate(sbpc.parse_module(path.read_text()), generated_feeds(program, 3))
    with np.load(tmp_path / "o.npz") as got:
        for name in expected:
            np.testing.assert_allclose(got[name], expected[name], rtol=rtol, atol=atol, err_msg=name)


@pytest.mark.parametrize("ranks", [1, 2])
def test_the_backend_on_an_emulated_gpu_matches_the_reference_on_mpi_ranks(ranks, tmp_path):
    run_mlp_and_compare(ranks, tmp_path, dict(os.environ, SBPC_CUDA_EMULATE="1"), 1e-4, 1e-5)


@pytest.mark.parametrize("ranks", [1, 2])
def test_mlp_forward_and_backward_on_gpus_match_the_reference(ranks, tmp_path):
    gpu_or_skip()
    env = {k: v for k, v in os.environ.items() if k != "SBPC_CUDA_EMULATE"}
    run_mlp_and_compare(ranks, tmp_path, env, 1e-3, 1e-4)


def test_a_cuda_plan_without_a_gpu_is_a_clear_error(tmp_path):
    try:
        cuda.driver()
        pytest.skip("this machine has a GPU")
    except cuda.CudaUnavailable:
        pass
    path = tmp_path / "mlp.mlir"
    path.write_text(mlp_train_text(1))
    env = {k: v for k, v in os.environ.items() if k != "SBPC_CUDA_EMULATE"}
    done = subprocess.run([sys.executable, "-m", "sbpc.tools.sbp_run", str(path), "-n", "1", "-o",
                           str(tmp_path / "o.npz")], capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 1
    assert "the plan is placed on CUDA devices but this rank has none" in done.stderr
    assert "Traceback" not in done.stderr
