"""What the driver and every rank know of a plan before anything runs: the
program in a module, its feeds and fetched outputs, the check of a step's
feeds, the plan each rank loads (its own device alone), and the global
values assembled from the ranks' pieces. No MPI here: a driver (`sbpc.compile(...).run`, `sbp-run`)
imports this, and importing mpi4py's MPI would make the driver an MPI
singleton, whose process-manager thread listens on TCP ports that any local
user can reach."""

from __future__ import annotations

import pickle
import warnings
import weakref
from collections.abc import Callable, Collection, Mapping
from io import StringIO
from typing import Any, TypeVar

import numpy as np
from xdsl.dialects.builtin import ModuleOp
from xdsl.printer import Printer

from sbpc.dialects import plan
from sbpc.dialects.dtypes import numpy_dtype
from sbpc.dialects.op_tree import op_tree
from sbpc.dialects.sbp import DTensorType, lookup_placement
from sbpc.semantics.local_eval import assemble

T = TypeVar("T")


class RuntimeFailure(Exception):
    """A failure to report with where it happened."""


class FeedConversionWarning(UserWarning):
    """A feed given as an array of another width than its input's type
    (float64 values for an f32 input, int32 labels for i64) was converted.
    Narrowing rounds the values; widening keeps them, but the data is then
    of less precision than the graph computes in. Python numbers and lists
    take the input's type without a warning."""


def find_program(module: ModuleOp, name: str | None = None) -> plan.ProgramOp:
    programs = plan.programs(module)
    if name is not None:
        programs = [p for p in programs if p.sym_name.data == name]
    if len(programs) != 1:
        raise RuntimeFailure("the module holds no plan.program" if not programs else "name the plan.program to run")
    if plan.REPRESENTATIVES in programs[0].attributes:
        raise RuntimeFailure(f"@{programs[0].sym_name.data} holds one device per equivalence class, for the "
                             "step-time simulator (sbp-to-plan{representatives=true}); compile without it to run")
    return programs[0]


_PROGRAM_IO: weakref.WeakKeyDictionary[plan.ProgramOp, tuple[dict, dict]] = weakref.WeakKeyDictionary()


def _program_io(program: plan.ProgramOp) -> tuple[dict[str, DTensorType], dict[str, tuple]]:
    """The program's feeds (global types) and fetched outputs (global type,
    mesh, numpy dtype), found in one walk of its registers and remembered
    per program: a plan does not change once it runs, and walking every
    register of every device on each step cost the driver of `train_step`
    and every rank about 10 ms of CPU per step on the GPT of
    bench/train_throughput.py (feeds), and rank 0 1.2 of the 1.7 ms a
    train_step spent outside its step (assembling the loss)."""
    known = _PROGRAM_IO.get(program)
    if known is None:
        feeds: dict[str, DTensorType] = {}
        fetches: dict[str, tuple] = {}
        for device in program.devices():
            for reg in device.registers():
                t = reg.value
                if reg.feed is not None:
                    feeds[reg.feed.data] = t
                if reg.fetch is not None:
                    fetches[reg.fetch.data] = (t, lookup_placement(program, t.placement).mesh(),
                                               numpy_dtype(t.element_type))
        known = _PROGRAM_IO[program] = (feeds, fetches)
    return known


def feed_types(program: plan.ProgramOp) -> dict[str, DTensorType]:
    """Every feed the program takes, with its global type."""
    return _program_io(program)[0]


def fetch_layouts(program: plan.ProgramOp) -> dict[str, tuple[DTensorType, Any, np.dtype]]:
    """Each fetched output's global type, mesh and numpy dtype."""
    return _program_io(program)[1]


_CONVERTED: weakref.WeakKeyDictionary[plan.ProgramOp, set[tuple[str, np.dtype]]] = weakref.WeakKeyDictionary()
"""The (feed, dtype) pairs each plan has warned about converting."""


