"""The import rules that keep the layers visible (README, "Where to read next").

Every `import` in the project's packages, at module level or inside a function, is read
from the source and checked against the layer it sits in; a lower layer importing a higher
one fails here, naming the file, the line and the rule. Two process rules are checked by
importing in a fresh interpreter: a container's entry point stays light, and the rank
launcher (zygote) starts no thread and imports no torch before it forks.
"""
from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PACKAGES = ("chaos", "harness", "reports", "runfolder")

# layer (module prefix) -> module prefixes of this project it must not import
FORBIDDEN = {
    "chaos": ("harness", "reports", "runfolder"),
    "runfolder": ("chaos", "harness", "reports"),
    "reports": ("chaos", "harness"),
    "harness.signals": ("chaos", "harness.", "reports", "runfolder"),
    "harness.job": ("harness.cluster", "harness.run", "harness.k8s", "harness.cli",
                    "harness.pytest_plugin", "reports"),
    "harness.cluster": ("harness.run", "harness.k8s", "harness.cli", "harness.pytest_plugin", "reports"),
    "harness.run": ("harness.k8s", "harness.cli", "harness.pytest_plugin"),
    "harness.k8s": ("harness.cli", "harness.pytest_plugin"),
}


def _module_name(path: Path, repo: Path) -> str:
    parts = path.relative_to(repo).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> list[tuple[int, str]]:
    """(line, module) for every import; `from harness import signals` counts as
    harness.signals, `from harness.run.plan import TrialPlan` as harness.run.plan."""
    tree = ast.parse(path.read_text(), filename=str(path))
    return [found for node in ast.walk(tree) if isinstance(node, (ast.Import, ast.ImportFrom))
            for found in _imports_of(node)]


def _within(module: str, prefix: str) -> bool:
    if prefix.endswith("."):
        return module.startswith(prefix)
    return module == prefix or module.startswith(prefix + ".")


def _layer(module: str) -> str | None:
    matches = [layer for layer in FORBIDDEN if _within(module, layer)]
    return max(matches, key=len) if matches else None


def violations(repo: Path = REPO) -> list[str]:
    found = []
    for package in PACKAGES:
        for path in sorted((repo / package).rglob("*.py")):
            module = _module_name(path, repo)
            layer = _layer(module)
            if layer is None:
                continue
            for line, imported in _imports(path):
                if _within(imported, module):  # a package importing its own modules
                    continue
                for prefix in FORBIDDEN[layer]:
                    if _within(imported, prefix):
                        found.append(f"{path.relative_to(repo)}:{line}: {module} imports {imported} "
                                     f"({layer} must not import {prefix.rstrip('.')})")
    return found


def test_no_layer_imports_a_higher_one():
    assert violations() == []


def test_runfolder_uses_the_standard_library_only():
    outside = []
    for path in sorted((REPO / "runfolder").rglob("*.py")):
        for line, imported in _imports(path):
            top = imported.split(".")[0]
            if top not in sys.stdlib_module_names and top not in ("runfolder", "__future__"):
                outside.append(f"{path.relative_to(REPO)}:{line}: {imported}")
    assert outside == []


def import_circles(package: str, repo: Path = REPO) -> list[list[str]]:
    """The circles among `package`'s modules (imports under `if TYPE_CHECKING:` left out:
    they never run), each as the modules in order with the first repeated."""
    graph = {}
    for path in sorted((repo / package).rglob("*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        typing_only = {id(sub) for node in ast.walk(tree) if isinstance(node, ast.If)
                       and "TYPE_CHECKING" in ast.unparse(node.test) for sub in ast.walk(node)}
        graph[_module_name(path, repo)] = {
            m for node in ast.walk(tree) if id(node) not in typing_only and isinstance(node, (ast.Import, ast.ImportFrom))
            for _, m in _imports_of(node)}
    circles, done = [], set()

    def visit(module: str, path: list[str]) -> None:
        for imported in sorted(graph.get(module, ())):
            if imported in path:
                circles.append(path[path.index(imported):] + [imported])
            elif imported in graph and imported not in done:
                visit(imported, path + [imported])
        done.add(module)

    for module in graph:
        if module not in done:
            visit(module, [module])
    return circles


def _imports_of(node: ast.Import | ast.ImportFrom) -> list[tuple[int, str]]:
    if isinstance(node, ast.Import):
        return [(node.lineno, alias.name) for alias in node.names]
    if node.level or not node.module:
        return []
    if "." in node.module:
        return [(node.lineno, node.module)]
    return [(node.lineno, f"{node.module}.{alias.name}") for alias in node.names]


def test_the_fault_library_has_no_import_circle():
    assert import_circles("chaos") == []


def test_the_harness_has_no_import_circle():
    """Function-level imports included: a user's job starts through one entry
    (harness.cluster.jobstart), which uses preload and workers, never the other way."""
    assert import_circles("harness") == []


def test_an_import_circle_is_found(tmp_path):
    (tmp_path / "chaos").mkdir()
    (tmp_path / "chaos" / "a.py").write_text("from chaos import b\n")
    (tmp_path / "chaos" / "b.py").write_text("def f():\n    from chaos.a import x\n")
    (tmp_path / "chaos" / "c.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from chaos import a\n")
    assert import_circles("chaos", tmp_path) == [["chaos.a", "chaos.b", "chaos.a"]]


def test_the_rule_catches_a_violation(tmp_path):
    """The checker itself: a job module importing the orchestrator inside a function, and
    reports importing the harness, are both reported."""
    (tmp_path / "harness" / "job").mkdir(parents=True)
    (tmp_path / "harness" / "job" / "bad.py").write_text(
        "def f():\n    from harness.run.orchestrator import Trial\n")
    (tmp_path / "reports").mkdir()
    (tmp_path / "reports" / "bad.py").write_text("from harness import signals\n")
    assert violations(tmp_path) == ["harness/job/bad.py:2: harness.job.bad imports harness.run.orchestrator "
                            "(harness.job must not import harness.run)",
                                      "reports/bad.py:1: reports.bad imports harness.signals "
                                      "(reports must not import harness)"]


def _loaded_after(statement: str) -> dict:
    probe = (f"{statement}\nimport json, sys, threading\n"
             "print(json.dumps({'modules': sorted(sys.modules), 'threads': threading.active_count()}))")
    out = subprocess.run([sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True,
                         check=True, timeout=60).stdout
    return json.loads(out.splitlines()[-1])


HEAVY = ("torch", "pandas", "matplotlib", "pydantic", "yaml", "docker", "pyroute2")


@pytest.mark.parametrize("statement, allowed", [
    # PID 1 of a rank container: it must answer SIGTERM at once, before the heavy imports.
    ("import harness.cluster.container", ()),
    # The zygote imports torch in main(), after it knows it is the launcher; importing the
    # module must not, and must start no thread (fork from a multi-threaded process is unsafe).
    ("import harness.cluster.zygote", ("pydantic",)),
])
def test_process_entry_points_stay_light(statement, allowed):
    loaded = _loaded_after(statement)
    heavy = [m for m in loaded["modules"] if m.split(".")[0] in HEAVY and m.split(".")[0] not in allowed]
    assert heavy == []
    assert loaded["threads"] == 1
