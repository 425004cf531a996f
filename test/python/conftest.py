"""`make test` runs every layer's tests once; `make test-all` (SBPC_FULL=1)
adds the repeats: the same check on more rank counts, more variants of a
model already covered, longer hypothesis campaigns. A test or parameter
marked `full` is one of those repeats."""

from __future__ import annotations

import pytest
from support import FULL


def pytest_configure(config):
    config.addinivalue_line("markers", "full: a repeat that only `make test-all` (SBPC_FULL=1) runs")


def pytest_collection_modifyitems(config, items):
    if FULL:
        return
    skip = pytest.mark.skip(reason="a repeat of a covered case: make test-all (SBPC_FULL=1) runs it")
    for item in items:
        if "full" in item.keywords:
            item.add_marker(skip)
