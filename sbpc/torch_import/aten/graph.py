"""export's own nodes around the ATen ops: getitem of an op's results,
the metadata asserts, and the higher-order regions (grad mode, autocast)
imported in place."""

from __future__ import annotations

from typing import TYPE_CHECKING

from sbpc.frontend import Tensor
from sbpc.torch_import.aten.registry import rule
from sbpc.torch_import.values import _DTYPES

if TYPE_CHECKING:
    # for the annotations only: the importer loads the rules (through their
    # registry) before it defines _Importer
    from sbpc.torch_import.importer import _Importer


@rule("getitem")
def _getitem(im: _Importer, seq, index):
    return seq[index]


@rule("aten._assert_tensor_metadata")
def _assert_metadata(im: _Importer, x, size=None, stride=None, dtype=None, **where):
    """export's check that a value has the dtype it was traced with: true of
    every lg value by construction (a cast to another dtype is refused)."""
    x = im.lift(x)
    if dtype is not None and _DTYPES.get(str(dtype)) != str(x.dtype):
        raise ValueError(f"a value of dtype {x.dtype} where {dtype} was traced")
    return None


@rule("wrap_with_set_grad_enabled")
def _grad_mode_region(im: _Importer, enabled, region, *args):
    """A `torch.no_grad()` / `torch.enable_grad()` region (LLaMA's rotary
    embedding is computed under no_grad). One on constants was folded; one on
    computed values is imported in place when gradients stay on. With them
    off, gradients must not flow through it, which lg cannot yet say."""
    if not enabled and any(isinstance(a, Tensor) for a in args):
        raise ValueError("a torch.no_grad() region over values computed from the inputs or parameters "
                         "(sbpc has no stop-gradient yet)")
    return im.inline(region, args)


@rule("wrap_with_autocast")
def _autocast_region(im: _Importer, device_type, dtype, enabled, cache_enabled, region, *args):
    """A `torch.autocast` region, imported in place. One that is on casts as
    PyTorch's CPU autocast does: the inputs of matmuls, linears and
    convolutions to its lower precision, and every other op's result to
    the dtype PyTorch traced (promotion; the ops it runs in float32). One
    that is off (models force float32 so, around rotary embeddings and
    norms) computes what its ops say."""
    lower = _DTYPES.get(str(dtype))
    if enabled and lower not in ("bf16", "f16"):
        raise ValueError(f"a torch.autocast region to {dtype} (sbpc's lower precisions: bfloat16, float16)")
    outer, im.autocast = im.autocast, lower if enabled else None
    try:
        return im.inline(region, args)
    finally:
        im.autocast = outer


@rule("aten.sym_size.int")
def _sym_size(im: _Importer, x, dim):
    """Shapes are static: the size itself."""
    shape = im.lift(x).shape
    return int(shape[dim])


@rule("aten.sym_numel")
def _sym_numel(im: _Importer, x):
    count = 1
    for d in im.lift(x).shape:
        count *= int(d)
    return count


@rule("aten.sym_stride.int")
def _sym_stride(im: _Importer, x, dim):
    """lg values are dense and row-major: the stride of a contiguous tensor."""
    shape = list(im.lift(x).shape)
    stride = 1
    for d in shape[dim % len(shape) + 1:]:
        stride *= int(d)
    return stride


@rule("aten.sym_storage_offset")
def _sym_storage_offset(im: _Importer, x):
    im.lift(x)
    return 0


@rule("aten.sym_is_contiguous")
def _sym_is_contiguous(im: _Importer, x, memory_format=None):
    im.lift(x)
    return True
