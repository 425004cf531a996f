"""Calibration fitting on synthetic timings: timings made from known figures
(plus noise) must give those figures back, and the fitted cluster must be a
valid cluster file that prices what it measured."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest

from sbpc.perf.cluster import latency_steps, load_cluster
from sbpc.perf.fit import fit_cluster, fit_line, fit_nonnegative

TRUE = {
    "gemm_rate": 80e9, "gemm_overhead": 3e-6, "bandwidth": 12e9, "cache_bandwidth": 48e9, "cache_bytes": 8e6,
    "kernel": 1.5e-6, "actor": 1e-6, "vector": 2e9,
    "collectives": {"all_reduce": (4e-6, 3e9), "all_gather": (6e-6, 5e9), "reduce_scatter": (7e-6, 2.5e9),
                    "all_to_all": (5e-6, 4e9), "transfer": (3e-6, 9e9)},
}


def synthetic(ranks: int = 2, noise: float = 0.0, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)

    def jitter(t: float) -> float:
        return t * (1.0 + noise * rng.standard_normal())

    gemm = [[m, k, n, jitter(TRUE["gemm_overhead"] + 2.0 * m * k * n / TRUE["gemm_rate"])]
            for m, k, n in [(64, 64, 64), (256, 256, 256), (512, 512, 512), (1024, 1024, 1024)]]
    elementwise = []
    for count in [2**e for e in range(10, 24, 2)]:
        nbytes = 12.0 * count
        bw = TRUE["cache_bandwidth"] if nbytes <= TRUE["cache_bytes"] else TRUE["bandwidth"]
        elementwise.append([nbytes, jitter(TRUE["kernel"] + nbytes / bw)])
    reduction = [[b, jitter(TRUE["kernel"] + b / 10e9)] for b in (1e4, 1e5, 1e6, 1e7)]
    vector = [[8.0 * 2**18, 8.0 * 2**18, jitter(TRUE["kernel"] + 8.0 * 2**18 / TRUE["vector"])]]
    collectives = {}
    for kind, (alpha, beta) in TRUE["collectives"].items():
        p = ranks if kind != "transfer" else 2
        collectives[kind] = [[b, jitter(latency_steps(kind, p) * alpha + b / beta)] for b in (1e3, 1e4, 1e5, 1e6, 1e7)]
    def core(flops: float, nbytes: float, rate: float = TRUE["vector"]) -> float:  # a small (in-cache) kernel
        return max(flops / rate, nbytes / TRUE["cache_bandwidth"])

    fused_rate = max(TRUE["vector"], TRUE["cache_bandwidth"] / 12)  # simple steps: an add's bytes per flop
    probe = [["lg.softmax", 5e3, 8e3, "f32", 1, jitter(20e-6 + core(5e3, 8e3))],
             ["lg.softmax", 5e4, 8e4, "f32", 1, jitter(20e-6 + core(5e4, 8e4))],
             ["plan.fused", 1e3, 4e3, "f32", 3, jitter(3 * 2e-6 + core(1e3, 4e3, fused_rate))]]
    return {"ranks": ranks, "gemm": gemm, "elementwise": elementwise, "reduction": reduction, "vector": vector,
            "tiny_kernel": TRUE["kernel"], "actor": TRUE["actor"], "collectives": collectives, "probe": probe,
            "overlap": {"compute": 0.02, "comm": 0.01, "both": 0.025}, "memory": 8e9,
            "cache_bytes": TRUE["cache_bytes"]}


def test_fit_line_recovers_a_line_and_keeps_coefficients_non_negative():
    x = [1.0, 2.0, 4.0, 8.0]
    assert fit_line(x, [3.0 + 2.0 * v for v in x]) == pytest.approx((3.0, 2.0))
    # a line through points that want a negative intercept: clamped at 0, slope refitted
    intercept, slope = fit_line([1.0, 2.0, 3.0], [0.5, 2.0, 3.5])
    assert intercept == 0.0 and slope > 0
    assert fit_nonnegative([[1.0, 0.0], [0.0, 1.0]], [-1.0, 2.0]) == pytest.approx([0.0, 2.0])


@pytest.mark.parametrize("ranks", [2, 4])
def test_exact_timings_give_the_figures_back(ranks):
    cluster = fit_cluster(synthetic(ranks)).cluster
    d = cluster.device
    assert d.gemm_rate("f32") == pytest.approx(TRUE["gemm_rate"], rel=1e-3)
    assert d.memory_bandwidth == pytest.approx(TRUE["bandwidth"], rel=1e-3)
    assert d.cache_bandwidth == pytest.approx(TRUE["cache_bandwidth"], rel=1e-3)
    assert d.cache_bytes == TRUE["cache_bytes"]
    assert d.vector_flops == pytest.approx(TRUE["vector"], rel=1e-3)
    assert d.kernel_overhead == pytest.approx(TRUE["kernel"])
    assert d.actor_overhead == pytest.approx(TRUE["actor"])
    assert d.kernel_overheads["lg.softmax"] == pytest.approx(20e-6, rel=1e-3)
    assert d.kernel_overheads["plan.fused"] == pytest.approx(2e-6, rel=1e-3)  # per fused step
    assert d.comm_overlap == pytest.approx(0.5)  # 5 of the shorter 10 ms hidden
    fits = cluster.levels[0].collectives
    for kind, (alpha, beta) in TRUE["collectives"].items():
        assert fits[kind].latency == pytest.approx(alpha, rel=1e-3), kind
        assert fits[kind].bandwidth == pytest.approx(beta, rel=1e-3), kind
    # and the cluster prices what was measured
    group = list(range(ranks))
    alpha, beta = TRUE["collectives"]["all_reduce"]
    assert cluster.collective_time("all_reduce", group, 1e6) == pytest.approx(
        latency_steps("all_reduce", ranks) * alpha + 1e6 / beta, rel=1e-3)


def test_probe_steps_at_two_sizes_give_a_kernels_fixed_cost_and_its_in_step_scale():
    # Inside a step, matmuls run 1.3x slower than their isolated rate and
    # fused chains 0.4x the fused roofline; a small and a large probe step
    # separate that from each one's fixed cost.
    raw = synthetic(2)
    def gemm(flops: float) -> float:
        return flops / TRUE["gemm_rate"]

    def fused(flops: float, nbytes: float) -> float:
        bandwidth = TRUE["cache_bandwidth"] if nbytes <= TRUE["cache_bytes"] else TRUE["bandwidth"]
        return max(flops / max(TRUE["vector"], TRUE["cache_bandwidth"] / 12), nbytes / bandwidth)

    raw["probe"] = [["lg.matmul", f, 0.0, "f32", 1, 5e-6 + 1.3 * gemm(f)] for f in (2e3, 2e4, 2e7, 6e7)]
    raw["probe"] += [["plan.fused", f, 4 * f, "f32", 3, 3 * 1e-6 + 0.4 * fused(f, 4 * f)] for f in (1e3, 1e6, 1e7)]
    d = fit_cluster(raw).cluster.device
    assert d.kernel_scales["lg.matmul"] == pytest.approx(1.3, rel=1e-3)
    assert d.kernel_overheads["lg.matmul"] == pytest.approx(5e-6, rel=1e-3)
    assert d.kernel_scales["plan.fused"] == pytest.approx(0.4, rel=1e-3)
    assert d.kernel_overheads["plan.fused"] == pytest.approx(1e-6, rel=1e-3)
    # and the cluster prices the in-step time, not the isolated one
    cluster = fit_cluster(raw).cluster
    assert cluster.work_time("lg.matmul", 6e7, 0.0) == pytest.approx(5e-6 + 1.3 * gemm(6e7), rel=1e-3)
    # a kernel at one size only keeps scale 1 (its remainder is all fixed
    # cost); one at sizes apart whose in-step rate is the isolated one gets 1
    plain = fit_cluster(synthetic(2)).cluster.device
    assert "plan.fused" not in plain.kernel_scales and plain.kernel_overheads["plan.fused"] > 0
    assert plain.kernel_scales["lg.softmax"] == pytest.approx(1.0, rel=1e-3)
    # Where ranks outnumber cores (2 ranks on 1 here), a probe actor times a
    # core of its own while the rates were timed with 2 ranks on each: its
    # time at the rates' crowding is twice what it measured, fixed cost and
    # scale alike, and the simulator halves that again where its mate waits.
    shared = fit_cluster({**raw, "cores": 1}).cluster.device
    assert shared.timed_ranks_per_cpu == 2
    assert shared.kernel_scales["lg.matmul"] == pytest.approx(2 * 1.3, rel=1e-3)
    assert shared.kernel_overheads["lg.matmul"] == pytest.approx(2 * 5e-6, rel=1e-3)
    assert shared.kernel_scales["plan.fused"] == pytest.approx(2 * 0.4, rel=1e-3)
    # sbp-calibrate now times kernels a rank a core, the other ranks asleep:
    # the figures are as measured, and the simulator crowds them
    alone = fit_cluster({**raw, "cores": 1, "timed_ranks_per_core": 1}).cluster.device
    assert alone.timed_ranks_per_cpu == 1
    assert alone.kernel_scales["lg.matmul"] == pytest.approx(1.3, rel=1e-3)
    assert alone.kernel_overheads["lg.matmul"] == pytest.approx(5e-6, rel=1e-3)


def test_a_kernel_the_probe_does_not_run_is_priced_as_its_kind():
    # The probe times add and mul (elementwise) and softmax (a row kernel)
    # at sizes apart; tanh, exp and a layernorm it never runs take their
    # kind's median, a grouped matmul the GEMM rate and the matmul's
    # figures, a convolution (a window kernel: none probed) the GEMM rate alone.
    raw = synthetic(2)

    def core(flops: float, nbytes: float) -> float:
        bandwidth = TRUE["cache_bandwidth"] if nbytes <= TRUE["cache_bytes"] else TRUE["bandwidth"]
        return max(flops / TRUE["vector"], nbytes / bandwidth)

    timed = {"lg.add": (1e-6, 0.5), "lg.mul": (3e-6, 0.9), "lg.sub": (2e-6, 0.7), "lg.softmax": (4e-6, 1.5)}
    raw["probe"] = [[k, f, 12 * f, "f32", 1, fixed + scale * core(f, 12 * f)]
                    for k, (fixed, scale) in timed.items() for f in (1e3, 1e6, 1e7)]
    raw["probe"] += [["lg.matmul", f, 0.0, "f32", 1, 5e-6 + 1.3 * f / TRUE["gemm_rate"]] for f in (2e3, 2e7, 6e7)]
    cluster = fit_cluster(raw).cluster
    d = cluster.device
    assert d.kind_scales["elementwise"] == pytest.approx(0.7, rel=1e-3)  # the median of 0.5, 0.7, 0.9
    assert d.kind_overheads["elementwise"] == pytest.approx(2e-6, rel=1e-3)
    assert d.kind_scales["row"] == pytest.approx(1.5, rel=1e-3)
    assert "tanh" not in str(d.kernel_scales)
    for kernel in ("lg.tanh", "lg.exp"):
        assert cluster.work_time(kernel, 1e6, 12e6) == pytest.approx(2e-6 + 0.7 * core(1e6, 12e6), rel=1e-3)
    assert cluster.work_time("lg.layernorm", 1e6, 12e6) == pytest.approx(4e-6 + 1.5 * core(1e6, 12e6), rel=1e-3)
    assert cluster.work_time("lg.add", 1e6, 12e6) == pytest.approx(1e-6 + 0.5 * core(1e6, 12e6), rel=1e-3)
    grouped = cluster.work_time("lg.grouped_matmul", 6e7, 1e6)
    assert grouped == pytest.approx(5e-6 + 1.3 * 6e7 / TRUE["gemm_rate"], rel=1e-3)
    conv = cluster.work_time("lg.conv2d", 6e7, 1e6)
    assert conv == pytest.approx(d.kernel_overhead + 6e7 / TRUE["gemm_rate"], rel=1e-3)
    # a kind no probed kernel has: the device's own fixed cost and scale 1
    assert "gather" not in d.kind_scales
    assert cluster.work_time("lg.gather", 1e3, 1e4) == pytest.approx(d.kernel_overhead + core(1e3, 1e4), rel=1e-3)


def test_a_shared_core_sync_measured_apart_prices_the_cluster_grown_past_its_cores():
    # Two ranks with a core each meet no sync; four on their two cores did.
    raw = {**synthetic(2), "cores": 2, "sync": {"compute": 1.2e-3, "both": 1.3e-3, "lockstep": 0.1e-3},
           "shared_sync": {"ranks": 4, "cores": 2,
                           "sync": {"compute": 1.2e-3, "both": 1.45e-3, "lockstep": 0.1e-3}}}
    cluster = fit_cluster(raw).cluster
    assert cluster.levels[0].sync == pytest.approx(0.15e-3)
    alone = cluster.collective_time("all_reduce", [0, 1], 1e5)
    grown = cluster.resized(4)
    assert grown.collective_time("all_reduce", [0, 1], 1e5) == pytest.approx(alone)  # cores 0 and 1
    assert grown.collective_time("all_reduce", [0, 2], 1e5) == pytest.approx(alone + 0.15e-3)  # both on core 0


def test_memory_bandwidth_is_the_median_past_the_cache():
    # one slow outlier past the cache does not move it
    raw = synthetic(2)
    raw["elementwise"] = []
    for count in [2**e for e in range(10, 25)]:
        nbytes = 12.0 * count
        bw = TRUE["cache_bandwidth"] if nbytes <= TRUE["cache_bytes"] else TRUE["bandwidth"]
        raw["elementwise"].append([nbytes, TRUE["kernel"] + nbytes / bw])
    raw["elementwise"][-2][1] *= 3.0
    d = fit_cluster(raw).cluster.device
    assert d.memory_bandwidth == pytest.approx(TRUE["bandwidth"], rel=1e-3)
    assert d.cache_bandwidth == pytest.approx(TRUE["cache_bandwidth"], rel=1e-3)


def test_the_cost_of_members_arriving_apart_is_charged_to_every_collective():
    raw = synthetic(4)
    # 1.2 ms of skewed compute; with the collective 1.5 ms; the collective alone in lock-step 0.1 ms
    raw["sync"] = {"compute": 1.2e-3, "both": 1.5e-3, "lockstep": 0.1e-3}
    cluster = fit_cluster(raw).cluster
    assert cluster.levels[0].sync == pytest.approx(0.2e-3)
    without = fit_cluster(synthetic(4)).cluster
    group = [0, 1, 2, 3]
    for kind in ("all_reduce", "all_gather", "transfer"):
        extra = cluster.collective_time(kind, group[:2] if kind == "transfer" else group, 1e5) - \
            without.collective_time(kind, group[:2] if kind == "transfer" else group, 1e5)
        assert extra == pytest.approx(0.2e-3), kind
    assert cluster.collective_time("all_reduce", [0], 1e5) == without.collective_time("all_reduce", [0], 1e5)
    # arrivals that cost nothing beyond the lock-step time leave no sync cost (never a negative one)
    raw["sync"] = {"compute": 1.2e-3, "both": 1.25e-3, "lockstep": 0.1e-3}
    assert fit_cluster(raw).cluster.levels[0].sync == 0.0


def test_the_fitted_cluster_prices_each_measured_collective_size_as_measured():
    """The line is fitted over every size, but a collective of a measured
    size costs what it measured: an all_gather whose small messages hit a
    floor and whose 64 KB ones a knee (MPI's eager limit) fits no line."""
    raw = synthetic(2)
    measured = [[1e3, 20e-6], [1e4, 22e-6], [6.4e4, 60e-6], [1e6, 300e-6], [1e7, 2.2e-3]]
    raw["collectives"]["all_gather"] = measured
    cluster = fit_cluster(raw).cluster
    fit = cluster.levels[0].collectives["all_gather"]
    assert fit.members == 2 and [list(p) for p in fit.measured] == measured
    for volume, seconds in measured:
        assert cluster.collective_time("all_gather", [0, 1], volume) == pytest.approx(seconds), volume
    line = latency_steps("all_gather", 2) * fit.latency + 6.4e4 / fit.bandwidth
    assert abs(line / 60e-6 - 1) > 0.2  # what the line alone would have said
    # the other kinds' exact timings: their points and their line agree at
    # the sizes measured, and between them within the few percent that
    # log-log interpolation bends an affine cost
    alpha, beta = TRUE["collectives"]["reduce_scatter"]
    assert cluster.collective_time("reduce_scatter", [0, 1], 1e5) == pytest.approx(alpha + 1e5 / beta, rel=1e-3)
    assert cluster.collective_time("reduce_scatter", [0, 1], 3e5) == pytest.approx(alpha + 3e5 / beta, rel=0.05)


def test_noisy_timings_give_figures_within_the_noise():
    cluster = fit_cluster(synthetic(2, noise=0.03, seed=1)).cluster
    assert cluster.device.gemm_rate("f32") == pytest.approx(TRUE["gemm_rate"], rel=0.1)
    assert cluster.device.memory_bandwidth == pytest.approx(TRUE["bandwidth"], rel=0.1)
    assert cluster.levels[0].collectives["all_reduce"].bandwidth == pytest.approx(3e9, rel=0.15)


def test_the_fitted_cluster_is_a_valid_file(tmp_path):
    fitted = fit_cluster(synthetic(2), name="synthetic")
    path = tmp_path / "cluster.json"
    fitted.cluster.save(str(path))
    loaded = load_cluster(str(path))
    assert loaded == fitted.cluster
    assert json.loads(path.read_text())["name"] == "synthetic"
    assert "gemm GFLOP/s" in fitted.format()


def test_sbp_calibrate_fits_raw_timings_from_a_file(tmp_path, capsys):
    from sbpc.tools.sbp_calibrate import main

    raw = tmp_path / "raw.json"
    raw.write_text(json.dumps(synthetic(2)))
    out = tmp_path / "cluster.json"
    assert main(["--from-raw", str(raw), "-o", str(out)]) == 0
    assert "all_reduce GB/s" in capsys.readouterr().out
    assert load_cluster(str(out)).count == 2
    raw.write_text("{}")
    assert main(["--from-raw", str(raw), "-o", str(out)]) == 1
    assert "sbp-calibrate: error:" in capsys.readouterr().err


def test_a_quick_calibration_of_this_machine_names_it_and_measures_ranks_sharing_its_cores(tmp_path, capsys):
    # The whole path `make cpu-preset` takes, at the quick sizes: the ranks
    # time this machine, the fit writes a cluster that names the CPU, its
    # cores and BLAS kernels and the date, and the cost of collectives among
    # ranks that share a core comes from a run on more ranks than cores.
    import os

    from sbpc.tools.sbp_calibrate import main

    cores = len(os.sched_getaffinity(0))
    if cores > 4:
        pytest.skip(f"{2 * cores} ranks to share {cores} cores: this test is for small machines")
    out = tmp_path / "cpu.json"
    assert main(["-n", "2", "--quick", "--shared-ranks", str(2 * cores), "--name", "cpu", "-o", str(out)]) == 0
    printed = capsys.readouterr().out
    assert f"measured on {2 * cores} ranks sharing" in printed
    cluster = load_cluster(str(out))
    assert cluster.name == "cpu" and cluster.count == 2
    assert cluster.source.startswith("sbp-calibrate on 20") and " cores, " in cluster.source
    assert "BLAS" in cluster.source or "OpenBLAS" in cluster.source
    # (its value is the machine's: on a loaded one it reads near 0, the
    # fit's use of it is test_a_shared_core_sync_measured_apart_...)
    assert cluster.levels[0].sync >= 0 and cluster.levels[0].cores == cores
    assert {"gemm", "elementwise", "row", "fused"} <= set(cluster.device.kind_scales)
    assert "lg.conv2d" in cluster.device.kernel_overheads and "window" in cluster.device.kind_overheads  # (the CNN)
    # --add-kernels-to: the file without the convolutions' figures gets
    # them back, measured again; every figure it kept stays as it was
    d = cluster.device
    image = ("lg.conv2d", "lg.conv2d_grad_input", "lg.conv2d_grad_weight")
    lacking = replace(cluster, device=replace(
        d, kernel_overheads={k: v for k, v in d.kernel_overheads.items() if k not in image},
        kernel_scales={k: v for k, v in d.kernel_scales.items() if k not in image},
        kind_overheads={k: v for k, v in d.kind_overheads.items() if k != "window"},
        kind_scales={k: v for k, v in d.kind_scales.items() if k != "window"}))
    lacking.save(str(tmp_path / "lacking.json"))
    added_path = tmp_path / "added.json"
    assert main(["-n", "2", "--quick", "--add-kernels-to", str(tmp_path / "lacking.json"), "-o", str(added_path)]) == 0
    added = load_cluster(str(added_path))
    assert set(image) <= set(added.device.kernel_overheads) and "window" in added.device.kind_overheads
    for kernel, seconds in lacking.device.kernel_overheads.items():
        assert added.device.kernel_overheads[kernel] == seconds
    assert added.levels == lacking.levels and added.device.peak_flops == lacking.device.peak_flops
    assert "added by sbp-calibrate --add-kernels-to on 20" in added.source


def test_kernels_added_to_a_calibrated_cluster_leave_its_figures_as_they_were():
    """sbp-calibrate --add-kernels-to: the probe's kernels the cluster has no
    figures for (a convolution and its input's gradient, a window kind) are
    fitted against the cluster's own rates; what it had (the matmul's
    figures, the elementwise kind) stays, even where the new probe times
    those kernels otherwise."""
    from sbpc.perf.fit import add_kernel_costs

    raw = synthetic(2)
    raw["probe"] = [["lg.matmul", f, 0.0, "f32", 1, 5e-6 + 1.3 * f / TRUE["gemm_rate"]] for f in (2e3, 2e7, 6e7)]
    raw["probe"] += [["lg.add", f, 12 * f, "f32", 1, 1e-6 + 0.5 * f / TRUE["vector"]] for f in (1e3, 1e6, 1e7)]
    cluster = fit_cluster(raw).cluster
    probe = [["lg.matmul", f, 0.0, "f32", 1, 9e-6 + 3.0 * f / TRUE["gemm_rate"]] for f in (2e3, 2e7, 6e7)]
    probe += [["lg.conv2d", f, 0.0, "f32", 1, 6e-6 + 2.0 * f / TRUE["gemm_rate"]] for f in (2e4, 2e7, 6e7)]
    probe += [["lg.conv2d_grad_input", f, 0.0, "f32", 1, 8e-6 + 2.4 * f / TRUE["gemm_rate"]] for f in (2e4, 6e7)]
    added = add_kernel_costs(cluster, {"ranks": 2, "cores": 2, "date": "2026-11-30", "probe": probe}).cluster
    d, before = added.device, cluster.device
    assert d.kernel_scales["lg.conv2d"] == pytest.approx(2.0, rel=1e-3)
    assert d.kernel_overheads["lg.conv2d"] == pytest.approx(6e-6, rel=1e-3)
    assert d.kind_scales["window"] == pytest.approx(2.2, rel=1e-3)  # the median of 2.0 and 2.4
    for kernel in ("lg.matmul", "lg.add"):
        assert d.kernel_scales[kernel] == before.kernel_scales[kernel]
        assert d.kernel_overheads[kernel] == before.kernel_overheads[kernel]
    assert {k: v for k, v in d.kind_scales.items() if k != "window"} == before.kind_scales
    assert (d.gemm_rate("f32"), d.vector_flops, d.memory_bandwidth) == (
        before.gemm_rate("f32"), before.vector_flops, before.memory_bandwidth)
    assert added.levels == cluster.levels
    assert added.work_time("lg.matmul", 6e7, 0.0) == cluster.work_time("lg.matmul", 6e7, 0.0)
    assert added.work_time("lg.conv2d", 6e7, 0.0) == pytest.approx(6e-6 + 2.0 * 6e7 / TRUE["gemm_rate"], rel=1e-3)
    assert added.work_time("lg.conv2d_grad_weight", 6e7, 0.0) == pytest.approx(  # priced as its kind
        d.kind_overheads["window"] + 2.2 * 6e7 / TRUE["gemm_rate"], rel=1e-3)
    assert "lg.conv2d, lg.conv2d_grad_input added by sbp-calibrate --add-kernels-to on 2026-11-30" in added.source
    assert added.source.startswith(cluster.source)
    # a probe with nothing new leaves the cluster as it was
    assert add_kernel_costs(cluster, {"ranks": 2, "probe": probe[:3]}).cluster == cluster
