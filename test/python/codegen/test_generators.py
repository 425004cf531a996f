"""The kernel generators (codegen/generators.py), each kernel checked where
it is compiled. For the host: every kernel plan-codegen describes (all but
matmul) is compiled as C and checked against the local reference kernel on
random inputs, with odd sizes, broadcasting, splits over ranks and both
element types. For CUDA: every generated kernel compiles to PTX with NVRTC
(and passes ptxas for sm_90 where ptxas exists) on any machine; launches
compare with the numpy local kernels and are skipped, with the reason,
where there is no GPU."""

import numpy as np
import pytest
from support.gpu import gpu_or_skip
from support.kernel_graphs import device_actors, kernels_graph, random_input
from xdsl.context import Context

import sbpc
from sbpc import B, S
from sbpc.codegen.generators import CUDA, WithHost, describe, generate_host
from sbpc.codegen.render import Kernel, Unsupported
from sbpc.dialects import lg, plan
from sbpc.dialects.dtypes import numpy_dtype
from sbpc.dialects.pieces import piece_of
from sbpc.dialects.sbp import PartialAttr, ReduceKind, lookup_placement
from sbpc.lowering.compile import CompilePass
from sbpc.lowering.plan_codegen import PlanCodegenPass
from sbpc.runtime import cuda, host_kernels
from sbpc.semantics.local_eval import local_kernel
from sbpc.semantics.plan_interpreter import actor_kernel

needs_a_c_compiler = pytest.mark.skipif(host_kernels.unavailable() is not None,
                                        reason=f"no host kernels here: {host_kernels.unavailable()}")
"""The host's kernels are built with this machine's C compiler (runtime/host_kernels.py)."""


@pytest.fixture(scope="module")
def nvrtc():
    return pytest.importorskip("cuda.bindings.nvrtc", reason="the NVRTC binding is part of sbpc[test]")


needs_nvrtc = pytest.mark.usefixtures("nvrtc")
"""CUDA kernels are compiled with NVRTC, which needs no GPU (runtime/cuda.py)."""


# -- C for the host -------------------------------------------------------------------


CASES = [(1, "f32", True), (2, "f32", True), (2, "f64", True), (2, "f32", False), (1, "f64", False)]


@needs_a_c_compiler
@pytest.mark.parametrize("ranks,dtype,fuse", CASES, ids=[f"{r}r-{d}-{'fused' if f else 'apart'}" for r, d, f in CASES])
def test_every_host_kernel_matches_the_reference(ranks, dtype, fuse):
    module = kernels_graph(ranks, dtype, fuse)
    rng = np.random.default_rng(ranks)
    ctx = sbpc.make_context()
    seen = set()
    for device, registers, actors in device_actors(module):
        made = {}
        for actor in actors:
            try:
                made[actor] = generate_host(actor, registers)
            except Unsupported:  # matmul is BLAS's; integer arithmetic (the random step's count) numpy's
                if isinstance(CUDA.get(lg.op_class(actor.kernel.data)), WithHost):
                    # a CPU runs a form of its own or numpy's; the CUDA kernel's body, rendered as a loop,
                    # is checked here, where no GPU runs it
                    cuda_form = describe(actor, registers)
                    assert isinstance(cuda_form, Kernel), actor.kernel.data
                    made[actor] = cuda_form
                    continue
                out = registers[actor.outs.data[0].string_value()]
                assert actor.kernel.data == "lg.matmul" or str(out.type.element_type) == "i64", actor.kernel.data
        library = host_kernels.Library(list(made.values()))
        rank = device.rank.value.data

        def piece_here(t, device=device, rank=rank):
            return piece_of(t, lookup_placement(device, t.placement).mesh(), rank)

        for actor, kernel in made.items():
            ins = [registers[r.string_value()] for r in actor.ins.data]
            out_reg = registers[actor.outs.data[0].string_value()]
            inputs = [random_input(r, rng) for r in ins]
            op, local = actor_kernel(ctx, actor, registers, piece_here)
            expected = local_kernel(op, local, *inputs)
            dtype_out = numpy_dtype(out_reg.type.element_type)
            out = np.full(tuple(out_reg.type.get_shape()), np.nan if dtype_out.kind == "f" else -1, dtype_out)
            library.bind(kernel.name)(inputs, out)
            tolerance = 1e-5 if dtype == "f32" else 1e-12
            np.testing.assert_allclose(out, expected, rtol=tolerance, atol=tolerance,
                                       err_msg=f"{actor.kernel.data} @{actor.sym_name.data} on rank {rank}")
            seen.add(actor.kernel.data)
    expected_kinds = {"lg.softmax", "lg.log_softmax", "lg.layernorm", "lg.reduce_sum", "lg.reduce_mean",
                      "lg.reduce_max", "lg.transpose", "lg.cumsum", "lg.pad", "lg.sum_exp", "lg.token_cross_entropy",
                      "lg.token_cross_entropy_grad", "lg.gather", "lg.scatter_add", "lg.conv2d",
                      "lg.conv2d_grad_input", "lg.conv2d_grad_weight", "lg.max_pool2d", "lg.max_pool2d_grad",
                      "lg.dropout", "lg.compare", "lg.cast", "lg.logical", "lg.select", "lg.argmax"}
    expected_kinds |= {plan.FUSED} if fuse else {"lg.add", "lg.mul", "lg.gelu", "lg.erf", "lg.rsqrt"}
    assert expected_kinds <= seen, expected_kinds - seen


