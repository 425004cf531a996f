"""A graph that uses every kind of kernel the generators cover (compiled
for CPU ranks), its devices' compute actors, and random inputs for them:
for the tests of the generated host kernels (codegen/ and
runtime/test_host_kernels.py)."""

import numpy as np
from xdsl.context import Context

import sbpc
from sbpc import B, S
from sbpc.dialects import lg, plan
from sbpc.dialects.dtypes import numpy_dtype
from sbpc.dialects.sbp import PartialAttr, ReduceKind
from sbpc.lowering.compile import CompilePass


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
    # layernorm's input gradient over the innermost axis and over the last two
    ln_back = (g.add(lg.LayerNormGradOp(e.value, r.value, 2, 1e-5)) * 1.0
               + g.add(lg.LayerNormGradOp(r.value, x.value, 1, 1e-3)))
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
    overwritten = sbpc.scatter(x, picks, picked * 2.0, 2)  # the last of repeated picks wins
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
    # uniform draws split by rows and along their last axis, numbered as in the whole tensor
    dropped = dropped + g.rand(x.shape, dtype).to(S(0)) + g.rand(x.shape, dtype).to(S(2))
    # masks: a comparison in the inputs' type, casts both ways, a logical op and a select, broadcasting
    positive = sbpc.compare("gt", x, v)  # (6, 5, 13) i1
    counted = sbpc.cast(sbpc.logical("xor", positive, sbpc.compare("le", c, v)), dtype)
    masked = sbpc.where(positive, x, c) + counted + sbpc.cast(sbpc.cast(x * 3.0, "i64"), dtype)
    picked_high = sbpc.cast(sbpc.compare("ge", picks, g.constant(np.int64(7))), dtype)  # integers compared
    counts = sbpc.cast(positive, "i64").sum(axes=(1, 2)) * picks.sum(axes=(1, 2))  # integer sums and products
    # the largest element's index along the inner axis (x split by rows) and of an integer tensor
    counts = counts + sbpc.argmax(x, 2).sum(axes=(1,)) + sbpc.argmax(picks, 1).sum(axes=(1,))
    # integer division rounded down: by a negative divisor, by a computed one, by zero (0)
    counts = (counts + sbpc.floordiv(counts - 50, -3) + sbpc.floordiv(counts, picks.sum(axes=(1, 2)) - 60)
              + sbpc.floordiv(counts, 0))
    g.output(red=red, t=t, d=-e / (r + 3.0), cols=cols, swapped=swapped, scans=scans, padded=padded,
             scattered=scattered, overwritten=overwritten, tokens=tokens.to(sbpc.P), grad=grad.to(S(1)),
             split_picked=split_picked,
             split_scattered=split_scattered, convolved=convolved, conv_input=conv_grads[0],
             conv_weight=conv_grads[1], pool_back=pool_back, dropped=dropped, split_dropped=split_dropped,
             masked=masked, picked_high=picked_high, counts=counts, ln_back=ln_back)
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
