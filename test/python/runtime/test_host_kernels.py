"""The generated C kernels of the CPU backend as the runtime builds and
loads them (runtime/host_kernels.py): a library is built once per source,
cached only in a folder no one else can write, compiler errors come with
their message, a kernel body is compiled once whatever its actors are
named (and kernels of one name with different bodies stay apart), and a GPT
trained with them (and without) matches the reference on real ranks.
Their sources are checked in test/python/codegen/."""

import dataclasses
import functools
import math

import numpy as np
import pytest
from support.kernel_graphs import device_actors, kernels_graph, random_input

import sbpc
from sbpc.codegen.generators import generate_host
from sbpc.dialects import lg
from sbpc.runtime import host_kernels
from sbpc.semantics.local_eval import local_kernel
from sbpc.semantics.plan_interpreter import actor_kernel

pytestmark = pytest.mark.skipif(host_kernels.unavailable() is not None,
                                reason=f"no host kernels here: {host_kernels.unavailable()}")


def test_a_library_is_built_once_per_source(tmp_path, monkeypatch):
    monkeypatch.setenv("SBPC_CACHE", str(tmp_path))
    module = kernels_graph(1, "f32", True)
    _, registers, actors = next(device_actors(module))
    kernels = [generate_host(a, registers) for a in actors if a.kernel.data == "lg.softmax"]
    first = host_kernels.Library(kernels)
    built = set((tmp_path / "host-kernels").glob("*.so"))  # with the vector-math probe, where it ran first here
    again = host_kernels.Library(kernels)
    assert first.paths == again.paths and set(first.paths) <= built
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

    sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "examples"))
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


def test_kernels_of_one_name_and_different_bodies_each_run_their_own():
    """Two actors' kernels of one name (actors named `a.b` and `a_b` once
    made one C name) are two functions: each runs its own code."""
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


def test_a_body_is_compiled_once_whatever_its_actors_are_named(tmp_path, monkeypatch):
    """Kernels that differ only in their names share one C function; a
    library of the same bodies under other names, in another order (another
    plan, another rank of a data-parallel plan) builds nothing; one with a
    new body builds that body alone."""
    import ctypes

    monkeypatch.setenv("SBPC_CACHE", str(tmp_path))
    module = kernels_graph(1, "f32", True)
    _, registers, actors = next(device_actors(module))
    softmax = next(a for a in actors if a.kernel.data == "lg.softmax")
    log_softmax = next(a for a in actors if a.kernel.data == "lg.log_softmax")
    layernorm = next(a for a in actors if a.kernel.data == "lg.layernorm")
    first, second = generate_host(softmax, registers), generate_host(log_softmax, registers)
    copies = [dataclasses.replace(first, name=f"layer{i}_softmax") for i in range(3)]
    library = host_kernels.Library([first, *copies, second])
    assert len(library.kernels) == 2 and len(library.paths) == 1
    built = set((tmp_path / "host-kernels").glob("k*.so"))
    renamed = host_kernels.Library([dataclasses.replace(second, name="other"), dataclasses.replace(first, name="x")])
    assert renamed.paths == library.paths and set((tmp_path / "host-kernels").glob("k*.so")) == built
    third = generate_host(layernorm, registers)
    grown = host_kernels.Library([first, third])
    (new,) = set(grown.paths) - set(library.paths)
    assert hasattr(ctypes.CDLL(str(new)), host_kernels.function_name(third))
    assert not hasattr(ctypes.CDLL(str(new)), host_kernels.function_name(first))
    rng = np.random.default_rng(1)
    x = random_input(registers[softmax.ins.data[0].string_value()], rng)
    shape = tuple(registers[softmax.outs.data[0].string_value()].type.get_shape())
    outs = []
    for kernel, lib in ((first, library), *((c, library) for c in copies), (first, grown)):
        outs.append(np.empty(shape, np.float32))
        lib.bind(kernel)([x], outs[-1])
    assert all(np.array_equal(outs[0], out) for out in outs[1:])
    op, local = actor_kernel(sbpc.make_context(), softmax, registers,
                             lambda t: tuple(slice(0, d) for d in t.get_shape()))
    np.testing.assert_allclose(outs[0], local_kernel(op, local, x), rtol=1e-5, atol=1e-6)


