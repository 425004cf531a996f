"""The architecture, checked: layers import only downward, nothing imports
in a loop, and importing the IR does not drag in the API, the runtime or
MPI (docs/ARCHITECTURE.md describes the layers)."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

PACKAGES = {
    "sbpc.dialects": "dialects",
    "sbpc.semantics": "semantics",
    "sbpc.perf": "perf",
    "sbpc.codegen": "codegen",
    "sbpc.planning": "planning",
    "sbpc.lowering": "lowering",
    "sbpc.runtime": "runtime",
    "sbpc": "sbpc",
    "sbpc.tools": "tools",
}
"""Package -> folder (pyproject's package-dir), bottom layer first: the
order is the layering."""

LAYERS = {package: level for level, package in enumerate(PACKAGES)}


def modules() -> dict[str, Path]:
    found = {}
    for package, folder in PACKAGES.items():
        # a layer's subpackages (planning/autoplan/, sbpc/torch_import/) belong
        # to it; the links sbpc/<layer> are not the sbpc layer's subpackages
        paths = (ROOT / folder).rglob("*.py") if package != "sbpc" else [
            *(ROOT / folder).glob("*.py"),
            *(path for sub in sorted((ROOT / folder).iterdir()) if sub.is_dir() and not sub.is_symlink()
              for path in sub.rglob("*.py"))]
        for path in sorted(paths):
            parts = path.relative_to(ROOT / folder).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join((package, *parts))] = path
    return found


def layer(module: str) -> int:
    """The layer of `module`: its longest package prefix in PACKAGES."""
    while module not in LAYERS:
        module = module.rsplit(".", 1)[0]
    return LAYERS[module]


def imports(module: str, path: Path, known: dict[str, Path]) -> set[str]:
    """Every sbpc module `module` imports, at any depth (inside functions
    too): `from X import name` counts as importing X.name where that is a
    module, else X."""
    package = module if path.stem == "__init__" else module.rsplit(".", 1)[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base for alias in node.names]
        else:
            continue
        found.update(t for t in targets if t in known and t != module)
    return found


def graph() -> dict[str, set[str]]:
    known = modules()
    return {name: imports(name, path, known) for name, path in known.items()}


def test_every_module_has_a_layer():
    assert len(modules()) > 40
    for name in modules():
        layer(name)


def test_imports_point_only_downward():
    upward = [
        f"{a} (layer {layer(a)}) imports {b} (layer {layer(b)})"
        for a, targets in graph().items()
        for b in targets
        if layer(b) > layer(a)
    ]
    assert not upward, "\n".join(sorted(upward))


def test_no_import_cycles():
    edges = graph()
    state: dict[str, int] = {}
    stack: list[str] = []
    cycles = []

    def visit(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(edges[node]):
            if state.get(nxt) == 1:
                cycles.append(" -> ".join([*stack[stack.index(nxt):], nxt]))
            elif nxt not in state:
                visit(nxt)
        stack.pop()
        state[node] = 2

    for node in sorted(edges):
        if node not in state:
            visit(node)
    assert not cycles, "\n".join(cycles)


def test_the_checker_sees_upward_and_cyclic_imports(tmp_path):
    # The checks above must be able to fail: a lower module importing a
    # higher one, and a loop, are both found.
    known = {"sbpc.dialects.a": tmp_path / "a.py", "sbpc.runtime.b": tmp_path / "b.py"}
    known["sbpc.dialects.a"].write_text("def f():\n    from sbpc.runtime import b\n")
    known["sbpc.runtime.b"].write_text("from sbpc.dialects.a import f\n")
    a = imports("sbpc.dialects.a", known["sbpc.dialects.a"], known)
    b = imports("sbpc.runtime.b", known["sbpc.runtime.b"], known)
    assert a == {"sbpc.runtime.b"} and b == {"sbpc.dialects.a"}
    assert layer("sbpc.runtime.b") > layer("sbpc.dialects.a")


def test_importing_the_ir_loads_no_api_runtime_or_mpi():
    code = (
        "import sys\n"
        "import sbpc.dialects.lg, sbpc.dialects.sbp, sbpc.dialects.plan, sbpc.semantics.reference\n"
        "import sbpc.lowering.sbp_infer, sbpc.lowering.sbp_to_plan\n"
        "loaded = [m for m in sys.modules if m.startswith(('sbpc.api', 'sbpc.frontend', 'sbpc.runtime', 'mpi4py'))]\n"
        "print(loaded)\n"
        "assert not loaded, loaded\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_api_still_reaches_everything_lazily():
    import sbpc

    assert sbpc.Graph.__module__ == "sbpc.frontend"
    assert callable(sbpc.compile) and callable(sbpc.parse_module)
    assert set(sbpc.__all__) <= set(dir(sbpc))


def test_the_type_checker_sees_across_layers(tmp_path):
    # a value of one layer's type used as another: mypy resolves sbpc.<layer>
    # to the real files (the links sbpc/<layer> -> ../<layer>), where the
    # package-dir mapping alone made every cross-layer import Any
    planted = tmp_path / "planted.py"
    planted.write_text("from sbpc.dialects.sbp import Sbp\nfrom sbpc.runtime.program import check_feeds\n\n"
                       "wrong: int = Sbp.B\ncheck_feeds(3, {})\n")
    done = subprocess.run([sys.executable, "-m", "mypy", "--config-file", str(ROOT / "pyproject.toml"), str(planted)],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 1, done.stdout + done.stderr
    assert 'expression has type "Sbp", variable has type "int"' in done.stdout, done.stdout
    assert 'Argument 1 to "check_feeds" has incompatible type "int"' in done.stdout, done.stdout


def test_every_layer_is_linked_into_the_package_for_the_type_checker():
    for package, folder in PACKAGES.items():
        if package == "sbpc":
            continue
        link = ROOT / "sbpc" / package.removeprefix("sbpc.")
        assert link.is_symlink() and link.resolve() == (ROOT / folder).resolve(), link


def lowering_imports(path: Path) -> list[tuple[str, str]]:
    """(module, name) for every `from sbpc.lowering... import name` in `path`."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("sbpc.lowering"):
            found += [(node.module or "", alias.name) for alias in node.names]
        elif isinstance(node, ast.Import):
            found += [(alias.name, "*") for alias in node.names if alias.name.startswith("sbpc.lowering")]
    return found


def test_above_lowering_the_passes_are_only_run():
    # runtime/, sbpc/ and tools/ take a pass (or the registry of them) from
    # lowering/ to run it; what several layers share (plan facts, the
    # stage cutter, state key names) lives below lowering, not in a pass file
    import importlib

    from xdsl.passes import ModulePass

    wrong = []
    for name, path in modules().items():
        if layer(name) <= LAYERS["sbpc.lowering"]:
            continue
        for module, imported in lowering_imports(path):
            value = getattr(importlib.import_module(module), imported, None) if imported != "*" else None
            runs = imported == "PASSES" or (isinstance(value, type) and issubclass(value, ModulePass))
            if not runs:
                wrong.append(f"{name} imports {imported} from {module}")
    assert not wrong, "\n".join(wrong)


LOWERING_AFTER_INFERENCE = {
    "SbpInsertBoxingPass": "sbp-insert-boxing", "SbpSimplifyPass": "sbp-simplify",
    "SbpBucketCollectivesPass": "sbp-bucket-collectives", "SbpToPlanPass": "sbp-to-plan",
    "PlanFuseElementwisePass": "plan-fuse-elementwise", "PlanAllocateMemoryPass": "plan-allocate-memory",
    "PlanVerifyPass": "plan-verify"}
"""The passes after sbp-infer, by class and by pipeline name."""


PIPELINE_TEXT = re.compile("(?:{0})(?:{{[^}}]*}})? *, *(?:{0})".format("|".join(LOWERING_AFTER_INFERENCE.values())))
"""Two of those passes in pipeline text (`sbp-to-plan,plan-allocate-memory`)."""


def pass_lists(path: Path, root: Path = ROOT) -> list[str]:
    """The functions of a module that make two or more of the passes after
    inference (by class or in pipeline text): each is a list of them."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        made = {n.func.id for n in ast.walk(node) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)
                and n.func.id in LOWERING_AFTER_INFERENCE}
        texts = [n.value for n in ast.walk(node) if isinstance(n, ast.Constant) and isinstance(n.value, str)]
        if len(made) >= 2 or any(PIPELINE_TEXT.search(text) for text in texts):
            found.append(f"{path.relative_to(root)}: {node.name}")
    return found


def test_the_lowering_after_inference_is_defined_once():
    # compile, the planner's search and the layer profiler all lower through
    # lowering.compile.lowering_passes; a second list of those passes would
    # drift from it (there were three)
    lists = [f for path in modules().values() for f in pass_lists(path)]
    assert lists == ["lowering/compile.py: lowering_passes"], lists


def test_a_second_list_of_the_lowering_is_found(tmp_path):
    (tmp_path / "x.py").write_text(
        "def lower(m):\n    for p in (SbpInsertBoxingPass(), SbpSimplifyPass()):\n        p.apply(m)\n"
        "def text():\n    return 'sbp-to-plan,plan-allocate-memory'\n")
    assert [f.split(": ")[1] for f in pass_lists(tmp_path / "x.py", tmp_path)] == ["lower", "text"]



MIRROR_OF_LG = "sbpc.torch_import.aten."
"""The importer's ATen rules, grouped by the lg op family they produce:
aten/conv.py holds the rules that make what dialects/lg/conv.py defines."""


def test_no_public_class_or_module_name_means_two_things():
    # one meaning per name: a class name defined in two modules (DeviceKind
    # was an enum of the IR and a cluster's device figures) or two modules
    # named alike (two layout.py, two kernels.py) make a reader ask which
    classes: dict[str, list[str]] = {}
    stems: dict[str, list[str]] = {}
    for name, path in modules().items():
        if path.stem != "__init__" and not name.startswith(MIRROR_OF_LG):
            stems.setdefault(path.stem, []).append(name)
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
                classes.setdefault(node.name, []).append(name)
    assert len(classes) > 150
    twice = {k: v for k, v in {**classes, **stems}.items() if len(v) > 1}
    assert not twice, twice
