"""The CUDA execution backend (runtime/cuda_backend.py). Host logic
(pointers, staging, copies) is checked on CPU: plain functions directly,
and the whole CudaExecutor on EmulatedGpu, which keeps device memory in a
numpy array and runs each actor's numpy kernel at the pointers the
executor passes (no CUDA code runs). The same MLP training plan runs for
real only where a GPU and its driver are present. The generated kernels
themselves are compiled and launched in test/python/codegen/."""

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from support.gpu import gpu_or_skip
from xdsl.context import Context

import sbpc
from sbpc.dialects import plan
from sbpc.lowering.compile import CompilePass
from sbpc.runtime import cuda
from sbpc.semantics.reference import evaluate
from sbpc.tools.sbp_run import generated_feeds

nvrtc = pytest.importorskip("cuda.bindings.nvrtc", reason="the NVRTC binding is part of sbpc[test]")


EXAMPLES = Path(__file__).resolve().parents[3] / "examples"


def mlp_train_text(ranks: int, device: str = "cuda") -> str:
    text = (EXAMPLES / "mlp_train.mlir").read_text()
    line = "sbp.placement @dp cpu ranks [0, 1, 2, 3] mesh [4]"
    assert line in text
    ranks_text = ", ".join(map(str, range(ranks)))
    return text.replace(line, f"sbp.placement @dp {device} ranks [{ranks_text}] mesh [{ranks}]")


def cuda_plan(ranks: int):
    module = sbpc.parse_module(mlp_train_text(ranks))
    CompilePass().apply(Context(), module)
    return module, next(p for p in module.ops if isinstance(p, plan.ProgramOp))


def test_launch_pointers_and_staging_follow_the_memory_plan():
    from sbpc.runtime import cuda_backend as cb

    module, program = cuda_plan(2)
    assert cb.is_cuda_program(program)
    for device in program.devices():
        registers = {r.sym_name.data: r for r in device.registers()}
        arena, persistent = cb.region_sizes(device)
        bases = (1 << 32, 1 << 40)
        limits = {bases[0]: arena, bases[1]: persistent}
        comm_seen = 0
        for actor in device.actors():
            for step in (0, 1, 2):
                if isinstance(actor, plan.ComputeOp):
                    refs = [*actor.ins.data, actor.outs.data[0]]
                    args = cb.launch_arguments(actor, registers, step, bases)
                    assert len(args) == len(refs)
                    for ref, address in zip(refs, args):
                        reg = registers[ref.string_value()]
                        base = bases[1] if reg.is_persistent is not None else bases[0]
                        slot = step % reg.slots.value.data
                        assert address == base + reg.offset.value.data + slot * reg.bytes.value.data
                        assert base <= address and address + reg.bytes.value.data <= base + limits[base]
                else:
                    down, up = cb.staging(actor, registers, step)
                    assert [s.nbytes for s in down] == [
                        registers[r.string_value()].bytes.value.data for r in actor.ins.data
                    ]
                    assert [s.nbytes for s in up] == [
                        registers[r.string_value()].bytes.value.data for r in actor.outs.data
                    ]
                    comm_seen += 1
        assert comm_seen, "a 2-rank data-parallel step has collectives to stage"


def test_the_backend_runs_on_an_emulated_gpu_in_process():
    from mpi4py import MPI

    from sbpc.runtime.cuda_backend import CudaExecutor, EmulatedGpu
    from sbpc.runtime.executor import Executor

    module, program = cuda_plan(1)
    feeds = generated_feeds(program, 2)
    gpu = EmulatedGpu()
    results = []
    executors = (CudaExecutor(module, program, MPI.COMM_WORLD, gpu=gpu), Executor(module, program, MPI.COMM_WORLD))
    for executor in executors:
        executor.initialize()
        executor.feed(feeds)
        results.append({k: v[2] for k, v in executor.run(2).items()})  # two steps: parameters written back on the GPU
    on_gpu, on_cpu = results
    for name in on_cpu:
        np.testing.assert_array_equal(on_gpu[name], on_cpu[name], err_msg=name)
    launched = {name for name, _ in gpu.launches}
    generated = {a.sym_name.data for a in program.devices()[0].actors()
                 if isinstance(a, plan.ComputeOp) and "cuda.source" in a.attributes}
    assert generated and launched == generated
    kinds = {kind for kind, _, _ in gpu.copies}
    assert {"htod", "dtoh"} <= kinds  # parameters and feeds up, fetches down
    assert ("dtod" in kinds) == bool(executors[0].updates)  # updated parameters, in place on the GPU


