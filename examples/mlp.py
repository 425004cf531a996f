"""Compiles examples/mlp.mlir as far as sbpc goes today and checks it.

1. Parses and verifies the graph and evaluates it with the reference
   interpreter (the semantics every later level keeps); the loss must match a
   hand-written numpy forward pass of the same MLP.
2. Runs sbp-infer, prints the signature it chose for every op, and checks
   each one: every device's local piece, combined by the SBP, must give the
   op's global result.
3. Inserts the boxing and interprets the whole distributed graph device by
   device; its outputs must match the reference.
4. Lowers to the physical plan (actors, registers, memory arenas), prints
   each device's memory, and runs the plan on real per-device arenas.
"""

import pathlib
import sys

import numpy as np
from xdsl.context import Context

import sbpc
from sbpc.dialects import lg, plan
from sbpc.dialects.dtypes import numpy_dtype
from sbpc.dialects.sbp import SIGNATURE_ATTR, format_nd, nd_to_plain
from sbpc.lowering.plan_allocate_memory import PlanAllocateMemoryPass
from sbpc.lowering.plan_verify import PlanVerifyPass
from sbpc.lowering.sbp_comm_summary import summarize
from sbpc.lowering.sbp_infer import SbpInferPass
from sbpc.lowering.sbp_insert_boxing import SbpInsertBoxingPass
from sbpc.lowering.sbp_simplify import SbpSimplifyPass
from sbpc.lowering.sbp_to_plan import SbpToPlanPass
from sbpc.semantics.local_eval import run_distributed
from sbpc.semantics.plan_interpreter import run_plan
from sbpc.semantics.reference import evaluate, initial_value
from sbpc.semantics.sbp_interpreter import evaluate_distributed

HERE = pathlib.Path(__file__).parent


def main() -> int:
    module = sbpc.parse_module((HERE / "mlp.mlir").read_text(), "mlp.mlir")
    graph = next(op for op in module.ops if isinstance(op, lg.GraphOp))
    params = {op.key.data: initial_value(op) for op in graph.body.ops if isinstance(op, lg.ParamOp)}

    rng = np.random.default_rng(0)
    feeds = {"x": rng.normal(size=(32, 64)).astype(np.float32), "labels": rng.integers(0, 10, 32)}
    out = evaluate(module, feeds, params)

    h = feeds["x"] @ params["w1"] + params["b1"]
    a = 0.5 * h * (1 + np.tanh(np.sqrt(2 / np.pi) * (h + 0.044715 * h**3)))
    logits = a @ params["w2"] + params["b2"]
    z = logits - logits.max(axis=1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(axis=1, keepdims=True))
    loss = -logp[np.arange(32), feeds["labels"]].mean()

    print(f"graph @{graph.sym_name.data}: {len(list(graph.body.ops))} ops, {len(params)} parameters")
    print(f"loss (sbpc reference) = {float(out['loss']):.6f}")
    print(f"loss (numpy by hand)  = {loss:.6f}")
    ok = bool(np.isclose(out["loss"], loss, rtol=1e-5) and np.allclose(out["logits"], logits, rtol=1e-4, atol=1e-5))

    SbpInferPass().apply(Context(), module)
    module.verify()
    mesh = next(op for op in module.ops if not isinstance(op, lg.GraphOp)).mesh()
    cost = graph.attributes["sbp.total_cost"].value.data
    print(f"\nsbp-infer on {mesh.size} {mesh.device} devices (cost {cost:.3g} s):")
    trace = {}
    evaluate(module, feeds, params, trace=trace)
    for op in graph.body.ops:
        sig = op.attributes.get(SIGNATURE_ATTR)
        if sig is None:
            continue
        ins = ", ".join(format_nd(nd) for nd in sig.inputs.data)
        line = f"  {op.name:<18} ({ins}) -> ({format_nd(sig.outputs.data[0])})"
        if op.operands:
            expected = trace[op.results[0]]
            got = run_distributed(
                op, [nd_to_plain(nd) for nd in sig.inputs.data], nd_to_plain(sig.outputs.data[0]), mesh.shape,
                [trace[o] for o in op.operands], expected.shape, numpy_dtype(op.results[0].type.element_type), rng,
            )
            good = np.allclose(got, expected, rtol=1e-4, atol=1e-5)
            ok &= good
            line += "   per-device pieces reproduce the global result" if good else "   MISMATCH"
        print(line)

    SbpInsertBoxingPass().apply(Context(), module)
    SbpSimplifyPass().apply(Context(), module)
    module.verify()
    interpreted = evaluate_distributed(module, feeds, params)
    same = all(np.allclose(interpreted.outputs[k], out[k], rtol=1e-4, atol=1e-5) for k in out)
    ok &= same
    comm = ", ".join(f"{n} {kind} ({b} B)" for kind, n, b in summarize(graph)) or "none"
    print(f"\nboxing: {comm}; interpreted on {mesh.size} devices: loss {float(interpreted.outputs['loss']):.6f}"
          f" ({'matches' if same else 'DIFFERS FROM'} the reference)")

    for p in (SbpToPlanPass(), PlanAllocateMemoryPass(), PlanVerifyPass()):
        p.apply(Context(), module)
    program = next(op for op in module.ops if isinstance(op, plan.ProgramOp))
    for device in program.devices():
        print(f"plan @{device.sym_name.data}: {len(device.actors())} actors, arena {device.arena.value.data} B "
              f"(live-set bound {device.live_bound.value.data} B, {device.no_reuse.value.data} B without reuse), "
              f"persistent {device.persistent.value.data} B")
    planned = run_plan(module, feeds, params)
    same = all(np.allclose(planned[k], out[k], rtol=1e-4, atol=1e-5) for k in out)
    ok &= same
    verdict = "matches" if same else "DIFFERS FROM"
    print(f"plan run on real arenas: loss {float(planned['loss']):.6f} ({verdict} the reference)")
    print("\nmatch" if ok else "\nMISMATCH")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
