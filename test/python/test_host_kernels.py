"""The generated C kernels of the CPU backend (runtime/host_kernels.py):
every kernel plan-codegen describes (all but matmul) is compiled for the
host and checked against the local reference kernel on random inputs, with
odd sizes, broadcasting, splits over ranks and both element types; the CUDA
source is rendered from the same description; plans run with them match the
reference on real ranks."""

import dataclasses

import numpy as np
import pytest
from xdsl.context import Context

import sbpc
from sbpc import B, S
from sbpc.codegen.generators import describe, generate, generate_host
from sbpc.codegen.render import Unsupported, cuda_source
from sbpc.dialects import lg, plan
from sbpc.dialects.pieces import numpy_dtype, piece_of
from sbpc.dialects.sbp import PartialAttr, ReduceKind, lookup_placement
from sbpc.lowering.compile import CompilePass
from sbpc.runtime import host_kernels
from sbpc.semantics.local_eval import local_kernel
from sbpc.semantics.plan_interpreter import actor_kernel

pytestmark = pytest.mark.skipif(host_kernels.unavailable() is not None,
                                reason=f"no host kernels here: {host_kernels.unavailable()}")


def kernels_graph(ranks: int, dtype: str, fuse: bool):
    """Every kind of kernel the generator covers, at odd sizes, split over `ranks`."""
    g = sbpc.Graph("kernels", placement=sbpc.placement("cpu", ranks=ranks))
    x = g.input("x", (6, 5, 13), sbp=S(0), dtype=dtype)
    v = g.input("v", (13,), sbp=B, dtype=dtype)
    c = g.input("c", (6, 1, 13), sbp=S(0), dtype=dtype)
    e = sbpc.gelu(x + v) * 0.5 - sbpc.exp(-x) / sbpc.sqrt(x * x + 1.0) + c  # broadcasting chain
    r = sbpc.rsqrt(x * x + 2.0) + sbpc.tanh(sbpc.relu(x)) - sbpc.erf(x) * x
    s = sbpc.softmax(e, axis=2) + sbpc.log_softmax(r, axis=1)  # innermost axis and a strided one
    ln = sbpc.layernorm(e, g.param("g", (13,), init=sbpc.normal(1.0, 0.1), dtype=dtype),
                        g.param("b", (13,), init=sbpc.normal(0.0, 0.1), dtype=dtype), axis=2)
    ln0 = sbpc.layernorm(r, axis=1)
    red = s.sum(axes=(1, 2)) + ln0.mean(axes=(0, 2)).sum() + ln.max(axes=(1, 2), keepdims=False)
    # reductions over leading, middle and trailing axes (the host's loops differ)
    cols = e.sum(axes=(0, 1)) + r.mean(axes=(1,)).max(axes=(0,)) + s.max(axes=(0,)).sum(axes=(0,))
    t = ln.transpose(0, 2, 1).reshape(6, 65)
    swapped = (e * 2.0).transpose(2, 0, 1) + 1.0  # a transpose that moves the innermost axis
    # running sums over the split batch (each piece's contribution) and backwards along a row; padding
    scans = sbpc.cumsum(x, 0) * 0.5
    # picks along the innermost axis by computed indices, and the gradient's scatter-add back
    picks = g.input("picks", (6, 5, 4), sbp=S(0), dtype="i64")
    picked = sbpc.gather(x, picks, 2)
    scattered = g.add(lg.ScatterAddOp(picked.value, picks.value, 2, 13))
    # the same along a split axis: each piece picks what it holds (P), and fills its rows (S)
    rows = g.input("rows", (6, 13), sbp=S(1), dtype=dtype)
    row_picks = g.input("row_picks", (6, 4), sbp=B, dtype="i64")
    split_picked = sbpc.gather(rows, row_picks, 1).to(sbpc.P)
    split_scattered = g.add(lg.ScatterAddOp(g.input("updates", (6, 4), sbp=B, dtype=dtype).value, row_picks.value, 1,
                                            13)).to(S(1))
    padded = sbpc.cumsum(sbpc.pad(r, [0, 1, 0], [0, 0, 2], -0.5), 2, reverse=True)  # (6, 6, 15)
    # a grouped, strided, padded, dilated convolution and its two gradients
    images = g.input("images", (6, 4, 5, 7), sbp=S(0), dtype=dtype)
    conv = {"stride": (2, 1), "padding": (1, 0), "dilation": (1, 2), "groups": 2}
    filters = g.param("filters", (6, 2, 3, 2), init=sbpc.normal(0.0, 0.3), dtype=dtype)
    convolved = sbpc.conv2d(images, filters, **conv)  # (6, 6, 3, 5)
    back = g.input("back", (6, 6, 3, 5), sbp=S(0), dtype=dtype)
    pooled = g.add(lg.MaxPool2dOp(images.value, (3, 2), (2, 2), (1, 1)))
    pool_back = g.add(lg.MaxPool2dGradOp(images.value, pooled.value, (3, 2), (2, 2), (1, 1)))
    conv_grads = (g.add(lg.Conv2dGradInputOp(back.value, filters.value, (5, 7), **conv)),
                  g.add(lg.Conv2dGradWeightOp(images.value, back.value, (3, 2), **conv)))
    # the vocabulary-parallel cross-entropy over logits split by class, labels some of them ignored
    logits = g.input("logits", (6, 13), sbp=S(1), dtype=dtype)
    labels = g.input("labels", (6,), sbp=B, dtype="i64")
    row_max = sbpc.reduce_max(logits, [1]).to(PartialAttr(ReduceKind.MAX))  # the hints hold the class split
    sum_exp = g.add(lg.SumExpOp(logits.value, row_max.value)).to(sbpc.P)
    tokens = g.add(lg.TokenCrossEntropyOp(logits.value, labels.value, row_max.value, sum_exp.value, -100))
    grad = g.add(lg.TokenCrossEntropyGradOp(logits.value, labels.value, row_max.value, sum_exp.value,
                                            tokens.value, -100))
    # dropout of the batch split by rows, and of rows split along their last axis: each piece draws the
    # elements it holds by their indices in the whole tensor
    dropped, split_dropped = sbpc.dropout(x, 0.3), sbpc.dropout(rows, 0.5).to(S(1))
    # masks: a comparison in the inputs' type, casts both ways, a logical op and a select, broadcasting
    positive = sbpc.compare("gt", x, v)  # (6, 5, 13) i1
    counted = sbpc.cast(sbpc.logical("xor", positive, sbpc.compare("le", c, v)), dtype)
    masked = sbpc.where(positive, x, c) + counted + sbpc.cast(sbpc.cast(x * 3.0, "i64"), dtype)
    picked_high = sbpc.cast(sbpc.compare("ge", picks, g.constant(np.int64(7))), dtype)  # integers compared
    counts = sbpc.cast(positive, "i64").sum(axes=(1, 2)) * picks.sum(axes=(1, 2))  # integer sums and products
    # the largest element's index along the inner axis (x split by rows) and of an integer tensor
    counts = counts + sbpc.argmax(x, 2).sum(axes=(1,)) + sbpc.argmax(picks, 1).sum(axes=(1,))
    g.output(red=red, t=t, d=-e / (r + 3.0), cols=cols, swapped=swapped, scans=scans, padded=padded,
             scattered=scattered, tokens=tokens.to(sbpc.P), grad=grad.to(S(1)), split_picked=split_picked,
             split_scattered=split_scattered, convolved=convolved, conv_input=conv_grads[0],
             conv_weight=conv_grads[1], pool_back=pool_back, dropped=dropped, split_dropped=split_dropped,
             masked=masked, picked_high=picked_high, counts=counts)
    module = g.module()
    CompilePass(fuse=fuse).apply(Context(), module)
    return module


