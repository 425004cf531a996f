"""Compile and run: `sbpc.compile(graph)` returns an Executable.

    exe = sbpc.compile(g)                  # lg -> sbp -> boxing -> plan -> memory
    out = exe.run({"x": x, "labels": y})   # dict of global numpy arrays
    w = exe.params["w"]; exe.params["w"] = w * 0.5

Where it runs:
- from a plain Python process: on real MPI ranks it starts itself with the
  mpich wheel's mpiexec, kept alive across `run` calls (one pool per rank
  count, stopped at exit);
- inside an `mpiexec` launch of the right size: every rank runs its share,
  and every rank gets the gathered outputs;
- `mode="interpret"`: in this process, device by device on real arenas
  (sbpc.semantics.plan_interpreter), for debugging. Never chosen silently.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
import shutil
import tempfile
import weakref
from collections.abc import Collection, Mapping, Sequence
from typing import TYPE_CHECKING, Any, cast

import numpy as np
from xdsl.context import Context
from xdsl.dialects.builtin import ArrayAttr, ModuleOp, StringAttr, SymbolRefAttr
from xdsl.passes import ModulePass, PassPipeline

from sbpc.arguments import checked
from sbpc.dialects import collector_paused, lg, parse_module
from sbpc.dialects.lg_analysis import OPTIMIZER_STATE_KEYS
from sbpc.dialects.plan import ProgramOp, programs
from sbpc.dialects.sbp import AUTOPLAN_ALTERNATIVES_ATTR, AUTOPLAN_ATTR
from sbpc.frontend import Graph, Placement
from sbpc.optim import Optimizer
from sbpc.planning.autoplan.candidates import check_memory_budget
from sbpc.runtime.hosts import Hosts
from sbpc.runtime.pool_client import RankPool

if TYPE_CHECKING:
    from sbpc.runtime.checkpoint import Weights

MODES = ("auto", "mpi", "interpret")

PLANS = ("manual", "auto")
BEFORE_PLANNING = ("lg-micro-batch", "lg-autodiff", "lg-optimizer")
"""Passes that run before sbp-autoplan when a pipeline names them."""


@checked
def compile(  # noqa: A001 - the verb users expect
    graph: Graph | ModuleOp | str,
    placement: Placement | None = None,
    pipeline: str = "compile",
    mode: str = "auto",
    plan: str = "manual",
    cluster: str | os.PathLike = "cpu",
    memory_budget: int | None = None,
    devices: int | None = None,
    optimizer: Optimizer | None = None,
    seed: int | None = None,
    stages: int = 1,
    hosts: str | Sequence[str] | Hosts | None = None,
) -> Executable:
    """Runs the pass pipeline (default: the whole `compile` chain) on a
    frontend graph, a module, or IR text, and returns an Executable.

    `plan="auto"` runs sbp-autoplan first (with the pipeline's lg-micro-batch,
    lg-autodiff and lg-optimizer as its training passes, so that pipeline
    stages and micro-batches are planned too): the stages, the mesh shape
    and every op's distribution, with ZeRO or FSDP where they pay or memory
    needs them, chosen by predicting each plan on `cluster` (a preset, a cluster file)
    within `memory_budget` bytes per device (default: the cluster device's),
    for the placement's ranks or `devices`. `Executable.explain()` shows the
    choice and its alternatives. A hand plan is priced on `cluster` too:
    sbp-infer's remaining choices and the gradient buckets (as
    `pipeline="compile{device=...}"` would price them).

    `optimizer` (`sbpc.optim.SGD`, `Adam`, `AdamW`) makes it a training step:
    lg-autodiff and the optimizer's lg-optimizer run before `pipeline`, and
    its learning rate is fed as `lr` unless a step's feeds give one.

    `stages` cuts a graph without sbp hints into that many pipeline stages
    (as sbp-autoplan cuts them: equal shares of the flops where the fewest
    bytes cross), each on an equal share of the placement's ranks, with
    sbp-infer choosing each stage's distribution; with a pipeline that
    begins with `lg-micro-batch{count=K}` the stages overlap K
    micro-batches. (`plan="auto"` chooses stages itself.)

    `seed` starts the graph's random numbers (dropout; default 0): the
    parameter `rng.seed`, saved in checkpoints with the step count
    `rng.step`, so that a reload resumes the same stream. Every plan of one
    graph draws the same numbers for one seed.

    `hosts` runs the ranks on several machines: `"node0:2,node1:2"` (rank
    0 and 1 on node0, 2 and 3 on node1; without counts, an even share),
    a list of host names, or `sbpc.Hosts.from_file(path)` / `sbpc.Hosts.parse(
    text, launcher=...)`. The first host must be this machine. The plan is
    the same; give a cluster calibrated on those hosts (`sbp-calibrate
    --hosts`) for `plan="auto"` to plan for their network."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    if plan not in PLANS:
        raise ValueError(f"plan must be one of {PLANS}, got {plan!r}")
    check_memory_budget(memory_budget)
    budget = None if memory_budget is None else int(memory_budget)
    placed_on = Hosts.of(hosts)
    if placed_on is not None:
        placed_on.check_driver_host()
    module = _module_of(graph, placement)
    passes = _passes(pipeline, optimizer)
    if stages != 1:
        if plan == "auto" or programs(module):
            raise ValueError("stages= cuts a graph by hand: not with plan='auto' (which chooses stages) "
                             "or a compiled plan")
        from sbpc.planning.autoplan.stages import place_stages

        place_stages(module, stages)
    autoplan: dict[str, Any] = {}
    with collector_paused():  # graph passes, the planner's search and compile make and drop IR by the thousand
        if programs(module):
            if plan == "auto":
                raise ValueError("plan='auto' needs a graph, not a compiled plan")
        else:
            if plan == "auto":
                passes, autoplan = _plan_automatically(module, passes, str(cluster), devices or 0, budget)
            else:
                passes = _priced_on(passes, str(cluster))
            PassPipeline(tuple(passes)).apply(Context(), module)
        module.verify()
    if budget is not None and programs(module):
        _check_budget(programs(module)[0], budget)
    exe = Executable(module, mode, placed_on)
    exe.autoplan = autoplan
    _fill_in(exe, graph, optimizer, seed)
    return exe