def run_mlp_and_compare(ranks: int, tmp_path, env: dict, rtol: float, atol: float) -> None:
    """sbp-run trains the MLP on `ranks` CUDA ranks; its outputs match the reference."""
    path = tmp_path / "mlp.mlir"
    path.write_text(mlp_train_text(ranks))
    done = subprocess.run([sys.executable, "-m", "sbpc.tools.sbp_run", str(path), "-n", str(ranks), "--seed", "3",
                           "-o", str(tmp_path / "o.npz")], capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr
    _, program = cuda_plan(ranks)
    expected = evaluate(sbpc.parse_module(path.read_text()), generated_feeds(program, 3))
    with np.load(tmp_path / "o.npz") as got:
        for name in expected:
            np.testing.assert_allclose(got[name], expected[name], rtol=rtol, atol=atol, err_msg=name)


@pytest.mark.parametrize("ranks", [1, 2])
def test_the_backend_on_an_emulated_gpu_matches_the_reference_on_mpi_ranks(ranks, tmp_path):
    run_mlp_and_compare(ranks, tmp_path, dict(os.environ, SBPC_CUDA_EMULATE="1"), 1e-4, 1e-5)


@pytest.mark.parametrize("ranks", [1, 2])
def test_mlp_forward_and_backward_on_gpus_match_the_reference(ranks, tmp_path):
    gpu_or_skip()
    env = {k: v for k, v in os.environ.items() if k != "SBPC_CUDA_EMULATE"}
    run_mlp_and_compare(ranks, tmp_path, env, 1e-3, 1e-4)


def test_a_cuda_plan_without_a_gpu_is_a_clear_error(tmp_path):
    try:
        cuda.driver()
        pytest.skip("this machine has a GPU")
    except cuda.CudaUnavailable:
        pass
    path = tmp_path / "mlp.mlir"
    path.write_text(mlp_train_text(1))
    env = {k: v for k, v in os.environ.items() if k != "SBPC_CUDA_EMULATE"}
    done = subprocess.run([sys.executable, "-m", "sbpc.tools.sbp_run", str(path), "-n", "1", "-o",
                           str(tmp_path / "o.npz")], capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 1
    assert "the plan is placed on CUDA devices but this rank has none" in done.stderr
    assert "Traceback" not in done.stderr


def losses_printed(stdout: str) -> list[float]:
    return [float(line.split("loss")[1].split()[0]) for line in stdout.splitlines() if line.startswith("step")]


def test_the_gpt_example_trains_on_cuda_devices_as_on_cpus():
    """examples/gpt.py --device cuda: each rank's plan on a GPU (emulated on
    CPU where there is none, so the flag is checked everywhere), the losses
    it prints those of the CPU run."""
    try:
        cuda.driver()
        env, tolerance = {k: v for k, v in os.environ.items() if k != "SBPC_CUDA_EMULATE"}, 2e-3
    except cuda.CudaUnavailable:
        # numpy's kernels on the emulated GPU, the generated C ones on the CPU ranks: the losses agree
        # to float32 rounding, so the 4 printed decimals may differ in the last one
        env, tolerance = dict(os.environ, SBPC_CUDA_EMULATE="1"), 1e-4
    runs = {}
    for device in ("cpu", "cuda"):
        done = subprocess.run([sys.executable, str(EXAMPLES / "gpt.py"), "--ranks", "1", "--steps", "5", "--layers",
                               "1", "--device", device], capture_output=True, text=True, timeout=300, env=env)
        assert done.returncode == 0, done.stdout + done.stderr
        assert "MISMATCH" not in done.stdout
        runs[device] = losses_printed(done.stdout)
    assert len(runs["cpu"]) == 5  # step 0, then every step
    np.testing.assert_allclose(runs["cuda"], runs["cpu"], rtol=tolerance, atol=0)
