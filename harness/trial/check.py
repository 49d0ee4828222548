"""One scenario under one policy, run and judged: what `pytest scenarios/` runs per test.

    result = check_policy(Path("scenarios/link_down.yaml"), "timeout", out=Path("runs"))
    result.failures        # [] when the trial met the scenario's expectations
    result.failure_text()  # which expectation broke, the measured value, how to reproduce

Plain functions over the harness API (`run_scenario`) and the reports (`report_run`, whose
row carries the one verdict on the expectation the trial's plan stored), so they work and
are tested without pytest.
"""
from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.cluster.backends import backend_named
from harness.cluster.launcher import LauncherPool
from harness.scenario.scenario import Scenario, load_scenario, reproduce_command
from harness.trial.scenario_run import run_scenario
from harness.trial.progress import Progress
import reports
from runfolder import events as kinds
from runfolder.events import EVENTS_FILE, read_events
from runfolder.layout import LOGS_DIR, REPORT_MARKDOWN, trial_dir

LOG_TAIL_LINES = 8
# Events worth a line in a failing test's timeline, besides the fault actions.
_TIMELINE_KINDS = (kinds.TRIAL_START, kinds.WARMUP_DONE, kinds.FAULT_APPLIED, kinds.FAULT_REVERTED,
                   kinds.BREAKER_OPEN, kinds.RANK_EXITED, kinds.HANG_DETECTED, kinds.TRIAL_END)


@dataclass(frozen=True)
class PolicyCheck:
    scenario: Scenario
    scenario_file: Path
    policy: str
    run_dir: Path
    metrics: dict[str, Any]
    failures: tuple[str, ...]
    seconds: float
    reproduce: str  # the `chaos run` line that runs this trial again

    @property
    def trial_dir(self) -> Path:
        return trial_dir(self.run_dir, self.policy)

    def summary(self) -> str:
        """"timeout: failed-fast (detect 5.12 s) in 14.2 s" for the runtime table."""
        times = [f"{label} {self.metrics[col]:.2f} s" for col, label in
                 (("ttd_s", "detect"), ("ttr_s", "recover"), ("breaker_open_s", "breaker"))
                 if _is_number(self.metrics.get(col))]
        detail = f" ({', '.join(times)})" if times else ""
        return f"{self.policy}: {self.metrics.get('outcome')}{detail} in {self.seconds:.1f} s"

    def failure_text(self) -> str:
        lines = [f"{self.scenario.name} under {self.policy}: "
                 f"{len(self.failures)} expectation{'s' if len(self.failures) > 1 else ''} not met"]
        lines += [f"  {failure}" for failure in self.failures]
        lines += [f"  outcome {self.metrics.get('outcome')}: {self.metrics.get('outcome_reason', '')}",
                  f"  reproduce: {self.reproduce}",
                  f"  run folder: {self.run_dir} ({REPORT_MARKDOWN}, {EVENTS_FILE})"]
        return "\n".join(lines)

    def timeline_text(self) -> str:
        """The trial's faults and reactions, in seconds after warm-up (from events.jsonl)."""
        events, _ = read_events(self.trial_dir / EVENTS_FILE)
        warm = next((e["t"] for e in events if e["kind"] == kinds.WARMUP_DONE), events[0]["t"] if events else 0.0)
        first_error: dict[int, dict[str, Any]] = {}
        lines = []
        for ev in events:
            if ev["kind"] == kinds.COLLECTIVE_ERROR and ev["rank"] not in first_error:
                first_error[ev["rank"]] = ev
            elif ev["kind"] in _TIMELINE_KINDS and not ev.get("stopped"):
                lines.append((ev["t"], _event_text(ev)))
        if first_error:
            firsts = sorted(first_error.values(), key=lambda e: e["t"])
            lines.append((firsts[0]["t"], f"first collective error: r{firsts[0]['rank']} "
                                          f"{firsts[0].get('cause')}: {firsts[0].get('error', '')[:120]}"))
            lines.append((firsts[-1]["t"], f"collective errors on {len(firsts)} ranks by now"))
        return "\n".join(f"{t - warm:+9.3f} s  {text}" for t, text in sorted(lines))

    def log_tails(self, lines: int = LOG_TAIL_LINES) -> str:
        """The last lines of every rank's log."""
        parts = []
        for log in sorted((self.trial_dir / LOGS_DIR).glob("*.log")):
            tail = log.read_text(errors="replace").splitlines()[-lines:]
            parts.append(f"--- {log.name}\n" + ("\n".join(tail) if tail else "(empty)"))
        return "\n".join(parts) or "(no rank logs)"


def _is_number(value: Any) -> bool:
    try:
        return not math.isnan(float(value))
    except (TypeError, ValueError):
        return False


def _event_text(ev: dict[str, Any]) -> str:
    fields = {k: v for k, v in ev.items() if k not in ("t", "src", "rank", "pid", "kind")}
    who = f"r{ev['rank']} " if ev.get("rank") is not None else ""
    return f"{who}{ev['kind']} {json.dumps(fields, default=str, separators=(',', ':'))}"


def check_policy(scenario_file: Path, policy: str, out: Path, overrides: dict[str, Any] | None = None,
                 progress: Progress | None = None, launchers: LauncherPool | None = None) -> PolicyCheck:
    """Run `policy` of the scenario in `scenario_file` on a fresh cluster, write its reports
    and take their verdict on the expectation the trial's plan stored; `launchers` lends
    the rank launcher (a session's checks share one)."""
    scenario = load_scenario(scenario_file, overrides)
    started = time.monotonic()
    command = reproduce_command(scenario_file, policy, scenario.seed, overrides)
    run_dir, _ = run_scenario(scenario, scenario_file, [policy], out, backend_named(scenario.cluster.backend),
                              progress or Progress(scope=scenario.name), command=command, launchers=launchers)
    metrics = reports.report_run(run_dir)[0].iloc[0].to_dict()
    return PolicyCheck(scenario, scenario_file, policy, run_dir, metrics, tuple(reports.trial_failures(metrics)),
                       time.monotonic() - started, command)
