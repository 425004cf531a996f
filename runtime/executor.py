"""The actor executor of one rank: runs its device's schedule on real
arenas, with communication on MPI overlapping computation.

Memory: the device's arena is one byte buffer and its persistent region
another; register slot k is a numpy view at offset + k * bytes, so the
memory plan is what runs.

Firing follows the register protocol: an actor fires for step s once its
inputs hold step s (a communication result counts once its MPI requests
complete) and the slot it writes (s mod slots) is free: nothing in flight
still reads or writes those bytes. Actors are issued in schedule order, and
so are communication actors, which makes every rank issue its collectives in
the plan's order; non-blocking MPI lets the next compute actors run while a
collective is in flight, and MPI is given a chance to progress between
kernels. A rank moves on to the next step without waiting for its peers, so
pipeline stages overlap through multi-slot registers.

Every exception is reported with the rank, the actor and its registers.
"""

from __future__ import annotations

import gc
import math
import os
import signal
import sys
import time
from collections.abc import Callable, Collection, Mapping
from typing import Any

import numpy as np
from mpi4py import MPI
from xdsl.dialects.builtin import ModuleOp

from sbpc.dialects import lg, make_context, plan
from sbpc.dialects.dtypes import numpy_dtype
from sbpc.dialects.pieces import piece_of
from sbpc.dialects.sbp import COLLECTIVES, DTensorType, lookup_placement
from sbpc.semantics.plan_interpreter import actor_kernel
from sbpc.semantics.reference import constant_value, initialize

from . import host_kernels, numpy_kernels, progress
from .collectives import CommActor, Pending, Staging
from .program import RuntimeFailure

STREAMS = {"compute": 0, "comm": 1}
"""Trace thread ids: one track per rank and stream."""


WATCHDOG_VARIABLE = "SBPC_WATCHDOG_S"
"""The environment variable with the seconds a rank waits for one collective
before it ends the job (default 600, PyTorch's NCCL default)."""


def watchdog_seconds() -> float:
    value = os.environ.get(WATCHDOG_VARIABLE, "600")
    try:
        seconds = float(value)
    except ValueError:
        seconds = -1.0
    if not seconds > 0:
        raise RuntimeFailure(f"{WATCHDOG_VARIABLE} must be a positive number of seconds, got {value!r}")
    return seconds


def give_way() -> None:
    """Called between polls of a rank waiting for MPI: gives its core to any
    other runnable process, as MPICH's blocking waits do. Where ranks
    outnumber cores (4 ranks on this 2-core machine) a waiting rank that
    never yields takes the core from the rank it waits for: steps ran 2-5x
    slower. With a core per rank the call returns at once."""
    os.sched_yield()


SPIN = 0.002
"""Seconds a waiting rank keeps polling without sleeping: the waits of a
step (a collective, the next stage's activation) and commands that follow
each other (train_step in a loop) mostly end within it and meet no sleep."""
FIRST_NAP = 0.00005
IDLE_SHARE = 0.05
"""After SPIN, a sleep between polls is at most this share of the time
waited so far (FIRST_NAP at least, LONGEST_NAP at most): a wait ends at most
5% later than it would spinning, and a rank that waits for seconds (a stuck
peer under the watchdog, the driver compiling its next plan) wakes 50 times
a second, not at full speed. Spinning through every wait, three ranks
waiting for a stalled fourth took both cores of a 2-core machine (all of
it in sched_yield) from everything else on it; the idle ranks of the test
suite, sleeping 0.5 ms at most, woke 5 million times: about a minute of
CPU."""
LONGEST_NAP = 0.02


class Backoff:
    """The pause between polls of one wait: yields the core while it spins
    (SPIN), then sleeps for growing naps (IDLE_SHARE)."""

    __slots__ = ("start", "nap")

    def __init__(self) -> None:
        self.start = time.perf_counter()
        self.nap = FIRST_NAP

    def pause(self) -> None:
        give_way()
        waited = time.perf_counter() - self.start
        if waited > SPIN:
            time.sleep(self.nap)
            self.nap = min(2 * self.nap, max(FIRST_NAP, min(LONGEST_NAP, IDLE_SHARE * waited)))


