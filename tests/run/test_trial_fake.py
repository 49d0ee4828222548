"""A whole trial (harness.trial.orchestrator) against the fake cluster, on a fake clock: no
root, no namespaces, no processes. The orchestrator executes its plan in order, stops a
trial that makes no progress at the hang cap, and tears down last-in first-out."""
from __future__ import annotations

import json
import subprocess
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from chaos.errors import UsageError
from chaos.faults import parse_fault
from harness.cluster.fake import FakeBackend, FakeClock
from harness.scenario.scenario import load_scenario
from harness.trial.orchestrator import Monitor, POLL_S, Trial, cut_off_for_good, frozen_for_good
from harness.trial.scenario_run import start_run
from harness.trial.plan import build_plan
from harness.trial.progress import Progress
import reports
from runfolder.events import EVENTS_FILE, read_events, schema_problems
from runfolder.info import read_run_info, read_trial_info
from runfolder.layout import trial_dir

HEADER = """\
cluster: {ranks: 4}
workload: {step_period: 250ms}
warmup_steps: 4
settle_steps: 4
policies: {timeout: {timeout: 5s}}
"""
FLAPS = HEADER + """\
hang_cap: 10s
faults:
  - {kind: link_down, target: {rank: 1}, start: 1s, duration: 3s, pulses: {on_for: 1s, off_for: 500ms}}
  - {kind: pause, target: {rank: 2}, start: 1500ms, duration: 1s}
expect: {timeout: {outcome: absorbed}}
"""
STUCK = HEADER + """\
hang_cap: 5s
faults:
  - {kind: blackhole, target: {rank: 1}, start: 1s}
  - {kind: link_down, target: {rank: 2}, start: 2s, duration: 100s}
expect: {timeout: {outcome: recovered, recover_within: 12s}}
"""

# rank 2 frozen for good, the others killed: nothing can move any more
HELD = HEADER + """\
hang_cap: 30s
faults:
  - {kind: pause, target: {rank: 2}, start: 1s}
  - {kind: kill, target: {ranks: [0, 1, 3]}, start: 2s}
"""


def run_trial(tmp_path: Path, text: str, clock: FakeClock | None = None):
    path = tmp_path / "scenario.yaml"
    path.write_text(text)
    scenario = load_scenario(path)
    clock = clock or FakeClock()
    backend = FakeBackend(clock)
    run_dir = start_run(tmp_path / "runs", scenario, path, ["timeout"], backend.name, "chaos run scenario.yaml")
    plan = build_plan(scenario, "timeout")
    result = Trial(plan, trial_dir(run_dir, "timeout"), backend, Progress(quiet=True), make_injector=backend.injector,
                   clock=clock, sleep=clock.sleep, state_dir=tmp_path / "state").run()
    events, _ = read_events(result.trial_dir / EVENTS_FILE)
    return plan.trial, result, events, backend.journal, run_dir


def offsets(events: list[dict]) -> list[tuple[str, int, float]]:
    """(verb, fault index, seconds after warm-up) of every fault action the harness recorded."""
    warm = next(e["t"] for e in events if e["kind"] == "warmup_done")
    verbs = {"fault_applied": "apply", "fault_reverted": "revert"}
    return [(verbs[e["kind"]], e["index"], e["t"] - warm) for e in events if e["kind"] in verbs]


def test_the_trial_applies_and_reverts_in_the_plan_s_order_at_its_offsets(tmp_path: Path) -> None:
    plan, result, events, journal, run_dir = run_trial(tmp_path, FLAPS)
    assert [(a.verb, a.index) for a in plan.actions] == [
        ("apply", 0), ("apply", 1), ("revert", 0), ("revert", 1), ("apply", 0), ("revert", 0)]
    done = offsets(events)
    assert [(verb, index) for verb, index, _ in done] == [(a.verb, a.index) for a in plan.actions]
    for (_, _, at), action in zip(done, plan.actions, strict=True):
        assert action.at <= at <= action.at + POLL_S + 1e-9
    assert [entry for entry in journal if entry[0] in ("apply", "revert")] == [
        ("apply", "link_down", (1,)), ("apply", "pause", (2,)), ("revert", "link_down", (1,)),
        ("revert", "pause", (2,)), ("apply", "link_down", (1,)), ("revert", "link_down", (1,))]
    assert result.end == "settled"
    assert read_trial_info(result.trial_dir).plan == plan  # trial.json stores the plan it ran
    assert [p for e in events for p in schema_problems(e)] == []
    [row] = reports.analyze_run(run_dir).to_dict("records")
    assert row["outcome"] == "absorbed" and row["expect_ok"]
    assert row["max_stall_s"] == pytest.approx(2.5, abs=0.3)  # the ring waited through both faults


