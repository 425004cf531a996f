"""The renderers (codegen/render.py): one kernel description renders the
same statements per element as CUDA C and as host C, and the host
prelude's float exp keeps IEEE special values (the softmax built on it too)."""

import numpy as np
import pytest
from support.kernel_graphs import device_actors, kernels_graph
from xdsl.context import Context

import sbpc
from sbpc.codegen.generators import describe, generate, generate_host
from sbpc.codegen.render import cuda_source
from sbpc.lowering.compile import CompilePass
from sbpc.runtime import host_kernels

pytestmark = pytest.mark.skipif(host_kernels.unavailable() is not None,
                                reason=f"no host kernels here: {host_kernels.unavailable()}")


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
            if made.host_body is not None:  # a reduction's, draw's, pooling's or row's loops (values checked above)
                assert made.host_body in host and actor.kernel.data in {*host_kernels.REDUCTIONS, "lg.dropout",
                                                                        "lg.uniform", "lg.max_pool2d",
                                                                        "lg.max_pool2d_grad",
                                                                        "lg.token_cross_entropy_grad"}
                continue
            # the statements for one element are the same on both targets
            # (a broadcasting chain finds its offsets by loops on the host)
            statements = made.nest.element if made.nest is not None else made.body
            for line in statements.splitlines():
                assert line.strip() in src and line.strip() in host, line


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