def settle_heap() -> None:
    """Puts every object alive now (the parsed plan and the bound kernels:
    hundreds of thousands of xDSL and Python objects, alive for the whole
    run) out of the garbage collector's walks. Otherwise a full collection
    walks them all, in the middle of some step: 45 ms inside one actor of
    the GPT benchmark's step 8 on every rank at once, a step of 30 ms. For
    the rank processes of ours alone: sbp-run's worker, once its plan is
    loaded, and the rank pool, once at its start (its plans come and go:
    see runtime/pool.py)."""
    gc.collect()
    gc.freeze()


def rendezvous(world: MPI.Comm, what: str, pause: Callable[[], None] | None = None) -> None:
    """A barrier under the watchdog: before a blocking exchange outside the
    plan (gathering the outputs), so a rank stuck in its step ends the job
    instead of hanging the others in the exchange. `pause` runs between
    polls (a Backoff's by default; a rank that must not take its core from
    another even while it spins sleeps there)."""
    seconds = watchdog_seconds()
    request = world.Ibarrier()
    deadline = time.monotonic() + seconds
    pause = pause or Backoff().pause
    while not request.Test():
        pause()
        if time.monotonic() > deadline:
            raise RuntimeFailure(f"rank {world.rank}: {what}: not every rank arrived within {seconds:g} s "
                                 f"(watchdog, {WATCHDOG_VARIABLE}): a rank is stuck")


FAULT_VARIABLE = "SBPC_TEST_FAULT"
"""Tests only: `kill:RANK:STEP:ACTOR` (SIGKILL) or `stall:RANK:STEP:ACTOR`
(sleep for ever) on that rank when it reaches the actor of that index in
that step, as a rank that dies or hangs mid-step. STEP -1: when the rank
pool tells the rank to stop (runtime/pool.py), as a rank that hangs at the
end of a job; STEP -2: once the rank has written its checkpoint pieces, as
a rank that dies mid-save."""


def injected_fault(rank: int) -> tuple[str, int, int] | None:
    spec = os.environ.get(FAULT_VARIABLE)
    if not spec:
        return None
    kind, at_rank, step, actor = spec.split(":")
    return (kind, int(step), int(actor)) if int(at_rank) == rank else None


def inject(kind: str) -> None:
    if kind == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    while kind == "stall":
        time.sleep(3600)


def actor_names(executor: Executor) -> list[str]:
    """Each actor of the rank's schedule, as its progress record names it."""
    return [executor.describe(actor) for actor in getattr(executor, "schedule", [])]


