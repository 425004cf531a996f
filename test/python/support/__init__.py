"""Helpers the tests share, imported as `support.<module>`: pytest puts
test/python (the folder of conftest.py) on sys.path. alloc_probe.py is run
as a script under mpiexec."""