def device_actors(module):
    for program in plan.programs(module):
        for device in program.devices():
            registers = {r.sym_name.data: r for r in device.registers()}
            yield device, registers, [a for a in device.actors() if isinstance(a, plan.ComputeOp)]


def random_input(register, rng):
    shape = tuple(register.type.get_shape())
    dtype = numpy_dtype(register.type.element_type)
    if dtype.kind == "b":
        return rng.random(shape) < 0.5
    if dtype.kind == "i":  # of 13 classes or elements: labels (1-D) some ignored (-100), indices all in range
        ignored = rng.random(shape) < (0.2 if len(shape) == 1 else 0)
        return np.where(ignored, -100, rng.integers(0, 13, shape)).astype(dtype)
    return np.array(rng.normal(size=shape) * 1.5, dtype)


CASES = [(1, "f32", True), (2, "f32", True), (2, "f64", True), (2, "f32", False), (1, "f64", False)]


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
                out = registers[actor.outs.data[0].string_value()]
                assert actor.kernel.data == "lg.matmul" or str(out.type.element_type) == "i64", actor.kernel.data
        library = host_kernels.Library(list(made.values()))
        rank = device.rank.value.data

        def piece(t, device=device, rank=rank):
            return piece_of(t, lookup_placement(device, t.placement).mesh(), rank)

        for actor, kernel in made.items():
            ins = [registers[r.string_value()] for r in actor.ins.data]
            out_reg = registers[actor.outs.data[0].string_value()]
            inputs = [random_input(r, rng) for r in ins]
            op, local = actor_kernel(ctx, actor, registers, piece)
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


