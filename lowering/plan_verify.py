"""`plan-verify`: checks a plan beyond what each op's verifier can see.

- every register an actor names exists on its device (also op-local);
- every register has an offset, and lies inside its region (the arena, or
  the persistent region), with the regions' sizes recorded;
- no two registers live at the same time share bytes, except an input and
  the output an in-place actor writes over it, a register that aliases
  another (an in-place parameter update), which is only written once every
  read of the other is done, and the views of one buffer (a reshape in
  place whose input lives on, a slice in place on the run of its input's
  bytes it keeps, the inputs of a concatenation in place on their runs of
  its output's bytes): a view group counts as one register, live
  from its first member's write to the last read of any member, so no
  other register's bytes meet its bytes meanwhile and nothing writes them
  but the first member's producer (an in-place actor only where the whole
  group dies);
- every collective's group is the same ordered list of ranks on each member,
  every member takes part, with the same kind;
- any two devices issue the collectives they share in the same order (so no
  rank waits on a collective another rank has not reached); point-to-point
  transfers are exempt: they match by id, in any order;
- with `memory_budget=N`: every device's arena and persistent region
  together take at most N bytes (the budget a plan was chosen for, checked
  on the plan as compiled rather than on the planner's estimate).

Local shapes against global shape, nd-SBP and mesh place are checked by
plan.register's own verifier. Each violation is a diagnostic that names the
register or actor.
"""

from __future__ import annotations

import bisect
import heapq
import math
from dataclasses import dataclass
from typing import NoReturn, cast

from xdsl.context import Context
from xdsl.dialects.builtin import IntegerAttr, ModuleOp, SymbolRefAttr
from xdsl.passes import ModulePass
from xdsl.utils.exceptions import PassFailedException

from sbpc.dialects import plan
from sbpc.dialects.plan_analysis import group_lifetimes, lifetimes, register_names


def _fail(device: plan.DeviceOp, what: str) -> NoReturn:
    raise PassFailedException(f"'plan.device' @{device.sym_name.data}: {what}")


Contents = tuple[list[plan.RegisterOp], list[plan.ComputeOp | plan.CommOp]]
"""A device's registers and actors (`DeviceOp.contents()`)."""


