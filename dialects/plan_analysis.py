"""Analyses of a plan's device schedule that several layers read: the
memory allocator (plan-allocate-memory), plan-verify, the visualizer and
the tests all need when each register is live."""

from __future__ import annotations

from . import plan

Names = tuple[list[list[str]], list[list[str]]]
"""The names of the registers each actor of a schedule writes and reads, by position."""


def register_names(actors: list[plan.ComputeOp | plan.CommOp]) -> Names:
    """What each actor writes and reads, read once from its attributes for
    the analyses and checks that all walk the schedule."""
    return ([[ref.string_value() for ref in actor.outs.data] for actor in actors],
            [[ref.string_value() for ref in actor.ins.data] for actor in actors])


def lifetimes(device: plan.DeviceOp,
              contents: tuple[list[plan.RegisterOp], list[plan.ComputeOp | plan.CommOp]] | None = None,
              names: Names | None = None) -> dict[str, tuple[int, int]]:
    """[first, last] schedule positions of every register (feeds from -1,
    fetched outputs to the end). `contents`: the device's registers and
    actors (`device.contents()`), and `names`: register_names of those
    actors, where the caller has them."""
    registers, actors = device.contents() if contents is None else contents
    end = len(actors)
    writes, reads = register_names(actors) if names is None else names
    span: dict[str, list[int | None]] = {}
    for reg in registers:
        first = -1 if reg.feed is not None else None
        last = end if reg.fetch is not None else None
        span[reg.sym_name.data] = [first, last]
    readers: dict[str, list[int]] = {}
    for pos, (outs, ins) in enumerate(zip(writes, reads)):
        for name in outs:
            s = span[name]
            s[0] = pos if s[0] is None else min(s[0], pos)
        for name in ins:
            s = span[name]
            s[1] = pos if s[1] is None else max(s[1], pos)
            readers.setdefault(name, []).append(pos)
    # Communication is asynchronous: what a collective reads stays in flight
    # until its result is first needed by a kernel (a send with no local
    # result, until the step ends), so its bytes may not be reused before
    # then. A collective that reads another's result (a boxing chain:
    # reduce_scatter, all_reduce, all_gather) does not count: a device that
    # enqueues collectives on streams issues it without waiting.
    done_at: dict[int, int] = {}

    def done(pos: int) -> int:
        """Where the collective at `pos` is known complete: the first
        compute actor that reads its result, through any collectives that
        read it in turn (a device that enqueues them does not wait at
        their issue)."""
        if pos not in done_at:
            first = end
            for name in writes[pos]:
                for r in readers.get(name, ()):
                    first = min(first, done(r) if isinstance(actors[r], plan.CommOp) and r > pos else r)
            done_at[pos] = first
        return done_at[pos]

    for pos, actor in enumerate(actors):
        if isinstance(actor, plan.CommOp):
            finish = done(pos)
            for name in reads[pos]:
                s = span[name]
                s[1] = max(s[1] if s[1] is not None else pos, finish)
    out = {}
    for name, (first, last) in span.items():
        first = -1 if first is None else first
        out[name] = (first, max(first, last if last is not None else first))
    return out


def group_lifetimes(life: dict[str, tuple[int, int]], group: dict[str, str]) -> dict[str, tuple[int, int]]:
    """Each register's lifetime, a view group's member's (`group`: member ->
    the group's first register) being the whole group's: from the first
    member's write to the last read of any member."""
    span: dict[str, tuple[int, int]] = {}
    for name, root in (*group.items(), *((r, r) for r in set(group.values()))):
        start, end = life[name]
        s, e = span.get(root, (start, end))
        span[root] = (min(s, start), max(e, end))
    if not span:
        return life
    return {name: span.get(group.get(name, name), lived) for name, lived in life.items()}


def is_view(group: dict[str, str], name: str) -> bool:
    """`name` is a view in `group` (not its group's first register): its
    reshape does nothing, and the group places its bytes."""
    return group.get(name, name) != name
