"""2-D convolution and max pooling over NCHW images, with the gradient ops
their backward passes emit (the convolution's two gradients share one
template)."""

from __future__ import annotations

import math
from abc import ABC
from typing import Any, ClassVar

from xdsl.dialects.builtin import I64, DenseArrayBase, IntegerAttr, i64
from xdsl.ir import Attribute, SSAValue
from xdsl.irdl import operand_def, prop_def, result_def, traits_def
from xdsl.traits import Pure

from ..irdl_verify import op_definition
from ..sbp import TensorLike, element_type, global_shape
from .base import LgOp, Shape, ShapeError, Signature, passthrough_signatures, require_float, same_element_type, split_ok
from .elementwise import MulOp
from .index import OneHotOp
from .reduce import ArgmaxOp, ReduceSumOp
from .shape import ConcatOp, PadOp, ReshapeOp, SliceOp


def _conv_output_size(size: int, kernel: int, stride: int, padding: int, dilation: int) -> int:
    return (size + 2 * padding - dilation * (kernel - 1) - 1) // stride + 1


class _ConvOp(LgOp, ABC):
    """What a 2-D convolution and its gradients share: stride, padding and
    dilation (height, width) and the number of groups, as PyTorch's
    `conv2d` takes them; images are NCHW and weights (O, C/groups, kh, kw)."""

    KERNEL_KIND: ClassVar[str] = "window"

    stride = prop_def(DenseArrayBase.constr(i64))
    padding = prop_def(DenseArrayBase.constr(i64))
    dilation = prop_def(DenseArrayBase.constr(i64))
    groups = prop_def(IntegerAttr[I64])

    @staticmethod
    def _conv(stride, padding, dilation, groups: int) -> dict[str, Any]:
        """The convolution's keywords as the rules take them."""
        return {"stride": tuple(stride), "padding": tuple(padding), "dilation": tuple(dilation), "groups": groups}

    @staticmethod
    def _props(stride, padding, dilation, groups) -> dict[str, Attribute]:
        return {"stride": DenseArrayBase.from_list(i64, list(stride)),
                "padding": DenseArrayBase.from_list(i64, list(padding)),
                "dilation": DenseArrayBase.from_list(i64, list(dilation)), "groups": IntegerAttr(groups, i64)}

    def params(self):
        return {"stride": tuple(self.stride.get_values()), "padding": tuple(self.padding.get_values()),
                "dilation": tuple(self.dilation.get_values()), "groups": self.groups.value.data}

    SPLITS: ClassVar[tuple[tuple[int, int, bool, Signature], ...]] = ()
    """(operand, axis, whole groups only, signature): each split the op
    offers where that operand's axis may be split (and, where marked, the
    convolution has one group). Every convolution is also bilinear: all B,
    or one partial operand with the other whole."""

    @classmethod
    def sbp_rule(cls, in_shapes, out_shape, p, groups, **params):
        sigs = [sig for operand, axis, whole_groups, sig in cls.SPLITS
                if (groups == 1 or not whole_groups) and split_ok(in_shapes[operand][axis], p)]
        return sigs + [(("B", "B"), ("B",)), (("P", "B"), ("P",)), (("B", "P"), ("P",))]

    @staticmethod
    def _check(image: Shape, weight: Shape, stride, padding, dilation, groups) -> tuple[int, int]:
        """The output's height and width, or a ShapeError."""
        if len(image) != 4 or len(weight) != 4:
            raise ShapeError(f"images must be NCHW and weights (O, C/groups, kh, kw), got {list(image)} and "
                             f"{list(weight)}")
        if not (len(stride) == len(padding) == len(dilation) == 2):
            raise ShapeError("stride, padding and dilation need 2 entries (height, width)")
        if min(stride) < 1 or min(dilation) < 1 or min(padding) < 0 or groups < 1:
            raise ShapeError(f"need stride >= 1, dilation >= 1, padding >= 0 and groups >= 1, got stride "
                             f"{list(stride)}, padding {list(padding)}, dilation {list(dilation)}, groups {groups}")
        if image[1] != weight[1] * groups or weight[0] % groups:
            raise ShapeError(f"{image[1]} input channels and {weight[0]} output channels do not fit weights "
                             f"{list(weight)} in {groups} groups")
        sizes = (_conv_output_size(image[2], weight[2], stride[0], padding[0], dilation[0]),
                 _conv_output_size(image[3], weight[3], stride[1], padding[1], dilation[1]))
        if min(sizes) < 1:
            raise ShapeError(f"the kernel {list(weight[2:])} (dilation {list(dilation)}) does not fit the padded "
                             f"image {[image[2] + 2 * padding[0], image[3] + 2 * padding[1]]}")
        return sizes


