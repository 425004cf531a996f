"""The cluster model (`perf/cluster.py`): file validation, presets,
topology arithmetic, the compute roofline, and the documented format."""

import json
import math
import re
from dataclasses import fields, replace
from pathlib import Path

import pytest

from sbpc.perf.cluster import (
    CPU,
    INFINIBAND,
    KINDS,
    NVLINK,
    PRESETS,
    Cluster,
    ClusterError,
    CollectiveFit,
    DeviceModel,
    Level,
    Links,
    cluster_from_json,
    h100_cluster,
    latency_steps,
    load_cluster,
    preset,
    presets,
    validate,
)

# -- cluster files ------------------------------------------------------------------------


def valid() -> dict:
    """A well-formed cluster description: 16 devices, nodes of 8."""
    return {
        "name": "test",
        "count": 16,
        "device": {
            "kind": "cuda", "memory": 8e9, "peak_flops": {"f32": 1e12, "bf16": 4e12}, "efficiency": 0.5,
            "vector_flops": 1e11, "memory_bandwidth": 1e11, "kernel_overhead": 1e-6,
        },
        "levels": [
            {"name": "node", "size": 8, "bandwidth": 1e11, "latency": 1e-6},
            {"name": "cluster", "size": 2, "bandwidth": 1e10, "latency": 5e-6},
        ],
    }


def _set(path: str, value):
    """A mutation of `valid()`: sets (or with `...` deletes) the entry at a dotted path."""

    def mutate(data: dict) -> dict:
        *parents, last = path.split(".")
        node = data
        for key in parents:
            node = node[int(key)] if isinstance(node, list) else node[key]
        if value is ...:
            del node[last]
        elif isinstance(node, list):
            node[int(last)] = value
        else:
            node[last] = value
        return data

    return mutate


def _links(n: int):
    def mutate(data: dict) -> dict:
        del data["levels"]
        data["links"] = {"bandwidth": [[1e9] * n for _ in range(n)], "latency": [[0.0] * n for _ in range(n)]}
        return data

    return mutate


def _both(data: dict) -> dict:
    _links(16)(data)
    data["levels"] = valid()["levels"]
    return data


def _link_entry(data: dict) -> dict:
    _links(16)(data)
    data["links"]["bandwidth"][3][5] = 0
    return data


def _link_row(data: dict) -> dict:
    _links(16)(data)
    data["links"]["latency"][2] = 0.0
    return data


def _fit(fit: dict, kind: str = "all_reduce"):
    def mutate(data: dict) -> dict:
        data["levels"][1]["collectives"] = {kind: fit}
        return data

    return mutate


