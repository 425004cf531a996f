"""The graph that holds every lg op: the first split of the lit round-trip
test test/filecheck/lg/ops.mlir (the lit test keeps it complete), and feeds
in range for it (labels of its 4 classes, ids of table rows and of the
gathered axis). For the per-op tests of shape and SBP rules."""

from pathlib import Path

import numpy as np

import sbpc

OPS_FILE = Path(__file__).resolve().parents[2] / "filecheck" / "lg" / "ops.mlir"


def every_op_graph():
    """(module, feeds): parsing verifies each op's declared type against its rule."""
    text = OPS_FILE.read_text().split("// -----")[0]
    module = sbpc.parse_module("\n".join(line for line in text.splitlines() if not line.lstrip().startswith("//")))
    rng = np.random.default_rng(0)
    feeds = {"x": rng.normal(size=(8, 16)).astype(np.float32), "labels": rng.integers(0, 4, 8),
             "ids": rng.integers(0, 4, (2, 3)).astype(np.int32)}
    return module, feeds