@op_definition
class Conv2dOp(_ConvOp):
    """2-D convolution (cross-correlation, as PyTorch's `conv2d`, without
    bias: the importer adds it): x (N, C, H, W), weight (O, C/groups, kh,
    kw) -> (N, O, Ho, Wo). A split batch stays split (data parallel);
    split output channels split the result (the weight split by rows);
    split input channels give a partial sum."""

    name = "lg.conv2d"

    input = operand_def(TensorLike)
    weight = operand_def(TensorLike)
    result = result_def(TensorLike)

    traits = traits_def(Pure())

    assembly_format = (
        "$input `,` $weight `stride` $stride `padding` $padding `dilation` $dilation `groups` $groups attr-dict "
        "`:` functional-type(operands, results)"
    )

    SPLITS: ClassVar = ((0, 0, False, (("S0", "B"), ("S0",))),  # the batch: data parallel
                        (1, 0, True, (("B", "S0"), ("S1",))),  # output channels
                        (0, 1, True, (("S1", "S1"), ("P",))))  # input channels: a partial sum

    def __init__(self, input: SSAValue, weight: SSAValue, stride=(1, 1), padding=(0, 0), dilation=(1, 1),
                 groups: int = 1):
        params = self._conv(stride, padding, dilation, groups)
        super().__init__(operands=[input, weight], properties=self._props(**params),
                         result_types=[self.infer([input, weight], **params)])

    @classmethod
    def rule(cls, shapes, elems, stride, padding, dilation, groups):
        image, weight = shapes
        require_float("input", elems[0])
        height, width = cls._check(image, weight, stride, padding, dilation, groups)
        return (image[0], weight[0], height, width), same_element_type(elems)

    @classmethod
    def flops(cls, in_shapes, out_shape, **params):
        return 2.0 * math.prod(out_shape) * math.prod(in_shapes[1][1:])

    def gradient(self, g, e):
        p = self.params()
        image = global_shape(self.input.type)
        return [e.emit(Conv2dGradInputOp(g, self.weight, image[2:], **p)),
                e.emit(Conv2dGradWeightOp(self.input, g, global_shape(self.weight.type)[2:], **p))]


class _ConvGradOp(_ConvOp, ABC):
    """A gradient of lg.conv2d: two operands and, beside the convolution's
    properties, the extent (height, width) of what it computes, which the
    convolution's output alone does not determine: the image's `size` or
    the weight's `kernel`, the property EXTENT names."""

    EXTENT: ClassVar[str]

    def __init__(self, first: SSAValue, second: SSAValue, extent, stride=(1, 1), padding=(0, 0),
                 dilation=(1, 1), groups: int = 1):
        params = {**self._conv(stride, padding, dilation, groups), self.EXTENT: tuple(extent)}
        props = {**self._props(stride, padding, dilation, groups),
                 self.EXTENT: DenseArrayBase.from_list(i64, list(extent))}
        super().__init__(operands=[first, second], properties=props,
                         result_types=[self.infer([first, second], **params)])

    def params(self):
        return {**super().params(), self.EXTENT: tuple(getattr(self, self.EXTENT).get_values())}