def check_feeds(program: plan.ProgramOp, feeds: Mapping[str, Any]) -> dict[str, np.ndarray]:
    """Feeds with a wrong name, shape or dtype are rejected before anything runs."""
    wanted = feed_types(program)
    unknown = sorted(set(feeds) - set(wanted))
    if unknown:
        raise RuntimeFailure(
            f"feed {unknown[0]!r} is not an input of @{program.sym_name.data} (inputs: {sorted(wanted)})"
        )
    missing = sorted(set(wanted) - set(feeds))
    if missing:
        raise RuntimeFailure(f"feed {missing[0]!r} is missing")
    checked = {}
    for name, t in wanted.items():
        value = np.asarray(feeds[name])
        dtype = numpy_dtype(t.element_type)
        if tuple(value.shape) != tuple(t.get_shape()):
            raise RuntimeFailure(f"feed {name!r}: expected shape {list(t.get_shape())}, got {list(value.shape)}")
        if value.dtype.kind != dtype.kind:
            raise RuntimeFailure(f"feed {name!r}: expected {dtype} values, got {value.dtype}")
        converted = _CONVERTED.setdefault(program, set())
        if value.dtype != dtype and hasattr(feeds[name], "dtype") and (name, value.dtype) not in converted:
            converted.add((name, value.dtype))  # once per plan, feed and dtype, whatever the warning filters
            warnings.warn(f"feed {name!r}: {value.dtype} values converted to {dtype}, the input's type "
                          f"(give {dtype} values to keep them as they are)", FeedConversionWarning, stacklevel=3)
        checked[name] = np.asarray(value, dtype=dtype, order="C")  # keeps 0-d feeds 0-d
    return checked


def rank_plans(module: ModuleOp, ranks: int) -> list[str]:
    """The plan text each of `ranks` ranks loads: the module with only that
    rank's device in its program (none for a rank the plan does not use). A
    rank needs no other device (what crosses ranks is named by ranks and
    placements), and parsing is most of a load: every rank parsing every
    device made a load O(ranks^2) in all (a small GPT on 4 ranks: 2.2 s of
    parsing on each, 4.3 s a load on 2 cores). A rank whose device is
    `like` another gets that one too: it runs that body."""
    return _each_rank(module, ranks, module_text)


def rank_plan_pickles(module: ModuleOp, ranks: int) -> list[bytes]:
    """What `rank_plans` gives, as each rank's pickled op tree
    (dialects/op_tree.py): what the rank pool sends, which its ranks
    rebuild without parsing. A rank unpickles its own alone."""
    return _each_rank(module, ranks, lambda m: pickle.dumps(op_tree(m), protocol=pickle.HIGHEST_PROTOCOL))


def module_text(module: ModuleOp) -> str:
    """The module as IR text, as sbp-opt prints it."""
    stream = StringIO()
    Printer(stream=stream).print_op(module)
    return stream.getvalue()


def _each_rank(module: ModuleOp, ranks: int, show: Callable[[ModuleOp], T]) -> list[T]:
    """`show` of the module with each rank's own device alone in its program
    (and the device it is `like`), for each of `ranks` ranks in turn."""
    program = find_program(module)
    devices = {device.rank.value.data: device for device in program.devices()}
    runs = {rank: device.source() for rank, device in devices.items()}  # read while the devices are in the program
    block = program.body.block
    for device in devices.values():
        device.detach()
    shown_by_rank = []
    try:
        for rank in range(ranks):
            shown = list(dict.fromkeys([runs[rank], devices[rank]])) if rank in devices else []
            for device in shown:
                block.add_op(device)
            shown_by_rank.append(show(module))
            for device in shown:
                device.detach()
    finally:
        for device in sorted(devices.values(), key=lambda d: d.rank.value.data):
            if device.parent is None:
                block.add_op(device)
    return shown_by_rank


def assemble_outputs(program: plan.ProgramOp, gathered: list[tuple[int, dict[str, tuple[Any, np.ndarray]]]],
                     outputs: Collection[str] | None = None) -> dict[str, np.ndarray]:
    """The fetched outputs (those named in `outputs`, when given) as global
    arrays, from each rank's pieces (rank, {name: (index, piece)})."""
    return {
        name: assemble(t, mesh, {rank: got[name][1] for rank, got in gathered if name in got}, dtype)
        for name, (t, mesh, dtype) in fetch_layouts(program).items()
        if outputs is None or name in outputs
    }


def assemble_param(program: plan.ProgramOp, key: str, pieces: list) -> np.ndarray:
    """A parameter's global value from every rank's piece ((type, index,
    piece), or None where a rank holds none)."""
    found = [p for p in pieces if p is not None]
    if not found:
        raise KeyError(f"no parameter {key!r}")
    t = found[0][0]
    mesh = lookup_placement(program, t.placement).mesh()
    held = {rank: got[2] for rank, got in enumerate(pieces) if got is not None}
    return assemble(t, mesh, held, numpy_dtype(t.element_type))
