"""The CUDA path: NVRTC compiles generated kernels to PTX (no GPU needed),
the CUDA driver API (NVIDIA's `cuda.bindings.driver`) loads and launches them
(GPU needed).

- `compile_ptx(source)`: NVRTC through `cuda.bindings.nvrtc` (with the NVRTC
  library wheel pinned to the GPU driver's CUDA, 13.0), for compute_90,
  cached on disk by source hash.
- `check_ptx(ptx)`: runs `ptxas -arch=sm_90` where ptxas exists, which
  rejects what the driver would.
- `driver(rank)`: a `Driver` with the primary context of GPU rank mod
  device count current, or CudaUnavailable with the reason (no binding, no
  driver, no device). runtime/cuda_backend.py runs whole plans.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import numpy as np

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


class Driver:
    """The CUDA driver API through NVIDIA's own binding (`cuda.bindings.driver`,
    the package that already gives NVRTC), with the primary context of one
    GPU current. Addresses are ints; every call's error is raised with the
    driver's own text. No PyCUDA: it has no wheel and must be built against
    a driver, which the GPU machines cannot fetch."""

    def __init__(self, ordinal: int):
        try:
            from cuda.bindings import driver as cu
        except ImportError as e:
            raise CudaUnavailable(f"no CUDA driver binding ({e}); install sbpc[nvrtc]") from None
        self.cu = cu
        try:
            (err,) = cu.cuInit(0)
        except RuntimeError as e:  # the binding could not find libcuda: no driver installed
            raise CudaUnavailable(f"no CUDA driver ({e})") from None
        if err != cu.CUresult.CUDA_SUCCESS:
            raise CudaUnavailable(f"no usable CUDA driver ({self._text(err)})")
        count = self._call("cuDeviceGetCount")
        if count == 0:
            raise CudaUnavailable("no CUDA device")
        self.device = self._call("cuDeviceGet", ordinal % count)
        self.name = self._call("cuDeviceGetName", 256, self.device).split(b"\0")[0].decode()
        self.context = self._call("cuDevicePrimaryCtxRetain", self.device)
        self._call("cuCtxSetCurrent", self.context)
        self._keep: list = []  # PTX images and argument arrays a launch still points into

    def _text(self, err) -> str:
        _, text = self.cu.cuGetErrorString(err)
        return f"{err.name}: {text.decode() if text else 'unknown error'}"

    def _call(self, name: str, *args):
        err, *results = getattr(self.cu, name)(*args)
        if err != self.cu.CUresult.CUDA_SUCCESS:
            raise RuntimeError(f"CUDA {name} failed ({self._text(err)})")
        return results[0] if len(results) == 1 else tuple(results) if results else None

    def alloc(self, nbytes: int) -> int:
        """Zeroed device memory (a rank's two regions live as long as it; `free` the rest)."""
        address = int(self._call("cuMemAlloc", max(nbytes, 1)))
        self._call("cuMemsetD8", address, 0, max(nbytes, 1))
        return address

    def free(self, address: int) -> None:
        self._call("cuMemFree", address)

    def pinned(self, nbytes: int):
        """Zeroed page-locked host memory as a numpy byte array."""
        address = int(self._call("cuMemHostAlloc", max(nbytes, 1), 0))
        array = np.ctypeslib.as_array((ctypes.c_uint8 * max(nbytes, 1)).from_address(address))[:nbytes]
        array[...] = 0
        return array

    def upload(self, address: int, host) -> None:
        if host.nbytes:
            self._call("cuMemcpyHtoD", address, np.ascontiguousarray(host).ctypes.data, host.nbytes)

    def download(self, host, address: int) -> None:
        assert host.flags.c_contiguous, "a download lands in a contiguous array"
        if host.nbytes:
            self._call("cuMemcpyDtoH", host.ctypes.data, address, host.nbytes)

    def copy(self, dst: int, src: int, nbytes: int) -> None:
        if nbytes:
            self._call("cuMemcpyDtoD", dst, src, nbytes)

    def function(self, ptx: bytes, entry: str):
        """The kernel `entry` of a PTX image, loaded into this context."""
        image = np.frombuffer(ptx + b"\0", np.uint8)
        self._keep.append(image)
        module = self._call("cuModuleLoadData", image.ctypes.data)
        return self._call("cuModuleGetFunction", module, entry.encode())

    def launch(self, function, grid, block, pointers: list[int]) -> None:
        """Launches `function` on the default stream with device pointers as
        its arguments (what every generated kernel takes)."""
        values = np.asarray(pointers, np.uint64)
        params = np.asarray([values.ctypes.data + 8 * i for i in range(len(pointers))], np.uint64)
        self._call("cuLaunchKernel", function, *grid, *block, 0, 0, params.ctypes.data, 0)

    def synchronize(self) -> None:
        self._call("cuCtxSynchronize")

    def best_time(self, call, repeats: int) -> float:
        """The best of `repeats` runs of `call` (which launches work), in
        seconds, from CUDA events around it, after one warm-up run."""
        call()
        best = float("inf")
        for _ in range(repeats):
            start, end = self._call("cuEventCreate", 0), self._call("cuEventCreate", 0)
            self._call("cuEventRecord", start, 0)
            call()
            self._call("cuEventRecord", end, 0)
            self._call("cuEventSynchronize", end)
            best = min(best, self._call("cuEventElapsedTime", start, end) / 1e3)
            self._call("cuEventDestroy", start)
            self._call("cuEventDestroy", end)
        return best


_DRIVER: Driver | None = None


def driver(rank: int = 0) -> Driver:
    """The driver with a context on this rank's GPU (rank mod the device
    count), or CudaUnavailable with the reason."""
    global _DRIVER
    if _DRIVER is None:
        _DRIVER = Driver(rank)
    return _DRIVER


def launch(source: str, entry: str, launch_dims, inputs, out_shape, dtype):
    """Runs one generated kernel on the GPU: inputs are numpy arrays; returns
    the output as a numpy array. For tests and the benchmark."""
    gpu = driver()
    function = gpu.function(compile_ptx(source), entry)
    buffers = []
    for x in inputs:
        x = np.ascontiguousarray(x)
        buffers.append(gpu.alloc(x.nbytes))
        gpu.upload(buffers[-1], x)
    out = np.empty(out_shape, dtype)
    out_gpu = gpu.alloc(out.nbytes)
    gx, gy, gz, bx, by, bz = launch_dims
    gpu.launch(function, (gx, gy, gz), (bx, by, bz), [*buffers, out_gpu])
    gpu.download(out, out_gpu)
    for address in (*buffers, out_gpu):
        gpu.free(address)
    return out
