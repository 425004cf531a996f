"""The planted-bug harness: does the suite catch a wrong compiler?

Each bug in bugs.py is a small text change to one source file and the test
(a `make test` file, or one lit file) that must fail on it. For every bug the
harness copies the working tree, plants the bug in the copy, runs that test
there, and reports the bug killed (the test failed) or surviving (it passed).

- A bug whose text is not found exactly once is an error: the code moved and
  the bug must be moved with it, never counted as a pass.
- Before the bugs, each named test runs once on an unchanged copy: a test
  that fails there kills nothing (an error, too).
- A test that stops with an internal or collection error (a planted bug that
  breaks the syntax) is an error, not a kill: the bugs are meant to be
  wrong compilers, not broken files.

    python test/mutation/run.py [--jobs 2] [--only NAME ...] [--no-baseline] [--list]

Exit status 0 when every bug is killed and nothing erred. `make mutation`
runs it.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bugs import BUGS, Bug  # noqa: E402 - the folder of this script, put on the path above

ROOT = Path(__file__).resolve().parents[2]


class Moved(Exception):
    """A bug's text is not where the bug says: the code changed under it."""


def tree_files(root: Path) -> list[str]:
    """The tracked files and the untracked ones git does not ignore (a bug may
    be planted in work not yet committed)."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=root,
                            capture_output=True, check=True).stdout.decode()
    return [p for p in listed.split("\0") if p]


def copy_tree(root: Path, files: list[str], dest: Path) -> None:
    for name in files:
        src, dst = root / name, dest / name
        if not os.path.lexists(src):
            continue  # deleted in the working tree, not yet in git
        dst.parent.mkdir(parents=True, exist_ok=True)
        if src.is_symlink():
            os.symlink(os.readlink(src), dst)
        else:
            shutil.copy2(src, dst)


def plant(bug: Bug, tree: Path) -> None:
    path = tree / bug.path
    if not path.is_file():
        raise Moved(f"{bug.name}: {bug.path} does not exist")
    text = path.read_text()
    found = text.count(bug.before)
    if found != 1:
        raise Moved(f"{bug.name}: the text to change occurs {found} times in {bug.path} (expected once): "
                    "the code moved; move the bug with it")
    path.write_text(text.replace(bug.before, bug.after))


def test_command(test: str, select: str | None) -> list[str]:
    if test.endswith(".mlir"):
        return [str(Path(sys.executable).parent / "lit"), "-q", test]
    command = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", test]
    return command + (["-k", select] if select else [])


def run_test(tree: Path, test: str, select: str | None, timeout: float) -> tuple[str, float, str]:
    """('passed' | 'failed' | 'timed out' | 'error', seconds, the output's tail)."""
    env = {k: v for k, v in os.environ.items() if k not in ("SBPC_FULL", "SBPC_RANDOM_EXAMPLES")}
    env["PYTHONPATH"] = str(tree)  # the copy's sbpc, ahead of the installed (editable) one
    env["SBPC_VERIFY_EACH"] = "1"  # as `make test` runs
    start = time.perf_counter()
    try:
        done = subprocess.run(test_command(test, select), cwd=tree, env=env, capture_output=True, text=True,
                              timeout=timeout)
    except subprocess.TimeoutExpired:
        return "timed out", time.perf_counter() - start, ""
    seconds = time.perf_counter() - start
    tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-6:])
    if done.returncode == 0:
        return "passed", seconds, tail
    if test.endswith(".mlir") or done.returncode == 1:  # lit: 1 on a failed test; pytest: 1 = tests failed
        return "failed", seconds, tail
    return "error", seconds, tail


@dataclass
class Outcome:
    bug: Bug
    verdict: str  # killed, SURVIVED, ERROR
    seconds: float
    detail: str


def try_bug(bug: Bug, root: Path, files: list[str]) -> Outcome:
    with tempfile.TemporaryDirectory(prefix="sbpc-mutant-") as tmp:
        tree = Path(tmp) / "sbpc"
        copy_tree(root, files, tree)
        try:
            plant(bug, tree)
        except Moved as e:
            return Outcome(bug, "ERROR", 0.0, str(e))
        result, seconds, tail = run_test(tree, bug.test, bug.select, bug.timeout)
    if result in ("failed", "timed out"):
        return Outcome(bug, "killed", seconds, result)
    if result == "passed":
        return Outcome(bug, "SURVIVED", seconds, f"{bug.test} passed with the bug planted")
    return Outcome(bug, "ERROR", seconds, f"{bug.test} stopped with an error, not a failure:\n{tail}")


def baseline(tests: list[tuple[str, str | None]], root: Path, files: list[str], jobs: int) -> list[str]:
    """The named tests on an unchanged copy: the problems found."""
    with tempfile.TemporaryDirectory(prefix="sbpc-baseline-") as tmp:
        tree = Path(tmp) / "sbpc"
        copy_tree(root, files, tree)
        with ThreadPoolExecutor(jobs) as pool:
            results = list(pool.map(lambda t: run_test(tree, t[0], t[1], 600), tests))
    return [f"{test}{f' -k {select!r}' if select else ''} does not pass unchanged ({result}):\n{tail}"
            for (test, select), (result, _, tail) in zip(tests, results) if result != "passed"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=2, help="bugs tried at once (default 2)")
    parser.add_argument("--only", nargs="*", help="the bugs of these names")
    parser.add_argument("--no-baseline", action="store_true", help="skip running the tests unchanged first")
    parser.add_argument("--list", action="store_true", help="list the bugs and their tests, run nothing")
    args = parser.parse_args(argv)
    bugs = [b for b in BUGS if not args.only or b.name in args.only]
    if args.only and len(bugs) != len(set(args.only)):
        print(f"unknown bugs: {sorted(set(args.only) - {b.name for b in bugs})}", file=sys.stderr)
        return 2
    if args.list:
        for b in bugs:
            print(f"{b.layer:<12} {b.name:<40} {b.path:<40} {b.test}{f' -k {b.select!r}' if b.select else ''}")
        return 0
    start = time.perf_counter()
    files = tree_files(ROOT)
    if not args.no_baseline:
        tests = sorted({(b.test, b.select) for b in bugs}, key=lambda t: (t[0], t[1] or ""))
        problems = baseline(tests, ROOT, files, args.jobs)
        if problems:
            print("\n\n".join(problems), file=sys.stderr)
            return 1
        print(f"baseline: {len(tests)} tests pass unchanged ({time.perf_counter() - start:.0f} s)", flush=True)
    outcomes = []
    with ThreadPoolExecutor(args.jobs) as pool:
        for outcome in pool.map(lambda b: try_bug(b, ROOT, files), bugs):
            outcomes.append(outcome)
            print(f"{outcome.verdict:<9} {outcome.seconds:6.1f} s  {outcome.bug.layer:<12} {outcome.bug.name}  "
                  f"({outcome.bug.test}){'' if outcome.verdict == 'killed' else chr(10) + outcome.detail}",
                  flush=True)
    killed = sum(o.verdict == "killed" for o in outcomes)
    survived = [o.bug.name for o in outcomes if o.verdict == "SURVIVED"]
    erred = [o.bug.name for o in outcomes if o.verdict == "ERROR"]
    print(f"\n{killed} of {len(outcomes)} planted bugs killed; survived: {survived or 'none'}; "
          f"errors: {erred or 'none'} ({time.perf_counter() - start:.0f} s)")
    return 0 if killed == len(outcomes) else 1


if __name__ == "__main__":
    sys.exit(main())