def _module_of(graph: Graph | ModuleOp | str, placement: Placement | None) -> ModuleOp:
    """The module to compile: a frontend graph's own module, or a copy of
    the module or of the parsed text (the caller's is left as it is); a
    graph that names no placement goes on `placement`."""
    if isinstance(graph, Graph):
        if placement is not None and graph.placement is None:
            graph.placement = placement
            graph.use(placement)
            graph.builder.placement = placement.name
        return graph.module()
    module = parse_module(graph) if isinstance(graph, str) else graph.clone()
    if placement is not None:
        for g in module.ops:
            if isinstance(g, lg.GraphOp) and g.placement is None:
                g.placement = SymbolRefAttr(placement.name)
                first = module.body.block.first_op
                assert first is not None  # `g` is in this block
                module.body.block.insert_op_before(placement.op(), first)
    return module


def _passes(pipeline: str, optimizer: Optimizer | None) -> list[ModulePass]:
    """The pipeline's passes, parsed once, with the optimizer's lg-autodiff
    and lg-optimizer first (after a leading lg-micro-batch: micro-batches
    are cut before autodiff)."""
    from sbpc.lowering import PASSES

    passes = list(PassPipeline.parse_spec(PASSES, pipeline).passes)
    if optimizer is None:
        return passes
    if any(p.name in ("lg-autodiff", "lg-optimizer") for p in passes):
        raise ValueError("pass either optimizer= or a pipeline with lg-autodiff and lg-optimizer, not both")
    lead = next((i for i, p in enumerate(passes) if p.name != "lg-micro-batch"), len(passes))
    return [*passes[:lead], *optimizer.passes(), *passes[lead:]]


def _priced_on(passes: list[ModulePass], cluster: str) -> list[ModulePass]:
    """A hand plan's passes with `compile`'s pricing (sbp-infer's choices,
    the gradient buckets) on `cluster`, where the pipeline names no cluster
    of its own; both naming different ones is an error."""
    from sbpc.lowering.compile import CompilePass
    from sbpc.planning.cost_model import DEFAULT_DEVICE

    out = []
    for p in passes:
        if isinstance(p, CompilePass) and cluster != DEFAULT_DEVICE:
            if p.device not in (DEFAULT_DEVICE, cluster):
                raise ValueError(f"cluster={cluster!r} and the pipeline's compile{{device={p.device}}} name "
                                 "different clusters: give one")
            p = dataclasses.replace(p, device=cluster)
        out.append(p)
    return out