@needs_a_c_compiler
def test_a_maximum_keeps_nan_as_numpy_does():
    """A NaN anywhere in what a maximum reduces makes that output NaN, as
    numpy's np.max does, whichever of the host's loops runs it (leading,
    middle, trailing or scattered axes)."""
    g = sbpc.Graph("maxima", placement=sbpc.placement("cpu", ranks=1))
    x = g.input("x", (4, 5, 6), sbp=B)
    g.output(a=x.max(axes=(0,)), b=x.max(axes=(1,)), c=x.max(axes=(2,)), d=x.max(axes=(0, 2)))
    module = g.module()
    CompilePass().apply(Context(), module)
    ctx = sbpc.make_context()
    data = np.arange(120, dtype=np.float32).reshape(4, 5, 6)
    data[1, 2, 3] = data[3, 0, 5] = np.nan
    (device, registers, actors), = device_actors(module)
    maxima = [a for a in actors if a.kernel.data == "lg.reduce_max"]
    assert len(maxima) == 4
    library = host_kernels.Library([generate_host(a, registers) for a in maxima])
    for actor in maxima:
        out_reg = registers[actor.outs.data[0].string_value()]
        out = np.zeros(tuple(out_reg.type.get_shape()), np.float32)
        library.bind(generate_host(actor, registers).name)([data], out)
        op, local = actor_kernel(ctx, actor, registers, lambda t: tuple(slice(None) for _ in t.get_shape()))
        expected = local_kernel(op, local, data)
        assert np.isnan(expected).any()
        np.testing.assert_array_equal(out, expected, err_msg=f"@{actor.sym_name.data}")


@needs_a_c_compiler
def test_the_generated_float_exp_is_within_two_ulps_of_numpys():
    """The host's float exp (codegen/render.py: Cephes' expf, written out so
    the compiler vectorizes softmax) is as accurate as Cephes says: within 2
    units in the last place of numpy's exp, from the underflow to the
    overflow bound, and 0, inf and NaN outside. A tolerance of 1e-5 on the
    kernels above would let a mistyped coefficient through."""
    g = sbpc.Graph("exp", placement=sbpc.placement("cpu", ranks=1))
    x = g.input("x", (4096,), sbp=B)
    g.output(y=sbpc.exp(x))
    module = g.module()
    CompilePass(fuse=False).apply(Context(), module)
    (device, registers, actors), = device_actors(module)
    (actor,) = [a for a in actors if a.kernel.data == "lg.exp"]
    kernel = generate_host(actor, registers)
    run = host_kernels.Library([kernel]).bind(kernel.name)
    inside = np.concatenate([np.linspace(-87.0, 88.5, 4000), np.linspace(-0.5, 0.5, 90)]).astype(np.float32)
    out = np.empty(4096, np.float32)
    run([np.concatenate([inside, np.zeros(6, np.float32)])], out)
    np.testing.assert_array_max_ulp(out[:4090], np.exp(inside), maxulp=2)
    edges = np.array([-200.0, -105.0, 90.0, 200.0, np.nan, -np.inf], np.float32)
    run([np.resize(edges, 4096).astype(np.float32)], out)
    with np.errstate(over="ignore"):
        np.testing.assert_array_equal(out[:6], np.array([0.0, 0.0, np.inf, np.inf, np.nan, 0.0], np.float32))