@op_definition
class Conv2dGradInputOp(_ConvGradOp):
    """The gradient of lg.conv2d for its input: (N, O, Ho, Wo) gradient and
    the weight -> (N, C, H, W) (a transposed convolution), `size` (H, W)."""

    name = "lg.conv2d_grad_input"

    grad = operand_def(TensorLike)
    weight = operand_def(TensorLike)
    size = prop_def(DenseArrayBase.constr(i64))
    result = result_def(TensorLike)

    traits = traits_def(Pure())

    assembly_format = (
        "$grad `,` $weight `size` $size `stride` $stride `padding` $padding `dilation` $dilation `groups` $groups "
        "attr-dict `:` functional-type(operands, results)"
    )

    SPLITS: ClassVar = ((0, 0, False, (("S0", "B"), ("S0",))),
                        (1, 0, True, (("S1", "S0"), ("P",))),
                        (1, 1, True, (("B", "S1"), ("S1",))))

    EXTENT: ClassVar = "size"

    @classmethod
    def rule(cls, shapes, elems, size, stride, padding, dilation, groups):
        grad, weight = shapes
        require_float("grad", elems[0])
        if len(size) != 2 or len(grad) != 4 or len(weight) != 4:
            raise ShapeError(f"size needs (H, W), grad (N, O, Ho, Wo) and weight (O, C/groups, kh, kw), got "
                             f"{list(size)}, {list(grad)} and {list(weight)}")
        image = (grad[0], weight[1] * groups, *size)
        if tuple(grad[1:]) != (weight[0], *cls._check(image, weight, stride, padding, dilation, groups)):
            raise ShapeError(f"grad shape {list(grad)} is not the convolution's output for images of size "
                             f"{list(size)} and weights {list(weight)}")
        return image, same_element_type(elems)

    @classmethod
    def flops(cls, in_shapes, out_shape, **params):
        return 2.0 * math.prod(in_shapes[0]) * math.prod(in_shapes[1][1:])

    def gradient(self, g, e):
        """Linear in both operands (a transposed convolution): the gradient's
        gradient is the convolution of `g` by the weight, the weight's is
        the weight gradient of a convolution of `g` giving this gradient."""
        p = {k: v for k, v in self.params().items() if k != "size"}
        kernel = global_shape(self.weight.type)[2:]
        return [e.emit(Conv2dOp(g, self.weight, **p)), e.emit(Conv2dGradWeightOp(g, self.grad, kernel, **p))]


