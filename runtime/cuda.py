"""The CUDA path: NVRTC compiles generated kernels to PTX (no GPU needed),
PyCUDA loads and launches them (GPU needed).

- `compile_ptx(source)`: NVRTC through `cuda.bindings.nvrtc` (with the NVRTC
  library wheel pinned to the GPU driver's CUDA, 13.0), for compute_90,
  cached on disk by source hash.
- `check_ptx(ptx)`: runs `ptxas -arch=sm_90` where ptxas exists, which
  rejects what the driver would.
- `driver(rank)`: imports PyCUDA lazily and creates a context on GPU
  rank mod device count, or raises CudaUnavailable with the reason (no
  pycuda, no driver, no device). runtime/cuda_backend.py runs whole plans.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

ARCH = "compute_90"


class CudaUnavailable(Exception):
    """Why kernels cannot be compiled or launched here."""


def cache_dir() -> Path:
    root = Path(os.environ.get("SBPC_CACHE", Path.home() / ".cache" / "sbpc")) / "ptx"
    root.mkdir(parents=True, exist_ok=True)
    return root


def compile_ptx(source: str, name: str = "kernel.cu") -> bytes:
    """PTX for `source`, from the disk cache or NVRTC."""
    key = hashlib.sha256(f"{ARCH}\0{source}".encode()).hexdigest()
    cached = cache_dir() / f"{key}.ptx"
    if cached.exists():
        return cached.read_bytes()
    try:
        from cuda.bindings import nvrtc
    except ImportError as e:
        raise CudaUnavailable(f"no NVRTC binding ({e}); install sbpc[nvrtc]") from None
    err, program = nvrtc.nvrtcCreateProgram(source.encode(), name.encode(), 0, [], [])
    _check(nvrtc, err, "nvrtcCreateProgram")
    options = [f"--gpu-architecture={ARCH}".encode(), b"--std=c++17"]
    (err,) = nvrtc.nvrtcCompileProgram(program, len(options), options)
    if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        _, size = nvrtc.nvrtcGetProgramLogSize(program)
        log = b" " * size
        nvrtc.nvrtcGetProgramLog(program, log)
        raise RuntimeError(f"NVRTC could not compile {name}:\n{log.decode(errors='replace').strip()}")
    err, size = nvrtc.nvrtcGetPTXSize(program)
    _check(nvrtc, err, "nvrtcGetPTXSize")
    ptx = b" " * size
    (err,) = nvrtc.nvrtcGetPTX(program, ptx)
    _check(nvrtc, err, "nvrtcGetPTX")
    nvrtc.nvrtcDestroyProgram(program)
    ptx = ptx.rstrip(b"\0")
    tmp = cached.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_bytes(ptx)
    tmp.replace(cached)
    return ptx


def _check(nvrtc, err, what: str) -> None:
    if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        raise RuntimeError(f"{what} failed: {err}")


def ptxas() -> str | None:
    return shutil.which("ptxas")


def check_ptx(ptx: bytes) -> str:
    """ptxas's report (registers, shared memory) for sm_90, or raises."""
    tool = ptxas()
    if tool is None:
        raise CudaUnavailable("no ptxas on PATH")
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "k.ptx"
        path.write_bytes(ptx)
        done = subprocess.run([tool, "-arch=sm_90", "-v", str(path), "-o", str(Path(tmp) / "k.cubin")],
                              capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"ptxas rejected the PTX:\n{done.stderr.strip()}")
    return done.stderr


_DRIVER = None


def driver(rank: int = 0):
    """pycuda.driver with a context on this rank's GPU (rank mod the device
    count), or CudaUnavailable with the reason."""
    global _DRIVER
    if _DRIVER is None:
        try:
            import pycuda.driver as cuda
        except ImportError as e:
            raise CudaUnavailable(f"PyCUDA cannot load ({e})") from None
        except OSError as e:
            raise CudaUnavailable(f"no CUDA driver ({e})") from None
        try:
            cuda.init()
            count = cuda.Device.count()
            if count == 0:
                raise CudaUnavailable("no CUDA device")
            context = cuda.Device(rank % count).make_context()
        except cuda.Error as e:
            raise CudaUnavailable(f"no usable CUDA device ({e})") from None
        import atexit

        atexit.register(context.pop)
        _DRIVER = cuda
    return _DRIVER


def launch(source: str, entry: str, launch_dims, inputs, out_shape, dtype):
    """Runs one generated kernel on the GPU: inputs are numpy arrays; returns
    the output as a numpy array. For tests and the CUDA backend."""
    import numpy as np

    cuda = driver()
    module = cuda.module_from_buffer(compile_ptx(source) + b"\0")
    kernel = module.get_function(entry)
    buffers = [cuda.to_device(np.ascontiguousarray(x)) for x in inputs]
    out = np.empty(out_shape, dtype)
    out_gpu = cuda.mem_alloc(max(out.nbytes, 1))
    gx, gy, gz, bx, by, bz = launch_dims
    kernel(*buffers, out_gpu, block=(bx, by, bz), grid=(gx, gy, gz))
    cuda.memcpy_dtoh(out, out_gpu)
    return out