# -- CUDA C, compiled to PTX with NVRTC --------------------------------------------------


def cuda_kernels_graph():
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
    ln_back = g.add(lg.LayerNormGradOp(e.value, r.value, 2, 1e-5))  # layernorm's input gradient
    red = e.sum(axes=(1, 2)) + ln0.mean(axes=(1, 2)) + ln.max(axes=(1, 2), keepdims=False)
    t = x.transpose(0, 2, 1).reshape(8, 96)
    scans = sbpc.cumsum(x, 0) + sbpc.cumsum(x, 2, reverse=True)
    picks = g.input("picks", (8, 6, 4), sbp=S(0), dtype="i64")
    scattered = g.add(lg.ScatterAddOp(sbpc.gather(x, picks, 2).value, picks.value, 2, 16))
    overwritten = sbpc.scatter(x, picks, sbpc.gather(x, picks, 2) * 2.0, 2)
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
    # top-k along the last axis and the smallest along an inner one, of floats and of integers
    counts = (counts + sbpc.topk(x, 1, 2)[1].reshape(8, 6) + sbpc.topk(x, 6, 1, largest=False)[1].sum(axes=(2,))
              + sbpc.topk(picks, 2, 2)[1].sum(axes=(2,)))
    counts = counts + sbpc.floordiv(counts, -3)  # integer division rounded down
    # a mixture of experts: rows split (each device finds its rows' groups
    # from the global ends), then experts split (each device its own
    # experts' rows, partial sums), and the weight gradient split by experts
    ends = g.input("ends", (3,), sbp=B, dtype="i64")
    rows = x.reshape(48, 16)
    grouped = sbpc.grouped_matmul(rows, g.param("experts", (3, 16, 5), init=sbpc.normal(0.0, 0.3)), ends)
    by_expert = sbpc.grouped_matmul(grouped.to(B), g.param("experts_t", (3, 16, 5), init=sbpc.normal(0.0, 0.3),
                                                           sbp=S(0)), ends, transpose_experts=True)
    expert_grad = g.add(lg.GroupedMatmulGradWeightOp(rows.to(B).value, grouped.to(B).value, ends.value)).to(S(0))
    g.output(yt=yt, b=b, s=s, red=red, t=t, scans=scans, padded=padded, scattered=scattered, dropped=dropped,
             masked=masked, counts=counts, overwritten=overwritten, by_expert=by_expert.to(sbpc.P),
             expert_grad=expert_grad, ln_back=ln_back,
             tokens=tokens.to(sbpc.P), grad=grad.to(S(1)), conv=convs[0], conv_input=convs[1], conv_weight=convs[2],
             pool_back=convs[3])
    module = g.module()
    CompilePass().apply(Context(), module)
    PlanCodegenPass().apply(Context(), module)
    return module


@pytest.fixture(scope="module")
def module():
    return cuda_kernels_graph()


def actors(module):
    for program in [p for p in module.ops if isinstance(p, plan.ProgramOp)]:
        for device in program.devices():
            registers = {r.sym_name.data: r for r in device.registers()}
            for actor in device.actors():
                if isinstance(actor, plan.ComputeOp):
                    yield device, registers, actor


@needs_nvrtc
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
            "lg.dropout", "lg.compare", "lg.cast", "lg.logical", "lg.select", "lg.argmax", "lg.topk",
            "lg.grouped_matmul", "lg.grouped_matmul_grad_weight", "lg.scatter"} <= seen


@needs_nvrtc
def test_ptx_is_cached_by_source(module, tmp_path, monkeypatch):
    monkeypatch.setenv("SBPC_CACHE", str(tmp_path))
    _, _, actor = next(actors(module))
    source = actor.attributes["cuda.source"].data
    first = cuda.compile_ptx(source)
    assert len(list((tmp_path / "ptx").glob("*.ptx"))) == 1
    assert cuda.compile_ptx(source) == first


@needs_nvrtc
def test_a_kernel_that_does_not_compile_reports_nvrtc_log():
    with pytest.raises(RuntimeError, match="NVRTC could not compile"):
        cuda.compile_ptx('extern "C" __global__ void k() { undefined_thing(); }')


