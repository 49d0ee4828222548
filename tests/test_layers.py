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
    "harness.job": ("harness.cluster", "harness.scenario", "harness.trial", "harness.studies", "harness.k8s",
                    "harness.cli", "harness.pytest_plugin", "reports"),
    "harness.cluster": ("harness.scenario", "harness.trial", "harness.studies", "harness.k8s", "harness.cli",
                        "harness.pytest_plugin", "reports"),
    # the harness process in three layers: the scenario model, the trial engine that runs
    # it, and the studies (tune, explore, nightly, campaign, init) that run many trials
    "harness.scenario": ("harness.trial", "harness.studies", "harness.k8s", "harness.cli", "harness.pytest_plugin"),
    "harness.trial": ("harness.studies", "harness.k8s", "harness.cli", "harness.pytest_plugin"),
    "harness.studies": ("harness.k8s", "harness.cli", "harness.pytest_plugin"),
    "harness.k8s": ("harness.studies", "harness.cli", "harness.pytest_plugin"),
}


def _module_name(path: Path, repo: Path) -> str:
    parts = path.relative_to(repo).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> list[tuple[int, str]]:
    """(line, module) for every import; `from harness import signals` counts as
    harness.signals, `from harness.trial.plan import TrialPlan` as harness.trial.plan."""
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


def import_circles(repo: Path = REPO, packages: tuple[str, ...] = PACKAGES) -> list[list[str]]:
    """The circles among the project's modules, each as the modules in order with the first
    repeated. Every import counts: at module level, inside a function, and under `if
    TYPE_CHECKING:` (a type a module needs is a dependency too: ownership runs one way)."""
    paths = {_module_name(path, repo): path for package in packages for path in sorted((repo / package).rglob("*.py"))}
    graph = {}
    for module, path in paths.items():
        tree = ast.parse(path.read_text(), filename=str(path))
        graph[module] = {target for node in ast.walk(tree) if isinstance(node, (ast.Import, ast.ImportFrom))
                         for target in _targets(node, paths)} - {module}
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


def _targets(node: ast.Import | ast.ImportFrom, modules: dict[str, Path]) -> list[str]:
    """The project modules an import reaches: `from harness.trial import plan` is
    harness.trial.plan where that is a module, else the package (harness.trial)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names if alias.name in modules]
    if node.level or not node.module:
        return []
    return [f"{node.module}.{alias.name}" if f"{node.module}.{alias.name}" in modules else node.module
            for alias in node.names if node.module in modules or f"{node.module}.{alias.name}" in modules]


def _imports_of(node: ast.Import | ast.ImportFrom) -> list[tuple[int, str]]:
    if isinstance(node, ast.Import):
        return [(node.lineno, alias.name) for alias in node.names]
    if node.level or not node.module:
        return []
    if "." in node.module:
        return [(node.lineno, node.module)]
    return [(node.lineno, f"{node.module}.{alias.name}") for alias in node.names]


def test_no_import_circle_among_the_projects_modules():
    """chaos/, harness/, reports/ and runfolder/ together: the undo table and heal report
    sit in a leaf (chaos.undotable), the cluster's value types apart from the interfaces and
    the registry (harness.cluster.spec), the docker mechanisms typed against a protocol."""
    assert import_circles() == []


def test_an_import_circle_is_found_through_any_kind_of_import(tmp_path):
    (tmp_path / "chaos").mkdir()
    (tmp_path / "chaos" / "__init__.py").write_text("")
    (tmp_path / "chaos" / "a.py").write_text("from chaos import b\n")
    (tmp_path / "chaos" / "b.py").write_text("def f():\n    from chaos.a import x\n")
    (tmp_path / "chaos" / "c.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from chaos import d\n")
    (tmp_path / "chaos" / "d.py").write_text("import chaos.c\n")
    assert import_circles(tmp_path, ("chaos",)) == [["chaos.a", "chaos.b", "chaos.a"],
                                                    ["chaos.c", "chaos.d", "chaos.c"]]


def test_the_rule_catches_a_violation(tmp_path):
    """The checker itself: a job module importing the orchestrator inside a function, reports
    importing the harness, the scenario model importing the trial engine and the trial
    engine importing a study are all reported."""
    (tmp_path / "harness" / "job").mkdir(parents=True)
    (tmp_path / "harness" / "job" / "bad.py").write_text(
        "def f():\n    from harness.trial.orchestrator import Trial\n")
    (tmp_path / "harness" / "scenario").mkdir()
    (tmp_path / "harness" / "scenario" / "bad.py").write_text("from harness.trial.plan import Plan\n")
    (tmp_path / "harness" / "trial").mkdir()
    (tmp_path / "harness" / "trial" / "bad.py").write_text("from harness.studies.nightly import Cell\n")
    (tmp_path / "reports").mkdir()
    (tmp_path / "reports" / "bad.py").write_text("from harness import signals\n")
    assert violations(tmp_path) == [
        "harness/job/bad.py:2: harness.job.bad imports harness.trial.orchestrator "
        "(harness.job must not import harness.trial)",
        "harness/scenario/bad.py:1: harness.scenario.bad imports harness.trial.plan "
        "(harness.scenario must not import harness.trial)",
        "harness/trial/bad.py:1: harness.trial.bad imports harness.studies.nightly "
        "(harness.trial must not import harness.studies)",
        "reports/bad.py:1: reports.bad imports harness.signals (reports must not import harness)"]


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
