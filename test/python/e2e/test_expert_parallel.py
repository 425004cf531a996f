"""Expert parallelism on a Hugging Face mixture of experts, as the runtime
runs it: each token's row goes to the rank holding its expert and comes back
by collectives whose counts the router sets at run time (rows grouped by
expert, sbp.GroupedAttr), so they change from step to step as training moves
the router."""

import collections
import json
import subprocess
import sys

import numpy as np
import pytest

import sbpc
from sbpc import S
from sbpc.dialects import plan as plan_dialect

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from test_hf_families import Text, moe, tokens  # noqa: E402


def _grouped_comms(exe) -> dict[str, plan_dialect.CommOp]:
    program = next(op for op in exe.module.ops if isinstance(op, plan_dialect.ProgramOp))
    return {a.sym_name.data: a for d in program.devices() for a in d.actors()
            if isinstance(a, plan_dialect.CommOp) and len(a.ins.data) == 2}


@pytest.mark.full
def test_tokens_reach_their_experts_by_counts_the_router_sets_each_step(tmp_path):
    """Mixtral (tiny, its default grouped experts) expert parallel on 4
    ranks, trained 4 steps on one batch with a rate that moves its router:
    the traced bytes of the grouped collectives change between steps and
    never pass the bound (the whole tensor each rank stores). No collective
    sums or gathers the experts' hidden rows whole between their layers.
    The experts are wide (4096) beside the 32 tokens: with experts as
    narrow as the tokens, gathering the experts to every rank costs fewer
    collectives than routing the tokens, and sbp-infer does that."""
    model = moe("mixtral", expert_width=4096)
    batch = tokens(1)[0]
    graph = sbpc.from_torch(Text(model), batch, sbp={"*experts*": S(0)}, placement=sbpc.placement("cpu", 4))
    exe = sbpc.compile(graph, optimizer=sbpc.optim.AdamW(lr=0.05), mode="interpret")
    grouped = _grouped_comms(exe)
    assert {a.kind.data for a in grouped.values()} >= {"all_to_all", "all_gather"}, grouped
    hidden = {tuple(e.gate_up_proj.shape[1:2]) for e in model.modules() if hasattr(e, "gate_up_proj")}
    program = next(op for op in exe.module.ops if isinstance(op, plan_dialect.ProgramOp))
    summed = [a.sym_name.data for d in program.devices() for a in d.actors() if isinstance(a, plan_dialect.CommOp)
              and a.kind.data == "all_reduce" and tuple(a.source.get_shape()[1:]) in hidden]
    assert not summed, f"the experts' hidden rows are summed whole: {summed}"

    (tmp_path / "plan.mlir").write_text(exe.plan_text)
    params = exe.params
    np.savez(tmp_path / "params.npz", **{k: params[k] for k in params.keys()})  # noqa: SIM118 - no dict
    np.savez(tmp_path / "feeds.npz", input_ids=batch[0].numpy(), labels=batch[1].numpy(), lr=np.float32(0.05))
    trace = tmp_path / "trace.json"
    done = subprocess.run([sys.executable, "-m", "sbpc.tools.sbp_run", str(tmp_path / "plan.mlir"), "-n", "4",
                           "--steps", "4", "--feeds", str(tmp_path / "feeds.npz"), "--params",
                           str(tmp_path / "params.npz"), "--trace", str(trace), "-o", str(tmp_path / "out.npz")],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    moved = collections.defaultdict(list)
    for e in json.loads(trace.read_text())["traceEvents"]:
        if e.get("ph") == "X" and e["name"] in grouped:
            moved[(e["pid"], e["name"])].append(e["args"]["bytes"])
    assert moved and all(len(v) == 4 for v in moved.values()), moved
    changing = [key for key, v in moved.items() if len(set(v)) > 1]
    assert changing, f"no grouped collective moved different bytes in different steps: {dict(moved)}"
    for (_, name), v in moved.items():
        source = grouped[name].source
        bound = source.get_shape()[0] * int(np.prod(source.get_shape()[1:])) * 4
        assert max(v) <= bound, (name, v, bound)
