"""What this machine is, for figures that name it: the CPU model and the
BLAS kernels numpy runs (a step's GEMM speed depends on them more than on
anything else). The calibration records both in a cluster file's source,
and the benchmarks print them beside their figures."""

from __future__ import annotations

import ctypes
import os
import platform

OPENBLAS_CORENAME_SYMBOLS = ("scipy_openblas_get_corename64_", "scipy_openblas_get_corename",
                             "openblas_get_corename64_", "openblas_get_corename")
"""`openblas_get_corename` as the builds numpy ships name it (the
scipy-openblas wheels prefix and suffix their symbols)."""


def openblas_core() -> str | None:
    """The kernel set of the OpenBLAS numpy loaded into this process (a
    process started from this one inherits its environment, so its choice
    too); None where numpy uses another BLAS or it cannot be asked."""
    import numpy  # noqa: F401  (loads its BLAS)

    try:
        with open("/proc/self/maps") as maps:
            paths = sorted({line.split()[-1] for line in maps if "openblas" in line.lower() and ".so" in line})
    except OSError:
        return None
    for path in paths:
        try:
            library = ctypes.CDLL(path)  # loaded already: this only looks its symbols up
        except OSError:
            continue
        for symbol in OPENBLAS_CORENAME_SYMBOLS:
            corename = getattr(library, symbol, None)
            if corename is not None:
                corename.restype = ctypes.c_char_p
                name = corename()
                return name.decode() if name else None
    return None


def cpu_model() -> str:
    """The CPU's model name with its family and model numbers (Linux's
    /proc/cpuinfo: a virtual machine may name only the product line), else
    what Python knows of the processor."""
    fields: dict[str, str] = {}
    try:
        with open("/proc/cpuinfo") as info:
            for line in info:
                key, _, value = line.partition(":")
                key = key.strip()
                if key in ("model name", "cpu family", "model") and key not in fields:
                    fields[key] = value.strip()
                if not line.strip() and fields:
                    break  # the first processor's block
    except OSError:
        pass
    name = fields.get("model name") or platform.processor() or platform.machine() or "unknown CPU"
    if "cpu family" in fields and "model" in fields:
        name += f" (family {fields['cpu family']}, model {fields['model']})"
    return name


def blas_kernels_named() -> str:
    """The OpenBLAS kernel set in use, and whether OPENBLAS_CORETYPE pinned it."""
    core = openblas_core()
    if core is None:
        return "not an OpenBLAS that names its kernels"
    pinned = os.environ.get("OPENBLAS_CORETYPE")
    return f"OpenBLAS kernels {core}" + (f" (pinned by OPENBLAS_CORETYPE={pinned})" if pinned else "")
