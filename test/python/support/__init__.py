"""Helpers the tests share, imported as `support.<module>`: pytest puts
test/python (the folder of conftest.py) on sys.path. alloc_probe.py is run
as a script under mpiexec."""

import os

FULL = os.environ.get("SBPC_FULL") == "1"
"""`make test-all`: the repeats and the longer slices run too (conftest.py)."""