class Executor:
    def __init__(self, module: ModuleOp, program: plan.ProgramOp, world: MPI.Intracomm, trace: bool = False,
                 write_back: bool = True):
        self.module = module
        self.program = program
        self.world = world
        self.rank = world.rank
        self.trace_on = trace
        self.events: list[dict] = []
        self.t0 = time.perf_counter()
        devices = {d.rank.value.data: d for d in program.devices()}
        self.device = devices.get(self.rank)
        self.ctx = make_context()
        self._feeds: dict[str, np.ndarray] = {}
        self.steps_run = 0
        """Steps run so far, over every `run`: failures name the step by it."""
        self._step = 0
        self._feed_pieces: list[tuple[str, str, np.dtype, tuple]] | None = None
        self.progress: np.ndarray | None = None
        """This rank's progress record (runtime/progress.py), when the driver keeps one."""
        self.watchdog = watchdog_seconds()
        self._fault = injected_fault(self.rank)
        if self.device is None:
            self.schedule = []
            self.updates: list[tuple[str, str]] = []
            return
        if self.device.arena is None:
            raise RuntimeFailure(f"rank {self.rank}: the plan is not allocated; run plan-allocate-memory")
        arena, persistent = self.device.region_bytes()
        self.arena = self._host_buffer(arena + 1)
        self.persistent = self._host_buffer(persistent + 1)
        self.registers = {r.sym_name.data: r for r in self.device.registers()}
        self._slots = {name: reg.slots.value.data for name, reg in self.registers.items()}
        self._views: dict[tuple[str, int], np.ndarray] = {}
        for name, reg in self.registers.items():
            buffer = self.persistent if reg.is_persistent is not None else self.arena
            dtype = numpy_dtype(reg.type.element_type)
            count = int(np.prod(reg.type.get_shape()))
            for slot in range(reg.slots.value.data):
                offset = reg.byte_offset() + slot * reg.bytes.value.data
                self._views[(name, slot)] = np.frombuffer(buffer, dtype, count, offset).reshape(
                    tuple(reg.type.get_shape())
                )
        self.schedule = self.device.actors()
        self._meshes: dict[str, Any] = {}
        self.kernels = {}
        generated = self._bind_host_kernels()
        for actor in self.schedule:
            if isinstance(actor, plan.ComputeOp):
                self.kernels[actor] = generated.get(actor) or self._bind(actor)
        self._parts = {
            a: p for a in self.kernels if a.kernel.data == "lg.matmul" and (p := self._bind_parts(a)) is not None
        }
        self.staging = Staging()
        self.comm_actors = self._build_comm_actors()
        self.updates = plan.update_pairs(self.device) if write_back else []
        # What each firing needs, read off the IR once (xDSL attribute access
        # costs microseconds, which tiny kernels would feel): per actor, its
        # registers and, for each slot phase, their views and byte ranges.
        self._spans = {name: (1 if reg.is_persistent is not None else 0, reg.byte_offset(), reg.bytes.value.data)
                       for name, reg in self.registers.items()}
        self._firing: list[tuple[Any, bool, list[str], list[str], int, bool]] = []
        for actor in self.schedule:
            ins = [r.string_value() for r in actor.ins.data]
            outs = [r.string_value() for r in actor.outs.data]
            period = math.lcm(1, *(self._slots[n] for n in (*ins, *outs)))
            self._firing.append((actor, isinstance(actor, plan.ComputeOp), ins, outs, period,
                                 plan.does_nothing(actor)))
        self._phase_cache: dict[tuple[int, int], tuple[list[np.ndarray], np.ndarray | None, list, tuple[int, int]]] = {}
        self._hazards: dict[tuple[int, int], dict[tuple[int, int], bool]] = {}
        """Per actor phase, whether it must wait for a collective of each
        issuing phase: the byte ranges of both are fixed, so each pair is
        compared once, not at every firing."""

    # -- backend hooks (the numpy backend's registers are its host views) -------

    def _host_buffer(self, nbytes: int) -> np.ndarray:
        """The bytes behind a region's host views."""
        return np.zeros(nbytes, np.uint8)

    def _host_written(self, name: str, slot: int) -> None:
        """A register slot's host view was written (feed, parameter)."""

    def _host_needed(self, name: str, slot: int) -> None:
        """A register slot's host view is about to be read (fetch)."""

    STAGED = False
    """Whether registers live elsewhere than their host views (a GPU): then
    host work on an actor's registers (a collective, a kernel run on the
    host) reads its inputs through _stage_in and publishes its outputs
    through _stage_out."""

    def _stage_in(self, actor, step: int) -> None:
        """Host work is about to read the actor's input slots for `step`."""

    def _stage_out(self, actor, step: int) -> None:
        """Host work wrote the actor's output slots for `step`."""

    # -- helpers ---------------------------------------------------------------

    def mesh(self, t: DTensorType):
        name = t.placement_name
        if name not in self._meshes:
            self._meshes[name] = lookup_placement(self.program, t.placement).mesh()
        return self._meshes[name]

    def piece_of(self, t: DTensorType):
        return piece_of(t, self.mesh(t), self.rank)

    def view(self, name: str, slot: int) -> np.ndarray:
        return self._views[(name, slot % self._slots[name])]

    def _phase(self, index: int, step: int) -> tuple[list[np.ndarray], np.ndarray | None, list, tuple[int, int]]:
        """Actor `index` at `step`: its input views, its output view, the
        byte ranges it touches and the phase itself ((index, step mod its
        registers' slots), which names it in `_hazards`), computed once per
        slot phase."""
        actor, is_compute, ins, outs, period, _ = self._firing[index]
        key = (index, step % period)
        found = self._phase_cache.get(key)
        if found is None:
            ranges = [(*self._range(n, step), False) for n in ins] + [(*self._range(n, step), True) for n in outs]
            if not is_compute:
                # A collective's own pack and unpack buffers are reused by its
                # next issue, whose registers may be other slots: it waits for
                # this one (a range no other actor has).
                ranges.append((2 + index, 0, 1, True))
            found = ([self.view(n, step) for n in ins], self.view(outs[0], step) if outs else None, ranges, key)
            self._phase_cache[key] = found
        return found

    def _range(self, name: str, step: int) -> tuple[int, int, int]:
        """(buffer, lo, hi) of a register's slot at `step`."""
        buf, offset, nbytes = self._spans[name]
        lo = offset + (step % self._slots[name]) * nbytes
        return buf, lo, lo + nbytes

    def _build_comm_actors(self) -> dict:
        """Group communicators, created in the order of the first collective
        that uses them, which is the same on every member."""
        groups: dict[tuple[int, ...], MPI.Comm] = {}
        actors = {}
        for actor in self.schedule:
            if not isinstance(actor, plan.CommOp):
                continue
            group = tuple(actor.group.get_values())
            kind = actor.kind.data
            comm = None
            if kind in COLLECTIVES and COLLECTIVES[kind].communicates:
                if group not in groups:
                    groups[group] = self.world.Create_group(
                        self.world.group.Incl(list(group)), tag=actor.comm_id.value.data
                    )
                comm = groups[group]
            actors[actor] = CommActor(actor, self.rank, self.mesh, self.view, comm, self.staging)
        self.group_comms = list(groups.values())
        return actors

    def describe(self, actor) -> str:
        ins = ", ".join(f"@{r.string_value()}" for r in actor.ins.data)
        outs = ", ".join(f"@{r.string_value()}" for r in actor.outs.data)
        what = actor.kernel.data if isinstance(actor, plan.ComputeOp) else actor.kind.data
        return f"actor @{actor.sym_name.data} ({what}) reading [{ins}] writing [{outs}]"

    # -- loading -----------------------------------------------------------------

    def initialize(self, params: Mapping[str, np.ndarray] | None = None) -> None:
        """Writes this rank's pieces of every parameter (from `params`, else
        its initializer) and constant."""
        if self.device is None:
            return
        params = params or {}
        for name, reg in self.registers.items():
            shape, dtype = reg.value.get_shape(), numpy_dtype(reg.value.element_type)
            if reg.param is not None:
                value = params.get(reg.param.data)
                if value is None:
                    if reg.init is None:
                        raise RuntimeFailure(f"rank {self.rank}: parameter {reg.param.data!r} has no initializer")
                    value = initialize(reg.init, reg.seed.value.data if reg.seed else 0, reg.param.data, shape, dtype)
            elif reg.constant is not None:
                value = constant_value(reg.constant)
            else:
                continue
            self._write(name, value)

    def set_param(self, key: str, value: np.ndarray) -> None:
        if self.device is None:
            return
        for name, reg in self.registers.items():
            if reg.param is not None and reg.param.data == key:
                self._write(name, value)

    def feed(self, feeds: Mapping[str, np.ndarray]) -> None:
        """Keeps this rank's pieces of the (checked) feeds; every step writes
        them into their registers, whose bytes the memory plan reuses once
        the feed is dead."""
        if self.device is None:
            return
        if self._feed_pieces is None:  # per feed register: its feed, dtype and this rank's piece (found once)
            self._feed_pieces = [(name, reg.feed.data, numpy_dtype(reg.value.element_type), self.piece_of(reg.value))
                                 for name, reg in self.registers.items() if reg.feed is not None]
        self._feeds = {name: np.asarray(feeds[key], dtype)[piece].copy()
                       for name, key, dtype, piece in self._feed_pieces}

    def _write_feeds(self, pending: list[Pending], step: int) -> None:
        for name, piece_ in self._feeds.items():
            self._wait_register(pending, name, step)
            self.view(name, step)[...] = piece_
            self._host_written(name, step % self.registers[name].slots.value.data)

    def _wait_register(self, pending: list[Pending], name: str, step: int) -> None:
        """Completes in-flight communication touching a register's bytes."""
        self._wait_ranges(pending, [(*self._range(name, step), True)])

    def _write(self, name: str, value: np.ndarray) -> None:
        reg = self.registers[name]
        self.write_param_piece(name, np.asarray(value, numpy_dtype(reg.value.element_type))[self.piece_of(reg.value)])

    def write_param_piece(self, name: str, local: np.ndarray) -> None:
        """Writes this rank's piece of a register's value into every slot."""
        for slot in range(self.registers[name].slots.value.data):
            self._views[(name, slot)][...] = local
            self._host_written(name, slot)

    def param_registers(self) -> list[tuple[str, str]]:
        """(parameter key, register name) of every parameter register of this rank."""
        if self.device is None:
            return []
        return [(reg.param.data, name) for name, reg in self.registers.items() if reg.param is not None]

    def held_params(self) -> list[tuple[str, str]]:
        """(parameter key, register name): one register of each parameter
        this rank holds (`param_piece` reads the same one)."""
        first: dict[str, str] = {}
        for key, name in self.param_registers():
            first.setdefault(key, name)
        return list(first.items())

    def param_view(self, name: str) -> np.ndarray:
        """A parameter register's current value on this rank, as a view."""
        self._host_needed(name, 0)
        return self.view(name, 0)

    def param_piece(self, key: str) -> tuple[DTensorType, tuple, np.ndarray] | None:
        if self.device is None:
            return None
        name = dict(self.held_params()).get(key)
        if name is None:
            return None
        t = self.registers[name].value
        return t, self.piece_of(t), self.param_view(name).copy()

    # -- running -------------------------------------------------------------------

    def run(
        self, steps: int = 1, outputs: Collection[str] | None = None
    ) -> dict[str, tuple[DTensorType, tuple, np.ndarray]]:
        """Runs `steps` steps; returns this rank's pieces of the fetched
        outputs (of those named in `outputs`, when given)."""
        pending: list[Pending] = []
        if self.device is not None:
            with np.errstate(all="ignore"):
                for step in range(steps):
                    self._step = self.steps_run + step
                    if self.progress is not None:
                        self.progress[progress.STEP : progress.ACTOR + 1] = (self._step, -1)
                    self._write_feeds(pending, step)
                    self._run_step(pending, step)
                    if self.updates:
                        self._write_back(pending, step)
                while pending:
                    self._complete(pending, pending[0])
        self.steps_run += steps
        fetched = {}
        if self.device is not None:
            for name, reg in self.registers.items():
                if reg.fetch is not None and (outputs is None or reg.fetch.data in outputs):
                    self._host_needed(name, (steps - 1) % reg.slots.value.data)
                    fetched[reg.fetch.data] = (reg.value, self.piece_of(reg.value), self.view(name, steps - 1).copy())
        return fetched

    def _run_step(self, pending: list[Pending], step: int) -> None:
        record, fault = self.progress, self._fault
        for index, (actor, is_compute, *_, nothing) in enumerate(self._firing):
            if record is not None:
                record[progress.ACTOR] = index
            if fault is not None and fault[1:] == (self._step, index):
                inject(fault[0])
            if nothing:  # its output is its input's bytes: whoever reads it waits for them
                continue
            try:
                ins, out, ranges, phase = self._phase(index, step)
                if pending:
                    self._wait_ranges(pending, ranges, phase)
                if is_compute:
                    assert out is not None  # a compute actor writes one register (its kernel is bound to it)
                    self._fire_compute(actor, step, ins, out, pending)
                else:
                    self._issue_comm(pending, actor, step, ranges, phase)
                if pending:
                    self._progress(pending)
            except RuntimeFailure:
                raise
            except Exception as e:  # noqa: BLE001 - reported with its place, then the job ends
                raise RuntimeFailure(
                    f"rank {self.rank}: step {self._step}: {self.describe(actor)}: {type(e).__name__}: {e}"
                ) from e

    def _issue_comm(self, pending: list[Pending], actor: plan.CommOp, step: int, ranges=None,
                    phase: tuple[int, int] | None = None) -> Pending:
        """Issues a collective (the one path of every backend): its input
        slots are staged to the host views first, and once it completes (now,
        or when a hazard or progress retires it) its outputs are staged back."""
        start = time.perf_counter()
        if self.STAGED:
            self._stage_in(actor, step)
        issued = self.comm_actors[actor].issue(step, step)
        if self.STAGED:
            issued.finish = self._staged_finish(actor, step, issued.finish)
        issued.start = start
        issued.ranges = ranges if ranges is not None else self._ranges(actor, step)
        issued.phase = phase
        if issued.requests:
            pending.append(issued)
        else:
            self._retire(issued)
        return issued

    def _staged_finish(self, actor, step: int, finish):
        def staged() -> None:
            if finish:
                finish()
            self._stage_out(actor, step)

        return staged

    def _retire(self, p: Pending) -> None:
        """A collective completed: unpack its results, give its packing
        buffers back and record it."""
        if p.finish:
            p.finish()
        self.staging.give_back(p.staged)
        self._record(p.actor, "comm", p.start, time.perf_counter(), p.moved)

    def _write_back(self, pending: list[Pending], step: int) -> None:
        """After a step, updated parameters and optimizer state replace the
        old ones (lg-optimizer's `new.<key>` outputs), so the next step and
        the next run train on."""
        for new, param in self.updates:
            self._wait_register(pending, new, step)
            self._views[(param, 0)][...] = self.view(new, step)

    def _bind(self, actor: plan.ComputeOp) -> numpy_kernels.Fire:
        """The actor's out= kernel, bound (scratch and all) at load time."""
        op, local = actor_kernel(self.ctx, actor, self.registers, self.piece_of)
        try:
            return numpy_kernels.bind(op, local, [self.view(r.string_value(), 0) for r in actor.ins.data],
                                self.view(actor.outs.data[0].string_value(), 0))
        except Exception as e:  # noqa: BLE001 - reported with its place
            raise RuntimeFailure(f"rank {self.rank}: {self.describe(actor)}: {e}") from None

    def _bind_host_kernels(self) -> dict[plan.ComputeOp, numpy_kernels.Fire]:
        """The actors that run generated C (runtime/host_kernels.py: fused
        chains, elementwise ops, softmax, layernorm), built into one library per device;
        none where SBPC_HOST_KERNELS=0 or no C compiler or cffi is here."""
        if not host_kernels.enabled() or host_kernels.unavailable() is not None:
            return {}
        made = host_kernels.generate([a for a in self.schedule if isinstance(a, plan.ComputeOp)], self.registers,
                                     rank=self.rank)  # a device like another runs that one's actors
        if not made:
            return {}
        try:
            library = host_kernels.Library(list(made.values()))
        except host_kernels.BuildError as e:  # generated C that does not compile: a bug, said loudly
            raise RuntimeFailure(f"rank {self.rank}: {e}") from None
        except OSError as e:  # no room or no permission for the library: numpy's kernels run instead
            print(f"sbpc: rank {self.rank}: generated C kernels unavailable ({e}); running numpy's", file=sys.stderr)
            return {}
        return {actor: library.bind(kernel) for actor, kernel in made.items()}

    def _bind_parts(self, actor: plan.ComputeOp):
        """A long matmul's column blocks (numpy_kernels.bind_parts), when its
        output shares no bytes with an input."""
        ins = [self.view(r.string_value(), 0) for r in actor.ins.data]
        out = self.view(actor.outs.data[0].string_value(), 0)
        if any(np.may_share_memory(x, out) for x in ins):
            return None
        op, _ = actor_kernel(self.ctx, actor, self.registers, self.piece_of)
        return numpy_kernels.bind_parts(op, ins, out)

    def _fire_compute(self, actor: plan.ComputeOp, step: int, ins: list[np.ndarray], out: np.ndarray,
                      pending: list[Pending] | None = None) -> None:
        start = time.perf_counter() if self.trace_on else 0.0
        parts = self._parts.get(actor) if pending else None
        if parts is None:
            self.kernels[actor](ins, out)
        else:  # communication in flight: let MPI progress between blocks
            assert pending is not None  # parts are looked up only while communication is pending
            for _ in parts(ins, out):
                self._progress(pending)
        if self.trace_on:
            self._record(actor, "compute", start, time.perf_counter())

    def _ranges(self, actor, step: int) -> list[tuple[int, int, int, bool]]:
        """Byte ranges an actor touches: (buffer, lo, hi, writes)."""
        return ([(*self._range(ref.string_value(), step), False) for ref in actor.ins.data]
                + [(*self._range(ref.string_value(), step), True) for ref in actor.outs.data])

    def _wait_ranges(self, pending: list[Pending], mine: list[tuple[int, int, int, bool]],
                     phase: tuple[int, int] | None = None) -> None:
        """Completes in-flight communication touching any of these bytes
        where either side writes them. Reading what a send is reading needs
        no wait (MPI-3 lets a send buffer be read while the send is in
        flight): a 1F1B stage reads the activation it sends on, and waiting
        there for the next stage to post its receive deadlocked the
        pipeline. `phase` names the actor phase whose ranges `mine` are:
        its answers are remembered."""
        known = None
        if phase is not None:
            known = self._hazards.get(phase)
            if known is None:
                known = self._hazards[phase] = {}
        for p in list(pending):
            if known is not None and p.phase is not None:
                hit = known.get(p.phase)
                if hit is None:
                    hit = known[p.phase] = _conflict(mine, p.ranges)
            else:
                hit = _conflict(mine, p.ranges)
            if hit:
                self._complete(pending, p)

    def _complete(self, pending: list[Pending], p: Pending) -> None:
        if not MPI.Request.Testall(p.requests):
            # A watchdog, as PyTorch's for NCCL: a peer that is stuck (or a
            # collective no other rank issues) ends the job with this rank's
            # place instead of hanging it. MPI's Waitall polls at full speed;
            # this loop backs off (Backoff) once the wait outlasts SPIN.
            deadline = time.monotonic() + self.watchdog
            backoff = Backoff()
            while not MPI.Request.Testall(p.requests):
                backoff.pause()
                if time.monotonic() > deadline:
                    raise RuntimeFailure(
                        f"rank {self.rank}: step {self._step}: {self.describe(p.actor)}: did not complete in "
                        f"{self.watchdog:g} s (watchdog, {WATCHDOG_VARIABLE}): a rank it waits for is stuck"
                    )
        pending.remove(p)
        self._retire(p)

    def _progress(self, pending: list[Pending]) -> None:
        """Lets MPI progress (any test advances every operation in flight)
        and retires what completed, oldest first. Collectives mostly complete
        in issue order, so testing stops at the first one still running: a
        backward pass with many gradients in flight costs one test per actor
        (one that completed out of order is retired at its next hazard)."""
        while pending and MPI.Request.Testall(pending[0].requests):
            self._retire(pending.pop(0))

    def _record(self, actor, stream: str, start: float, end: float, moved: int | None = None) -> None:
        if not self.trace_on:
            return
        event = {
            "name": actor.sym_name.data,
            "ph": "X",
            "pid": self.rank,
            "tid": STREAMS[stream],
            "ts": (start - self.t0) * 1e6,
            "dur": (end - start) * 1e6,
        }
        if isinstance(actor, plan.CommOp):
            # (grouped rows: what this issue moved, known only at run time)
            event["args"] = {"kind": actor.kind.data,
                             "bytes": moved if moved is not None else actor.bytes.value.data if actor.bytes else 0,
                             "group": list(actor.group.get_values())}
        else:
            event["args"] = {"kernel": actor.kernel.data}
        self.events.append(event)


def _conflict(a: list[tuple[int, int, int, bool]], b: list[tuple[int, int, int, bool]]) -> bool:
    """Whether two lists of (buffer, lo, hi, writes) share a byte that either side writes."""
    return any(b1 == b2 and lo1 < hi2 and lo2 < hi1 and (w1 or w2)
               for b1, lo1, hi1, w1 in a for b2, lo2, hi2, w2 in b)


def is_lg_module(module: ModuleOp) -> bool:
    return bool(lg.graphs(module))
