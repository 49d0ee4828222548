"""`pytest scenarios/`: every scenario YAML file is collected as tests, one per policy.

    scenarios/link_down.yaml::timeout   runs the scenario under `timeout` on a fresh cluster,
                                        analyzes it, and fails naming the expectation that
                                        broke, the measured value and `chaos run ... --seed N`

A thin layer over `harness.trial.check.check_policy`: options (the `chaos` group), the fixture
`chaos_check` (run one policy of a scenario file; usable from Python tests too; the
session's checks share one rank launcher, `chaos_launchers`), markers
(chaos_scenario always; the trial's tier unless it is the default, so `nightly` for a trial its
scenario's `tier:` leaves to the nights (harness.scenario.tiers); requires_root for a backend that
needs it, requires_docker for docker, requires_netem for kinds only netem injects), skips with the reason
`chaos doctor` gives for a fault kind this machine cannot inject, the fault timeline and
the tail of each rank's log on a failing test, and a runtime table at the end.
Registered as a `pytest11` entry point, so `pytest path/to/scenarios/` works in any
project where the harness is installed; it collects only YAML files that are scenarios (a
top-level `faults:` or `policies:` key), and imports the harness only when it does. Ctrl-C,
SIGTERM or SIGHUP tears the running trial down (the orchestrator's teardown runs on every
path) and stops the session.
"""
from __future__ import annotations

import math
import os
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator

import pytest

from chaos.errors import ChaosError
from harness.cluster.backends import BACKEND_NAMES, backend_class, traits_of
from harness.scenario.tiers import DEFAULT_TIER, TIERS

if TYPE_CHECKING:
    from harness.cluster.launcher import LauncherPool
    from harness.scenario.scenario import Scenario
    from harness.trial.check import PolicyCheck

_RESULTS = pytest.StashKey[list["PolicyCheck"]]()
# the runtime table's lines, one per check, in plain types: a pytest-xdist worker sends its
# own to the controller, which prints the table (`./dev.sh test` runs two workers)
_LINES = pytest.StashKey[list[dict[str, Any]]]()
WORKER_LINES = "chaos_checks"
_SCENARIO_KEY = re.compile(rb"^(faults|policies):", re.MULTILINE)


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("chaos", "chaos scenarios (scenarios/*.yaml)")
    group.addoption("--chaos-out", metavar="DIR",
                    help="folder for the run folders (default: a pytest temporary folder)")
    group.addoption("--backend", choices=BACKEND_NAMES,
                    help="run every scenario on this host backend (overrides cluster.backend)")
    group.addoption("--chaos-seed", type=int, metavar="N", help="override every scenario's seed")
    group.addoption("--chaos-ranks", type=int, metavar="N", help="override every scenario's cluster.ranks")
    group.addoption("--chaos-policy", action="append", metavar="NAME",
                    help="run only this policy of each scenario (repeatable)")
    group.addoption("--chaos-progress", action="store_true",
                    help="show each trial's progress bar (stderr; use with -s)")


def pytest_configure(config: pytest.Config) -> None:
    config.stash[_RESULTS] = []
    config.stash[_LINES] = []
    config.addinivalue_line("markers", "chaos_scenario: a scenario YAML file run under one policy")
    for tier, meaning in TIERS.items():  # Python tests take them too: @pytest.mark.nightly
        if tier != DEFAULT_TIER:
            config.addinivalue_line("markers", f"{tier}: {meaning}")


def scenario_overrides(config: pytest.Config) -> dict[str, Any]:
    overrides: dict[str, Any] = {}
    if config.getoption("chaos_seed", None) is not None:
        overrides["seed"] = config.getoption("chaos_seed")
    if config.getoption("chaos_ranks", None) is not None:
        overrides["cluster.ranks"] = config.getoption("chaos_ranks")
    if config.getoption("backend", None):
        overrides["cluster.backend"] = config.getoption("backend")
    return overrides


def is_scenario_file(path: Path) -> bool:
    """A YAML file with a top-level `faults:` or `policies:` key (CI configs, compose files
    and other YAML files beside the scenarios are not collected)."""
    try:
        return bool(_SCENARIO_KEY.search(path.read_bytes()))
    except OSError:
        return False


def pytest_collect_file(file_path: Path, parent: pytest.Collector) -> pytest.Collector | None:
    if file_path.suffix in (".yaml", ".yml") and is_scenario_file(file_path):
        return ScenarioFile.from_parent(parent, path=file_path)
    return None


