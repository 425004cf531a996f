# The two commands of the README:
#   make run    set up, then run the main job
#   make test   set up, then run every test (ruff, mypy, lit, pytest)
# Both create the virtual environment .venv on first use. `make test-all`
# adds the repeats that `make test` leaves out (test/python/conftest.py):
# the whole rank-count matrix, longer random-graph campaigns.

VENV ?= .venv
PYTHON ?= python3
BIN := $(VENV)/bin

# Bytecode: pip's own compile at install runs on one core over all 12,000
# Python files of the environment, though the tests import about 3,700 of
# them. Setup compiles, on every core (compileall -j 0), the packages the
# tests import, less the parts they never do: test folders, the model
# definitions of transformers (the tests build a few families), torch's
# inductor, and the tools' own packages (pip, setuptools, mypy: compiled
# with mypyc). Python writes the bytecode of anything else as it first
# imports it: make's recipes run with PYTHONDONTWRITEBYTECODE emptied
# (emptied, not unset, so that one in the caller's environment cannot make
# every process compile from source). As with pip's compile, a file this
# Python cannot compile is skipped (torch ships a test helper in 3.12
# syntax). Setup from a fresh clone took 51 s with pip's compile; the
# compile step now takes 14 s of wall time (24 s over everything but
# transformers' models), the install before it 16-33 s as the package
# index answers (2-core Intel Xeon, 2026-11-29).
export PYTHONDONTWRITEBYTECODE :=
NOT_COMPILED := /tests?/|/testing/|/transformers/models/|/torch/_inductor/|/sympy/physics/|/scipy/(stats|signal|interpolate|integrate|ndimage|io)/|/(pip|setuptools|mypy|mypyc|pygments|pydantic|rich)/

.PHONY: run test test-all mutation lint typecheck lit pytest setup clean cpu-preset

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet --no-compile -e ".[test]"
	$(BIN)/python -m compileall -q -j 0 -x '$(NOT_COMPILED)' $(VENV)/lib > /dev/null 2>&1 || true
	touch $@

run: setup
	$(BIN)/sbp-opt examples/mlp.mlir -p 'compile{to_plan=false}',sbp-comm-summary
	$(BIN)/python examples/mlp.py
	$(BIN)/python examples/train_mlp.py --ranks 2 --steps 60
	$(BIN)/python examples/gpt.py --ranks 2 --steps 300
	$(BIN)/python examples/gpt.py --ranks 4 --parallel tp --steps 120
	$(BIN)/python examples/gpt.py --ranks 4 --parallel pipeline --steps 120
	$(BIN)/python examples/torch_gpt.py --ranks 2 --steps 200
	$(BIN)/python examples/hf_gpt2.py --ranks 2 --steps 200
	$(BIN)/python examples/hf_resnet.py --ranks 2 --steps 60

# pytest shares the test files between two processes (pytest-xdist; a
# file's tests stay together, so its fixtures and rank pools are made once):
# most tests compile in one Python process and would leave a core idle.
# mypy runs on one core, so it runs beside lit (each one's output kept
# together); pytest follows once both have passed.
test: lint
	$(MAKE) --no-print-directory -j2 --output-sync=target typecheck lit
	$(MAKE) --no-print-directory pytest

test-all: setup
	SBPC_FULL=1 SBPC_RANDOM_EXAMPLES=200 $(MAKE) --no-print-directory test

# Planted bugs (test/mutation/bugs.py) the suite must kill: each is planted
# in a copy of the tree and the test file it names is run there. Minutes;
# not part of `make test`.
mutation: setup
	$(BIN)/python test/mutation/run.py

# The cpu preset (perf/cpu.json), measured again on this machine: 2 ranks,
# and a collective's cost where 4 ranks share its 2 cores. Seconds; on an
# idle machine of the kind the preset describes (2 cores).
cpu-preset: setup
	$(BIN)/sbp-calibrate -n 2 --shared-ranks 4 --name cpu -o perf/cpu.json

lint: setup
	$(BIN)/ruff check .

typecheck: setup
	$(BIN)/mypy

lit: setup
	SBPC_VERIFY_EACH=1 $(BIN)/lit -v test/filecheck

pytest: setup
	SBPC_VERIFY_EACH=1 $(BIN)/python -m pytest -q -n 2 --dist loadfile test/python

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis .mypy_cache .ruff_cache
