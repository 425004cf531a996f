"""`sbp-comm-summary`: prints, per graph, how many collectives of each kind
run and the bytes a device receives in them (what sbp-insert-boxing
recorded), to stderr so the IR on stdout stays clean. The IR is unchanged."""

from __future__ import annotations

import sys
from collections import Counter
from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects.builtin import ModuleOp
from xdsl.passes import ModulePass

from sbpc.dialects import lg, sbp


def summarize(graph: lg.GraphOp) -> list[tuple[str, int, int]]:
    """(collective, count, bytes per device) rows, by kind."""
    counts: Counter[str] = Counter()
    volume: Counter[str] = Counter()
    for op in graph.body.ops:
        if isinstance(op, sbp.COLLECTIVE_OPS):
            kind = op.name.removeprefix("sbp.")
            counts[kind] += 1
            volume[kind] += op.bytes.value.data if op.bytes is not None else 0
    return [(kind, counts[kind], volume[kind]) for kind in sorted(counts)]


@dataclass(frozen=True)
class SbpCommSummaryPass(ModulePass):
    name = "sbp-comm-summary"

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        for graph in lg.graphs(op):
            rows = summarize(graph)
            where = f" on @{graph.placement.string_value()}" if graph.placement is not None else ""
            lines = [f"// communication of @{graph.sym_name.data}{where}, bytes a device receives:"]
            lines += [f"//   {kind:<16} {count:>5} {nbytes:>14,}" for kind, count, nbytes in rows]
            total = sum(r[2] for r in rows)
            lines.append(f"//   {'total':<16} {sum(r[1] for r in rows):>5} {total:>14,}")
            print("\n".join(lines), file=sys.stderr)