MALFORMED = [
    # (id, mutation of valid(), the message's beginning: the field at fault)
    ("bandwidth-negative", _set("levels.1.bandwidth", -1.0), "levels[1].bandwidth:"),
    ("bandwidth-string", _set("levels.0.bandwidth", "fast"), "levels[0].bandwidth:"),
    ("latency-negative", _set("levels.0.latency", -1e-6), "levels[0].latency:"),
    ("sync-negative", _set("levels.1.sync", -1e-4), "levels[1].sync:"),
    ("sync-string", _set("levels.0.sync", "slow"), "levels[0].sync:"),
    ("size-fraction", _set("levels.0.size", 2.5), "levels[0].size:"),
    ("unknown-dtype", _set("device.peak_flops.f99", 1e12), "device.peak_flops.f99:"),
    ("no-dtypes", _set("device.peak_flops", {}), "device.peak_flops:"),
    ("efficiency-above-1", _set("device.efficiency", 1.5), "device.efficiency:"),
    ("efficiency-zero", _set("device.efficiency", 0), "device.efficiency:"),
    ("overlap-above-1", _set("device.comm_overlap", 2.0), "device.comm_overlap:"),
    ("launch-ahead-string", _set("device.launch_ahead", "yes"), "device.launch_ahead:"),
    ("memory-nan", _set("device.memory", math.nan), "device.memory:"),
    ("memory-infinite", _set("device.memory", math.inf), "device.memory:"),
    ("device-kind", _set("device.kind", "tpu"), "device.kind:"),
    ("scale-zero", _set("device.kernel_scales", {"lg.matmul": 0}), "device.kernel_scales.lg.matmul:"),
    ("scales-not-object", _set("device.kernel_scales", [1.2]), "device.kernel_scales: must be an object"),
    ("count-zero", _set("count", 0), "count:"),
    ("count-float", _set("count", 16.0), "count:"),
    ("count-bool", _set("count", True), "count:"),
    ("sizes-vs-count", _set("levels.1.size", 3), "levels: the sizes multiply to 24 (8 x 3) but count is 16"),
    ("levels-not-list", _set("levels", {"size": 16}), "levels: must be a list"),
    ("level-not-object", _set("levels.0", 8), "levels[0]: must be a JSON object"),
    ("links-shape", _links(3), "links.bandwidth: must be a 16 x 16 matrix"),
    ("links-entry", _link_entry, "links.bandwidth[3][5]:"),
    ("links-row", _link_row, "links.latency: must be a list of lists"),
    ("levels-and-links", _both, "levels, links: give exactly one"),
    ("neither-levels-nor-links", _set("levels", ...), "levels, links: give exactly one"),
    ("empty-levels", _set("levels", []), "levels, links: give exactly one"),
    ("unknown-field", _set("colour", "blue"), "colour: unknown field"),
    ("unknown-device-field", _set("device.tflops", 1.0), "device.tflops: unknown field"),
    ("unknown-level-field", _set("levels.0.speed", 1.0), "levels[0].speed: unknown field"),
    ("missing-memory", _set("device.memory", ...), "device.memory: missing"),
    ("missing-count", _set("count", ...), "count: missing"),
    ("missing-level-size", _set("levels.1.size", ...), "levels[1].size: missing"),
    ("missing-device", _set("device", ...), "device: missing"),
    ("fit-kind", _fit({"latency": 0.0, "bandwidth": 1e9}, "broadcast"), "levels[1].collectives.broadcast:"),
    ("fit-missing", _fit({"latency": 0.0}), "levels[1].collectives.all_reduce.bandwidth: missing"),
    ("fit-bandwidth", _fit({"latency": 0.0, "bandwidth": 0}), "levels[1].collectives.all_reduce.bandwidth:"),
    ("fits-not-object", _set("levels.1.collectives", []), "levels[1].collectives: must be an object"),
    ("fit-points-no-members", _fit({"latency": 0.0, "bandwidth": 1e9, "measured": [[1e3, 1e-5], [1e4, 2e-5]]}),
     "levels[1].collectives.all_reduce.members: the ranks its measured points were timed over"),
    ("fit-points-shrink", _fit({"latency": 0.0, "bandwidth": 1e9, "members": 2,
                                "measured": [[1e4, 1e-5], [1e3, 2e-5]]}),
     "levels[1].collectives.all_reduce.measured[1]: volumes must grow"),
    ("fit-point-negative", _fit({"latency": 0.0, "bandwidth": 1e9, "members": 2, "measured": [[1e3, -1e-5]]}),
     "levels[1].collectives.all_reduce.measured[0]: must be [volume, seconds], both positive"),
    ("fit-point-not-pair", _fit({"latency": 0.0, "bandwidth": 1e9, "members": 2, "measured": [1e3, 1e-5]}),
     "levels[1].collectives.all_reduce.measured[0]: must be [volume, seconds]"),
    ("fit-points-not-list", _fit({"latency": 0.0, "bandwidth": 1e9, "members": 2, "measured": "fast"}),
     "levels[1].collectives.all_reduce.measured: must be a list"),
    ("kind-unknown", _set("device.kind_scales", {"vector": 1.0}), "device.kind_scales.vector: not a kernel kind"),
    ("kind-scale", _set("device.kind_scales", {"row": 0.0}), "device.kind_scales.row:"),
    ("kind-overhead", _set("device.kind_overheads", {"gemm": -1.0}), "device.kind_overheads.gemm:"),
    ("kinds-not-object", _set("device.kind_overheads", [1.0]), "device.kind_overheads: must be an object"),
]


@pytest.mark.parametrize(("mutate", "field"), [m[1:] for m in MALFORMED], ids=[m[0] for m in MALFORMED])
def test_malformed_cluster_names_the_field(tmp_path, mutate, field):
    data = mutate(valid())
    with pytest.raises(ClusterError) as info:
        cluster_from_json(data)
    assert str(info.value).startswith(field), str(info.value)

    path = tmp_path / "cluster.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ClusterError) as info:
        load_cluster(str(path))
    assert str(info.value).startswith(f"{path}: {field}"), str(info.value)


