"""The Python side of the dialects: building IR through op constructors,
shape inference, plain-data views of SBP attributes and meshes, the
attribute verifiers only Python can reach, lookups outside a module."""

import pytest
from xdsl.dialects.builtin import TensorType, f32

from sbpc.dialects import lg, sbp
from sbpc.graph_builder import GraphBuilder


def test_constructors_infer_result_types():
    b = GraphBuilder("g")
    x = b.input("x", (2, 8, 16))
    w = b.param("w", (16, 4), lg.NormalInitAttr(0.0, 0.02))
    y = b.add(lg.MatmulOp(x, w))
    assert y.type == TensorType(f32, (2, 8, 4))
    t = b.add(lg.TransposeOp(y, [0, 2, 1]))
    assert t.type == TensorType(f32, (2, 4, 8))
    s = b.add(lg.SoftmaxOp(t, -1))  # negative axes are normalized
    assert s.owner.axis.value.data == 2
    r = b.add(lg.ReduceSumOp(s, [-1, 0], keepdims=True))
    assert r.owner.axes.get_values() == (0, 2) and r.type == TensorType(f32, (1, 4, 1))
    labels = b.input("labels", (2, 4), "i64")
    loss = b.add(lg.CrossEntropyOp(t, labels))
    assert loss.type == TensorType(f32, ())
    module = b.module({"loss": loss})
    module.verify()


def test_constructors_reject_ill_typed_operands():
    b = GraphBuilder("g")
    x = b.input("x", (8, 16))
    with pytest.raises(ValueError, match="lg.matmul: contracting dimensions differ"):
        lg.MatmulOp(x, x)
    with pytest.raises(ValueError, match=r"lg.add: shapes \[8, 16\], \[3\] do not broadcast"):
        lg.AddOp(x, b.input("y", (3,)))
    with pytest.raises(ValueError, match="lg.reshape: cannot reshape"):
        lg.ReshapeOp(x, (5, 5))


def test_sbp_attributes_and_mesh():
    nd = sbp.NdSbpAttr([sbp.SplitAttr(0), sbp.BroadcastAttr(), sbp.PartialAttr("max")])
    assert len(nd) == 3 and nd[0].axis.data == 0 and nd[2].reduce_kind is sbp.ReduceKind.MAX
    assert sbp.format_nd(nd) == "[S<0>, B, P<max>]"
    assert sbp.PartialAttr() == sbp.PartialAttr("sum")
    placement = sbp.PlacementOp("m", "cuda", [4, 5, 6, 7], [2, 2])
    placement.verify()
    assert placement.mesh() == sbp.Mesh("m", sbp.DeviceKind.CUDA, (4, 5, 6, 7), (2, 2))
    t = sbp.DTensorType((8, 4), f32, "m", [sbp.SplitAttr(1), sbp.BroadcastAttr()])
    assert sbp.global_shape(t) == (8, 4) and t.placement_name == "m"
    moved = t.with_distribution("n", [sbp.BroadcastAttr()])
    assert moved.placement_name == "n" and moved.get_shape() == (8, 4)
    with pytest.raises(Exception, match="split axis must be non-negative"):
        sbp.SplitAttr(-1)


def test_attribute_verifiers_reachable_only_from_python():
    # The parser cannot even spell these; the constructors must still refuse them.
    with pytest.raises(Exception, match="an nd-SBP needs at least one entry"):
        sbp.NdSbpAttr([])
    with pytest.raises(Exception, match="partial reduction must be one of sum, max, got 'min'"):
        sbp.PartialAttr("min")
    with pytest.raises(Exception, match="one entry per mesh axis"):
        sbp.SignatureAttr([sbp.NdSbpAttr([sbp.BroadcastAttr()])], [sbp.NdSbpAttr([sbp.BroadcastAttr()] * 2)])


def test_lookup_outside_a_module_is_a_diagnostic():
    b = GraphBuilder("g")
    t = sbp.DTensorType((4,), f32, "m", [sbp.BroadcastAttr()])
    x = b.add(lg.InputOp("x", t))  # the graph is in no module, so no symbol table
    with pytest.raises(Exception, match="'lg.input': placement @m does not exist"):
        x.owner.verify()