def test_the_hang_cap_stops_a_trial_whose_ranks_stop_stepping(tmp_path: Path) -> None:
    plan, result, events, _, run_dir = run_trial(tmp_path, STUCK)
    assert result.end == "hung"
    [hang] = [e for e in events if e["kind"] == "hang_detected"]
    last_step = max(e["t"] for e in events if e["kind"] == "step")
    assert hang["cap"] == 5.0 and hang["idle_since"] == pytest.approx(last_step)
    assert 5.0 <= hang["t"] - last_step <= 5.0 + POLL_S + 1e-9
    [row] = reports.analyze_run(run_dir).to_dict("records")
    assert row["outcome"] == "hung" and row["hung_cap"] == 5.0
    assert reports.format_table(reports.analyze_run(run_dir)).count(">= 5 s (hung)") == 1
    assert reports.trial_failures(row) == ["outcome: expected recovered, measured hung",
                                           "recover_within 12 s: time to recover nothing measured: hung >= 5 s"]


def test_a_trial_whose_every_live_rank_is_frozen_for_good_ends_at_once_not_at_the_hang_cap(tmp_path: Path) -> None:
    _, result, events, journal, run_dir = run_trial(tmp_path, HELD)
    assert result.end == "held"
    killed = next(e["t"] for e in events if e["kind"] == "fault_applied" and e["index"] == 1)
    end = next(e["t"] for e in events if e["kind"] == "trial_end")
    assert end - killed < 2.0  # not the 30 s cap
    assert [e for e in events if e["kind"] == "hang_detected"] == []
    assert ("revert", "pause", (2,)) in journal  # thawed at teardown, then stopped
    [row] = reports.analyze_run(run_dir).to_dict("records")
    assert row["outcome"] != "hung"


def test_a_fault_still_waiting_for_its_event_when_every_live_rank_is_frozen_is_not_applied(tmp_path: Path) -> None:
    """Found by `chaos explore` (a timeout policy read as hung): a fault anchored on an event
    no frozen rank can record kept the trial waiting until the hang cap."""
    anchored = HELD + "  - {kind: link_down, target: {rank: 2}, start: {on: step, nth: 500}, duration: 1s}\n"
    _, result, events, _, _ = run_trial(tmp_path, anchored)
    assert result.end == "held"
    killed = next(e["t"] for e in events if e["kind"] == "fault_applied" and e["index"] == 1)
    end = next(e["t"] for e in events if e["kind"] == "trial_end")
    assert end - killed < 2.0 and [e for e in events if e["kind"] == "hang_detected"] == []
    assert [e["index"] for e in events if e["kind"] == "fault_not_applied"] == [2]


def test_a_rank_frozen_for_good_beside_live_ones_still_waits_for_the_hang_cap(tmp_path: Path) -> None:
    _, result, _, _, _ = run_trial(tmp_path, HELD.replace("ranks: [0, 1, 3]", "ranks: [0, 1]"))
    assert result.end == "hung"


def test_the_warm_up_deadline_counts_the_warm_up_steps_at_the_step_period(tmp_path: Path) -> None:
    """Four warm-up steps of 20 s (a step period the scale rule stretched) outlast the
    backend's 60 s bound for bring-up; the warm-up is not cut short for it."""
    text = HEADER.replace("step_period: 250ms", "step_period: 20s") + "hang_cap: 100s\n"
    _, _, events, _, _ = run_trial(tmp_path, text)
    warm = next(e for e in events if e["kind"] == "warmup_done")
    assert warm["t"] - events[0]["t"] >= 4 * 20 > FakeBackend.start_timeout_s


def test_teardown_reverts_last_in_first_out_then_stops_ranks_then_closes_the_cluster(tmp_path: Path) -> None:
    _, _, events, journal, _ = run_trial(tmp_path, STUCK)
    assert journal[-4:] == [("revert", "link_down", (2,)), ("revert", "blackhole", (1,)),
                            ("stop_ranks", (0, 1, 2, 3)), ("close",)]
    torn = [(e["kind"], e.get("index")) for e in events
            if e.get("teardown") or e.get("stopped") or e["kind"] in ("stopping", "trial_end")]
    assert torn == [("fault_reverted", 1), ("fault_reverted", 0), ("stopping", None), *[("rank_exited", None)] * 4,
                    ("trial_end", None)]
    assert events[-1] == {**events[-1], "kind": "trial_end", "reason": "hung"}
    assert not (tmp_path / "state").exists() or list((tmp_path / "state").iterdir()) == []  # the ledger closed clean