class ScenarioFile(pytest.File):
    """A scenario file: a bad file is one collection error that names file, line and field."""

    def collect(self) -> list[pytest.Item]:
        from chaos.errors import UsageError
        from harness.scenario.scenario import load_scenario
        overrides = scenario_overrides(self.config)
        skip = None
        try:
            scenario = load_scenario(self.path, overrides)
        except UsageError as exc:
            # --backend asked for one that cannot run a good file (link faults on local): a
            # skip that says why
            try:
                if "cluster.backend" not in overrides:
                    raise
                scenario = load_scenario(self.path, {k: v for k, v in overrides.items() if k != "cluster.backend"})
            except UsageError:
                raise self.CollectError(str(exc)) from None
            skip = f"--backend {overrides['cluster.backend']}: {str(exc).splitlines()[0]}"
        wanted = self.config.getoption("chaos_policy", None)
        tests = [ScenarioTest.from_parent(self, name=policy, callobj=_scenario_test, scenario=scenario)
                 for policy in scenario.trial_names() if not wanted or policy in wanted]
        for test in tests if skip else ():
            test.add_marker(pytest.mark.skip(reason=skip))
        return tests


class ScenarioTest(pytest.Function):
    """One policy of one scenario file, as a test function of the `chaos_check` fixture."""

    def __init__(self, *, scenario: Scenario, **kwargs: Any) -> None:
        from chaos.faults import Corrupt, Duplicate, Reorder  # only sch_netem injects these
        super().__init__(**kwargs)
        self.scenario = scenario
        self.add_marker("chaos_scenario")
        tier = scenario.tier_of(self.name)
        if tier != DEFAULT_TIER:
            self.add_marker(tier)
        if traits_of(scenario.cluster.backend).needs_root:
            self.add_marker("requires_root")
        if scenario.cluster.backend == "docker":
            self.add_marker("requires_docker")
        if any(isinstance(event.fault, (Duplicate, Corrupt, Reorder)) for event in scenario.faults):
            self.add_marker("requires_netem")

    def reportinfo(self) -> tuple[Path, int, str]:
        return self.path, 0, self.name  # a line (the file's first): pytest places a skip there

    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException]) -> Any:  # type: ignore[override]
        if isinstance(excinfo.value, ChaosError):  # the harness could not run the trial
            return f"{self.path.name}::{self.name}: {excinfo.value}"
        return super().repr_failure(excinfo)


def _scenario_test(chaos_check: Callable[[Path, str], PolicyCheck], request: pytest.FixtureRequest) -> None:
    item = request.node
    result = chaos_check(item.path, item.name)
    if result.failures:
        item.add_report_section("call", "fault timeline (seconds after warm-up)", result.timeline_text())
        item.add_report_section("call", "rank logs (tails)", result.log_tails())
        pytest.fail(result.failure_text(), pytrace=False)


def _skip_reason(scenario: Scenario) -> str | None:
    """Why this machine cannot run the scenario, in `chaos doctor`'s words, or None."""
    from chaos.inject import default_mechanisms, process_mechanisms
    from chaos.mechanism import Unavailable
    backend = backend_class(scenario.cluster.backend)
    why = backend.why_not_here()
    if why:
        return f"the {backend.name} backend cannot run here: {why}"
    if backend.traits.needs_root and os.geteuid() != 0:
        # `chaos run` would become root of a user namespace of its own; a test session does not
        return (f"the {backend.name} backend needs root in a test session; as an ordinary user, "
                "`chaos run` on this file enters a user namespace of its own, or run pytest with --backend local")
    # the capability probe needs root, and a backend without links needs no probe
    mechanisms = default_mechanisms() if backend.traits.network_faults else process_mechanisms()
    for event in scenario.faults:
        mechanism = mechanisms.get(event.fault.kind)  # type: ignore[attr-defined]
        mechanism = mechanism and mechanism.for_fault(event.fault)  # a setting may need its own way
        if isinstance(mechanism, Unavailable):
            return f"{event.fault.kind} cannot be injected here: {mechanism.reason}"  # type: ignore[attr-defined]
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    reasons: dict[str, str | None] = {}
    for item in items:
        if isinstance(item, ScenarioTest):
            name = item.scenario.name
            if name not in reasons:
                reasons[name] = _skip_reason(item.scenario)
            if reasons[name]:
                item.add_marker(pytest.mark.skip(reason=reasons[name]))