@needs_nvrtc
def test_unsupported_kernels_are_diagnosed():
    g = sbpc.Graph("e", placement=sbpc.placement("cuda", ranks=1))
    t = g.param("t", (4, 3), init=sbpc.normal())
    i = g.input("i", (2,), dtype="i64")
    g.output(e=sbpc.embedding(t, i))
    module = g.module()
    CompilePass().apply(Context(), module)
    with pytest.raises(Exception, match="no CUDA kernel for kernel lg.embedding"):
        PlanCodegenPass().apply(Context(), module)


def cuda_random_input(register, rng) -> np.ndarray:
    shape, dtype = register.type.get_shape(), numpy_dtype(register.type.element_type)
    if dtype.kind == "b":
        return rng.random(shape) < 0.5
    if dtype.kind == "i":  # of 13 classes or elements: labels (1-D) some ignored (-100), indices all in range
        ignored = rng.random(shape) < (0.2 if len(shape) == 1 else 0)
        return np.where(ignored, -100, rng.integers(0, 13, shape)).astype(dtype)
    return rng.normal(size=shape).astype(dtype)


@needs_nvrtc
def test_kernels_launch_and_match_numpy(module):
    gpu_or_skip()
    rng = np.random.default_rng(0)
    ctx = sbpc.make_context()
    for device, registers, actor in actors(module):
        if device.rank.value.data != 0:
            continue
        ins = [registers[r.string_value()] for r in actor.ins.data]
        out = registers[actor.outs.data[0].string_value()]
        inputs = [cuda_random_input(r, rng) for r in ins]

        def piece_on_rank_0(t, device=device):
            return piece_of(t, lookup_placement(device, t.placement).mesh(), 0)

        # the op the actor runs (a fused chain's too) and its local context, as the plan interpreter builds them
        op, local = actor_kernel(ctx, actor, registers, piece_on_rank_0)
        expected = local_kernel(op, local, *inputs)
        got = cuda.launch(actor.attributes["cuda.source"].data, actor.attributes["cuda.entry"].data,
                          list(actor.attributes["cuda.launch"].get_values()), inputs, out.type.get_shape(),
                          numpy_dtype(out.type.element_type))
        np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5, err_msg=actor.sym_name.data)


def gemm_graph():
    """Matmuls of 128 rows and columns or more (the register-tiled kernel),
    at sizes no tile divides, batched and with either operand transposed."""
    g = sbpc.Graph("gemms", placement=sbpc.placement("cuda", ranks=1))
    a, b, c = g.input("a", (260, 70)), g.input("b", (70, 390)), g.input("c", (3, 390, 70))
    g.output(ab=a @ b, ca=sbpc.matmul(c, a, transpose_b=True), bb=sbpc.matmul(b, b, transpose_a=True))
    module = g.module()
    CompilePass(device="cuda", fuse=False).apply(Context(), module)
    PlanCodegenPass().apply(Context(), module)
    return [(registers, actor) for _, registers, actor in actors(module) if actor.kernel.data == "lg.matmul"]


@needs_nvrtc
def test_large_matmuls_take_the_register_tiled_kernel_and_compile():
    found = gemm_graph()
    assert len(found) == 3
    for _, actor in found:
        source = actor.attributes["cuda.source"].data
        assert "__launch_bounds__(256)" in source
        ptx = cuda.compile_ptx(source, "gemm.cu")
        if cuda.ptxas():
            assert "0 bytes spill stores" in cuda.check_ptx(ptx)


@needs_nvrtc
def test_the_register_tiled_matmul_launches_and_matches_numpy():
    gpu_or_skip()
    rng = np.random.default_rng(1)
    for registers, actor in gemm_graph():
        ins = [registers[r.string_value()] for r in actor.ins.data]
        out = registers[actor.outs.data[0].string_value()]
        inputs = [rng.normal(size=r.type.get_shape()).astype(np.float32) for r in ins]
        ta, tb = "transpose_lhs" in actor.props.data, "transpose_rhs" in actor.props.data
        a = np.swapaxes(inputs[0], -1, -2) if ta else inputs[0]
        b = np.swapaxes(inputs[1], -1, -2) if tb else inputs[1]
        got = cuda.launch(actor.attributes["cuda.source"].data, actor.attributes["cuda.entry"].data,
                          list(actor.attributes["cuda.launch"].get_values()), inputs, out.type.get_shape(),
                          np.float32)
        np.testing.assert_allclose(got, np.matmul(a, b), rtol=1e-4, atol=1e-4, err_msg=actor.sym_name.data)