def test_an_unusable_cache_folder_falls_back_to_a_temporary_one(tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("SBPC_CACHE", str(blocker / "cache"))
    folder = host_kernels.cache_dir()
    assert folder.is_dir() and not str(folder).startswith(str(blocker))


POOLINGS = [  # (kernel, stride, padding): as test_numpy_kernels', and wider images
    ((3, 3), (2, 2), (1, 1)),  # ResNet's
    ((2, 2), (2, 2), (0, 0)),
    ((3, 2), (1, 1), (1, 1)),  # overlapping windows: an element the maximum of up to six
    ((2, 3), (1, 2), (1, 0)),
    ((3, 3), (3, 1), (1, 1)),
]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_max_pooling_in_c_computes_numpys_bit_for_bit(dtype):
    """The generated C of max pooling and its gradient (a scatter from each
    window to its first maximum) against the numpy kernels, exactly: ties
    (the first maximum takes the gradient), NaNs (the first NaN does),
    windows of minus infinity (a window whose first tap is padding gives
    its gradient to no element), an infinite gradient, and an element the
    maximum of several windows (their gradients summed in numpy's order)."""
    from xdsl.dialects.builtin import TensorType, f32, f64
    from xdsl.ir import Block

    from sbpc.codegen.generators import Site, describe_site
    from sbpc.runtime.numpy_window_kernels import bind_max_pool2d, bind_max_pool2d_grad

    element = f32 if dtype == np.float32 else f64
    rng = np.random.default_rng(7)
    cases, kernels = [], []
    for shape in ((2, 3, 7, 6), (1, 2, 9, 17)):
        for kernel, stride, padding in POOLINGS:
            block = Block(arg_types=[TensorType(element, shape)])
            forward = lg.MaxPool2dOp(block.args[0], kernel, stride, padding)
            pooled = tuple(forward.result.type.get_shape())
            grads = Block(arg_types=[TensorType(element, shape), TensorType(element, pooled)])
            backward = lg.MaxPool2dGradOp(grads.args[0], grads.args[1], kernel, stride, padding)
            for op, ins in ((forward, (shape,)), (backward, (shape, pooled))):
                out = tuple(op.results[0].type.get_shape())
                site = Site(name=f"k{len(kernels)}", kernel=op.name, t="float" if dtype == np.float32 else "double",
                            in_shapes=ins, out_shape=out, props=dict(op.properties), global_in=shape)
                kernels.append(describe_site(site))
                cases.append((op, ins, out))
    library = host_kernels.Library(kernels)
    for (op, ins, out), kernel in zip(cases, kernels):
        numpy_fire = (bind_max_pool2d if isinstance(op, lg.MaxPool2dOp) else bind_max_pool2d_grad)(
            op, None, [np.empty(s, dtype) for s in ins], np.empty(out, dtype))
        c_fire = library.bind(kernel)
        for trial in range(4):
            x = rng.integers(-2, 3, ins[0]).astype(dtype)  # ties
            if trial >= 1:
                x[rng.random(x.shape) < 0.1] = np.nan
                x[rng.random(x.shape) < 0.3] = -np.inf
            if trial == 3:
                x[...] = -np.inf
                x[0, 0, 1, 1] = np.nan
            xs = [x]
            if len(ins) == 2:
                g = rng.standard_normal(ins[1]).astype(dtype)
                g[0, 0, 0, 0] = np.inf if trial == 1 else g[0, 0, 0, 0]
                xs.append(g)
            want, got = np.full(out, -7, dtype), np.full(out, -7, dtype)
            numpy_fire(xs, want)
            c_fire(xs, got)
            np.testing.assert_array_equal(got, want, err_msg=f"{op.name} {ins} {op.properties} trial {trial}")


CROSS_ENTROPIES = [  # (local logits, global rows, label element type)
    ((512, 16), 512, "i64"),  # a few classes: numpy's reductions cost a call's overhead a row
    ((7, 3), 14, "i32"),  # half the batch of a split one: its share of the global mean
    ((3, 5, 11), 15, "i64"),  # labels of two axes
    ((4, 600), 4, "i32"),  # rows past CROSS_ENTROPY_CHUNK: exponentials a chunk at a time
    ((0, 5), 6, "i64"),  # an empty piece of a split batch adds nothing
]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_cross_entropy_in_c_computes_numpys(dtype):
    """lg.cross_entropy in generated C (one pass a row) against the numpy
    kernel, a piece of a split batch included, a NaN logit and a row of
    minus infinity (NaN losses, as numpy's), and a label out of range: an
    error that names the op, as numpy's kernel raises, not a read past the row."""
    from xdsl.dialects.builtin import TensorType, f32, f64, i32, i64
    from xdsl.ir import Block

    from sbpc.codegen.generators import Site, describe_site
    from sbpc.dialects.sbp import Sbp
    from sbpc.runtime import numpy_kernels
    from sbpc.semantics.local_eval import LocalContext
    from sbpc.semantics.reference import EvaluationError

    element = f32 if dtype == np.float32 else f64
    rng = np.random.default_rng(9)
    for shape, global_rows, labels_type in CROSS_ENTROPIES:
        labels_shape, labels_dtype = shape[:-1], np.int64 if labels_type == "i64" else np.int32
        block = Block(arg_types=[TensorType(element, shape), TensorType(i64 if labels_type == "i64" else i32,
                                                                        labels_shape)])
        op = lg.CrossEntropyOp(block.args[0], block.args[1])
        global_logits = (global_rows, shape[-1]) if len(shape) == 2 else shape
        site = Site(name="k_ce", kernel=op.name, t="float" if dtype == np.float32 else "double",
                    in_shapes=(shape, labels_shape), out_shape=(), props={}, global_in=global_logits,
                    in_elems=(str(element), labels_type))
        kernel = describe_site(site, host=True)
        c_fire = host_kernels.Library([kernel]).bind(kernel)
        split = (slice(0, shape[0]),) + tuple(slice(0, d) for d in shape[1:])
        local = LocalContext((global_logits, global_logits[:-1]), (), (split, split[:-1]), (), (Sbp.B,))
        numpy_fire = numpy_kernels.bind(op, local, [np.empty(shape, dtype), np.empty(labels_shape, labels_dtype)],
                                        np.empty((), dtype))
        for trial in range(3):
            x = (rng.standard_normal(shape) * 4).astype(dtype)
            labels = rng.integers(0, shape[-1], labels_shape).astype(labels_dtype)
            if trial == 1 and x.size:
                x.reshape(-1, shape[-1])[0, 1] = np.nan
            if trial == 2 and x.size:
                x.reshape(-1, shape[-1])[-1] = -np.inf
            want, got = np.full((), -7, dtype), np.full((), -7, dtype)
            with np.errstate(all="ignore"):  # as the executor runs kernels: NaN losses, no warnings
                numpy_fire([x, labels], want)
            c_fire([x, labels], got)
            assert np.isnan(want) == (trial > 0 and x.size > 0)
            np.testing.assert_allclose(got, want, rtol=1e-6 if dtype == np.float32 else 1e-14,
                                       err_msg=f"{shape} of {global_rows} rows, trial {trial}")
        if labels.size:
            labels.reshape(-1)[-1] = shape[-1]
            with pytest.raises(EvaluationError, match=r"'lg.cross_entropy': label out of range \[0, "):
                c_fire([x, labels], got)


@pytest.mark.parametrize("shape, axes", [((8, 6, 2, 2), (0, 2, 3)), ((4, 3, 5, 6), (0, 3)), ((4, 3, 5, 6), (0, 1, 3)),
                                         ((2, 3, 4, 5, 6), (0, 1, 3, 4))])
def test_reductions_over_the_leading_and_trailing_axes_in_c_compute_numpys(shape, axes):
    """Sums, means and maxima over a run of leading axes and a run of
    trailing ones (batch normalization's statistics: N, H and W of NCHW)
    as one pass of generated C, against numpy's; a maximum keeps a NaN."""
    from xdsl.dialects.builtin import TensorType, f32
    from xdsl.ir import Block

    from sbpc.codegen.generators import MAX_RUN_IN_C, Site, describe_site

    rng = np.random.default_rng(8)
    cases = []
    for op_class, reference in ((lg.ReduceSumOp, np.sum), (lg.ReduceMeanOp, np.mean), (lg.ReduceMaxOp, np.max)):
        block = Block(arg_types=[TensorType(f32, shape)])
        op = op_class(block.args[0], axes, True)
        out = tuple(op.results[0].type.get_shape())
        kernel = describe_site(Site(name=f"k{len(cases)}", kernel=op.name, t="float", in_shapes=(shape,),
                                    out_shape=out, props=dict(op.properties), global_in=shape))
        run = math.prod(shape[a] for a in axes if all(b in axes for b in range(a, len(shape))))  # the trailing
        if reference is np.max and run > MAX_RUN_IN_C:  # numpy's maximum (it vectorizes)
            assert kernel.host_body is None and not host_kernels.beats_numpy(op.name, kernel)
            continue
        assert kernel.host_body is not None and host_kernels.beats_numpy(op.name, kernel)
        cases.append((kernel, reference, out))
    library = host_kernels.Library([kernel for kernel, _, _ in cases])
    for kernel, reference, out in cases:
        x = rng.standard_normal(shape).astype(np.float32)
        if reference is np.max:
            x[(0,) * len(shape)] = np.nan
        got = np.full(out, -7, np.float32)
        library.bind(kernel)([x], got)
        np.testing.assert_allclose(got, reference(x, axis=axes, keepdims=True), rtol=1e-5, atol=1e-5,
                                   err_msg=f"{reference.__name__} over {axes} of {shape}")
        if reference is np.max:
            assert np.isnan(got.reshape(-1)[0]) and not np.isnan(got.reshape(-1)[1:]).any()


WINOGRAD = [  # (images (N, C, H, W), output channels, padding, groups)
    ((2, 8, 7, 6), 8, (1, 1), 1),  # planes under ROW_TILES tiles wide: one loop over the tiles; odd output rows
    ((2, 8, 16, 19), 12, (1, 1), 1),  # planes ROW_TILES wide or more: a tile row at a time; odd output columns
    ((3, 8, 9, 8), 16, (2, 0), 2),  # groups; padding of 2 and of none
    ((1, 8, 5, 6), 8, (3, 1), 1),  # padding past 2: the input's gradient by im2col, the rest by Winograd
    ((2, 8, 2, 16), 8, (1, 1), 1),  # images under 3 rows; planes exactly ROW_TILES wide
]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("batch", ["per image", "at once"])
@pytest.mark.parametrize("images, out_channels, padding, groups", WINOGRAD)
def test_winograd_convolutions_compute_what_the_reference_computes(images, out_channels, padding, groups, batch,
                                                                    dtype, monkeypatch):
    """3x3 stride-1 convolutions, their input's and their weight's
    gradients by Winograd's F(2x2, 3x3) (generated C transforms, BLAS
    products), as the numpy backend binds them, against the reference's
    direct sums: to a few units of rounding of the largest output (the
    transforms round differently, not worse), in float32 and float64."""
    from xdsl.dialects.builtin import TensorType, f32, f64
    from xdsl.ir import Block

    from sbpc.runtime import numpy_kernels, winograd_kernels
    from sbpc.semantics.reference import REFERENCE

    monkeypatch.setattr(winograd_kernels, "MIN_CHANNELS", 1)
    monkeypatch.setattr(winograd_kernels, "MIN_TILES", 1)
    monkeypatch.setattr(winograd_kernels, "TILES_PER_IMAGE", 1 if batch == "per image" else 10**9)
    bound = []

    def spy(name):
        made = getattr(winograd_kernels, name)

        def binding(*args):
            fire = made(*args)
            bound.append(name if fire is not None else None)
            return fire
        return binding

    for name in ("conv2d", "conv2d_grad_input", "conv2d_grad_weight"):
        monkeypatch.setattr(winograd_kernels, name, spy(name))
    element = f32 if dtype == np.float32 else f64
    rng = np.random.default_rng(11)
    x = rng.standard_normal(images).astype(dtype)
    w = rng.standard_normal((out_channels, images[1] // groups, 3, 3)).astype(dtype)
    conv = {"stride": (1, 1), "padding": padding, "dilation": (1, 1), "groups": groups}
    block = Block(arg_types=[TensorType(element, x.shape), TensorType(element, w.shape)])
    forward = lg.Conv2dOp(block.args[0], block.args[1], **conv)
    g = rng.standard_normal(forward.result.type.get_shape()).astype(dtype)
    grads = Block(arg_types=[TensorType(element, g.shape), TensorType(element, w.shape), TensorType(element, x.shape)])
    cases = ((forward, [x, w], g.shape),
             (lg.Conv2dGradInputOp(grads.args[0], grads.args[1], x.shape[2:], **conv), [g, w], x.shape),
             (lg.Conv2dGradWeightOp(grads.args[2], grads.args[0], (3, 3), **conv), [x, g], w.shape))
    ulp = np.finfo(dtype).eps
    for op, ins, shape in cases:
        out = np.full(shape, np.nan, dtype)
        fire = numpy_kernels.NUMPY[type(op)](op, None, ins, out)
        want = REFERENCE[type(op)](op, *ins)
        for _ in range(2):  # scratch kept from the first firing must not leak into the second
            fire(ins, out)
            np.testing.assert_allclose(out, want, rtol=0, atol=64 * ulp * np.abs(want).max(), err_msg=op.name)
    past_reach = max(padding) > 2
    assert bound == ["conv2d", None if past_reach else "conv2d_grad_input", "conv2d_grad_weight"]


def test_winograd_is_left_to_im2col_where_it_would_not_gain():
    """Too few channels (a depthwise convolution, an RGB stem), too few
    tiles in the batch, another kernel or stride: im2col."""
    from sbpc.runtime import winograd_kernels

    def applies(images, filters, groups=1, stride=(1, 1), padding=(1, 1)):
        return winograd_kernels.applies(images, filters, groups, stride, padding, (1, 1), np.float32)

    assert applies((8, 64, 16, 16), (64, 64, 3, 3))
    assert not applies((8, 3, 16, 16), (64, 3, 3, 3))  # RGB in
    assert not applies((8, 64, 16, 16), (64, 1, 3, 3), groups=64)  # depthwise
    assert not applies((8, 256, 2, 2), (256, 256, 3, 3))  # 8 tiles
    assert not applies((8, 64, 16, 16), (64, 64, 3, 3), stride=(2, 2))
    assert not applies((8, 64, 16, 16), (64, 64, 5, 5), padding=(2, 2))
    assert not winograd_kernels.applies((8, 64, 16, 16), (64, 64, 3, 3), 1, (1, 1), (1, 1), (1, 1), np.float16)


def test_winograd_takes_arrays_that_are_not_contiguous(monkeypatch):
    """A caller's views (not the executor's registers) are copied for the
    generated C, which reads contiguous arrays."""
    from xdsl.dialects.builtin import TensorType, f32
    from xdsl.ir import Block

    from sbpc.runtime import winograd_kernels
    from sbpc.semantics.reference import REFERENCE

    monkeypatch.setattr(winograd_kernels, "MIN_TILES", 1)
    rng = np.random.default_rng(12)
    x = rng.standard_normal((6, 8, 2, 8), dtype=np.float32).transpose(2, 1, 0, 3)  # (2, 8, 6, 8), strided
    w = rng.standard_normal((8, 8, 3, 3), dtype=np.float32)
    out = np.zeros((2, 8, 8, 6), np.float32).transpose(0, 1, 3, 2)  # (2, 8, 6, 8), strided
    fire = winograd_kernels.conv2d(x.shape, w.shape, 1, (1, 1), np.float32)
    for _ in range(3):  # (the copies are staged once and reused)
        fire([x, w], out)
    block = Block(arg_types=[TensorType(f32, x.shape), TensorType(f32, w.shape)])
    want = REFERENCE[lg.Conv2dOp](lg.Conv2dOp(block.args[0], block.args[1], padding=(1, 1)), x, w)
    np.testing.assert_allclose(out, want, rtol=0, atol=64 * np.finfo(np.float32).eps * np.abs(want).max())


def test_winograd_falls_back_to_im2col_where_its_library_cannot_be_written(monkeypatch, capsys):
    """No room or no permission for the library (OSError): the convolution
    runs by im2col, with one line saying so, as the executor falls back to
    numpy's kernels."""
    from sbpc.runtime import winograd_kernels

    def refuse(kernels):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(host_kernels, "Library", refuse)
    monkeypatch.setattr(winograd_kernels, "_library", functools.cache(winograd_kernels._library.__wrapped__))
    assert not winograd_kernels.applies((8, 64, 16, 16), (64, 64, 3, 3), 1, (1, 1), (1, 1), (1, 1), np.float32)
    assert "convolving by im2col" in capsys.readouterr().err


# (batch, channels, image size, filters, kernel, stride, padding): output
# rows of one and of two vectors, filters and taps past whole register
# blocks (4 x 6), strides 1 to 3
DIRECT_GRAD_WEIGHTS = [
    (2, 3, 32, 5, 7, 2, 3),  # a stem: rows of 16, 147 taps
    (3, 2, 32, 7, 3, 1, 1),  # stride 1 (no phases to split), rows of 32
    (1, 3, 47, 3, 5, 3, 2),  # stride 3
    (2, 1, 34, 4, 3, 2, 0),  # the image's last row and column in no window
]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_direct_conv_weight_gradient_computes_the_reference(dtype):
    """lg.conv2d_grad_weight in generated C for filters of few taps
    (codegen's host_conv2d_grad_weight: each image split into its stride's
    phases, vectors along output rows summed in registers) against the
    reference, fired twice (the phase planes are kept between firings), and
    an infinity where no window reads stays out of every sum."""
    from xdsl.dialects.builtin import TensorType, f32, f64
    from xdsl.ir import Block

    from sbpc.semantics.reference import REFERENCE

    element = f32 if dtype == np.float32 else f64
    rng = np.random.default_rng(13)
    for n, c, size, o, k, stride, padding in DIRECT_GRAD_WEIGHTS:
        conv = {"stride": (stride, stride), "padding": (padding, padding)}
        x = rng.standard_normal((n, c, size, size)).astype(dtype)
        ho = (size + 2 * padding - k) // stride + 1
        g = rng.standard_normal((n, o, ho, ho)).astype(dtype)
        block = Block(arg_types=[TensorType(element, x.shape), TensorType(element, g.shape)])
        op = lg.Conv2dGradWeightOp(block.args[0], block.args[1], (k, k), **conv)
        got = np.full((o, c, k, k), np.nan, dtype)
        fire = host_kernels.bind_kernel(op, None, [x, g], got)
        assert fire is not None, "the direct kernel declined"
        if size - 1 + padding > (ho - 1) * stride + k - 1:  # the last row and column in no window
            x[:, :, -1, :] = x[:, :, :, -1] = np.inf
        want = REFERENCE[type(op)](op, x, g)
        assert np.isfinite(want).all()
        for _ in range(2):
            fire([x, g], got)
            np.testing.assert_allclose(got, want, rtol=0, atol=64 * np.finfo(dtype).eps * np.abs(want).max(),
                                       err_msg=str((n, c, size, o, k, stride, padding)))


def test_direct_conv_weight_gradient_declines_what_the_gemms_do_better():
    """Images of many channels, output rows that are not whole vectors,
    groups and dilation: the numpy kernel's windows and GEMMs (or Winograd) run."""
    from xdsl.dialects.builtin import TensorType, f32
    from xdsl.ir import Block

    def binds(images, filters, kernel, **conv):
        x = np.zeros(images, np.float32)
        block = Block(arg_types=[TensorType(f32, images), TensorType(f32, (1, 1, 1, 1))])
        probe = lg.Conv2dOp(block.args[0], Block(arg_types=[TensorType(f32, (filters, images[1] // conv.get(
            "groups", 1), *kernel))]).args[0], **conv)
        g = np.zeros(probe.result.type.get_shape(), np.float32)
        grads = Block(arg_types=[TensorType(f32, x.shape), TensorType(f32, g.shape)])
        op = lg.Conv2dGradWeightOp(grads.args[0], grads.args[1], kernel, **conv)
        out = np.zeros((filters, images[1] // conv.get("groups", 1), *kernel), np.float32)
        return host_kernels.bind_kernel(op, None, [x, g], out) is not None

    assert binds((2, 3, 64, 64), 8, (7, 7), stride=(2, 2), padding=(3, 3))
    assert not binds((2, 16, 32, 32), 8, (3, 3), padding=(1, 1))  # 16 channels
    assert not binds((2, 3, 24, 24), 8, (7, 7), stride=(2, 2), padding=(3, 3))  # rows of 12
    assert not binds((2, 3, 40, 40), 8, (7, 7), stride=(2, 2), padding=(3, 3))  # rows of 20
    assert not binds((2, 4, 32, 32), 8, (3, 3), padding=(1, 1), groups=2)
    assert not binds((2, 3, 40, 40), 8, (3, 3), padding=(2, 2), dilation=(2, 2))