def verify_memory(device: plan.DeviceOp, contents: Contents | None = None) -> None:
    if device.arena is None or device.persistent is None:
        _fail(device, "memory is not allocated; run plan-allocate-memory")
    regions = {False: device.arena.value.data, True: device.persistent.value.data}
    registers, actors = device.contents() if contents is None else contents
    # (name, offset, size, persistent) of every register, read once, with
    # the registers by name and those that alias another
    facts: list[tuple[str, int, int, bool]] = []
    by_name: dict[str, plan.RegisterOp] = {}
    aliasing: list[tuple[plan.RegisterOp, SymbolRefAttr]] = []
    for reg in registers:
        name = reg.sym_name.data
        by_name[name] = reg
        if reg.alias is not None:
            aliasing.append((reg, reg.alias))
        if reg.offset is None:
            _fail(device, f"register @{name} has no offset")
        offset, size, persistent = reg.offset.value.data, reg.size, reg.is_persistent is not None
        if offset + size > regions[persistent]:
            where = "persistent region" if persistent else "arena"
            _fail(
                device,
                f"register @{name} needs bytes [{offset}, {offset + size}) but the {where} has {regions[persistent]}",
            )
        facts.append((name, offset, size, persistent))
    names = register_names(actors)
    writes, reads = names
    life = lifetimes(device, (registers, actors), names)
    # An in-place actor may share bytes with an input only where its kernel
    # can run in place and the two start at the same offset.
    offsets = {name: offset for name, offset, _, _ in facts}
    sizes = {name: size for name, _, size, _ in facts}
    # The views of one buffer: an in-place reshape's result at its input's
    # offset, with its size, both temporaries (its input may live on).
    # A slice in place is a view of the run of its input's bytes it keeps
    # (plan.slice_view_start), one slot each.
    group: dict[str, str] = {}
    members: dict[str, list[str]] = {}  # each group's first register -> the others
    for pos, actor in enumerate(actors):
        if not (isinstance(actor, plan.ComputeOp) and plan.does_nothing(actor)):
            continue
        if actor.kernel.data == plan.CONCAT_KERNEL:
            _concatenated_views(device, actor, reads[pos], writes[pos][0], by_name, offsets, sizes, group, members)
        else:
            src, out = reads[pos][0], writes[pos][0]
            # it runs nothing: its result must be its input's bytes
            if actor.kernel.data == plan.SLICE_KERNEL:
                run = plan.slice_view_offset(actor, by_name[src])
                if run is None:
                    _fail(device, f"'plan.compute' @{actor.sym_name.data} runs nothing in place, but its slice of "
                                  f"@{src} is not one run of its bytes")
                at = offsets[src] + run
                lies_on = offsets[out] == at and at + sizes[out] <= offsets[src] + sizes[src]
            else:
                lies_on = offsets[out] == offsets[src] and sizes[out] == sizes[src]
            if (not lies_on
                    or by_name[src].slots != by_name[out].slots
                    or (by_name[src].is_persistent is None) != (by_name[out].is_persistent is None)):
                _fail(device, f"'plan.compute' @{actor.sym_name.data} runs nothing in place, but @{out} does not "
                              f"lie on @{src}'s bytes (offset, size, slots and region alike)")
            if by_name[src].is_persistent is None:
                root = group[out] = group.get(src, src)
                members.setdefault(root, []).append(out)
    span = group_lifetimes(life, group)
    in_place: set[tuple[str, str]] = set()
    for pos, actor in enumerate(actors):
        if (isinstance(actor, plan.ComputeOp) and actor.in_place is not None
                and actor.kernel.data in plan.OVERWRITING_KERNELS):
            out = writes[pos][0]
            in_place.update((group.get(name, name), group.get(out, out)) for name in reads[pos]
                            if offsets[name] == offsets[out] and group.get(name, name) != group.get(out, out))
    # (start, end, offset, size, name) of every temporary (a view group: its
    # first member, live for the whole group), swept by start
    temporaries = sorted(
        (*span[name], offset, size, name) for name, offset, size, persistent in facts
        if not persistent and name not in group
    )
    # The sweeps prove a plan sound in O(n log n); only where one finds a
    # suspect pair does the exhaustive pairwise check run, to decide and to
    # name the first offending pair exactly as it always has.
    if not temporaries_disjoint(temporaries, in_place):
        pair = first_shared_bytes(temporaries, in_place)
        if pair is not None:
            (s1, e1, _, _, na), (s2, e2, _, _, nb) = pair
            _fail(
                device,
                f"registers @{min(na, nb)} and @{max(na, nb)} are live together (positions "
                f"{max(s1, s2)}..{min(e1, e2)}) but overlap in the arena",
            )
    aliased = verify_aliases(device, by_name, aliasing, life, actors, writes)
    # An aliasing register has exactly its target's bytes (checked just
    # above), so with every target aliased at most once, leaving the aliasing
    # ones out of the sorted check hides no overlap the pairwise check would
    # report: whatever overlaps one overlaps its target too.
    target_of = dict(aliased)
    skipped = set(target_of) if len(set(target_of.values())) == len(target_of) else set()
    persistent_ranges = sorted((offset, offset + size) for name, offset, size, persistent in facts
                               if persistent and name not in skipped)
    if not _sorted_disjoint(persistent_ranges):
        _check_persistent_pairwise(device, registers, aliased)