def _plan_automatically(module: ModuleOp, passes: list[ModulePass], cluster: str, devices: int,
                        memory_budget: int | None) -> tuple[list[ModulePass], dict[str, Any]]:
    """Runs sbp-autoplan on `module`, handing it the pipeline's training
    passes (micro-batching, autodiff, the optimizer): it runs them inside,
    once per layout, since stages and micro-batches are cut before autodiff.
    Returns the passes left to run and what the planner chose."""
    from sbpc.lowering.sbp_autoplan import SbpAutoplanPass

    at = max((i + 1 for i, p in enumerate(passes) if p.name in BEFORE_PLANNING), default=0)
    planner = SbpAutoplanPass(cluster=cluster, devices=devices, memory_budget=memory_budget, explain=True)
    planner.plan(module, passes[:at])
    chosen = next(iter(lg.graphs(module)))
    described = cast(StringAttr, chosen.attributes[AUTOPLAN_ATTR])
    alternatives = cast("ArrayAttr[StringAttr]", chosen.attributes[AUTOPLAN_ALTERNATIVES_ATTR])
    return passes[at:], {"cluster": cluster, "chosen": described.data,
                         "alternatives": [a.data for a in alternatives.data]}


def _fill_in(exe: Executable, graph: Graph | ModuleOp | str, optimizer: Optimizer | None, seed: int | None) -> None:
    """What the compiled plan does not say and the caller gave: the frontend
    graph's initial values, state names and buffers, the optimizer's
    learning rate as the default `lr` feed, the random seed."""
    keys = set(exe.param_keys())
    orphans = [n for n in exe.output_names if n.startswith("new.") and n.removeprefix("new.") not in keys]
    if orphans:
        raise ValueError(f"output {orphans[0]!r} is the update of parameter {orphans[0].removeprefix('new.')!r}, "
                         f"which the graph does not have (parameters: {sorted(keys)}); name it otherwise")
    if isinstance(graph, Graph):
        exe.initial_values = dict(graph.initial_values)
        exe.state_names = dict(graph.state_names)
        exe.buffers = dict(graph.buffers)
        exe.weights = graph.weights
    if optimizer is not None:
        from sbpc.dialects.dtypes import numpy_dtype
        from sbpc.runtime.program import feed_types

        lr = feed_types(exe.program).get("lr")
        exe.default_feeds["lr"] = np.asarray(optimizer.lr, dtype=numpy_dtype(lr.element_type) if lr else np.float32)
    if seed is not None:
        from sbpc.frontend import RANDOM_SEED

        if RANDOM_SEED in exe.param_keys():
            exe.initial_values[RANDOM_SEED] = np.asarray(seed, np.int64)


def _check_budget(program: ProgramOp, budget: int) -> None:
    """A compiled plan over `memory_budget` on some device is an error that
    says what it needs (a hand plan; plan='auto' chooses within the budget)."""
    from sbpc.planning.autoplan.candidates import gib

    need = {d.rank.value.data: sum(d.region_bytes()) for d in program.devices()
            if d.arena is not None and d.persistent is not None}
    rank = max(need, key=need.__getitem__, default=None)
    if rank is not None and need[rank] > budget:
        raise ValueError(
            f"the plan needs {gib(need[rank])} on rank {rank} ({need[rank]} bytes: arena and persistent region), over "
            f"memory_budget={budget} ({gib(budget)}); plan='auto' searches for a plan within it (ZeRO, FSDP, "
            "recomputation, pipeline stages)")