def test_a_fault_a_host_does_not_allow_is_refused_before_any_rank_starts(tmp_path: Path) -> None:
    # a Slurm node whose agent lacks CAP_NET_ADMIN: learnt once the hosts are up
    path = tmp_path / "scenario.yaml"
    path.write_text(STUCK)
    scenario, clock = load_scenario(path), FakeClock()
    backend = FakeBackend(clock, refused={("link_down", 2): "node n2 does not allow it: no CAP_NET_ADMIN"})
    run_dir = start_run(tmp_path / "runs", scenario, path, ["timeout"], backend.name, "chaos run scenario.yaml")
    trial = Trial(build_plan(scenario, "timeout"), trial_dir(run_dir, "timeout"), backend, Progress(quiet=True),
                  make_injector=backend.injector, clock=clock, sleep=clock.sleep, state_dir=tmp_path / "state")
    with pytest.raises(UsageError) as refused:
        trial.run()
    assert str(refused.value).startswith("faults[1] (link_down") and "on r2): node n2 does not allow it: no " \
        "CAP_NET_ADMIN; see what each host allows with `chaos doctor --backend fake`" in str(refused.value)
    assert backend.journal == [("up", 4), ("stop_ranks", ()), ("close",)]  # no rank started; the cluster taken back
    events, _ = read_events(trial_dir(run_dir, "timeout") / EVENTS_FILE)
    assert events[-1]["kind"] == "trial_end" and "does not allow it" in events[-1]["error"]


def test_a_relative_out_gives_an_absolute_run_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Ranks and a user's job run in other working directories: every path they get is absolute."""
    path = tmp_path / "scenario.yaml"
    path.write_text(FLAPS)
    monkeypatch.chdir(tmp_path)
    run_dir = start_run(Path("runs"), load_scenario(path), path, ["timeout"], "fake", "chaos run scenario.yaml")
    assert run_dir.is_absolute() and run_dir.parent == tmp_path / "runs"


def test_a_run_names_the_commit_of_the_harness_that_ran_it(tmp_path: Path) -> None:
    """A result names the code that made it: the checkout's commit, "+changes" where its
    tracked files differ from it (as git itself says)."""
    path = tmp_path / "scenario.yaml"
    path.write_text(FLAPS)
    run_dir = start_run(tmp_path / "runs", load_scenario(path), path, ["timeout"], "fake", "chaos run scenario.yaml")
    repo = Path(__file__).resolve().parents[2]
    git = ["git", "-C", str(repo)]
    head = subprocess.run([*git, "rev-parse", "--short=12", "HEAD"], capture_output=True, text=True)
    if head.returncode != 0:
        assert read_run_info(run_dir).harness_commit is None  # not a git checkout
        return
    changed = subprocess.run([*git, "status", "--porcelain", "--untracked-files=no"], capture_output=True,
                             text=True).stdout.strip()
    assert read_run_info(run_dir).harness_commit == head.stdout.strip() + ("+changes" if changed else "")


def test_ranks_settle_without_one_frozen_for_good_and_never_with_none_left_moving(tmp_path: Path) -> None:
    """An elastic job goes on without a rank stopped for good: the others' steps settle the
    trial then, not the deadline; with every live rank frozen nothing settles (held does)."""
    monitor = Monitor(tmp_path / "events.jsonl", ranks=3, last_activity=0.0,
                      steps_since={(0, 0): 4, (1, 0): 5})
    assert not monitor.all_made(4) and monitor.all_made(4, frozen={2})
    assert not monitor.all_made(6, frozen={2}) and not monitor.all_made(0, frozen={0, 1, 2})


def test_a_rank_in_a_group_formed_again_settles_by_its_steps_in_it(tmp_path: Path) -> None:
    """Found by chaos explore (elastic, a rank under 20% loss for good): the trial settled on
    8 steps since the last fault action while the ranks had made one in the group formed
    after them, and the lossy rank none (the report: it never stepped again). Steps before a
    rank's new group do not settle it; its steps in it do."""
    path = tmp_path / "events.jsonl"
    monitor = Monitor(path, ranks=2, last_activity=0.0)

    def rank(r: int, t: float, kind: str, **fields: Any) -> dict:
        return {"t": t, "src": "rank", "rank": r, "pid": 100 + r, "kind": kind, **fields}

    with path.open("a") as out:
        for step in range(8):
            for r in (0, 1):
                out.write(json.dumps(rank(r, step, "step", step=step, gen=1, loss=1.0, dur=0.1)) + "\n")
        out.write(json.dumps(rank(0, 9, "group_ready", gen=2, world=2, group_rank=0, secs=0.1)) + "\n")
    monitor.poll()
    assert not monitor.all_made(8) and monitor.all_made(8, frozen={0})
    with path.open("a") as out:
        for step in range(8, 16):
            out.write(json.dumps(rank(0, step + 2, "step", step=step, gen=2, loss=1.0, dur=0.1)) + "\n")
    monitor.poll()
    assert monitor.all_made(8)


@pytest.mark.parametrize("kind, cut_off", [("blackhole", True), ("link_down", True), ("partition", True),
                                           ("loss", False), ("pause", False)])
