"""`make test` runs every layer's tests once; `make test-all` (SBPC_FULL=1)
adds the repeats: the same check on more rank counts, more variants of a
model already covered, longer hypothesis campaigns. A test or parameter
marked `full` is one of those repeats."""

from __future__ import annotations

import gc

import pytest
from support import FULL


def pytest_configure(config):
    config.addinivalue_line("markers", "full: a repeat that only `make test-all` (SBPC_FULL=1) runs")
    # A test process builds, runs and drops IR, models and executables by
    # the hundred thousand objects: most of them live through a few young
    # collections and die soon after, yet with Python's thresholds (700, 10,
    # 10) they were promoted and walked by full collections again and again,
    # with the 400k objects of torch's and transformers' imports: 31 s of
    # CPU over `make test`'s two test processes, against 11 s with young
    # collections at 20000 allocations and the imports frozen once the
    # tests are collected. It changes when garbage is found, not what runs.
    gc.set_threshold(20000, 20, 20)


def pytest_collection_finish(session):
    gc.collect()
    gc.freeze()  # what the test modules imported, out of every later collection's walk


def pytest_sessionfinish(session, exitstatus):
    # The run's garbage collected here, inside the session, and what lives
    # on frozen: pytest's own collection at unconfigure (it reports what
    # finalizers raised) then walks no heap. An xdist worker unconfigures
    # after it has reported its end, and execnet interrupts a worker still
    # busy 5 s later: with about 2M objects alive (caches of signatures and
    # checked ops, the models' modules), that one collection took 1.3 s idle
    # and, beside the other busy worker, past the 5 s (a KeyboardInterrupt
    # in hypothesis's gc callback, reported as a warning after the run).
    gc.collect()
    gc.freeze()


SLOWEST_FIRST = (
    "e2e/test_hf_models.py", "runtime/test_faults.py", "api/test_torch_frontend.py", "runtime/test_mpi_runtime.py",
    "planning/test_autoplan.py", "runtime/test_hosts.py", "e2e/test_hf_families.py", "runtime/test_checkpoint.py",
    "e2e/test_training.py", "codegen/test_generators.py", "runtime/test_numpy_kernels.py",
)
"""The files that take longest (make test, 2-core Intel Xeon, 2026-11-29:
56 s down to 18 s), handed to the two test processes first: pytest-xdist
gives out files in the order collected, and one of these collected last
(runtime/ sorts late) kept one process busy for half a minute after the
other had finished. The order of the rest is unchanged."""


def pytest_collection_modifyitems(config, items):
    rank = {name: i for i, name in enumerate(SLOWEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::")[0].removeprefix("test/python/"), len(rank)))
    if FULL:
        return
    skip = pytest.mark.skip(reason="a repeat of a covered case: make test-all (SBPC_FULL=1) runs it")
    for item in items:
        if "full" in item.keywords:
            item.add_marker(skip)
