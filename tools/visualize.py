"""Pictures a user can look at, as sbp-opt output targets.

- `-t dot`: Graphviz. An lg/sbp graph draws every op as a node and every
  value as an edge labelled with its distribution; boxing (collectives) is
  highlighted with the bytes it moves. A plan draws one cluster per device:
  compute actors as boxes, communication actors as red ellipses with their
  group, edges through registers (name and bytes), and dashed lines joining
  the members of each collective.
- `-t memory-svg`: for every plan device, its memory map: the schedule runs
  left to right, arena offsets top to bottom, one rectangle per register
  over its lifetime (feeds, fetched outputs, in-place chains and temporaries
  in their own colours), with the arena size and the live-set bound.

    sbp-opt model.mlir -p compile{to_plan=false} -t dot | dot -Tsvg > graph.svg
    sbp-opt model.mlir -p compile -t dot | dot -Tsvg > plan.svg
    sbp-opt model.mlir -p compile -t memory-svg > memory.svg
"""

from __future__ import annotations

import html
from dataclasses import dataclass
from typing import IO, ClassVar

from xdsl.context import Context
from xdsl.dialects.builtin import ModuleOp
from xdsl.ir import Operation
from xdsl.utils.target import Target

from sbpc.dialects import lg, plan, sbp
from sbpc.dialects.sbp import DTensorType, format_nd