def test_the_cuda_kernel_is_rendered_from_the_same_description():
    module = kernels_graph(2, "f32", True)
    for _, registers, actors in device_actors(module):
        for actor in actors:
            made = describe(actor, registers)
            src, entry, launch = generate(actor, registers)
            if actor.kernel.data == "lg.matmul":
                assert not isinstance(made, host_kernels.Kernel)
                continue
            assert (src, launch) == cuda_source(made) and entry == made.name
            host = host_kernels.host_source(made)
            if made.host_body is not None:  # a reduction's or dropout's loops on the host (values checked above)
                assert made.host_body in host and actor.kernel.data in {*host_kernels.REDUCTIONS, "lg.dropout"}
                continue
            # the statements for one element are the same on both targets
            # (a broadcasting chain finds its offsets by loops on the host)
            statements = made.nest.element if made.nest is not None else made.body
            for line in statements.splitlines():
                assert line.strip() in src and line.strip() in host, line


def test_a_library_is_built_once_per_source(tmp_path, monkeypatch):
    monkeypatch.setenv("SBPC_CACHE", str(tmp_path))
    module = kernels_graph(1, "f32", True)
    _, registers, actors = next(device_actors(module))
    kernels = [generate_host(a, registers) for a in actors if a.kernel.data == "lg.softmax"]
    first = host_kernels.Library(kernels)
    built = set((tmp_path / "host-kernels").glob("*.so"))  # with the vector-math probe, where it ran first here
    again = host_kernels.Library(kernels)
    assert first.path == again.path and first.path in built
    assert set((tmp_path / "host-kernels").glob("*.so")) == built


def test_libraries_are_loaded_only_from_a_folder_no_one_else_can_write(tmp_path, monkeypatch):
    import os
    import tempfile

    monkeypatch.setenv("SBPC_CACHE", str(tmp_path / "cache"))
    assert host_kernels.cache_dir() == tmp_path / "cache" / "host-kernels"
    assert (tmp_path / "cache" / "host-kernels").stat().st_mode & 0o777 == 0o700
    # a cache others can write into is passed over, for the user's folder in
    # the temporary directory, and where another user made that one, for a
    # folder of this process alone
    (tmp_path / "cache" / "host-kernels").chmod(0o777)
    monkeypatch.setattr(tempfile, "gettempdir", lambda: str(tmp_path / "tmp"))
    assert host_kernels.cache_dir() == tmp_path / "tmp" / f"sbpc-{os.getuid()}" / "host-kernels"
    if os.getuid() == 0:  # root can hand a folder to another user
        os.chown(tmp_path / "tmp" / f"sbpc-{os.getuid()}", 12345, 12345)
    else:
        (tmp_path / "tmp" / f"sbpc-{os.getuid()}").chmod(0o777)
    private = host_kernels.cache_dir()
    assert private.name.startswith("sbpc-host-kernels-") and private.stat().st_uid == os.getuid()
    assert private.stat().st_mode & 0o077 == 0


def test_a_compiler_error_is_reported_with_its_message(tmp_path, monkeypatch):
    monkeypatch.setenv("SBPC_CACHE", str(tmp_path))
    with pytest.raises(host_kernels.BuildError, match="undeclared|implicit"):
        host_kernels.build("void f(void) { g = undefined_thing; }")