class Executable:
    def __init__(self, module: ModuleOp, mode: str, hosts: Hosts | None = None):
        from sbpc.runtime.program import find_program

        self.module = module
        self.program = find_program(module)
        self.ranks = max(d.rank.value.data for d in self.program.devices()) + 1
        self.mode = mode
        self.hosts = hosts
        """Where a rank pool runs the ranks (None: this machine)."""
        if hosts is not None:
            hosts.ranks_per_host(self.ranks)  # a list that cannot place the ranks is said now
        self._local = None  # (executor, world) inside mpiexec
        self._sim_params: dict[str, np.ndarray] = {}
        self.autoplan: dict[str, Any] = {}
        """What sbp-autoplan chose (`compile(plan="auto")`): cluster, chosen, alternatives."""
        self.initial_values: dict[str, np.ndarray] = {}
        """Parameters' values at load, instead of their initializers (the graph's)."""
        self.state_names: dict[str, str] = {}
        """`state_dict()` names -> parameter keys (the graph's; empty: the keys themselves)."""
        self.buffers: dict[str, np.ndarray] = {}
        self.default_feeds: dict[str, np.ndarray] = {}
        """Feeds a step gets unless the caller gives them (the optimizer's `lr`)."""
        self.weights: Weights | None = None
        """Where the parameters' starting values are read from, piece by
        piece by each rank (`from_torch(weights=)`), instead of initializers."""
        self._ranks_ahead = False
        """Whether its pool's ranks hold state (trained parameters, optimizer
        state, the RNG's step) that loading the plan again would lose."""
        self._weights_read = False
        self._stash: tuple[RankPool, str] | None = None
        """Where that state waits (a checkpoint in the pool's job folder)
        while the pool runs another plan."""

    @property
    def params(self) -> Params:
        """The parameters (optimizer state included) as global arrays, to
        read and write. Made per use, not kept: a Params kept on the
        executable would make a reference cycle, keeping a dropped plan
        alive until the collector ran, and its pool would keep that plan's
        state (stashing it, as for a live plan) when it loads another."""
        return Params(self)

    def explain(self, cluster: Any = None) -> str:
        """What sbp-autoplan chose and the alternatives it predicted (fastest
        first, or why each was rejected), then this plan's predicted step on
        the cluster it planned for (or `cluster`)."""
        lines = []
        if self.autoplan:
            lines.append(f"sbp-autoplan chose {self.autoplan['chosen']}")
            lines.append("alternatives, fastest first:")
            lines += [f"  {a}" for a in self.autoplan["alternatives"]]
        else:
            lines.append("planned by hand (compile without plan='auto')")
        lines.append(self.predict(cluster or self.autoplan.get("cluster", "cpu"), devices=self.ranks).format())
        return "\n".join(lines)

    def predict(self, cluster="cpu", devices: int | None = None, steps: int = 4):
        """The step time, per-device breakdown, peak memory and critical path
        this plan would have on `cluster` (a preset name, a cluster file or a
        `sbpc.perf.cluster.Cluster`), from the step-time simulator; nothing runs."""
        from sbpc.perf.cluster import load_cluster
        from sbpc.perf.step_time import simulate_plan

        return simulate_plan(self.module, load_cluster(cluster, devices), steps=steps)

    # -- where to run ------------------------------------------------------------

    @functools.cached_property
    def plan_text(self) -> str:
        """The plan as IR text (printed on first use: a sixth of a compile)."""
        from sbpc.runtime.program import module_text

        return module_text(self.module)

    @functools.cached_property
    def rank_plan_pickles(self) -> list[bytes]:
        """What each rank of a pool loads: its own device alone, as a
        pickled op tree (runtime.program.rank_plan_pickles)."""
        from sbpc.runtime.program import rank_plan_pickles

        return rank_plan_pickles(self.module, self.ranks)

    def _where(self) -> str:
        if self.mode == "interpret":
            return "interpret"
        size = int(os.environ.get("PMI_SIZE", os.environ.get("OMPI_COMM_WORLD_SIZE", "1")))
        if size > 1 or "PMI_RANK" in os.environ:
            if size < self.ranks:
                raise RuntimeError(f"this plan needs {self.ranks} ranks but the mpiexec launch has {size}")
            return "inside"
        return "pool"

    def run(self, feeds: Mapping[str, Any], steps: int = 1,
            outputs: Collection[str] | None = None) -> dict[str, np.ndarray]:
        """Runs `steps` steps on the same feeds; returns the outputs of the
        last (only those named in `outputs`, when given: the others are not
        gathered from the ranks). A training graph (lg-optimizer) updates
        its parameters and optimizer state in place after every step."""
        from sbpc.runtime.program import check_feeds

        if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
            raise ValueError(f"steps must be a positive integer, got {steps!r}")
        feeds = check_feeds(self.program, {**self.default_feeds, **feeds})
        where = self._where()
        if where == "interpret":
            from sbpc.runtime.program import RuntimeFailure
            from sbpc.semantics.plan_interpreter import run_plan
            from sbpc.semantics.reference import EvaluationError

            self._read_weights()
            for step in range(steps):  # each step's updates (`new.<key>`) written back, as the ranks do
                try:
                    everything = run_plan(self.module, feeds, {**self.initial_values, **self._sim_params})
                except EvaluationError as e:  # what the ranks report for the same input, alike
                    raise RuntimeFailure(f"step {step}: {e}") from e
                for name, value in everything.items():
                    if name.startswith("new."):
                        self.params[name.removeprefix("new.")] = value
            return {k: v for k, v in everything.items() if outputs is None or k in outputs}
        if outputs is not None:
            outputs = sorted(outputs)
        if where == "inside":
            return self._run_inside(feeds, steps, outputs)
        pool = RankPool.get(self.ranks, self.hosts)
        self.params.ensure_loaded(pool)
        from sbpc.runtime.program import assemble_outputs

        self._ranks_ahead |= self._updates_state
        pieces = pool.request("run", pool.feeds.put(feeds), steps, outputs)
        return assemble_outputs(self.program, pieces, outputs)

    def _read_weights(self) -> None:
        """The interpreter's parameters from `weights`, read once, whole."""
        if self.weights is None or self._weights_read:
            return
        self._weights_read = True
        for key, value in self._read_whole(self.weights.folder, self.weights.pieces, self.weights.tensors):
            self._sim_params.setdefault(key, value)  # (a value set or loaded before the first run stays)

    def _read_whole(self, folder: str, pieces, tensors=None):
        """(key, global value) of each array of `pieces`, read whole: the
        interpreter's parameters, from a checkpoint or a model's weights."""
        from sbpc.runtime.checkpoint import read_pieces, whole

        types = self._param_types()
        wanted = [(key, whole(types[key][0]), types[key][1]) for key in pieces]
        return read_pieces(folder, pieces, wanted, tensors)

    @functools.cached_property
    def _updates_state(self) -> bool:
        """Whether a step changes the parameters (a training graph's updates)."""
        return any(name.startswith("new.") for name in self.output_names)

    def _run_inside(self, feeds, steps, outputs=None):
        from mpi4py import MPI

        from sbpc.runtime.cuda_backend import make_executor
        from sbpc.runtime.worker import gather_outputs

        world = MPI.COMM_WORLD
        if self._local is None:
            from sbpc.runtime.rank_auth import authenticate_messages

            authenticate_messages(world)  # the user's own launch: refused across hosts without SBPC_JOB_SECRET
            executor = make_executor(self.module, self.program, world)
            executor.initialize(self.initial_values or None)
            self._local = executor
        self._local.feed(feeds)
        gathered = gather_outputs(world, self.program, self._local.run(steps, outputs), outputs)
        return world.bcast(gathered, root=0)

    def train_step(self, feeds: Mapping[str, Any], outputs: Collection[str] | None = None) -> dict[str, np.ndarray]:
        """Runs one step and writes every `new.<name>` output (updated
        parameters and optimizer state, from lg-optimizer) back into the
        parameter `<name>`; returns the other outputs, or only those named
        in `outputs` (the rest are not gathered from the ranks: a language
        model's logits beside its loss)."""
        returned = [name for name in self.output_names if not name.startswith("new.")]
        unknown = sorted(set(outputs or ()) - set(returned))
        if unknown:
            raise ValueError(f"no output named {unknown[0]!r} (outputs: {', '.join(returned)})")
        # On MPI ranks each rank wrote its pieces back in place where the update
        # has its parameter's distribution (sbp-infer ties them), and those are
        # not gathered at all; the rest goes back as global arrays. The
        # interpreter writes every update back itself.
        if self._where() == "interpret":
            out = self.run(feeds, outputs=[n for n in returned if outputs is None or n in outputs])
            return out
        in_place = self._in_place_updates
        out = self.run(feeds, outputs=[name for name in self.output_names if name not in in_place and (
            name.startswith("new.") or outputs is None or name in outputs)])
        for name, value in out.items():
            if name.startswith("new.") and name not in in_place:
                self.params[name.removeprefix("new.")] = value
        return {k: v for k, v in out.items() if not k.startswith("new.")}

    @functools.cached_property
    def _in_place_updates(self) -> set[str]:
        names = set()
        for device in self.program.devices():
            params = {r.param.data: r.value for r in device.registers() if r.param is not None}
            for r in device.registers():
                if (r.fetch is not None and r.fetch.data.startswith("new.")
                        and params.get(r.fetch.data.removeprefix("new.")) == r.value):
                    names.add(r.fetch.data)
        return names

    def save(self, path: str | os.PathLike) -> None:
        """Writes every parameter, the optimizer's state and the RNG's seed
        and step. To a directory: a sharded checkpoint, each rank writing
        its own pieces in parallel (nothing is gathered), that any plan of
        the same graph loads bit for bit (runtime/checkpoint.py). To a path
        ending in `.npz`: global arrays in one file, for small models. Both
        are atomic: a crash, or a rank killed, mid-save leaves the previous
        checkpoint whole."""
        path = os.fspath(path)
        if path.endswith(".npz"):
            self._save_npz(path)
            return
        from sbpc.runtime import checkpoint

        where = self._where()
        if where == "inside":
            raise NotImplementedError("saving inside an mpiexec launch: run the plan on a rank pool (outside mpiexec)")
        with checkpoint.writing(path) as folder:
            if where == "interpret":
                arrays = {key: self.params[key] for key in self.param_keys()}
                written = [checkpoint.write_pieces(folder, 0, checkpoint.whole_pieces(arrays))]
            else:
                pool = RankPool.get(self.ranks, self.hosts)
                self.params.ensure_loaded(pool)
                written = pool.request("save_checkpoint", folder)
            checkpoint.write_index(folder, self._param_types(), self._param_layouts(), written)

    def _save_npz(self, path: str) -> None:
        arrays = {key: self.params[key] for key in self.param_keys()}
        directory = os.path.dirname(os.path.abspath(path))
        fd, tmp = tempfile.mkstemp(prefix=".ckpt-", suffix=".npz", dir=directory)
        try:
            with os.fdopen(fd, "wb") as f:
                # the cast quiets mypy, which rightly notes a parameter named allow_pickle would set savez's flag
                np.savez(f, **cast("dict[str, Any]", arrays))
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise

    def load(self, path: str | os.PathLike) -> None:
        """Reads a checkpoint written by `save`, from any plan of the same
        graph (another rank count, mesh, SBP, ZeRO, FSDP or pipeline): from
        a directory each rank reads only the bytes of its own pieces; an
        `.npz` file is read whole. A checkpoint of another graph, or a torn
        one, is refused, naming what differs or is missing."""
        from sbpc.runtime import checkpoint

        path = os.path.abspath(os.fspath(path))
        if not checkpoint.is_checkpoint_path(path):
            self._load_npz(path)
            return
        pieces = checkpoint.read_index(path, self._param_types())
        where = self._where()
        if where == "inside":
            raise NotImplementedError("loading inside an mpiexec launch: run the plan on a rank pool (outside mpiexec)")
        if where == "interpret":
            self._sim_params.update(self._read_whole(path, pieces))
            return
        pool = RankPool.get(self.ranks, self.hosts)
        self.params.ensure_loaded(pool)
        self._ranks_ahead = True
        pool.request("load_checkpoint", path, pieces)

    def _load_npz(self, path: str) -> None:
        with np.load(path) as data:
            missing = sorted(set(self.param_keys()) - set(data.files))
            if missing:
                raise ValueError(f"checkpoint {path!r} lacks parameters {missing}")
            shapes = self._param_types()
            for key in self.param_keys():
                value = data[key]
                shape, dtype = shapes[key]
                if value.dtype.kind == "V" and value.dtype.itemsize == dtype.itemsize:
                    value = value.view(dtype)  # npz keeps ml_dtypes' bfloat16 as raw 2-byte records
                if value.shape != shape or value.dtype != dtype:
                    raise ValueError(
                        f"checkpoint {path!r}: parameter {key!r} is {value.dtype}{list(value.shape)}, "
                        f"the plan wants {dtype}{list(shape)}"
                    )
                self.params[key] = value

    def save_pretrained(self, folder: str | os.PathLike, config: Any = None, prefix: str | None = None,
                        max_shard_size: int = 5 * 10**9) -> None:
        """Writes the weights in Hugging Face's layout, which
        `from_pretrained(folder)` and `from_torch(weights=folder)` read:
        `model.safetensors`, or above `max_shard_size` bytes the shards
        `model-0000k-of-0000n.safetensors` and `model.safetensors.index.json`.
        Each tensor is under its `state_dict()` name less `prefix` (a
        wrapper module's `model.`; by default the prefix `from_torch(weights=)`
        found, else none), a tied weight once, buffers with them; the
        optimizer's state is left out. With `config` (the model's
        `PretrainedConfig`) its `config.json` is written too. The driver
        holds one shard's tensors at a time."""
        from sbpc.runtime.checkpoint import write_hf_shards

        if not isinstance(max_shard_size, int) or max_shard_size < 1:
            raise ValueError(f"max_shard_size must be a positive number of bytes, got {max_shard_size!r}")
        if prefix is None:
            prefix = self.weights.prefix if self.weights is not None else ""
        keys = sorted(set(self.state_names.values())) if self.state_names else [
            k for k in self.param_keys() if not k.startswith(OPTIMIZER_STATE_KEYS)]
        unprefixed = [k for k in [*keys, *self.buffers] if not k.startswith(prefix)]
        if unprefixed:
            raise ValueError(f"save_pretrained: {unprefixed[0]!r} does not start with the prefix {prefix!r}")
        types = self._param_types()
        sizes = {key: math.prod(types[key][0]) * types[key][1].itemsize for key in keys}
        sizes.update({name: value.nbytes for name, value in self.buffers.items()})

        def value(name: str) -> np.ndarray:
            return self.buffers[name] if name in self.buffers else self.params[name]

        os.makedirs(folder, exist_ok=True)
        write_hf_shards(os.fspath(folder), {name.removeprefix(prefix): name for name in sizes}, sizes, value,
                        max_shard_size)
        if config is not None:
            config.save_pretrained(os.fspath(folder))

    def state_dict(self) -> dict[str, Any]:
        """The trained weights as `torch.Tensor`s under their `state_dict()`
        names and in PyTorch's layouts (an imported module's names, tied
        weights under each name, buffers as they came), so that
        `module.load_state_dict(exe.state_dict())` works. For a graph built
        in sbpc: every parameter but the optimizer's state."""
        names = self.state_names or {k: k for k in self.param_keys() if not k.startswith(OPTIMIZER_STATE_KEYS)}
        values = {key: self.params[key] for key in sorted(set(names.values()))}
        state = {name: _tensor(np.array(values[key])) for name, key in names.items()}
        state.update({name: _tensor(np.array(value)) for name, value in self.buffers.items()})
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Sets the parameters from a `state_dict()` (torch tensors or numpy
        arrays under the names `state_dict()` returns); buffers must match
        what was imported, since sbpc folded them into the plan."""
        names = self.state_names or {k: k for k in self.param_keys()}
        missing = sorted(set(names) - set(state))
        if missing:
            raise ValueError(f"state_dict lacks {missing[:5]}{' ...' if len(missing) > 5 else ''}")
        shapes = self._param_types()
        for name, key in names.items():
            value = _array(state[name])
            shape, dtype = shapes[key]
            if value.shape != shape:
                raise ValueError(f"state_dict[{name!r}] has shape {list(value.shape)}, the plan wants {list(shape)}")
            self.params[key] = value.astype(dtype)
        for name, value in self.buffers.items():
            given = state.get(name)
            if given is None:
                continue
            if not np.array_equal(_array(given), value):
                raise ValueError(f"buffer {name!r} differs from the imported one; sbpc folded it into the plan: "
                                 "import the module again")

    def _param_types(self) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
        from sbpc.dialects.dtypes import numpy_dtype

        return {r.param.data: (tuple(r.value.get_shape()), np.dtype(numpy_dtype(r.value.element_type)))
                for d in self.program.devices() for r in d.registers() if r.param is not None}

    def _param_layouts(self) -> dict[str, dict]:
        """Each parameter's SBP and mesh in this plan (a checkpoint's index records them)."""
        from sbpc.dialects.sbp import lookup_placement
        from sbpc.runtime.checkpoint import layout_of

        layouts: dict[str, dict] = {}
        for d in self.program.devices():
            for r in d.registers():
                if r.param is not None and r.param.data not in layouts:
                    layouts[r.param.data] = layout_of(r.value, lookup_placement(self.program, r.value.placement).mesh())
        return layouts

    def param_keys(self) -> list[str]:
        return list(self._param_key_set)

    @functools.cached_property
    def _param_key_set(self) -> dict[str, None]:
        """The parameters' names, sorted (a dict keeps their order and tests
        membership at once): found once, since each parameter read or
        written checks its name here: walking every register for each one
        made a state_dict O(parameters x registers), 27 s of the test
        suite's CPU under cProfile."""
        return dict.fromkeys(sorted({r.param.data for d in self.program.devices() for r in d.registers()
                                     if r.param is not None}))

    @functools.cached_property
    def output_names(self) -> list[str]:
        """Every output the plan fetches."""
        return sorted({r.fetch.data for d in self.program.devices() for r in d.registers() if r.fetch is not None})