def test_a_user_job_settles_without_a_host_cut_off_for_good_the_built_in_runner_does_not(tmp_path: Path, kind,
                                                                                          cut_off) -> None:
    """A user's job's agent cut off for good lives on in its rendezvous, never stepping:
    the others settle without it. The built-in runner's cut-off rank leaves by its policy
    and says so: it is waited for."""
    fault = f"{{kind: {kind}, target: {{rank: 2}}, start: 1s" + (", percent: 20%}" if kind == "loss" else "}")
    text = HEADER + f"hang_cap: 10s\nfaults:\n  - {fault}\n"
    path = tmp_path / "built_in.yaml"
    path.write_text(text)
    built_in = build_plan(load_scenario(path), "timeout").trial
    path = tmp_path / "job.yaml"
    path.write_text(text.replace("workload: {step_period: 250ms}\n", "job: {command: [python, train.py]}\n")
                    .replace("policies: {timeout: {timeout: 5s}}\n", ""))
    job = build_plan(load_scenario(path), "job").trial
    parsed = parse_fault({"kind": kind, **({"percent": "20%"} if kind == "loss" else {})})
    outstanding = {0: SimpleNamespace(applied=SimpleNamespace(fault=parsed))}
    assert cut_off_for_good(outstanding, job) == ({2} if cut_off else set())  # type: ignore[arg-type]
    assert cut_off_for_good(outstanding, built_in) == set()  # type: ignore[arg-type]
    assert frozen_for_good(outstanding, job) == ({2} if kind == "pause" else set())  # type: ignore[arg-type]
    grouped = {0: SimpleNamespace(applied=SimpleNamespace(fault=parse_fault({"kind": "partition",
                                                                             "groups": [[0, 1], [2, 3]]})))}
    assert cut_off_for_good(grouped, job) == set()  # type: ignore[arg-type]  # which side goes on is the job's


# due on rank 1 after its process ended on its own (a job that gave up): a pause of rank 1
# and rank 2, and a kill
GONE = HEADER + """\
hang_cap: 10s
faults:
  - {kind: pause, target: {ranks: [1, 2]}, start: 2s, duration: 1s}
  - {kind: kill, target: {rank: 1}, start: 4s}
"""


class ExitingClock(FakeClock):
    """Ends rank 1's process (as if it exited) once the clock passes `at`."""

    def __init__(self, at: float) -> None:
        super().__init__()
        self.at, self.backend = at, None

    def sleep(self, seconds: float) -> None:
        super().sleep(seconds)
        cluster = self.backend.clusters[-1] if self.backend and self.backend.clusters else None
        if cluster is not None and self.now >= self.at and 1 in cluster.live:
            cluster.kill(1)


def test_a_process_fault_due_on_a_rank_that_exited_is_not_applied_and_the_trial_goes_on(tmp_path: Path,
                                                                                      monkeypatch) -> None:
    clock = ExitingClock(at=FakeClock().now + 2.0)  # about 1 s into the fault timeline, before either fault
    made = FakeBackend.__init__

    def remember(backend, clock_):  # the clock acts on the cluster the trial brings up
        made(backend, clock_)
        clock.backend = backend
    monkeypatch.setattr(FakeBackend, "__init__", remember)
    _, result, events, journal, run_dir = run_trial(tmp_path, GONE, clock)
    assert result.end == "settled"
    assert [entry for entry in journal if entry[0] in ("apply", "revert")] == [
        ("apply", "pause", (2,)), ("revert", "pause", (2,))]
    warm = next(e["t"] for e in events if e["kind"] == "warmup_done")
    [exited] = [e["t"] for e in events if e["kind"] == "rank_exited" and e["rank"] == 1]
    assert warm < exited < warm + 2
    skipped = [e for e in events if e["kind"] == "fault_not_applied"]
    assert [(e["index"], e["fault_kind"], e["targets"], e["exited_t"]) for e in skipped] == [
        (0, "pause", [1], [pytest.approx(exited)]), (1, "kill", [1], [pytest.approx(exited)])]
    assert [e["targets"] for e in events if e["kind"] == "fault_applied"] == [[2]]
    # its settle steps count from the kill that came due (not applied), not from the revert before it
    stopping = next(e["t"] for e in events if e["kind"] == "stopping")
    assert stopping > warm + 4.0 + 3 * 0.25, stopping - warm  # its 4th step after the kill came due
    assert [p for e in events for p in schema_problems(e)] == []
    [row] = reports.analyze_run(run_dir).to_dict("records")
    after = f"{exited - warm:.1f}"
    assert row["not_applied"] == (f"pause on r1: not applied, the rank had exited at +{after} s; "
                                  f"kill on r1: not applied, the rank had exited at +{after} s")
    assert row["not_applied"] in reports.format_table(reports.analyze_run(run_dir))