@pytest.mark.parametrize("enabled", ["1", "0"])
def test_training_with_host_kernels_matches_the_reference(enabled, monkeypatch):
    """A GPT trained on 2 ranks with the generated C kernels (and without
    them) follows the reference interpreter's loss curve."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
    import models

    monkeypatch.setenv(host_kernels.VARIABLE, enabled)
    _, stoi = models.corpus()
    size = {"batch": 8, "seq": 8, "dim": 16, "heads": 4, "layers": 2}
    exe = sbpc.compile(models.gpt("dp", 2, len(stoi), **size))
    data = models.gpt_batches(size["batch"], size["seq"])
    losses = [float(exe.train_step(next(data))["loss"]) for _ in range(8)]
    expected = models.reference_losses(models.gpt("dp", 1, len(stoi), **size),
                                       models.gpt_batches(size["batch"], size["seq"]), 8)
    rel = np.abs(np.array(losses) - expected) / np.abs(expected)
    assert rel.max() <= 1e-5, (losses, expected)


def test_exp_and_softmax_keep_ieee_special_values():
    """The host's own float exp (vectorizable, see sbpc.codegen.render.HOST_PRELUDE)
    against numpy's over its whole range and at inf, NaN and the underflow
    edge; a softmax row masked with -inf gives exact zeros there."""
    g = sbpc.Graph("special", placement=sbpc.placement("cpu", ranks=1))
    x = g.input("x", (4, 1000))
    g.output(e=sbpc.exp(x), s=sbpc.softmax(x, axis=1))
    module = g.module()
    CompilePass().apply(Context(), module)
    _, registers, actors = next(device_actors(module))
    made = {a.kernel.data: generate_host(a, registers) for a in actors}
    library = host_kernels.Library(list(made.values()))
    rng = np.random.default_rng(0)
    data = rng.uniform(-110, 95, (4, 1000)).astype(np.float32)
    data[0, :13] = [-np.inf, np.inf, np.nan, 0.0, -0.0, 88.7, 88.72, 89.0, -87.3, -103.9, -104.0, -150.0, 1e-8]
    data[1:, 500:] = -np.inf  # masked halves
    data[1:, :500] = rng.normal(size=(3, 500))
    out = np.empty_like(data)
    library.bind(made["lg.exp"].name)([data], out)
    with np.errstate(all="ignore"):
        expected = np.exp(data)
    np.testing.assert_allclose(out, expected, rtol=1e-6, atol=1e-44)
    assert np.isnan(out[0, 2]) and out[0, 1] == np.inf and out[0, 0] == 0.0
    library.bind(made["lg.softmax"].name)([data], out)  # row 0 holds a NaN: only the masked rows are checked
    shifted = np.exp(data[1:] - data[1:].max(axis=1, keepdims=True))
    np.testing.assert_allclose(out[1:], shifted / shifted.sum(axis=1, keepdims=True), rtol=1e-5, atol=1e-7)
    assert (out[1:, 500:] == 0.0).all()


def test_kernel_names_that_clash_in_c_get_suffixes():
    """Actors named `a.b` and `a_b` make one C name; each still runs its own kernel."""
    module = kernels_graph(1, "f32", True)
    _, registers, actors = next(device_actors(module))
    softmax = next(a for a in actors if a.kernel.data == "lg.softmax")
    log_softmax = next(a for a in actors if a.kernel.data == "lg.log_softmax")
    first = generate_host(softmax, registers)
    second = dataclasses.replace(generate_host(log_softmax, registers), name=first.name)
    library = host_kernels.Library([first, second])
    rng = np.random.default_rng(0)
    for kernel, actor in ((first, softmax), (second, log_softmax)):
        x = random_input(registers[actor.ins.data[0].string_value()], rng)
        got = np.empty(tuple(registers[actor.outs.data[0].string_value()].type.get_shape()), np.float32)
        library.bind(kernel)([x], got)
        op, local = actor_kernel(sbpc.make_context(), actor, registers,
                                 lambda t: tuple(slice(0, d) for d in t.get_shape()))
        np.testing.assert_allclose(got, local_kernel(op, local, x), rtol=1e-5, atol=1e-6)


def test_an_unusable_cache_folder_falls_back_to_a_temporary_one(tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("SBPC_CACHE", str(blocker / "cache"))
    folder = host_kernels.cache_dir()
    assert folder.is_dir() and not str(folder).startswith(str(blocker))