def _concatenated_views(device: plan.DeviceOp, actor: plan.ComputeOp, ins: list[str], out: str,
                        by_name: dict[str, plan.RegisterOp], offsets: dict[str, int], sizes: dict[str, int],
                        group: dict[str, str], members: dict[str, list[str]]) -> None:
    """A concatenation in place runs nothing: its inputs are runs of its
    output (joined along its first axis longer than one), each lies on its
    run of the output's bytes (one slot each, all in the arena) and together
    they fill it; the inputs' view groups join the output's."""
    where = f"'plan.compute' @{actor.sym_name.data} runs nothing in place, but"
    axis = cast(IntegerAttr, actor.props.data["axis"]).value.data
    if math.prod(by_name[out].type.get_shape()[:axis]) != 1:
        _fail(device, f"{where} its inputs are no runs of @{out}'s bytes (joined along axis {axis})")
    at = offsets[out]
    for name in ins:
        reg = by_name[name]
        if (offsets[name] != at or reg.slots.value.data != 1 or by_name[out].slots.value.data != 1
                or reg.is_persistent is not None or by_name[out].is_persistent is not None
                or at + sizes[name] > offsets[out] + sizes[out]):
            _fail(device, f"{where} @{name} does not lie on its run of @{out}'s bytes "
                          "(offset, one slot, and the arena)")
        at += sizes[name]
        root = group.get(name, name)
        for member in (root, *members.pop(root, ())):
            group[member] = out
            members.setdefault(out, []).append(member)
    if at != offsets[out] + sizes[out]:
        _fail(device, f"{where} its inputs do not fill @{out}'s bytes")


def first_shared_bytes(temporaries: list[tuple[int, int, int, int, str]],
                       in_place: set[tuple[str, str]]) -> tuple[tuple[int, int, int, int, str], ...] | None:
    """The first two registers live together that share bytes (not an
    in-place pair at the position where its input dies), by checking every
    pair live together: quadratic in the live set. `temporaries` as for
    temporaries_disjoint."""
    for i, (_s1, e1, lo1, n1, na) in enumerate(temporaries):
        for s2, e2, lo2, n2, nb in temporaries[i + 1 :]:
            if s2 > e1:
                break  # sorted by start: nothing later is live with this one
            if lo1 < lo2 + n2 and lo2 < lo1 + n1:
                if ((na, nb) in in_place or (nb, na) in in_place) and e1 == s2:
                    continue  # written over its input where the input dies (as the sweep allows)
                return temporaries[i], (s2, e2, lo2, n2, nb)
    return None


def _check_persistent_pairwise(device: plan.DeviceOp, registers: list[plan.RegisterOp],
                               aliased: set[tuple[str, str]]) -> None:
    """Every pair of persistent registers (quadratic): fails on the first
    that shares bytes, bar a register and the one it aliases."""
    for reg in (r for r in registers if r.is_persistent is not None):
        for other in (r for r in registers if r.is_persistent is not None and r is not reg):
            lo1, lo2 = reg.byte_offset(), other.byte_offset()
            if lo1 < lo2 + other.size and lo2 < lo1 + reg.size and reg.sym_name.data < other.sym_name.data:
                if ((reg.sym_name.data, other.sym_name.data) in aliased
                        or (other.sym_name.data, reg.sym_name.data) in aliased):
                    continue
                _fail(device, f"persistent registers @{reg.sym_name.data} and @{other.sym_name.data} overlap")


