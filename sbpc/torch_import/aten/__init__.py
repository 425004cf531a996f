"""The lowering of each ATen op: a rule per op (`@rule("aten.<op>.<overload>")`,
the overload dropped when it is `default`) in `registry.RULES`, one module
per op family, named as the lg dialect's: a new rule goes beside those of
the ops it resembles, usually with the lg family it lowers to. A rule
receives the importer and the node's arguments (tensors as frontend
`Tensor`s, values known at import time as `_Const`s: `im.known(x)` gives
the array, `im.lift(x)` an lg.constant) and returns a `Tensor`, or a list
for ops with several results; it raises ValueError for an argument it does
not take.

    registry     RULES, rule; COMPLEX_RULES, complex_rule (ops on complex operands); the axis arguments
                 every family normalizes
    elementwise  arithmetic with PyTorch's promotion (add, mul, div...), unary ops, activations, pow
    mask         casts, logical and comparison ops, masked_fill, where, constant masks as additions
    shape        views and reshapes, transpose, permute, expand, slicing, split, cat, pad
    reduce       sum, mean, amax, argmax, cumsum
    norm         softmax, log_softmax, layer_norm, rms_norm, batch_norm
    linalg       linear, matmul, addmm, scaled_dot_product_attention
    conv         conv2d and pooling
    index        advanced indexing, index_select, gather, embedding
    loss         cross_entropy_loss, mse_loss
    random       dropout
    complex_numbers  complex values as their two real parts: the FFTs, view_as_real/complex, complex arithmetic
    graph        export's own nodes: getitem, metadata asserts, grad-mode and autocast regions

Importing this package registers every family's rules.
"""

from __future__ import annotations

from sbpc.torch_import.aten import (  # noqa: F401 - imported for their @rule registrations
    complex_numbers,
    conv,
    elementwise,
    graph,
    index,
    linalg,
    loss,
    mask,
    norm,
    random,
    reduce,
    shape,
)
