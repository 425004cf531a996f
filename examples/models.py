"""The example models, each in every parallel variant, written with the frontend.

The compiler has no model-specific code: a variant is nothing but SBP hints
and placements on an otherwise identical graph.

    dp        data parallel: the batch S(0), parameters B; weight gradients
              come out P and boxing all-reduces them
    tp        tensor parallel (Megatron): the first weight of each MLP and the
              q/k/v projections split by columns S(1) (attention heads split),
              the second MLP weight and the output projection by rows S(0);
              activations B
    2d        a (data x model) mesh: [S(0), B] batch, [B, tp hint] weights
    zero      dp, with the optimizer state split S(0) over the data axis
              (lg-optimizer{zero=true})
    fsdp      dp, with the parameters themselves stored S(0): gathered before
              each use, gradients reduce-scattered
    pipeline  two stages on disjoint rank sets (each data parallel inside),
              the layers split between them, `micro_batches` micro-batches
              per step flowing through them (lg-micro-batch)
    ep        expert parallel (a GPT with `experts`): the batch S(0), the
              experts' weights split by expert S(0), the others B
    ep-dp     a (data x expert) mesh: the batch [S(0), B], the experts
              [B, S(0)]
    ep-tp     a (expert x tensor) mesh: the batch [S(0), B], the experts
              split by expert over the first axis and by their hidden units
              over the second, attention Megatron's over the second
    none      no hints at all: for sbp-autoplan (`sbpc.compile(module,
              plan="auto")`) to choose

`training_module` differentiates the forward graph and appends the optimizer.
"""

from __future__ import annotations

import contextlib
import pathlib

import numpy as np
from xdsl.context import Context

import sbpc
from sbpc import B, S, moe
from sbpc.lowering.lg_autodiff import LgAutodiffPass
from sbpc.lowering.lg_micro_batch import LgMicroBatchPass
from sbpc.lowering.lg_optimizer import LgOptimizerPass

VARIANTS = ("dp", "tp", "2d", "zero", "fsdp", "pipeline")
EXPERT_VARIANTS = ("ep", "ep-dp", "ep-tp")
"""Variants for a GPT with a mixture of experts (`gpt(..., experts=E)`)."""
CORPUS = pathlib.Path(__file__).resolve().parent / "data" / "corpus.txt"