def verify_aliases(device: plan.DeviceOp, by_name: dict[str, plan.RegisterOp],
                   aliasing: list[tuple[plan.RegisterOp, SymbolRefAttr]], life,
                   actors: list[plan.ComputeOp | plan.CommOp] | None = None,
                   writes: list[list[str]] | None = None) -> set[tuple[str, str]]:
    """(register, the register whose bytes it takes) pairs, each checked: the
    same bytes, and no read of the old value after the new one is written
    (except by the in-place kernel that writes it). `by_name`: the device's
    registers; `aliasing`: those with an alias, and the alias; `actors`: the
    device's schedule, and `writes`: what each of its actors writes
    (register_names), where the caller has them."""
    if not aliasing:
        return set()
    # the writes of the aliasing registers, by schedule position
    writers: dict[str, list[tuple[int, plan.ComputeOp | plan.CommOp]]] = {r.sym_name.data: [] for r, _ in aliasing}
    if actors is None:
        actors = device.actors()
    for pos, outs in enumerate(register_names(actors)[0] if writes is None else writes):
        for out in outs:
            written = writers.get(out)
            if written is not None:
                written.append((pos, actors[pos]))
    pairs = set()
    for reg, alias in aliasing:
        name, target = reg.sym_name.data, alias.string_value()
        old = by_name.get(target)
        if old is None:
            _fail(device, f"register @{name} aliases @{target}, which is not a register of this device")
        if old.alias is not None or old.type != reg.type or old.slots != reg.slots or old.offset != reg.offset or (
            (old.is_persistent is None) != (reg.is_persistent is None)
        ):
            _fail(device, f"register @{name} aliases @{target} but does not take exactly its bytes (same type, "
                          f"slots, region and offset)")
        for pos, actor in writers.get(name, ()):
            last_read = life[target][1]
            reads_in_place = (
                isinstance(actor, plan.ComputeOp)
                and actor.in_place is not None
                and target in [r.string_value() for r in actor.ins.data]
            )
            if last_read > pos or (last_read == pos and not reads_in_place):
                _fail(device, f"register @{name} aliases @{target} but @{actor.sym_name.data} writes it at "
                              f"position {pos} while @{target} is still read (until position {last_read})")
        pairs.add((name, target))
    return pairs


def _sorted_disjoint(ranges: list[tuple[int, int]]) -> bool:
    """No two of `ranges` (sorted by start) overlap; may answer False for an
    empty range that only touches another (the pairwise check then decides)."""
    reach = -1
    for lo, hi in ranges:
        if lo < reach:
            return False
        reach = max(reach, hi)
    return True


def temporaries_disjoint(temporaries: list[tuple[int, int, int, int, str]], in_place: set[tuple[str, str]]) -> bool:
    """True when no two registers live at the same position share bytes, bar
    an input and the in-place output written over it at the position where
    the input dies. `temporaries` is (start, end, offset, size, name) sorted by
    start, lifetimes inclusive. False means a suspect pair: perhaps a real
    overlap, perhaps one the pairwise check allows (an in-place pair whose
    input lives on), so the caller checks pairwise then.

    A sweep over positions keeps the live registers sorted by offset; they are
    pairwise disjoint, so their ends are sorted too and a new register meets
    only a contiguous run of them, found by bisection. O(n log n) where the
    pairwise check is quadratic in the live set (the whole forward pass's
    activations in a training step)."""
    active: list[tuple[int, int, str, int]] = []  # (lo, hi, name, end) of the live registers, sorted
    dying: list[tuple[int, tuple[int, int, str, int]]] = []  # heap of (end, active entry)
    i, n = 0, len(temporaries)
    while i < n:
        t = temporaries[i][0]
        while dying and dying[0][0] < t:
            _, entry = heapq.heappop(dying)
            del active[bisect.bisect_left(active, entry)]
        born = []  # registers first live at t, checked against each other below
        while i < n and temporaries[i][0] == t:
            _, end, lo, size, name = temporaries[i]
            hi = lo + size
            j = bisect.bisect_left(active, (hi,)) - 1  # the last live register starting below hi
            while j >= 0 and active[j][1] > lo:
                other = active[j][2]
                # allowed only where the other dies here: it leaves `active` before this one enters
                if not ((other, name) in in_place or (name, other) in in_place) or active[j][3] != t:
                    return False
                j -= 1
            born.append((lo, hi, name, end))
            i += 1
        born.sort()
        if not _sorted_disjoint([(lo, hi) for lo, hi, _, _ in born]):
            return False
        while dying and dying[0][0] <= t:
            _, entry = heapq.heappop(dying)
            del active[bisect.bisect_left(active, entry)]
        for lo, hi, name, end in born:
            if end > t:
                entry = (lo, hi, name, end)
                bisect.insort(active, entry)
                heapq.heappush(dying, (end, entry))
    return True


