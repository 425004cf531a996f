"""The planted-bug harness (test/mutation/) stays runnable: every bug's text
is where the bug says, once, and the test it names exists and runs in
`make test`. Whether the suite kills each bug is `make mutation`'s job (it
runs a test file per bug: minutes); this only keeps a code change from
silently moving the ground under a bug."""

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "test" / "mutation"))

from bugs import BUGS  # noqa: E402 - the harness's folder, put on the path above


def test_there_are_at_least_25_bugs_with_distinct_names_across_the_layers():
    assert len(BUGS) >= 25
    assert len({b.name for b in BUGS}) == len(BUGS)
    assert {"lg", "sbp-rule", "boxing", "mpi", "memory", "executor", "optimizer", "rng", "importer",
            "cost"} <= {b.layer for b in BUGS}


def test_every_bug_finds_its_text_once_and_names_a_test_that_exists():
    for bug in BUGS:
        text = (ROOT / bug.path).read_text()
        assert text.count(bug.before) == 1, f"{bug.name}: its text occurs {text.count(bug.before)} times in {bug.path}"
        assert bug.before != bug.after, bug.name
        assert (ROOT / bug.test).is_file(), f"{bug.name}: no test {bug.test}"
        assert bug.test.startswith(("test/python/", "test/filecheck/")), bug.name


def test_the_harness_refuses_a_bug_whose_code_moved(tmp_path):
    import run  # test/mutation/run.py

    (tmp_path / "m.py").write_text("x = 1\n")
    moved = run.Bug("moved", "lg", "m.py", "x = 2", "x = 3", "test/python/test_planted_bugs.py")
    try:
        run.plant(moved, tmp_path)
    except run.Moved as e:
        assert "occurs 0 times" in str(e)
    else:
        raise AssertionError("a bug whose text is gone was planted")
    run.plant(run.Bug("here", "lg", "m.py", "x = 1", "x = 3", "t"), tmp_path)
    assert (tmp_path / "m.py").read_text() == "x = 3\n"