@pytest.fixture(scope="session")
def chaos_out(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where run folders go: --chaos-out, else a pytest temporary folder."""
    out = request.config.getoption("chaos_out", None)
    return Path(out) if out else tmp_path_factory.mktemp("chaos-runs")


@pytest.fixture(scope="session")
def chaos_launchers() -> Iterator[LauncherPool]:
    """The session's rank launcher, lent to every check: only the first waits while it
    imports torch."""
    from harness.cluster.launcher import LauncherPool
    with LauncherPool() as pool:
        yield pool


@pytest.fixture
def chaos_check(request: pytest.FixtureRequest, chaos_out: Path,
                chaos_launchers: LauncherPool) -> Callable[[Path, str], PolicyCheck]:
    """`chaos_check(scenario_file, policy)`: run and judge one policy of a scenario file
    (with the session's --chaos-* overrides); the result is kept for the runtime table. A
    policy of a scenario runs once per session: asking again (a Python test that looks
    closer at a run, and the scenario's own test) gets the same result and run folder."""
    config = request.config

    def run(scenario_file: Path, policy: str) -> PolicyCheck:
        path = Path(scenario_file).resolve()
        for earlier in config.stash[_RESULTS]:
            if earlier.scenario_file.resolve() == path and earlier.policy == policy:
                return earlier
        from harness import signals
        from harness.signals import Terminated
        from harness.trial.check import check_policy
        from harness.trial.progress import Progress
        signals.install()  # SIGTERM raises Terminated: the trial tears down on the way out
        progress = Progress(quiet=not config.getoption("chaos_progress", False))
        try:
            result = check_policy(path, policy, chaos_out, scenario_overrides(config), progress, chaos_launchers)
        except Terminated as exc:
            pytest.exit(f"{exc}; the running trial was torn down", returncode=143)
        config.stash[_RESULTS].append(result)
        config.stash[_LINES].append(_line(result))
        return result
    return run


def _line(check: PolicyCheck) -> dict[str, Any]:
    steal = check.metrics.get("host_steal_share")
    return {"scenario": check.scenario.name, "seconds": check.seconds, "ok": not check.failures,
            "summary": check.summary(), "run_dir": str(check.run_dir),
            "steal": steal if isinstance(steal, float) and not math.isnan(steal) else None}


def pytest_sessionfinish(session: pytest.Session) -> None:
    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None:  # a pytest-xdist worker: its lines go to the controller's table
        workeroutput[WORKER_LINES] = session.config.stash.get(_LINES, [])


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: Any) -> None:
    """pytest-xdist's controller, as each worker ends: that worker's lines of the table."""
    node.config.stash[_LINES].extend(getattr(node, "workeroutput", {}).get(WORKER_LINES, []))


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    lines = config.stash.get(_LINES, [])
    if not lines or hasattr(config, "workeroutput"):
        return
    terminalreporter.section("chaos scenarios: runtime per scenario and policy")
    by_scenario: dict[str, list[dict[str, Any]]] = {}
    for line in lines:
        by_scenario.setdefault(line["scenario"], []).append(line)
    for name, checks in by_scenario.items():
        terminalreporter.write_line(f"{name:18} {sum(c['seconds'] for c in checks):6.1f} s")
        for check in checks:
            terminalreporter.write_line(f"    {'ok' if check['ok'] else 'FAILED':6} {check['summary']}")
    run_dirs = list(dict.fromkeys(Path(line["run_dir"]) for line in lines))
    terminalreporter.write_line(f"{'total':18} {sum(c['seconds'] for c in lines):6.1f} s; "
                                f"run folders under {', '.join(sorted({str(d.parent) for d in run_dirs}))}")
    terminalreporter.write_line(machine_range(run_dirs))
    terminalreporter.write_line(steal_range([line["steal"] for line in lines]))


def machine_range(run_dirs: list[Path]) -> str:
    """How fast the machine was over these runs (each run.json's `machine`), to read the
    times above against: one session's runs on a shared machine can differ by half."""
    from runfolder.info import read_run_info
    speeds = [info.machine for info in map(read_run_info, run_dirs) if info.machine is not None]
    if not speeds:
        return "machine: not measured in any run"
    loop, wake, load = (_spread([getattr(m, field) for m in speeds], digits)
                        for field, digits in (("loop_ns", 0), ("wake_us", 1), ("load_1m", 1)))
    faults = [m.fault_us for m in speeds if m.fault_us is not None]
    fault = f", a page's first touch {_spread(faults, 1)} us" if faults else ""
    return (f"machine over {len(speeds)} run(s): a Python loop step {loop} ns, a round trip between "
            f"two processes on one CPU {wake} us{fault}, load average {load} (harness/trial/machine.py)")


def steal_range(shares_counted: list[float | None]) -> str:
    """How much CPU time the VM's host took over these trials (their host_steal_share; None:
    not counted): a slow hour of a shared VM is the host's when this is high."""
    shares = [100 * share for share in shares_counted if share is not None]
    if not shares:
        return "steal: not counted in any trial"
    return (f"steal over {len(shares)} trial(s): the VM's host took {_spread(shares, 1)}% of this "
            "machine's CPU time while the ranks ran (/proc/stat)")


def _spread(values: list[float], digits: int) -> str:
    low, high = f"{min(values):.{digits}f}", f"{max(values):.{digits}f}"
    return low if low == high else f"{low}-{high}"