@op_definition
class Conv2dGradWeightOp(_ConvGradOp):
    """The gradient of lg.conv2d for its weight: the input (N, C, H, W) and
    the (N, O, Ho, Wo) gradient -> (O, C/groups, kh, kw), `kernel` (kh, kw).
    A split batch gives a partial sum (each device's examples)."""

    name = "lg.conv2d_grad_weight"

    input = operand_def(TensorLike)
    grad = operand_def(TensorLike)
    kernel = prop_def(DenseArrayBase.constr(i64))
    result = result_def(TensorLike)

    traits = traits_def(Pure())

    assembly_format = (
        "$input `,` $grad `kernel` $kernel `stride` $stride `padding` $padding `dilation` $dilation `groups` "
        "$groups attr-dict `:` functional-type(operands, results)"
    )

    SPLITS: ClassVar = ((0, 0, False, (("S0", "S0"), ("P",))),  # each device's examples: a partial sum
                        (1, 1, True, (("B", "S1"), ("S0",))),
                        (0, 1, True, (("S1", "B"), ("S1",))))

    EXTENT: ClassVar = "kernel"

    @classmethod
    def rule(cls, shapes, elems, kernel, stride, padding, dilation, groups):
        image, grad = shapes
        require_float("input", elems[0])
        if len(kernel) != 2 or len(grad) != 4 or len(image) != 4:
            raise ShapeError(f"kernel needs (kh, kw), input (N, C, H, W) and grad (N, O, Ho, Wo), got "
                             f"{list(kernel)}, {list(image)} and {list(grad)}")
        weight = (grad[1], image[1] // groups, *kernel)
        if (grad[0], *grad[2:]) != (image[0], *cls._check(image, weight, stride, padding, dilation, groups)):
            raise ShapeError(f"grad shape {list(grad)} is not the convolution's output for input {list(image)} and "
                             f"a kernel {list(kernel)}")
        return weight, same_element_type(elems)

    @classmethod
    def flops(cls, in_shapes, out_shape, **params):
        return 2.0 * math.prod(in_shapes[1]) * math.prod(out_shape[1:])

    def gradient(self, g, e):
        """Linear in both operands: for the images, the transposed
        convolution of the gradient by `g` (a weight's gradient);
        for the gradient, the convolution of the images by `g`."""
        p = {k: v for k, v in self.params().items() if k != "kernel"}
        size = global_shape(self.input.type)[2:]
        return [e.emit(Conv2dGradInputOp(self.grad, g, size, **p)), e.emit(Conv2dOp(self.input, g, **p))]


class _PoolOp(LgOp, ABC):
    """What max pooling and its gradient share: the window (kh, kw), stride
    and padding (height, width) over NCHW images; padding counts as minus
    infinity (PyTorch's max_pool2d), so it is never the maximum."""

    KERNEL_KIND: ClassVar[str] = "row"

    kernel = prop_def(DenseArrayBase.constr(i64))
    stride = prop_def(DenseArrayBase.constr(i64))
    padding = prop_def(DenseArrayBase.constr(i64))

    @staticmethod
    def _props(kernel, stride, padding) -> dict[str, Attribute]:
        return {"kernel": DenseArrayBase.from_list(i64, list(kernel)),
                "stride": DenseArrayBase.from_list(i64, list(stride)),
                "padding": DenseArrayBase.from_list(i64, list(padding))}

    def params(self):
        return {"kernel": tuple(self.kernel.get_values()), "stride": tuple(self.stride.get_values()),
                "padding": tuple(self.padding.get_values())}

    @staticmethod
    def _pooled(image: Shape, kernel, stride, padding) -> tuple[int, int, int, int]:
        if len(image) != 4:
            raise ShapeError(f"images must be NCHW, got {list(image)}")
        if not (len(kernel) == len(stride) == len(padding) == 2):
            raise ShapeError("kernel, stride and padding need 2 entries (height, width)")
        if min(kernel) < 1 or min(stride) < 1 or min(padding) < 0 or any(2 * p > k for p, k in zip(padding, kernel)):
            raise ShapeError(f"need kernel >= 1, stride >= 1 and 0 <= padding <= kernel / 2, got kernel "
                             f"{list(kernel)}, stride {list(stride)}, padding {list(padding)}")
        sizes = (_conv_output_size(image[2], kernel[0], stride[0], padding[0], 1),
                 _conv_output_size(image[3], kernel[1], stride[1], padding[1], 1))
        if min(sizes) < 1:
            raise ShapeError(f"the window {list(kernel)} does not fit the padded image "
                             f"{[image[2] + 2 * padding[0], image[3] + 2 * padding[1]]}")
        return image[0], image[1], sizes[0], sizes[1]


@op_definition
class MaxPool2dOp(_PoolOp):
    """Each window's maximum (PyTorch's `max_pool2d`, without dilation or
    ceil mode): (N, C, H, W) -> (N, C, Ho, Wo). Batch and channels may be
    split; a maximum of candidates (P<max>) stays one."""

    name = "lg.max_pool2d"

    input = operand_def(TensorLike)
    result = result_def(TensorLike)

    traits = traits_def(Pure())

    assembly_format = (
        "$input `kernel` $kernel `stride` $stride `padding` $padding attr-dict `:` type($input) `->` type($result)"
    )

    def __init__(self, input: SSAValue, kernel, stride, padding=(0, 0)):
        params = {"kernel": tuple(kernel), "stride": tuple(stride), "padding": tuple(padding)}
        super().__init__(operands=[input], properties=self._props(**params),
                         result_types=[self.infer([input], **params)])

    @classmethod
    def rule(cls, shapes, elems, kernel, stride, padding):
        require_float("input", elems[0])
        return cls._pooled(shapes[0], kernel, stride, padding), elems[0]

    @classmethod
    def sbp_rule(cls, in_shapes, out_shape, p, kernel, stride, padding):
        sigs = [((f"S{i}",), (f"S{i}",)) for i in (0, 1) if split_ok(in_shapes[0][i], p)]
        return sigs + passthrough_signatures(1, ("Pmax",))

    @classmethod
    def flops(cls, in_shapes, out_shape, kernel, **params):
        return float(math.prod(out_shape) * math.prod(kernel))

    def gradient(self, g, e):
        return [e.emit(MaxPool2dGradOp(self.input, g, **self.params()))]


@op_definition
class MaxPool2dGradOp(_PoolOp):
    """The gradient of lg.max_pool2d: each window's gradient goes to the
    first element (in row-major order) that holds its maximum, as PyTorch
    routes it; the images (N, C, H, W) and the gradient (N, C, Ho, Wo) ->
    (N, C, H, W)."""

    name = "lg.max_pool2d_grad"

    input = operand_def(TensorLike)
    grad = operand_def(TensorLike)
    result = result_def(TensorLike)

    traits = traits_def(Pure())

    assembly_format = (
        "$input `,` $grad `kernel` $kernel `stride` $stride `padding` $padding attr-dict `:` "
        "functional-type(operands, results)"
    )

    def __init__(self, input: SSAValue, grad: SSAValue, kernel, stride, padding=(0, 0)):
        params = {"kernel": tuple(kernel), "stride": tuple(stride), "padding": tuple(padding)}
        super().__init__(operands=[input, grad], properties=self._props(**params),
                         result_types=[self.infer([input, grad], **params)])

    @classmethod
    def rule(cls, shapes, elems, kernel, stride, padding):
        require_float("input", elems[0])
        if tuple(shapes[1]) != cls._pooled(shapes[0], kernel, stride, padding):
            raise ShapeError(f"grad shape {list(shapes[1])} is not the pooling's output for images "
                             f"{list(shapes[0])}")
        return shapes[0], same_element_type(elems)

    @classmethod
    def sbp_rule(cls, in_shapes, out_shape, p, kernel, stride, padding):
        """Linear in the gradient: a partial gradient under whole images gives a partial result."""
        sigs = [((f"S{i}", f"S{i}"), (f"S{i}",)) for i in (0, 1) if split_ok(in_shapes[0][i], p)]
        return sigs + [(("B", "B"), ("B",)), (("B", "P"), ("P",))]

    @classmethod
    def flops(cls, in_shapes, out_shape, kernel, **params):
        # per window and tap: whether it holds the maximum, whether an
        # earlier tap did, the gradient taken or not, and its sum where the
        # windows overlap (a fifth of this was the count: the rate-bound
        # time then hid under the fixed cost, and calibration could not
        # tell the two apart)
        return 5.0 * math.prod(in_shapes[1]) * math.prod(kernel)

    def gradient(self, g, e):
        """PyTorch's double backward: linear in the gradient, so its own
        gradient is `g` read at each window's first maximum (the windows of
        the images and of `g` stacked on a last axis, lg.argmax picking);
        none for the images, which only choose."""
        kernel = self.params()["kernel"]
        first = e.emit(ArgmaxOp(self._windows(e, self.input, -math.inf), 4))
        chosen = e.emit(OneHotOp(first, kernel[0] * kernel[1], element_type(g.type)))
        return [None, e.emit(ReduceSumOp(e.emit(MulOp(chosen, self._windows(e, g, 0.0))), [4]))]

    def _windows(self, e, images: SSAValue, fill: float) -> SSAValue:
        """(N, C, Ho, Wo, kh * kw): each window's elements of `images`, in
        row-major order, the padding `fill`."""
        params = self.params()
        (kh, kw), (sh, sw), (ph, pw) = params["kernel"], params["stride"], params["padding"]
        n, c, _, _ = global_shape(images.type)
        _, _, oh, ow = global_shape(self.grad.type)
        padded = e.emit(PadOp(images, [0, 0, ph, pw], [0, 0, ph, pw], fill))
        return e.emit(ConcatOp([
            e.emit(ReshapeOp(e.emit(SliceOp(padded, [0, 0, i, j], [n, c, i + sh * (oh - 1) + 1, j + sw * (ow - 1) + 1],
                                            [1, 1, sh, sw])), [n, c, oh, ow, 1]))
            for i in range(kh) for j in range(kw)], 4))
