"""The CUDA path: every generated kernel compiles to PTX with NVRTC (and
passes ptxas for sm_90 where ptxas exists) on any machine; launches compare
with the numpy local kernels and are skipped, with the reason, where there
is no GPU."""

import numpy as np
import pytest
from xdsl.context import Context

import sbpc
from sbpc import B, S
from sbpc.dialects import plan
from sbpc.dialects.sbp import lookup_placement, nd_to_plain
from sbpc.local_eval import LocalContext, local_kernel, piece
from sbpc.lowering.compile import CompilePass
from sbpc.lowering.plan_codegen import PlanCodegenPass
from sbpc.reference import numpy_dtype
from sbpc.runtime import cuda

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
    g.output(yt=yt, b=b, s=s, red=red, t=t)
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
            "lg.reduce_mean", "lg.reduce_max", "lg.transpose", "lg.reshape"} <= seen


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


def test_kernels_launch_and_match_numpy(module):
    gpu_or_skip()
    rng = np.random.default_rng(0)
    for device, registers, actor in actors(module):
        if device.rank.value.data != 0:
            continue
        ins = [registers[r.string_value()] for r in actor.ins.data]
        out = registers[actor.outs.data[0].string_value()]
        inputs = [rng.normal(size=r.type.get_shape()).astype(numpy_dtype(r.type.element_type)) for r in ins]
        op = sbpc.make_context().get_op(actor.kernel.data).create(properties=dict(actor.props.data),
                                                                   result_types=[out.type])
        def piece_of(t):
            mesh = lookup_placement(device, t.placement).mesh()
            return piece(t.get_shape(), nd_to_plain(t.nd_sbp), mesh.shape, (0,))

        local = LocalContext(tuple(r.value.get_shape() for r in ins), out.value.get_shape(),
                             tuple(piece_of(r.value) for r in ins), piece_of(out.value), nd_to_plain(out.value.nd_sbp))
        expected = local_kernel(op, local, *inputs)
        got = cuda.launch(actor.attributes["cuda.source"].data, actor.attributes["cuda.entry"].data,
                          list(actor.attributes["cuda.launch"].get_values()), inputs, out.type.get_shape(),
                          numpy_dtype(out.type.element_type))
        np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5, err_msg=actor.sym_name.data)