class Layout:
    """Where a variant puts things: placements, and the hints for inputs,
    weights split by columns or rows, replicated weights and activations."""

    def __init__(self, variant: str, ranks: int, device: str = "cpu"):
        if variant not in (*VARIANTS, *EXPERT_VARIANTS, "none"):
            raise ValueError(f"unknown variant {variant!r} (choose {', '.join((*VARIANTS, *EXPERT_VARIANTS))} or "
                             "none)")
        self.variant = variant
        self.stages = [sbpc.placement(device, ranks=ranks)]
        self.zero = False
        self.micro_batches = 1
        self.experts_in = self.experts_out = None  # the experts' weights [E, d, f] and [E, f, d]
        if variant == "none":
            self.batch = self.replicated = self.columns = self.rows = self.vector_split = None
            return
        data = S(0)
        if variant in EXPERT_VARIANTS:
            self._experts(variant, ranks, device)
            return
        if variant == "2d":
            if ranks % 2:
                raise ValueError("the 2d variant needs an even number of ranks (a 2 x ranks/2 mesh)")
            self.stages = [sbpc.placement(device, ranks=ranks, mesh=(2, ranks // 2))]
        elif variant == "pipeline":
            if ranks < 2 or ranks % 2:
                raise ValueError("the pipeline variant needs an even number of ranks (two stages)")
            half = ranks // 2
            self.stages = [sbpc.placement(device, ranks=list(range(half)), name="stage0"),
                           sbpc.placement(device, ranks=list(range(half, ranks)), name="stage1")]
        model = variant in ("tp", "2d")
        if variant == "2d":
            self.batch, self.replicated = [data, B], [B, B]
            self.columns, self.rows = [B, S(1)], [B, S(0)]
            self.vector_split = [B, S(0)]
        elif model:
            self.batch, self.replicated, self.columns, self.rows, self.vector_split = B, B, S(1), S(0), S(0)
        elif variant == "fsdp":
            self.batch, self.replicated = data, S(0)
            self.columns = self.rows = self.vector_split = S(0)
        else:
            self.batch = data
            self.replicated = self.columns = self.rows = self.vector_split = B
        self.zero = variant == "zero"
        self.micro_batches = 1
        self.experts_in = self.experts_out = self.replicated  # a mixture's experts as the other weights

    def _experts(self, variant: str, ranks: int, device: str) -> None:
        if variant == "ep":
            self.batch, self.experts_in = S(0), S(0)
            self.experts_out = S(0)
            self.replicated = self.columns = self.rows = self.vector_split = B
            return
        if ranks % 2:
            raise ValueError(f"the {variant} variant needs an even number of ranks (a 2 x ranks/2 mesh)")
        self.stages = [sbpc.placement(device, ranks=ranks, mesh=(2, ranks // 2))]
        self.batch, self.replicated, self.vector_split = [S(0), B], [B, B], [B, B]
        if variant == "ep-dp":
            self.columns = self.rows = [B, B]
            self.experts_in = self.experts_out = [B, S(0)]
        else:
            self.columns, self.rows = [B, S(1)], [B, S(0)]
            self.experts_in, self.experts_out = [S(0), S(2)], [S(0), S(1)]

    @property
    def placement(self):
        return self.stages[0]

    def stage(self, g: sbpc.Graph, i: int):
        """The scope of stage i (a no-op where there is one placement)."""
        import contextlib

        return g.on(self.stages[i]) if len(self.stages) > 1 else contextlib.nullcontext()

    def activation(self, t):
        """The residual stream between layers: batch-split for FSDP (without
        the hint, inference may prefer moving activations to gathering
        weights on tiny models), replicated over the model axis for tensor
        parallelism (Megatron's layout, so each block ends in one all_reduce
        per sublayer rather than a reduce_scatter the next layer gathers)."""
        if self.variant in ("fsdp", "tp", "2d", "ep-tp"):
            return t.to(self.batch)
        return t


def training_module(g: sbpc.Graph, layout: Layout, algorithm: str = "adam", micro_batches: int = 1,
                    training: bool = True, schedule: str = "gpipe"):
    module = g.module()
    if not training:
        return module
    LgMicroBatchPass(count=micro_batches, schedule=schedule).apply(Context(), module)
    LgAutodiffPass().apply(Context(), module)
    LgOptimizerPass(algorithm=algorithm, zero=layout.zero).apply(Context(), module)
    module.verify()
    return module


# -- MLP ------------------------------------------------------------------------


def mlp(variant: str, ranks: int, batch: int = 64, features: int = 32, hidden: int = 64, classes: int = 8,
        algorithm: str = "adam", micro_batches: int | None = None, training: bool = True, schedule: str = "gpipe",
        dtype: str = "f32"):
    """x -> gelu(x @ w1 + b1) @ w2 -> cross-entropy: a classifier, its
    floats of `dtype`."""
    layout = Layout(variant, ranks)
    if micro_batches is None:
        micro_batches = 4 if variant == "pipeline" else 1
    g = sbpc.Graph("mlp_train", placement=layout.placement)
    x = g.input("x", (batch, features), dtype=dtype, sbp=layout.batch)
    with layout.stage(g, 0):
        w1 = g.param("w1", (features, hidden), init=sbpc.normal(0.0, features ** -0.5), seed=1, dtype=dtype,
                     sbp=layout.columns)
        b1 = g.param("b1", (hidden,), dtype=dtype, sbp=layout.vector_split)
        h = layout.activation(sbpc.gelu(x @ w1 + b1))
    with layout.stage(g, len(layout.stages) - 1):
        if len(layout.stages) > 1:
            h = h.to(layout.batch)
        w2 = g.param("w2", (hidden, classes), init=sbpc.normal(0.0, hidden ** -0.5), seed=2, dtype=dtype,
                     sbp=layout.rows)
        labels = g.input("labels", (batch,), dtype="i64", sbp=layout.batch)
        loss = sbpc.cross_entropy(h @ w2, labels)
    g.output(loss=loss)
    return training_module(g, layout, algorithm, micro_batches, training, schedule)


def mlp_batches(batch: int = 64, features: int = 32, classes: int = 8, seed: int = 0, lr: float = 3e-3,
                dtype=np.float32):
    """Inputs from a normal distribution, labels from a fixed random teacher."""
    rng = np.random.default_rng(seed)
    teacher = rng.normal(size=(features, classes))
    while True:
        x = rng.normal(size=(batch, features)).astype(dtype)
        yield {"x": x, "labels": np.argmax(x @ teacher, axis=1).astype(np.int64), "lr": dtype(lr)}


# -- GPT ------------------------------------------------------------------------


def gpt(variant: str, ranks: int, vocab: int, batch: int = 16, seq: int = 16, dim: int = 32, heads: int = 4,
        layers: int = 2, tied: bool = False, algorithm: str = "adam", micro_batches: int | None = None,
        training: bool = True, schedule: str = "gpipe", dropout: float = 0.0, dtype: str = "f32", device: str = "cpu",
        experts: int = 0, top_k: int = 2, capacity_factor: float | None = None, balance: float = 0.01):
    """Token + position embeddings, `layers` pre-LN blocks of causal multi-head
    attention and a GELU MLP, final layernorm, output head (tied to the token
    embedding or its own), cross-entropy on the next token. `dropout` where
    GPT-2 has it: on the embeddings, the attention probabilities and each
    block's two residual branches. Its floats are of `dtype`; its ranks are
    `device`s (cpu or cuda). With `experts`, each block's MLP is a mixture
    of that many experts (`sbpc.moe.layer`: `top_k` per token, at most
    `capacity_factor` times an even share each), and `balance` times each
    block's load-balancing loss is added to the loss."""
    layout = Layout(variant, ranks, device)
    if variant in EXPERT_VARIANTS and not experts:
        raise ValueError(f"the variant {variant} splits experts: give the GPT some (experts=E)")
    if micro_batches is None:
        micro_batches = 4 if variant == "pipeline" else 1
    if tied and len(layout.stages) > 1:
        raise ValueError("a tied head needs the token embedding on the last stage: use an untied head to pipeline")
    g = sbpc.Graph("gpt", placement=layout.placement)
    tokens = g.input("tokens", (batch, seq), dtype="i64", sbp=layout.batch)
    std = 0.02
    hd = dim // heads
    # a stage boundary after the first half of the blocks
    boundary = layers // 2 if len(layout.stages) > 1 else None
    scope = contextlib.ExitStack()  # the current stage's placement scope
    scope.enter_context(layout.stage(g, 0))
    floats = {"f32": np.float32, "f64": np.float64}[dtype]
    wte = g.param("wte", (vocab, dim), init=sbpc.normal(0.0, std), seed=1, dtype=dtype, sbp=layout.replicated)
    wpe = g.param("wpe", (seq, dim), init=sbpc.normal(0.0, std), seed=2, dtype=dtype, sbp=layout.replicated)
    # causal mask: -1e9 above the diagonal, added to the attention scores
    mask = g.constant(np.triu(np.full((seq, seq), -1e9, floats), k=1))
    h = layout.activation(sbpc.dropout(sbpc.embedding(wte, tokens) + wpe, dropout))
    balance_losses, kept_shares = [], []
    for i in range(layers):
        if i == boundary:
            scope.close()
            scope.enter_context(layout.stage(g, 1))
            h = h.to(layout.batch)
            mask = g.constant(np.triu(np.full((seq, seq), -1e9, floats), k=1))
        p = f"block{i}."

        # called only in this iteration (B023 is a false positive): `p` is this block's prefix
        def param(name, shape, sbp, init=None, seed=0):
            return g.param(p + name, shape, init=init or sbpc.normal(0.0, std), seed=seed, dtype=dtype,  # noqa: B023
                           sbp=sbp)

        def norm(name, x):
            return sbpc.layernorm(x, param(name + ".g", (dim,), layout.replicated, sbpc.ones()),
                                  param(name + ".b", (dim,), layout.replicated, sbpc.zeros()))

        def heads_of(t):
            return t.reshape(batch, seq, heads, hd).transpose(0, 2, 1, 3)

        x = norm("ln1", h)
        q = heads_of(x @ param("wq", (dim, dim), layout.columns, seed=10 * i + 3))
        k = heads_of(x @ param("wk", (dim, dim), layout.columns, seed=10 * i + 4))
        v = heads_of(x @ param("wv", (dim, dim), layout.columns, seed=10 * i + 5))
        scores = sbpc.matmul(q, k, transpose_b=True) * (1.0 / np.sqrt(hd)) + mask
        probs = sbpc.dropout(sbpc.softmax(scores, axis=3), dropout)
        att = sbpc.matmul(probs, v).transpose(0, 2, 1, 3).reshape(batch, seq, dim)
        h = layout.activation(h + sbpc.dropout(att @ param("wo", (dim, dim), layout.rows, seed=10 * i + 6), dropout))
        x = norm("ln2", h)
        if experts:
            mixed, balanced, kept = moe.layer(
                x.reshape(batch * seq, dim), param("router", (dim, experts), layout.replicated, seed=10 * i + 9),
                param("experts_in", (experts, dim, 4 * dim), layout.experts_in, seed=10 * i + 7),
                param("experts_out", (experts, 4 * dim, dim), layout.experts_out, seed=10 * i + 8),
                top_k, capacity_factor)
            h = layout.activation(h + sbpc.dropout(mixed.reshape(batch, seq, dim), dropout))
            balance_losses.append(balanced)
            kept_shares.append(kept)
            continue
        up = sbpc.gelu(x @ param("w1", (dim, 4 * dim), layout.columns, seed=10 * i + 7))
        h = layout.activation(h + sbpc.dropout(up @ param("w2", (4 * dim, dim), layout.rows, seed=10 * i + 8),
                                               dropout))
    if boundary is not None and boundary >= layers:
        raise ValueError("the pipeline variant needs at least 2 layers")
    h = sbpc.layernorm(h, g.param("lnf.g", (dim,), init=sbpc.ones(), dtype=dtype, sbp=layout.replicated),
                       g.param("lnf.b", (dim,), dtype=dtype, sbp=layout.replicated))
    if tied:
        logits = sbpc.matmul(h, wte, transpose_b=True)
    else:
        logits = h @ g.param("head", (dim, vocab), init=sbpc.normal(0.0, std), seed=9, dtype=dtype,
                             sbp=layout.replicated)
    targets = g.input("targets", (batch, seq), dtype="i64", sbp=layout.batch)
    loss = sbpc.cross_entropy(logits, targets)
    for balanced in balance_losses:
        loss = loss + balanced * balance
    scope.close()
    if kept_shares:  # the share of routed tokens the experts' capacity kept, over the blocks
        g.output(loss=loss, kept=sum(kept_shares[1:], kept_shares[0]) * (1.0 / len(kept_shares)))
        return training_module(g, layout, algorithm, micro_batches, training, schedule)
    g.output(loss=loss)
    return training_module(g, layout, algorithm, micro_batches, training, schedule)


def corpus() -> tuple[str, dict[str, int]]:
    text = CORPUS.read_text()
    return text, {c: i for i, c in enumerate(sorted(set(text)))}


def corpus_windows(batch: int, seq: int, seed: int = 0):
    """Random windows of the corpus, as (tokens, the next characters)."""
    text, stoi = corpus()
    data = np.array([stoi[c] for c in text], np.int64)
    rng = np.random.default_rng(seed)
    while True:
        starts = rng.integers(0, len(data) - seq - 1, batch)
        yield np.stack([data[s : s + seq] for s in starts]), np.stack([data[s + 1 : s + seq + 1] for s in starts])


def gpt_batches(batch: int = 16, seq: int = 16, seed: int = 0, lr: float = 3e-3, dtype=np.float32):
    """Random windows of the corpus: tokens and the next characters."""
    for tokens, targets in corpus_windows(batch, seq, seed):
        yield {"tokens": tokens, "targets": targets, "lr": dtype(lr)}


def reference_losses(module, batches, steps: int) -> list[float]:
    """The same training on one device, in the reference interpreter."""
    from sbpc.semantics.reference import evaluate, initial_value

    params = {op.key.data: initial_value(op) for op in module.ops.last.body.ops if op.name == "lg.param"}
    losses = []
    for _ in range(steps):
        out = evaluate(module, next(batches), params)
        params.update({k[4:]: v for k, v in out.items() if k.startswith("new.")})
        losses.append(float(out["loss"]))
    return losses