def test_valid_cluster_file_loads(tmp_path):
    path = tmp_path / "cluster.json"
    path.write_text(json.dumps(valid()))
    cluster = load_cluster(str(path))
    assert cluster == cluster_from_json(valid())
    assert (cluster.count, [lv.size for lv in cluster.levels]) == (16, [8, 2])
    assert cluster.device.actor_overhead == 0.0 and cluster.device.comm_overlap == 1.0  # the defaults
    assert load_cluster(str(path), devices=32).levels[1].size == 4
    with_fit = _fit({"latency": 1e-5, "bandwidth": 2e10})(valid())
    assert cluster_from_json(with_fit).levels[1].collectives == {"all_reduce": CollectiveFit(1e-5, 2e10)}
    assert cluster_from_json(_links(16)(valid())).links is not None


def test_a_file_that_is_not_json(tmp_path):
    path = tmp_path / "cluster.json"
    path.write_text('{"name": "test", "count": 16,')
    with pytest.raises(ClusterError, match=r"not valid JSON") as info:
        load_cluster(str(path))
    assert str(info.value).startswith(f"{path}: not valid JSON")


def test_a_file_that_is_not_an_object(tmp_path):
    path = tmp_path / "cluster.json"
    path.write_text("[1, 2]")
    with pytest.raises(ClusterError, match=r": the file: must be a JSON object, got list"):
        load_cluster(str(path))


@pytest.mark.parametrize("what", ["missing", "directory"])
def test_an_unreadable_file(tmp_path, what):
    path = tmp_path / "nothing.json" if what == "missing" else tmp_path
    with pytest.raises(ClusterError, match=r"is neither a preset \(cpu, h100-node, .*\) nor a readable file"):
        load_cluster(str(path))


def test_unknown_preset():
    with pytest.raises(ClusterError, match=r"no cluster preset 'tpu'"):
        preset("tpu")


# -- presets ------------------------------------------------------------------------------


@pytest.mark.parametrize("name", presets())
def test_presets_round_trip_through_a_file(tmp_path, name):
    devices = 64 if name == "h100" else None
    cluster = load_cluster(name, devices)
    assert cluster.to_json() == preset(name, devices).to_json()
    path = tmp_path / f"{name}.json"
    cluster.save(str(path))
    loaded = load_cluster(str(path))
    assert loaded.to_json() == cluster.to_json()
    assert loaded == cluster


def test_link_matrix_round_trips_through_a_file(tmp_path):
    cluster = cluster_from_json(_links(16)(valid()))
    path = tmp_path / "links.json"
    cluster.save(str(path))
    assert load_cluster(str(path)).to_json() == cluster.to_json()


@pytest.mark.parametrize("name", ["cpu", "h100-2nodes"])
def test_to_json_reads_back_without_a_file(name):
    cluster = preset(name)
    assert cluster_from_json(cluster.to_json()) == cluster


def test_presets():
    assert set(PRESETS) | {"h100"} == set(presets())
    assert preset("cpu").count == 2
    # the cpu preset is a measurement of this kind of machine, and says which
    cpu = preset("cpu")
    assert cpu.source.startswith("sbp-calibrate on 20") and " cores, " in cpu.source and "BLAS" in cpu.source
    assert cpu.levels[0].cores == 2 and cpu.levels[0].sync > 0  # where 4 ranks share the 2 cores
    assert set(cpu.device.kind_scales) == set(KINDS)  # every kernel kind priced as measured
    assert load_cluster("h100").name == "h100-node"
    big = load_cluster("h100", 64)
    assert big.count == 64 and [lv.size for lv in big.levels] == [8, 8]
    assert [lv.size for lv in load_cluster("h100", 4).levels] == [4]


# -- topology ---------------------------------------------------------------------------------


def test_level_of():
    c = h100_cluster(4)
    assert c.count == 32 and [(lv.name, lv.size) for lv in c.levels] == [("node", 8), ("cluster", 4)]
    assert c.level_of(list(range(8))) == 0
    assert c.level_of(list(range(8, 16))) == 0
    assert c.level_of([5]) == 0
    assert c.level_of([0, 8]) == 1
    assert c.level_of([7, 8]) == 1
    assert c.level_of(list(range(32))) == 1


@pytest.mark.parametrize(("kind", "p", "steps"), [
    ("all_reduce", 1, 0.0), ("all_reduce", 2, 2.0), ("all_reduce", 8, 6.0), ("all_reduce", 5, 6.0),
    ("all_gather", 8, 3.0), ("all_gather", 5, 3.0), ("reduce_scatter", 16, 4.0), ("reduce_scatter", 2, 1.0),
    ("all_to_all", 4, 3.0), ("all_to_all", 8, 7.0), ("transfer", 2, 1.0), ("transfer", 1, 0.0),
])
def test_latency_steps(kind, p, steps):
    assert latency_steps(kind, p) == steps


