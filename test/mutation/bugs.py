"""The planted bugs: each a small change to one file that makes the compiler
wrong, and the `make test` file (or lit file) that must fail on it.

A bug states the text it replaces exactly; run.py refuses a bug whose text is
not found once (the code moved: move the bug with it). `select` narrows a
slow test file to the tests that matter (pytest -k). The bugs marked
WEAKNESS are the ones the suite once let through (issue 57); their tests
were made to catch them.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Bug:
    name: str
    layer: str
    path: str
    before: str
    after: str
    test: str
    select: str | None = None
    timeout: float = 600.0


T = "test/python/"

BUGS = [
    # -- lg: shape rules and gradients --------------------------------------------------------------
    Bug("tanh-gradient-off-by-one", "lg", "dialects/lg/elementwise.py",
        "e.emit(SubOp(e.scalar(1.0, g), e.emit(MulOp(self.result, self.result))))",
        "e.emit(SubOp(e.scalar(2.0, g), e.emit(MulOp(self.result, self.result))))",
        T + "lowering/test_lg_autodiff.py"),
    Bug("softmax-gradient-drops-the-output", "lg", "dialects/lg/norm.py",
        "dot = e.emit(ReduceSumOp(e.emit(MulOp(g, self.result)), [self.axis.value.data], keepdims=True))",
        "dot = e.emit(ReduceSumOp(g, [self.axis.value.data], keepdims=True))",
        T + "lowering/test_lg_autodiff.py"),
    Bug("matmul-batch-axes-of-the-lhs-only", "lg", "dialects/lg/linalg.py",
        "batch = broadcast_shapes(a[:-2], b[:-2])",
        "batch = a[:-2]",
        T + "dialects/test_ops.py"),
    Bug("reduce-keepdims-drops-the-axes", "lg", "dialects/lg/reduce.py",
        "return tuple(1 if i in axes else d for i, d in enumerate(x)), elems[0]",
        "return tuple(d for i, d in enumerate(x) if i not in axes), elems[0]",
        T + "dialects/test_ops.py"),
    # -- SBP rules ---------------------------------------------------------------------------------
    Bug("matmul-split-contraction-gives-broadcast", "sbp-rule", "dialects/lg/linalg.py",  # WEAKNESS
        'sigs.append(((f"S{k_axis}", f"S{kb_axis}"), ("P",)))',
        'sigs.append(((f"S{k_axis}", f"S{kb_axis}"), ("B",)))',
        T + "dialects/test_sbp_rules.py"),
    Bug("grouped-convolution-split-by-output-channels", "sbp-rule", "dialects/lg/conv.py",  # WEAKNESS
        '(1, 0, True, (("B", "S0"), ("S1",))),  # output channels',
        '(1, 0, False, (("B", "S0"), ("S1",))),  # output channels',
        T + "dialects/test_sbp_rules.py"),
    Bug("softmax-split-along-its-axis", "sbp-rule", "dialects/lg/norm.py",
        'sigs = [sig for sig in aligned_splits(in_shapes, out_shape, p) if sig[1][0] != f"S{axis}"]',
        "sigs = list(aligned_splits(in_shapes, out_shape, p))",
        T + "dialects/test_sbp_rules.py"),
    Bug("reduce-split-keeps-its-axis-number", "sbp-rule", "dialects/lg/reduce.py",
        "out_axis = i if keepdims else i - sum(1 for a in axes if a < i)",
        "out_axis = i",
        T + "dialects/test_sbp_rules.py"),
    # -- boxing and the collectives' semantics ---------------------------------------------------
    Bug("partial-sum-keeps-the-first-piece", "boxing", "semantics/sbp_interpreter.py",  # WEAKNESS
        "whole = stack.max(axis=0) if src_kind == Sbp.PMAX else stack.sum(axis=0)",
        "whole = stack.max(axis=0) if src_kind == Sbp.PMAX else stack[0]",
        T + "lowering/test_sbp_insert_boxing.py"),
    Bug("boxing-planner-ignores-the-nesting-of-pieces", "boxing", "planning/boxing_planner.py",
        "if (Sbp.P in nxt and Sbp.PMAX in nxt) or hierarchy_violation(state, nxt, [a]) is not None:",
        "if Sbp.P in nxt and Sbp.PMAX in nxt:",
        T + "lowering/test_sbp_insert_boxing.py"),
    Bug("all-reduce-takes-the-max", "mpi", "runtime/collectives.py",
        "self.op = MPI.MAX if kind == Sbp.PMAX else MPI.SUM",
        "self.op = MPI.MAX",
        T + "runtime/test_mpi_runtime.py"),
    Bug("make-partial-keeps-every-copy", "mpi", "runtime/collectives.py",
        "if not any(here[a] for a in axes if src_nd[a] == Sbp.B):",
        "if True:",
        T + "runtime/test_mpi_runtime.py"),
    # -- the allocator and plan-verify ------------------------------------------------------------
    Bug("first-fit-frees-a-step-early", "memory", "planning/first_fit.py",
        "occupancy.add(buf.start, buf.end, offset, offset + buf.size)",
        "occupancy.add(buf.start, max(buf.start, buf.end - 1), offset, offset + buf.size)",
        T + "planning/test_first_fit.py"),
    Bug("shared-buffer-keeps-its-first-lifetime", "memory", "lowering/plan_allocate_memory.py",
        "buf.start, buf.end = min(buf.start, start), max(buf.end, end)",
        "buf.start, buf.end = min(buf.start, start), buf.end",
        T + "e2e/test_training.py", select="loss_curve"),
    Bug("plan-verify-skips-overlaps", "memory", "lowering/plan_verify.py",
        "if not temporaries_disjoint(temporaries, in_place):",
        "if False:",
        "test/filecheck/passes/plan-verify/errors.mlir"),
    Bug("a-placement-memo-keeps-its-module-alive", "memory", "dialects/sbp.py",
        "remember(_ROOT_PLACEMENTS, (id(root), name), (weakref.ref(root), weakref.ref(found)))",
        "remember(_ROOT_PLACEMENTS, (id(root), name), (weakref.ref(root), weakref.ref(found)))\n"
        "        globals().setdefault(\"_KEPT\", []).append(root)",
        T + "lowering/test_compile_speed.py", select="dropped"),
    # -- the executor's ordering ------------------------------------------------------------------
    Bug("reading-a-receive-in-flight-does-not-wait", "executor", "runtime/executor.py",
        "lo1 < hi2 and lo2 < hi1 and (w1 or w2)",
        "lo1 < hi2 and lo2 < hi1 and (w1 and w2)",
        T + "runtime/test_mpi_runtime.py"),
    Bug("updated-parameters-are-not-written-back", "executor", "runtime/executor.py",
        "self._views[(param, 0)][...] = self.view(new, step)",
        "self._views[(param, 0)][...] = self.view(param, 0)",
        T + "runtime/test_mpi_runtime.py"),
    Bug("a-killed-drivers-folder-stays", "executor", "runtime/pool.py",
        "if orphaned and _ends(job, DRIVER_EXIT_S):",
        "if orphaned and not _ends(job, DRIVER_EXIT_S):",
        T + "runtime/test_faults.py", select="killed_mid_training"),
    Bug("a-zombie-driver-counts-as-alive", "executor", "runtime/launch.py",
        "    if fields[0] in (\"Z\", \"X\"):  # field 3, the state\n        return None\n",
        "",
        T + "runtime/test_faults.py", select="new_pool"),
    # -- checkpoints ------------------------------------------------------------------------------
    Bug("resharding-reads-the-overlap-at-the-loading-pieces-offsets", "checkpoint", "runtime/checkpoint.py",
        "else f.get_slice(tensor)[relative(overlap, saved)])",
        "else f.get_slice(tensor)[relative(overlap, region)])",
        T + "runtime/test_checkpoint.py", select="reshards"),
    Bug("every-rank-writes-its-replicated-pieces", "checkpoint", "runtime/checkpoint.py",
        "    return replica == zlib.crc32(name.encode()) % replicas\n",
        "    return True\n",
        T + "runtime/test_checkpoint.py", select="own_shards"),
    Bug("a-plan-switched-out-of-its-pool-loses-its-state", "checkpoint", "sbpc/api.py",
        "            loaded.params._stash_state(pool)",
        "            pass",
        T + "runtime/test_checkpoint.py", select="reshards"),
    Bug("a-piece-saved-at-the-wrong-offsets-is-loaded", "checkpoint", "runtime/checkpoint.py",
        "        _check_tiling(name, types[name][0], pieces[name], where)\n",
        "",
        T + "runtime/test_checkpoint.py", select="damaged"),
    Bug("a-meta-modules-weights-start-from-initializers", "checkpoint", "sbpc/api.py",
        "        elif exe.weights is not None:\n",
        "        elif exe.weights is None:\n",
        T + "api/test_from_torch_weights.py", select="built_on_meta"),
    # -- the generated kernels ---------------------------------------------------------------------
    Bug("generated-gelu-constant-mistyped", "codegen", "codegen/generators.py",
        "(T)0.044715 * {0} * {0} * {0}",
        "(T)0.04715 * {0} * {0} * {0}",
        T + "codegen/test_generators.py"),
    Bug("generated-exp-polynomial-coefficient-mistyped", "codegen", "codegen/render.py",
        "p = SBPC_FMA(p, r, 4.1665795894e-2f);",
        "p = SBPC_FMA(p, r, 4.1965795894e-2f);",
        T + "codegen/test_generators.py"),
    # -- the optimizers ---------------------------------------------------------------------------
    Bug("adam-second-moment-decayed-by-beta1", "optimizer", "lowering/lg_optimizer.py",
        "e.emit(lg.MulOp(v, e.scalar(self.beta2, v)))",
        "e.emit(lg.MulOp(v, e.scalar(self.beta1, v)))",
        T + "lowering/test_lg_optimizer.py"),
    Bug("adam-without-first-bias-correction", "optimizer", "lowering/lg_optimizer.py",
        "step_size = e.emit(lg.DivOp(scalar_in(lr, f64), correction(self.beta1)))",
        "step_size = scalar_in(lr, f64)",
        T + "lowering/test_lg_optimizer.py"),
    Bug("momentum-dampened", "optimizer", "lowering/lg_optimizer.py",
        "e.emit(lg.MulOp(v, e.scalar(self.momentum, v)))",
        "e.emit(lg.MulOp(v, e.scalar(1 - self.momentum, v)))",
        T + "lowering/test_lg_optimizer.py"),
    Bug("adamw-decays-plain-adam-instead", "optimizer", "lowering/lg_optimizer.py",
        'if self.algorithm == "adamw" and decay:',
        'if self.algorithm == "adam" and decay:',
        T + "lowering/test_lg_optimizer.py"),
    # -- the RNG ----------------------------------------------------------------------------------
    Bug("dropout-mask-ignores-the-step", "rng", "semantics/philox.py",
        "(self.low, self.high, self.stream, step & 0xFFFFFFFF)",
        "(self.low, self.high, self.stream, 0)",
        T + "semantics/test_dropout.py"),
    Bug("philox-with-nine-rounds", "rng", "semantics/philox.py",
        "ROUNDS = 10",
        "ROUNDS = 9",
        T + "semantics/test_dropout.py"),
    Bug("dropout-scales-by-the-rate", "rng", "semantics/philox.py",
        "self.scale = 1.0 / (1.0 - rate)",
        "self.scale = 1.0 / rate",
        T + "semantics/test_dropout.py"),
    # -- micro-batching ---------------------------------------------------------------------------
    Bug("micro-batches-count-capacity-each-on-its-own", "micro-batch", "lowering/lg_micro_batch.py",
        "if isinstance(op, lg.CumsumOp | lg.AxisOp) and op.params()[\"axis\"] == 0:",
        "if isinstance(op, lg.AxisOp) and op.params()[\"axis\"] == 0:",
        T + "api/test_moe.py", select="micro_batches_drop"),
    Bug("uniform-draws-number-each-piece-from-zero", "rng", "runtime/numpy_kernels.py",
        "draws = UniformDraws(local.out_shape, local.out_piece, op.params()[\"stream\"])",
        "draws = UniformDraws(local.out_shape, tuple(slice(0, s.stop - s.start) for s in local.out_piece), "
        "op.params()[\"stream\"])",
        T + "semantics/test_dropout.py"),
    # -- the importer's ATen rules ----------------------------------------------------------------
    Bug("rsub-not-swapped", "importer", "sbpc/torch_import/aten/elementwise.py",
        'RULES["aten.rsub.Scalar"] = RULES["aten.rsub.Tensor"] = _binary(fe.sub, swap=True)',
        'RULES["aten.rsub.Scalar"] = RULES["aten.rsub.Tensor"] = _binary(fe.sub, swap=False)',
        T + "api/test_torch_frontend.py", select="rsub"),
    Bug("select-from-the-end-misses", "importer", "sbpc/torch_import/aten/shape.py",
        "i = index + x.shape[d] if index < 0 else index",
        "i = index + x.shape[d] - 1 if index < 0 else index",
        T + "api/test_torch_frontend.py", select="from_the_end"),
    Bug("sort-puts-nan-last-when-descending", "importer", "semantics/reference.py",
        "keys = (value, nan) if smallest else (-value, ~nan)",
        "keys = (value, nan) if smallest else (-value, nan)",
        T + "api/test_torch_frontend.py", select="ties"),
    Bug("grouped-matmul-ignores-where-the-experts-piece-starts", "lg", "semantics/reference.py",
        "        if expert0 <= g < expert0 + w.shape[0]:\n            weight = w[g - expert0]",
        "        if g < w.shape[0]:\n            weight = w[g]",
        T + "e2e/test_hf_families.py", select="mixtral-expert"),
    Bug("scatter-lets-the-first-of-repeated-indices-win", "lg", "runtime/numpy_kernels.py",
        "        np.put(buffer, at.flat, xs[2])",
        "        np.put(buffer, at.flat.ravel()[::-1].copy(), xs[2].ravel()[::-1].copy())",
        T + "runtime/test_numpy_kernels.py", select="out_kernels"),
    Bug("integer-division-truncates", "importer", "semantics/reference.py",
        "    np.floor_divide(a, b, out=out, where=mask)",
        "    np.floor_divide(np.abs(a), np.abs(b), out=out, where=mask)\n"
        "    np.multiply(out, np.sign(a) * np.sign(b), out=out)",
        T + "api/test_torch_frontend.py", select="integer_division"),
    Bug("expert-capacity-one-slot-too-many", "lg", "sbpc/moe.py",
        'kept = compare("lt", slot, g.constant(np.asarray(slots, dtype=floats)))',
        'kept = compare("le", slot, g.constant(np.asarray(slots, dtype=floats)))',
        T + "api/test_moe.py", select="plainly"),
    Bug("slice-ignores-its-step", "importer", "sbpc/torch_import/aten/shape.py",
        "return _slice_axis(x, d, begin, max(begin, stop), step)",
        "return _slice_axis(x, d, begin, max(begin, stop), 1)",
        T + "api/test_torch_frontend.py", select="from_the_end"),
    Bug("detach-passes-the-gradient", "importer", "sbpc/torch_import/aten/elementwise.py",
        "return fe.stop_gradient(x) if lg.is_float(x.dtype) else x",
        "return x",
        T + "api/test_torch_frontend.py", select="detached"),
    # -- the planner's cost -----------------------------------------------------------------------
    Bug("all-reduce-priced-as-a-reduce-scatter", "cost", "planning/cost_model.py",
        "return 2 * (p - 1) / p, 1  # all_reduce",
        "return (p - 1) / p, 1  # all_reduce",
        T + "lowering/test_sbp_insert_boxing.py"),
    Bug("empty-pieces-priced-as-even-ones", "cost", "planning/cost_model.py",
        "frac /= min(p, shape[axis]) if shape is not None and shape[axis] > 0 else p",
        "frac /= p",
        T + "planning/test_cost_model.py"),
    Bug("issuing-a-collective-costs-its-cores-nothing", "cost", "perf/step_time.py",
        "cost = task.duration + (1.0 - self.overlap) * spec.duration",
        "cost = task.duration",
        T + "perf/test_step_time.py"),
    Bug("autoplan-ignores-the-memory-budget", "cost", "planning/autoplan/candidates.py",  # WEAKNESS
        "return self.priced and self.peak_memory <= budget",
        "return self.priced",
        "test/filecheck/passes/sbp-autoplan/mlp.mlir"),
    Bug("simulated-memory-forgets-the-persistent-region", "cost", "perf/step_time.py",  # WEAKNESS
        "self.memory = (device.arena.value.data if device.arena else 0) + (",
        "self.memory = (device.arena.value.data if device.arena else 0) + 0 * (",
        "test/filecheck/passes/sbp-autoplan/mlp.mlir"),
    Bug("a-layer-profile-drops-what-the-loss-layer-hands-on", "cost", "planning/autoplan/profiler.py",
        "            handed = [mapping[v] for v in layer.outs if v is not self.loss_value]",
        "            handed = []",
        T + "planning/test_autoplan_layers.py", select="hands_on"),
    Bug("the-layer-search-trusts-its-memory-sum", "cost", "lowering/sbp_autoplan.py",
        "                if best.peak_memory > CHECKED_ABOVE * budget:",
        "                if False:",
        T + "planning/test_autoplan_layers.py", select="within_a_budget"),
    Bug("pooling-indices-step-by-the-window-not-the-image", "importer", "sbpc/torch_import/aten/conv.py",
        "        index = index + place * strides[a]",
        "        index = index + place * inner",
        T + "api/test_torch_frontend.py", select="max_pooling_with_indices"),
    Bug("the-embedding-gradients-double-backward-feeds-the-padding-row", "lg", "dialects/lg/index.py",
        "        if self.padding is None:\n            return [looked, None]",
        "        if True:\n            return [looked, None]",
        T + "lowering/test_lg_autodiff.py", select="embedding_grad"),
    Bug("an-embedding-bag-starts-one-index-late", "importer", "sbpc/torch_import/aten/index.py",
        'started = fe.compare("le", fe.reshape(offsets, [1, offsets.shape[0]]), positions)',
        'started = fe.compare("lt", fe.reshape(offsets, [1, offsets.shape[0]]), positions)',
        T + "api/test_core_aten.py", select="_embedding_bag"),
    Bug("grid-sampling-aligns-the-corners-always", "importer", "sbpc/torch_import/aten/conv.py",
        "v = (v + 1.0) * ((size - 1) / 2.0) if align_corners else ((v + 1.0) * size - 1.0) * 0.5",
        "v = (v + 1.0) * ((size - 1) / 2.0)",
        T + "api/test_torch_frontend.py", select="grid_sampling"),
    # -- the weaknesses issue 57 found ------------------------------------------------------------
    Bug("compile-refuses-every-graph", "pipeline", "lowering/compile.py",  # WEAKNESS
        "        passes = self.passes()\n        with collector_paused():",
        "        raise __import__('xdsl.utils.exceptions', fromlist=['_']).PassFailedException(\n"
        "            \"'lg.graph': refused\")\n        with collector_paused():",
        T + "e2e/test_random_training.py"),
    Bug("bfloat16-stored-as-float32", "numerics", "dialects/dtypes.py",  # WEAKNESS
        "return np.dtype(ml_dtypes.bfloat16)",
        "return np.dtype(np.float32)",
        T + "e2e/test_hf_models.py", select="bfloat16"),
    Bug("fsdp-gathers-every-weight-first", "schedule", "planning/list_schedule.py",  # WEAKNESS
        "if has_gathers or has_recomputations:",
        "if has_recomputations:",
        T + "e2e/test_training.py", select="fsdp"),
]