def _array(value) -> np.ndarray:
    """A torch tensor (on any device) or an array-like as a numpy array."""
    if hasattr(value, "detach"):
        from sbpc.torch_frontend import to_numpy

        return to_numpy(value.cpu())
    return np.asarray(value)


def _tensor(value: np.ndarray):
    """A numpy array as a torch tensor; ml_dtypes' bfloat16 as torch.bfloat16."""
    import torch

    from sbpc.dialects.dtypes import is_half

    if is_half(value.dtype) and value.dtype != np.float16:
        return torch.from_numpy(value.astype(np.float32)).to(torch.bfloat16)
    return torch.from_numpy(value)


class Params:
    """Parameters as global numpy arrays: read and write."""

    def __init__(self, exe: Executable):
        self.exe = exe

    def keys(self) -> list[str]:
        return self.exe.param_keys()

    def __getitem__(self, key: str) -> np.ndarray:
        if key not in self.exe._param_key_set:
            raise KeyError(f"no parameter {key!r} (parameters: {self.keys()})")
        exe = self.exe
        where = exe._where()
        if where == "interpret":
            exe._read_weights()
            if key not in exe._sim_params and key in exe.initial_values:
                exe._sim_params[key] = np.array(exe.initial_values[key])
            if key not in exe._sim_params:
                from sbpc.dialects.dtypes import numpy_dtype
                from sbpc.semantics.reference import initialize

                reg = next(r for d in exe.program.devices() for r in d.registers()
                           if r.param is not None and r.param.data == key)
                assert reg.init is not None  # sbp-to-plan gives every parameter register its initializer
                exe._sim_params[key] = initialize(reg.init, reg.seed.value.data if reg.seed else 0, key,
                                                  reg.value.get_shape(), numpy_dtype(reg.value.element_type))
            return exe._sim_params[key].copy()
        if where == "inside":
            raise NotImplementedError("reading parameters inside an mpiexec launch: use the fetched outputs")
        pool = RankPool.get(exe.ranks, exe.hosts)
        self.ensure_loaded(pool)
        from sbpc.runtime.program import assemble_param

        return assemble_param(exe.program, key, pool.request("get_param", key))

    def __setitem__(self, key: str, value) -> None:
        if key not in self.exe._param_key_set:
            raise KeyError(f"no parameter {key!r} (parameters: {self.keys()})")
        exe = self.exe
        where = exe._where()
        if where == "interpret":
            exe._sim_params[key] = np.asarray(value)
            return
        if where == "inside":
            raise NotImplementedError("writing parameters inside an mpiexec launch is not supported yet")
        pool = RankPool.get(exe.ranks, exe.hosts)
        self.ensure_loaded(pool)
        exe._ranks_ahead = True
        pool.request("set_param", key, np.asarray(value))

    def ensure_loaded(self, pool: RankPool) -> None:
        """The pool runs one plan at a time: load this one if another was
        last. The other plan's state is kept first, as a checkpoint in the
        job's folder, and this one's comes back from its own (else its
        parameters start from their initializers): two executables on the
        same ranks (a plan and the one its checkpoint is loaded into) each
        go on from where they were."""
        exe = self.exe
        loaded = pool.loaded() if pool.loaded is not None else None
        if loaded is exe:
            return
        if loaded is not None:
            loaded.params._stash_state(pool)
        pool.loaded = None  # (until this plan is there: a failed load leaves none)
        pool.request("load", exe.rank_plan_pickles, exe.initial_values or None)
        pool.loaded = weakref.ref(exe)
        if exe._stash is not None and exe._stash[0] is pool:
            from sbpc.runtime import checkpoint

            path = exe._stash[1]
            pool.request("load_checkpoint", path, checkpoint.read_index(path, exe._param_types()))
        elif exe.weights is not None:
            pool.request("load_checkpoint", exe.weights.folder, exe.weights.pieces, exe.weights.tensors)

    def _stash_state(self, pool: RankPool) -> None:
        """Writes the state the ranks hold for this plan, if a step or a
        write changed it since the plan was loaded, into the job's folder."""
        exe = self.exe
        if not exe._ranks_ahead:
            return
        from sbpc.runtime import checkpoint

        path = os.path.join(pool.errors.name, f"state-{id(exe)}")
        with checkpoint.writing(path) as folder:
            written = pool.request("save_checkpoint", folder)
            checkpoint.write_index(folder, exe._param_types(), exe._param_layouts(), written)
        if exe._stash is None or exe._stash[1] != path:
            weakref.finalize(exe, shutil.rmtree, path, True)
        exe._stash, exe._ranks_ahead = (pool, path), False