def test_collective_time_within_a_node():
    c = h100_cluster(4)
    nbytes = 3e8
    node = list(range(8))
    assert c.figures("all_reduce", node) == (NVLINK.latency, NVLINK.bandwidth)
    expected = 2 * math.ceil(math.log2(8)) * NVLINK.latency + nbytes / NVLINK.bandwidth
    assert c.collective_time("all_reduce", node, nbytes) == pytest.approx(expected, rel=1e-12)
    assert c.collective_time("all_gather", [8, 9, 10, 11], nbytes) == pytest.approx(
        2 * NVLINK.latency + nbytes / NVLINK.bandwidth, rel=1e-12)
    assert c.collective_time("all_to_all", node, nbytes) == pytest.approx(
        7 * NVLINK.latency + nbytes / NVLINK.bandwidth, rel=1e-12)
    assert c.collective_time("all_reduce", [3], nbytes) <= NVLINK.latency  # no bytes move


@pytest.mark.parametrize("kind", ["all_reduce", "all_gather", "reduce_scatter", "all_to_all"])
def test_a_collective_over_one_rank_costs_the_copy_of_its_result(kind):
    # Nothing crosses a link, but MPI copies the send buffer into the
    # receive buffer: no latency step, the copy of the result piece.
    cpu = preset("cpu")
    assert cpu.collective_time(kind, [0], 0.0, 1 << 20) == cpu.copy_time(1 << 20) > 0.0
    assert cpu.collective_time(kind, [0], 0.0) == 0.0


def test_collective_time_across_nodes():
    c = h100_cluster(4)
    nbytes = 3e8
    assert INFINIBAND.bandwidth < NVLINK.bandwidth
    assert c.figures("all_reduce", [0, 8]) == (INFINIBAND.latency, INFINIBAND.bandwidth)
    assert c.collective_time("all_reduce", [0, 8], nbytes) == pytest.approx(
        2 * INFINIBAND.latency + nbytes / INFINIBAND.bandwidth, rel=1e-12)
    assert c.collective_time("all_gather", list(range(16)), nbytes) == pytest.approx(
        4 * INFINIBAND.latency + nbytes / INFINIBAND.bandwidth, rel=1e-12)
    assert c.collective_time("transfer", [7, 8], nbytes) == pytest.approx(
        INFINIBAND.latency + nbytes / INFINIBAND.bandwidth, rel=1e-12)
    assert c.collective_time("all_reduce", list(range(32)), nbytes) > c.collective_time("all_reduce", list(range(8)),
                                                                                         nbytes)


def test_a_collective_fit_overrides_its_kind_on_its_level():
    fit = CollectiveFit(latency=1e-5, bandwidth=2e10)
    c = replace(h100_cluster(4), levels=(NVLINK, replace(INFINIBAND, size=4, collectives={"all_reduce": fit})))
    nbytes = 1e8
    assert c.figures("all_reduce", [0, 8]) == (fit.latency, fit.bandwidth)
    assert c.collective_time("all_reduce", [0, 8], nbytes) == pytest.approx(2 * 1e-5 + nbytes / 2e10, rel=1e-12)
    # other kinds on that level, and the same kind on the level below, keep the generic figures
    assert c.figures("all_gather", [0, 8]) == (INFINIBAND.latency, INFINIBAND.bandwidth)
    assert c.figures("all_reduce", list(range(8))) == (NVLINK.latency, NVLINK.bandwidth)
    # a fit on the node level does not reach a group that spans nodes
    c = replace(h100_cluster(4), levels=(replace(NVLINK, collectives={"all_reduce": fit}), replace(INFINIBAND, size=4)))
    assert c.figures("all_reduce", list(range(8))) == (fit.latency, fit.bandwidth)
    assert c.figures("all_reduce", [0, 8]) == (INFINIBAND.latency, INFINIBAND.bandwidth)