def verify_collectives(program: plan.ProgramOp, contents: dict[plan.DeviceOp, Contents] | None = None) -> None:
    """`contents`: each device's, where the caller has them."""
    devices = {d.rank.value.data: d for d in program.devices()}
    by_id: dict[int, dict[int, plan.CommOp]] = {}
    comms: dict[int, list[plan.CommOp]] = {}  # per rank, its collectives in schedule order
    groups: dict[plan.CommOp, list[int]] = {}  # each collective's rank group, unpacked once
    for rank, device in devices.items():
        actors = device.actors() if contents is None else contents[device][1]
        comms[rank] = [actor for actor in actors if isinstance(actor, plan.CommOp)]
        for actor in comms[rank]:
            by_id.setdefault(actor.comm_id.value.data, {})[rank] = actor
            groups[actor] = list(actor.group.get_values())
    for comm_id, members in sorted(by_id.items()):
        for rank, actor in members.items():
            group = groups[actor]
            for other in group:
                peer = members.get(other)
                if peer is None:
                    raise PassFailedException(
                        f"'plan.comm' @{actor.sym_name.data} (id {comm_id}) on rank {rank}: group member "
                        f"rank {other} has no part in this collective"
                    )
                if groups[peer] != group or peer.kind != actor.kind:
                    raise PassFailedException(
                        f"'plan.comm' @{actor.sym_name.data} (id {comm_id}): rank {rank} sees {actor.kind.data} over "
                        f"{group} but rank {other} sees {peer.kind.data} over {list(peer.group.get_values())}"
                    )
    # Point-to-point transfers match by id (their MPI tag), whatever the
    # order they are posted in: pipeline stages running 1F1B post them in
    # different orders. Collectives must be issued in one order.
    orders = {rank: [a.comm_id.value.data for a in comms[rank] if a.kind.data != "transfer"] for rank in devices}
    ranks = sorted(orders)
    for i, r1 in enumerate(ranks):
        for r2 in ranks[i + 1 :]:
            shared = set(orders[r1]) & set(orders[r2])
            seq1 = [c for c in orders[r1] if c in shared]
            seq2 = [c for c in orders[r2] if c in shared]
            if seq1 != seq2:
                first = next(k for k, (x, y) in enumerate(zip(seq1, seq2)) if x != y)
                raise PassFailedException(
                    f"'plan.program' @{program.sym_name.data}: ranks {r1} and {r2} issue their shared collectives "
                    f"in different orders (rank {r1}: id {seq1[first]}, rank {r2}: id {seq2[first]} at position "
                    f"{first}); this would deadlock"
                )


def verify_memory_budget(program: plan.ProgramOp, budget: int) -> None:
    """Every device's two regions together within `budget` bytes."""
    for device in program.devices():
        if device.arena is None or device.persistent is None:
            _fail(device, "has no memory plan to check against memory_budget (run plan-allocate-memory first)")
        need = sum(device.region_bytes())
        if need > budget:
            _fail(device, f"arena and persistent region take {need} bytes ({device.arena.value.data} + "
                          f"{device.persistent.value.data}), over memory_budget={budget}")


@dataclass(frozen=True)
class PlanVerifyPass(ModulePass):
    name = "plan-verify"

    memory_budget: int | None = None
    """Bytes per device that the arena and persistent region may take together."""

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        op.verify()
        for program in plan.programs(op):
            contents = {device: device.contents() for device in program.devices()}  # one walk of each
            for device, registers_and_actors in contents.items():
                if device.like is None:  # a device like another uses that one's memory, checked there
                    verify_memory(device, registers_and_actors)
            verify_collectives(program, contents)
            if self.memory_budget is not None:
                verify_memory_budget(program, self.memory_budget)
