"""A mixture-of-experts layer written with the frontend's ops: `sbpc.moe.layer`.

Routing, capacity and dropping are ops of the graph like any other, so they
mean what they mean on one device under every plan: a token is dropped
because of the whole logical batch, never because of how the batch is split
(Megatron-Core, DeepSpeed-MoE and torchtitan count capacity per rank, so
which tokens are dropped changes with the data-parallel degree). In SBP
terms (GShard's dispatch written as matmuls):

- the router's probabilities, its top k and their renormalization are
  per-token ops (split with the tokens);
- each routed copy's slot in its expert's buffer is a running count over
  the tokens (`lg.cumsum`, which computes a split axis's running sums from
  every piece before it), so capacity is counted over the whole batch;
- the dispatch into the experts' buffers [E, C, d] contracts the tokens (a
  partial sum where the tokens are split), the experts' weights [E, d, f]
  may be split by experts (S(0): expert parallelism), and the boxing between
  the two is a reduce-scatter, or an all-to-all where the combine reads the
  buffers split by experts from tokens split by rows.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from sbpc.dialects import lg
from sbpc.dialects.dtypes import numpy_dtype
from sbpc.frontend import Tensor, cast, compare, cumsum, gelu, matmul, softmax, topk, where


def capacity(tokens: int, experts: int, top_k: int, capacity_factor: float | None) -> int:
    """Slots per expert: `capacity_factor` times an even share of the routed
    copies (tokens * top_k / experts), rounded up; None: every token fits
    (no token is dropped)."""
    if capacity_factor is None:
        return tokens
    if capacity_factor <= 0:
        raise ValueError(f"capacity_factor must be positive, got {capacity_factor}")
    return max(1, min(tokens, math.ceil(capacity_factor * tokens * top_k / experts)))


def layer(x: Tensor, router: Tensor, w_in: Tensor, w_out: Tensor, top_k: int = 2,
          capacity_factor: float | None = None,
          activation: Callable[[Tensor], Tensor] = gelu) -> tuple[Tensor, Tensor, Tensor]:
    """(output [T, d], load-balancing loss, kept share) of tokens `x` [T, d]
    routed by `router` [d, E] to their `top_k` experts, each expert
    `activation(x @ w_in[e]) @ w_out[e]` ([E, d, f] and [E, f, d]), the
    outputs weighted by the renormalized router probabilities.

    With `capacity_factor`, each expert takes at most `capacity(...)` routed
    copies, in token order (a token's choices in order of preference before
    the next token's); a copy past its expert's capacity is dropped (it adds
    nothing to the output). The load-balancing loss is Switch
    Transformer's: E * sum over experts of (the share of routed copies it
    gets) x (its mean router probability), 1 when the load is even. The kept
    share is the fraction of routed copies not dropped."""
    tokens, dim = x.shape
    experts = router.shape[1]
    if router.shape[0] != dim or w_in.shape[:2] != (experts, dim) or w_out.shape != (experts, w_in.shape[2], dim):
        raise ValueError(f"a mixture of experts of tokens {list(x.shape)}, router {list(router.shape)}, experts "
                         f"{list(w_in.shape)} and {list(w_out.shape)} (want [T, d], [d, E], [E, d, f], [E, f, d])")
    if not 1 <= top_k <= experts:
        raise ValueError(f"top_k {top_k} is not between 1 and the {experts} experts")
    slots = capacity(tokens, experts, top_k, capacity_factor)
    g = x.graph
    elem = x.dtype  # the one-hots and counts in the tokens' float type
    floats = numpy_dtype(elem)
    probs = softmax(x @ router, axis=1)  # [T, E]
    gates, choice = topk(probs, top_k, axis=1)  # [T, k], the most probable first
    gates = gates / gates.sum(axes=(1,), keepdims=True)
    copies = tokens * top_k
    # routed copies in token order, one-hot over the experts: [T*k, E]
    routed = g.add(lg.OneHotOp(choice.reshape(copies).value, experts, elem))
    # the copies before this one that chose its expert: its slot there
    before = cumsum(routed, 0) - routed
    slot = (before * routed).sum(axes=(1,))  # [T*k]
    kept = compare("lt", slot, g.constant(np.asarray(slots, dtype=floats)))
    kept_share = cast(kept, str(x.dtype)).mean()
    where_slot = g.add(lg.OneHotOp(cast(where(kept, slot, g.constant(np.zeros((), floats))), "i64").value, slots,
                                   elem))  # [T*k, C]
    # dispatch [T, E*C]: 1 where a kept copy of token t sits in slot c of expert e
    placed = routed.reshape(copies, experts, 1) * where_slot.reshape(copies, 1, slots) * cast(
        kept, str(x.dtype)).reshape(copies, 1, 1)
    dispatch = placed.reshape(tokens, top_k, experts * slots).sum(axes=(1,))
    combine = (placed * gates.reshape(copies, 1, 1)).reshape(tokens, top_k, experts * slots).sum(axes=(1,))
    buffers = matmul(dispatch, x, transpose_a=True).reshape(experts, slots, dim)  # [E, C, d]
    outputs = matmul(activation(matmul(buffers, w_in)), w_out)  # [E, C, d]
    y = matmul(combine, outputs.reshape(experts * slots, dim))
    share = routed.mean(axes=(0,))  # [E]: the routed copies each expert gets
    balance = (share * probs.mean(axes=(0,))).sum() * float(experts)
    return y, balance, kept_share