def test_a_collective_of_a_measured_size_costs_what_it_measured():
    # points timed over 2 ranks that no line fits: a floor, then a knee, and a dip (noise)
    points = [[1e3, 20e-6], [1e4, 20e-6], [1e5, 80e-6], [1e6, 70e-6], [1e7, 1e-3]]
    fit = CollectiveFit(latency=5e-6, bandwidth=1e10, measured=points, members=2)
    sync = 3e-6
    c = replace(h100_cluster(1), name="two", count=2,
                levels=(Level("machine", 2, 1e9, 1e-6, collectives={"all_gather": fit}, sync=sync, cores=1),))
    assert c.collective_sync([0, 1]) == sync

    def priced(nbytes: float, kind: str = "all_gather", ranks=(0, 1)) -> float:
        return c.collective_time(kind, list(ranks), nbytes)

    assert priced(1e5) == pytest.approx(80e-6 + sync)  # the line says 5 + 10 us
    assert priced(1e7) == pytest.approx(1e-3 + sync)
    assert priced(10 ** 4.5) == pytest.approx(math.sqrt(20e-6 * 80e-6) + sync)  # log-log between its neighbours
    assert priced(1e6) == pytest.approx(80e-6 + sync)  # more bytes never cost less than fewer measured
    assert priced(10 ** 6.5) == pytest.approx(math.sqrt(80e-6 * 1e-3) + sync)
    assert priced(10.0) == pytest.approx(20e-6 + sync)  # below the smallest: the floor it measured
    line = latency_steps("all_gather", 2) * 5e-6 + 1e8 / 1e10 + sync
    assert priced(1e8) == pytest.approx(line)  # past the largest: the line
    # other kinds on the level keep its generic figures; a fit without points prices by its line
    assert priced(1e5, "all_reduce") == pytest.approx(latency_steps("all_reduce", 2) * 1e-6 + 1e5 / 1e9 + sync)
    plain = replace(c, levels=(replace(c.levels[0], collectives={"all_gather": replace(fit, measured=(), members=0)}),))
    assert plain.collective_time("all_gather", [0, 1], 1e5) == pytest.approx(5e-6 + 1e5 / 1e10 + sync)
    # points timed over 2 ranks do not price a group of 4: their line does
    four = replace(c, count=4, levels=(replace(c.levels[0], size=4),))
    assert four.collective_time("all_gather", [0, 1, 2, 3], 1e5) == pytest.approx(
        latency_steps("all_gather", 4) * 5e-6 + 1e5 / 1e10 + four.collective_sync([0, 1, 2, 3]))
    # and the points survive a file
    assert cluster_from_json(json.loads(json.dumps(c.to_json()))) == c


def test_a_link_matrix_prices_a_ring_by_its_slowest_link():
    bandwidth = [[0, 10e9, 99e9, 99e9], [99e9, 0, 5e9, 99e9], [20e9, 99e9, 0, 99e9], [99e9, 99e9, 99e9, 0]]
    latency = [[0, 1e-6, 0, 0], [0, 0, 2e-6, 0], [4e-6, 0, 0, 0], [0, 0, 0, 0]]
    c = Cluster(name="ring", count=4, device=h100_cluster(1).device, links=Links(bandwidth, latency))
    # the ring 0 -> 1 -> 2 -> 0: slowest bandwidth 5e9 (1 -> 2), largest latency 4e-6 (2 -> 0)
    assert c.figures("all_gather", [0, 1, 2]) == (4e-6, 5e9)
    nbytes = 1e7
    assert c.collective_time("all_gather", [0, 1, 2], nbytes) == pytest.approx(2 * 4e-6 + nbytes / 5e9, rel=1e-12)
    assert c.collective_time("all_reduce", [0, 1, 2], nbytes) == pytest.approx(4 * 4e-6 + nbytes / 5e9, rel=1e-12)
    assert c.figures("transfer", [0, 1]) == (1e-6, 10e9)  # 0 -> 1 and 1 -> 0
    assert c.figures("transfer", [2, 3]) == (0, 99e9)
    with pytest.raises(ClusterError, match=r"a link matrix describes exactly 4 devices"):
        c.resized(8)


def test_resized():
    node = preset("h100-node").resized(4)
    assert (node.count, [(lv.name, lv.size) for lv in node.levels]) == (4, [("node", 4)])
    big = preset("h100-2nodes").resized(64)
    assert (big.count, [(lv.name, lv.size) for lv in big.levels]) == (64, [("node", 8), ("cluster", 8)])
    assert big.levels[1].bandwidth == INFINIBAND.bandwidth
    small = preset("h100-2nodes").resized(4)
    assert (small.count, [lv.size for lv in small.levels]) == (4, [4])
    assert preset("h100-node").resized(8) is preset("h100-node")
    for make in (lambda: preset("h100-2nodes").resized(12), lambda: load_cluster("h100", 12),
                 lambda: load_cluster("h100-4nodes", 12)):
        with pytest.raises(ClusterError, match=r"12 devices is not a whole number of 8-device units"):
            make()