def _quote(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def _distribution(t) -> str:
    if isinstance(t, DTensorType):
        return f"{format_nd(t.nd_sbp)} @{t.placement_name}"
    return "x".join(str(d) for d in t.get_shape()) or "scalar"


def graph_dot(graph: lg.GraphOp, out: list[str]) -> None:
    name = graph.sym_name.data
    out.append(f"  subgraph {_quote('cluster_' + name)} {{")
    out.append(f"    label={_quote('@' + name)};")
    ids = {}
    for i, op in enumerate(graph.body.ops):
        node = f"{name}_{i}"
        ids[op] = node
        short = op.name.split(".", 1)[1]
        if isinstance(op, lg.InputOp | lg.ParamOp):
            label, style = f"{short} \"{op.key.data}\"", "shape=box, style=rounded"
        elif isinstance(op, sbp.COLLECTIVE_OPS):
            moved_bytes = getattr(op, "bytes", None)  # what sbp-comm-summary recorded, if it ran
            moved = f"\n{moved_bytes.value.data} B" if moved_bytes is not None else ""
            label, style = f"{short}{moved}", "shape=ellipse, color=red, fontcolor=red, penwidth=2"
        elif isinstance(op, sbp.AnnotateOp):
            label, style = "annotate", "shape=ellipse, style=dashed"
        elif isinstance(op, lg.OutputOp):
            label, style = "output", "shape=box, style=rounded"
        else:
            label, style = short, "shape=box"
        out.append(f"    {node} [label={_quote(label)}, {style}];")
        for operand in op.operands:
            owner = operand.owner
            if isinstance(owner, Operation) and owner in ids:
                boxing = isinstance(op, sbp.COLLECTIVE_OPS)
                color = ", color=red" if boxing else ""
                out.append(f"    {ids[owner]} -> {node} [label={_quote(_distribution(operand.type))}{color}];")
    out.append("  }")


def program_dot(program: plan.ProgramOp, out: list[str]) -> None:
    name = program.sym_name.data
    members: dict[int, list[str]] = {}
    for device in program.devices():
        dev = f"{name}_{device.sym_name.data}"
        out.append(f"  subgraph {_quote('cluster_' + dev)} {{")
        out.append(f"    label={_quote(f'@{device.sym_name.data} (rank {device.rank.value.data})')};")
        producer: dict[str, str] = {}
        registers = {r.sym_name.data: r for r in device.registers()}
        for i, actor in enumerate(device.actors()):
            node = f"{dev}_{i}"
            if isinstance(actor, plan.ComputeOp):
                label = actor.kernel.data.removeprefix("lg.")
                out.append(f"    {node} [label={_quote(label)}, shape=box];")
            else:
                group = ", ".join(str(r) for r in actor.group.get_values())
                label = f"{actor.kind.data} #{actor.comm_id.value.data}\n[{group}]"
                out.append(f"    {node} [label={_quote(label)}, shape=ellipse, color=red, fontcolor=red];")
                members.setdefault(actor.comm_id.value.data, []).append(node)
            for ref in actor.ins.data:
                src = producer.get(ref.string_value())
                reg = registers[ref.string_value()]
                if src is not None:
                    label = f"@{reg.sym_name.data}\n{reg.bytes.value.data} B"
                    out.append(f"    {src} -> {node} [label={_quote(label)}];")
            for ref in actor.outs.data:
                producer[ref.string_value()] = node
        out.append("  }")
    for nodes in members.values():
        for a, b in zip(nodes, nodes[1:]):
            out.append(f"  {a} -> {b} [style=dashed, dir=none, color=red, constraint=false];")


@dataclass(frozen=True)
class DotTarget(Target):
    name: ClassVar[str] = "dot"

    def emit(self, ctx: Context, module: ModuleOp, output: IO[str]) -> None:
        out = ["digraph sbpc {", "  rankdir=TB;", "  node [fontname=Helvetica, fontsize=10];",
               "  edge [fontname=Helvetica, fontsize=9];"]
        for op in module.ops:
            if isinstance(op, lg.GraphOp):
                graph_dot(op, out)
            elif isinstance(op, plan.ProgramOp):
                program_dot(op, out)
        out.append("}")
        output.write("\n".join(out) + "\n")


COLORS = {"feed": "#8ecae6", "fetch": "#ffb703", "in_place": "#b5e48c", "temp": "#d9d9d9"}


def memory_svg(module: ModuleOp) -> str:
    from sbpc.dialects.plan_analysis import lifetimes

    panels = []
    width, left, top, height = 640, 70, 40, 260
    y0 = 10
    for program in plan.programs(module):
        for device in program.devices():
            if device.arena is None:
                continue
            arena = max(device.arena.value.data, 1)
            steps = max(len(device.actors()), 1) + 2  # feeds before, fetches after
            life = lifetimes(device)
            in_place_outs = {
                a.outs.data[0].string_value()
                for a in device.actors()
                if isinstance(a, plan.ComputeOp) and a.in_place is not None
            }
            arena, persistent = device.region_bytes()
            bound = device.live_bound.value.data if device.live_bound else 0
            no_reuse = device.no_reuse.value.data if device.no_reuse else 0
            title = (
                f"@{program.sym_name.data} @{device.sym_name.data}: arena {arena} B, "
                f"live-set bound {bound} B, without reuse {no_reuse} B, persistent {persistent} B"
            )
            parts = [f'<g transform="translate(0,{y0})">',
                     f'<text x="{left}" y="{top - 20}" font-size="13">{html.escape(title)}</text>',
                     f'<rect x="{left}" y="{top}" width="{width}" height="{height}" fill="none" stroke="black"/>',
                     f'<text x="{left - 5}" y="{top + 10}" font-size="10" text-anchor="end">0</text>',
                     f'<text x="{left - 5}" y="{top + height}" font-size="10" text-anchor="end">{arena}</text>']
            for reg in device.registers():
                if reg.is_persistent is not None or reg.offset is None:
                    continue
                start, end = life[reg.sym_name.data]
                x = left + (start + 1) * width / steps
                w = (end - start + 1) * width / steps
                y = top + reg.offset.value.data * height / arena
                h = max(reg.size * height / arena, 1)
                role = ("feed" if reg.feed is not None else "fetch" if reg.fetch is not None
                        else "in_place" if reg.sym_name.data in in_place_outs else "temp")
                parts.append(
                    f'<rect x="{x:.1f}" y="{y:.1f}" width="{w:.1f}" height="{h:.1f}" fill="{COLORS[role]}" '
                    f'stroke="#333"><title>@{html.escape(reg.sym_name.data)}: {reg.size} B at '
                    f'{reg.offset.value.data}, live {start}..{end}</title></rect>'
                )
                if h > 11 and w > 30:
                    parts.append(
                        f'<text x="{x + 3:.1f}" y="{y + 11:.1f}" font-size="9">@{html.escape(reg.sym_name.data)}</text>'
                    )
            parts.append(f'<text x="{left + width / 2}" y="{top + height + 16}" font-size="10" '
                         f'text-anchor="middle">schedule position</text>')
            parts.append("</g>")
            panels.append("\n".join(parts))
            y0 += height + top + 40
    legend = " ".join(
        f'<rect x="{left + 120 * i}" y="{y0}" width="12" height="12" fill="{c}"/>'
        f'<text x="{left + 120 * i + 16}" y="{y0 + 10}" font-size="10">{k}</text>'
        for i, (k, c) in enumerate(COLORS.items())
    )
    total = y0 + 30
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{left + width + 20}" height="{total}" '
            f'font-family="Helvetica">\n' + "\n".join(panels) + "\n" + legend + "\n</svg>\n")


@dataclass(frozen=True)
class MemorySvgTarget(Target):
    name: ClassVar[str] = "memory-svg"

    def emit(self, ctx: Context, module: ModuleOp, output: IO[str]) -> None:
        output.write(memory_svg(module))