def test_compute_roofline():
    # a CPU dispatches each kernel before its arithmetic: the fixed cost adds
    # (the roofline alone: without the preset's measured costs per kernel)
    cpu = preset("cpu")
    cpu = replace(cpu, device=replace(cpu.device, kernel_overheads={}, kernel_scales={}, kind_overheads={},
                                      kind_scales={}))
    d = cpu.device
    assert not d.launch_ahead
    assert cpu.gemm_time(1e12, "f32") == pytest.approx(d.kernel_overhead + 1e12 / (d.peak_flops["f32"] * d.efficiency))
    assert cpu.device.gemm_rate("bf16") == cpu.device.peak_flops["f32"]  # no bf16 figure: the f32 one
    assert cpu.kernel_time(1e9, 1.0) == pytest.approx(d.kernel_overhead + 1e9 / d.vector_flops)
    assert cpu.kernel_time(1.0, 1e9) == pytest.approx(d.kernel_overhead + 1e9 / d.memory_bandwidth)
    # a GPU stream has kernels queued ahead: the fixed cost is a floor (autoparallel's 7 us)
    c = h100_cluster(1)
    d = c.device
    assert d.launch_ahead
    assert c.gemm_time(1e12, "bf16") == pytest.approx(1e12 / (d.peak_flops["bf16"] * d.efficiency))
    assert c.gemm_time(1e12, "f32") == pytest.approx(1e12 / (d.peak_flops["f32"] * d.efficiency))
    assert c.kernel_time(1e9, 1.0) == pytest.approx(1e9 / d.vector_flops)
    assert c.kernel_time(1.0, 1e9) == pytest.approx(1e9 / d.memory_bandwidth)
    assert c.kernel_time(1.0, 1e3) == d.kernel_overhead  # a tiny kernel costs the floor
    # a fused chain is one generated kernel on a GPU, one numpy call per step on a CPU
    assert c.work_time("plan.fused", 3.0, 1e3, calls=3) == d.kernel_overhead
    assert cpu.work_time("plan.fused", 3.0, 1e3, calls=3) == pytest.approx(
        3 * cpu.device.kernel_overhead + cpu.core_time("plan.fused", 3.0, 1e3))


def test_the_documented_cluster_file_loads(tmp_path):
    """docs/CLUSTER.md's example is a valid cluster file (the doc cannot drift from the format)."""
    text = (Path(__file__).resolve().parents[3] / "docs" / "CLUSTER.md").read_text()
    example = re.search(r"```json\n(.*?)```", text, re.S)
    assert example is not None
    path = tmp_path / "cluster.json"
    path.write_text(example.group(1))
    cluster = load_cluster(str(path))
    assert cluster.count == 2 and cluster.levels[0].sync > 0
    # every field of the format is documented
    for cls in (Cluster, DeviceModel, Level, Links, CollectiveFit):
        for f in fields(cls):
            assert f"`{f.name}`" in text, f"{cls.__name__}.{f.name} is not in docs/CLUSTER.md"


def test_only_a_collective_with_members_on_one_core_pays_sync():
    """4 ranks bound round robin to 2 cores (ranks 0 and 2 on core 0, 1 and 3
    on core 1): a pair on two cores moves without waiting for the OS to run
    a member that shares its core; a pair on one core, or all four, pay
    `sync`. Where the cores are not known, every collective pays it."""
    level = Level("machine", 4, bandwidth=1e9, latency=1e-5, sync=1e-4, cores=2)
    cluster = replace(CPU, count=4, levels=(level,))
    assert not cluster.share_a_core([0, 1]) and not cluster.share_a_core([2, 3])
    assert cluster.share_a_core([0, 2]) and cluster.share_a_core([0, 1, 2, 3])
    apart, together = (cluster.collective_time("all_reduce", g, 4096) for g in ([0, 1], [0, 2]))
    assert together - apart == pytest.approx(1e-4)
    unknown = replace(cluster, levels=(replace(level, cores=0),))
    assert unknown.share_a_core([0, 1])
    with pytest.raises(ClusterError, match=r"levels\[0\].cores: must be a non-negative integer"):
        validate(replace(cluster, levels=(replace(level, cores=-1),)))
