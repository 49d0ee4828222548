"""`chaos tune`'s logic on scripted figures (reports.tune: the measurement, the rules, the
judging, the halving, the recommendation) and its stages' budget and resume with a fake
cell runner (harness.studies.tune.command); tests/run/test_tune_real.py runs a real one."""
from __future__ import annotations

import argparse
import json
import math
from dataclasses import replace
from pathlib import Path

import pytest

from chaos.errors import UsageError
from harness.job.policies import DetectorSpec
from harness.studies.nightly import Done, Manifest, NightProgress
from harness.studies.tune.command import options_of, parse_faults
from harness.studies.tune.planned import JOB_STEPS_S, plan_estimate_text, planned_cells, trial_count
from harness.studies.tune.runner import Tune, window_estimate_s
from harness.studies.tune.stages import FAULT_FREE, FaultChoice, Options, Stages
from harness.trial.progress import Progress
from reports.tune import (DETECTOR_DEFAULT, DetectorEvidence, Evidence, FaultFree, FaultResult, Reference, Wave,
                          dead_host_notes, breaker_verdict, candidates, choose_detector, control_trips,
                          detector_candidates, fault_free, flap_warnings, halve, rejoin_wave, select, step_interval_s,
                          transient_s, wave_jitter)
from reports.tune_report import Findings, recommendation_text, tune_json
from reports.tune_torchrun import (HostsResult, RestartResult, hosts_choice, max_restarts_of, rdzv_conf_for,
                                   rdzv_wait_s, restart_choice, restarts_used)
from runfolder.heartbeats import HeartbeatGaps, bucket_of

REPO = Path(__file__).resolve().parent.parent.parent


def measured(max_s: float = 0.033, formation_s: float | None = 0.06, period: float = 0.25) -> FaultFree:
    return FaultFree(steps=100, median_s=0.01, p99_s=max_s, max_s=max_s, formation_s=formation_s,
                     step_period_s=period, seconds=25.0)


def test_a_fast_step_s_margins_are_over_one_step_period():
    cands = candidates(measured())
    assert [c.timeout for c in cands] == [1.0, 2.5, 7.5]  # 3, 10, 30 x 0.25 s, rounded up to 0.5 s
    assert "3 x the longest fault-free wait (one step period: 0.250 s; the longest step 0.033 s)" in cands[0].rules[0]
    first = cands[0]
    # base: the longest formation 0.06 s rounded up to 0.5 s; 5 retries: 0.5 x 31 = 15.5 s >= 10 s
    # jitter: 0 to the formation 0.06 s rounded up to 0.1 s
    assert (first.backoff_base, first.max_retries, first.backoff_cap, first.jitter) == (0.5, 5, 4.0, (0.0, 0.1))
    assert first.policy() == {"base": "retry", "timeout": 1.0, "max_retries": 5, "backoff_base": 0.5,
                              "backoff_cap": 4.0, "jitter": [0.0, 0.1]}
    assert transient_s(cands) == 0.5


def test_a_slow_step_s_margins_are_over_the_step_and_equal_timeouts_are_one_candidate():
    cands = candidates(measured(max_s=1.2, formation_s=2.2))
    assert [c.timeout for c in cands] == [4.0, 12.0, 36.0]
    assert "the longest fault-free step: 1.200 s" in cands[1].rules[0]
    assert cands[0].backoff_base == 2.5 and cands[0].max_retries == 3  # 2.5 x 7 = 17.5 s >= 10 s
    assert cands[0].jitter == (0.0, 2.2)
    assert candidates(measured(formation_s=0.23))[0].policy()["jitter"] == [0.0, 0.3]  # not 0.30000000000000004
    assert len(candidates(measured(max_s=0.01), margins=(3.0, 3.5))) == 1  # both 1 s


def test_the_measurement_is_every_rank_s_steps_and_the_slowest_formation():
    events = [{"kind": "group_ready", "t": 1.0, "secs": 0.4}, {"kind": "group_ready", "t": 1.0, "secs": 0.9}]
    events += [{"kind": "step", "t": 2.0 + i * 0.25, "dur": 0.01 * (i + 1)} for i in range(100)]
    got = fault_free(events, 0.25)
    assert (got.steps, got.max_s, got.p99_s, got.formation_s) == (100, 1.0, pytest.approx(0.99), 0.9)
    assert got.median_s == pytest.approx(0.505) and got.seconds == pytest.approx(24.75)
    with pytest.raises(ValueError, match="no step"):
        fault_free([{"kind": "step", "t": 1.0, "dur": None}], 0.25)


def test_a_false_trip_is_a_detection_between_warm_up_and_the_first_fault():
    events = [{"kind": "collective_error", "t": 1.0},  # warm-up: not counted
              {"kind": "warmup_done", "t": 2.0}, {"kind": "suspect", "t": 5.0}, {"kind": "step", "t": 6.0},
              {"kind": "collective_error", "t": 12.5}]  # after the first fault: the transient's
    assert control_trips(events, until_t=12.0) == (1, 10.0)
    assert control_trips([{"kind": "step", "t": 1.0}], 5.0) == (0, 0.0)  # never warmed up: not watched


def evidence(trips: int = 0, transient: int = 0, silent: float = 3.0) -> Evidence:
    return Evidence(false_trips=[trips], control_s=[30.0], transient_detected=[transient],
                    silent_detected_s=[silent], silent_first_s=[silent], silent_outcomes=["failed-fast"])


def test_halving_keeps_the_fastest_half_of_those_that_pass():
    found = {"a": evidence(silent=5.0), "b": evidence(silent=1.5, trips=1), "c": evidence(silent=2.0),
             "d": evidence(silent=8.0, transient=3), "e": evidence(silent=9.0)}
    assert select(found, halve(len(found))) == ["c", "a", "e"]
    assert select(found, 1) == ["c"] and halve(1) == 1 and halve(2) == 1
    assert not Evidence().passes  # no control run: nothing shown


def test_the_recommendation_gives_the_lines_to_paste_and_says_when_none_passed():
    cands = candidates(measured())
    found = {cands[0].name: evidence(transient=2, silent=1.2), cands[1].name: evidence(silent=2.7)}
    refs = [Reference("document_30s", 30.0, "failed-fast", 30.2, 40.0),
            Reference("pytorch_default", 1800.0, "hung", math.nan, 40.0)]
    text = recommendation_text(Findings(measured(), cands, found, cands[1].name, refs, 0.5, None))
    assert "`tuned_2_5s`: timeout 2.5 s" in text and "timeout=timedelta(seconds=2.5)" in text
    assert '"max_retries": 5' in text and "| document_30s | 30 s | 30.20 s | failed-fast |" in text
    assert "not within the trial (hung >= 40 s cap)" in text and "| tuned_1s | 1 s (3 x) | 0 in 30 s" in text
    assert "0 of 1 |" in text and "not run" in text  # tuned_1s missed the transient; 7.5 s never ran
    none = recommendation_text(Findings(measured(), cands, found, None, [], 0.5, "the budget (60 s) would be passed"))
    assert "No candidate passed" in none and "**Stopped early: the budget (60 s) would be passed.**" in none


# -- the stages' budget and resume, with a fake runner ------------------------------------------

class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def options(**changed) -> Options:
    given = dict(scenario_file=REPO / "scenarios" / "kill_rank.yaml", budget_s=600.0, repeat=2, measure_s=10.0,
                 control_s=5.0, ranks=4, backend=None, references=True)
    return Options(**{**given, **changed})


def tune_with(tmp_path: Path, manifest: Manifest, clock: Clock, budget_s: float = 600.0) -> tuple[Tune, list[str]]:
    ran: list[str] = []

    def run_cell(cell, runs: Path) -> Path:
        ran.append(cell.scenario.name)
        clock.t += 20.0 * len(cell.policies)
        folder = runs / cell.scenario.name
        folder.mkdir(parents=True)
        return folder
    (tmp_path / "runs").mkdir(exist_ok=True)
    progress = NightProgress(Progress(quiet=True), 15, sum(d.trials for d in manifest.done), clock, label="tune")
    return Tune(Stages(options(budget_s=budget_s), tmp_path), manifest, run_cell, progress, clock), ran


def test_a_stage_the_manifest_has_is_not_run_again(tmp_path):
    manifest = Manifest(night="t", digest="d", plan_file="p", info={"started": "now"},
                        done=(Done("kill_rank-measure/0/fault_free", 0, "runs/m", 1, 12.0),))
    tune, ran = tune_with(tmp_path, manifest, Clock())
    assert tune.run(tune.stages.measure(0.25)) == tmp_path / "runs/m" and ran == []
    cands = candidates(measured())
    control = tune.stages.control(0, cands, 0.5)
    assert tune.run(control) == tmp_path / "runs" / "kill_rank-control-0" and ran == ["kill_rank-control-0"]
    assert [d.key for d in tune.manifest.done][-1] == "kill_rank-control-0/0/tuned_1s+tuned_2_5s+tuned_7_5s"


def test_a_stage_that_would_pass_the_budget_is_not_started(tmp_path):
    clock = Clock()
    manifest = Manifest(night="t", digest="d", plan_file="p", info={"started": "now"})
    tune, ran = tune_with(tmp_path, manifest, clock, budget_s=100.0)
    assert tune.run(tune.stages.measure(0.25)) is not None  # its windows: well inside 100 s
    cands = candidates(measured())
    silent = tune.stages.silent(0, cands)  # 5 trials at this invocation's 20 s a trial: 100 s, 80 s left
    assert tune.run(silent) is None and ran == ["kill_rank-measure"]
    assert "would be passed by stage kill_rank-silent-0 (about 100 s, 80 s left)" in tune.stopped_early
    assert tune.run(tune.stages.control(0, cands, 0.5)) is None  # nothing after it either


def test_the_stages_fault_the_chosen_rank_and_keep_the_scenario_s_cluster(tmp_path):
    stages = Stages(options(), tmp_path)
    cands = candidates(measured())
    control = stages.control(1, cands, 0.5).scenario
    assert stages.target == 3 and control.cluster.ranks == 4 and [f.fault.kind for f in control.faults] == \
        ["pause", "link_down"]
    assert [f.start for f in control.faults] == [5.0, 9.5] and control.faults[1].duration == 0.5
    silent = stages.silent(0, cands)
    assert silent.policies == ("tuned_1s", "tuned_2_5s", "tuned_7_5s", "document_30s", "pytorch_default")
    assert silent.scenario.policy("tuned_7_5s").max_retries == 0 and silent.scenario.hang_cap == 35.0
    assert stages.silent(1, cands).policies == ("tuned_1s", "tuned_2_5s", "tuned_7_5s")  # references once
    assert (tmp_path / "scenarios" / "silent-0.yaml").read_text().startswith("# chaos tune: stage silent-0 of ")


def test_the_dry_run_estimate_adds_up_the_planned_stages_windows_and_names_where_the_budget_ends(tmp_path):
    stages = Stages(options(), tmp_path)
    cells = planned_cells(stages)
    names = [cell.scenario.name.removeprefix("kill_rank-") for cell in cells]
    assert names == ["measure", "control-0", "silent-0", "control-1", "silent-1", "wave",
                     "fault-link_down-10-s", "fault-pause-2-s", "fault-pause-10-s", "fault-kill",
                     "fault-blackhole-for-good", "detector-0", "detector-1"]
    assert [len(cells[i].policies) for i in (1, 3)] == [3, 2]  # successive halving of 1, 2.5 and 7.5 s
    assert cells[5].policies[0] == "tuned_1s"  # every rank knew at its timeout: the fastest, chosen
    windows = [window_estimate_s(cell) for cell in cells]
    # a trial under faults that heal is counted to their end; one under a fault for good, to its hang cap
    control, silent = cells[1].scenario, cells[2].scenario
    assert windows[1] == 3 * (10.0 + 5.0 + 0.5 + 4.0 + 0.5 + control.settle_steps * 0.25)
    assert windows[2] == 5 * (10.0 + 2.0 + silent.settle_steps * 0.25 + silent.hang_cap)
    whole = plan_estimate_text(Stages(options(budget_s=sum(windows) + 1), tmp_path))
    assert f"about {sum(windows) / 60:.0f} min if the longest fault-free wait is one step period" in whole
    assert "stop before" not in whole and whole.endswith(f"budget {(sum(windows) + 1) / 60:g} min")
    short = plan_estimate_text(Stages(options(budget_s=sum(windows[:6]) + 1), tmp_path))
    assert short.endswith("it would stop before kill_rank-fault-link_down-10-s")


def test_a_job_s_dry_run_estimates_its_plan_at_several_step_times(tmp_path):
    """Only a job's probe tells its step interval: its plan is estimated at each of a few."""
    job = Stages(options(scenario_file=REPO / "scenarios" / "byo_link_down.yaml", budget_s=1800.0), tmp_path)
    at = {step: sum(window_estimate_s(cell, step) for cell in planned_cells(job, step)) for step in JOB_STEPS_S}
    assert at[0.25] < at[1.0] < at[5.0]  # longer steps: longer timeouts and hang caps, slower settling
    text = plan_estimate_text(job)
    assert text.startswith(f"about {at[0.25] / 60:.0f} min if a step of your job takes 0.25 s, "
                           f"{at[1.0] / 60:.0f} min at 1 s, {at[5.0] / 60:.0f} min at 5 s (its probe measures it)")
    slowest = next(s for s in JOB_STEPS_S if at[s] > 1800.0)
    assert f"budget 30 min: at {slowest:g} s a step it would stop before byo_link_down-" in text
    # the measurement's steps are counted from the step time: --measure 10s, at least 8 steps
    measure = {step: next(c for c in planned_cells(job, step) if c.scenario.name.endswith("-measure"))
               for step in (1.0, 5.0)}
    assert (measure[1.0].scenario.settle_steps, measure[5.0].scenario.settle_steps) == (10, 8)


def test_bad_input_names_the_flag_and_the_fix(tmp_path):
    args = argparse.Namespace(scenario=str(REPO / "scenarios" / "kill_rank.yaml"), budget="soon", repeat=2,
                              measure="60s", control="30s", ranks=None, backend=None, no_references=False,
                              hogs=0, faults=None)
    with pytest.raises(UsageError, match="--budget soon: .* is not"):
        options_of(args)
    with pytest.raises(UsageError, match=r"--hogs -1: give 0 to \d+ \(4 per usable CPU\) busy processes"):
        options_of(argparse.Namespace(**{**vars(args), "budget": "15m", "hogs": -1}))
    with pytest.raises(UsageError, match="--repeat 0: give 1 or more rounds"):
        options_of(argparse.Namespace(**{**vars(args), "budget": "15m", "repeat": 0}))
    with pytest.raises(UsageError, match=r"job: has no `tune:`.*\n  tune: \{timeout: \"--timeout \{seconds\}\"\}"):
        Stages(options(scenario_file=REPO / "scenarios" / "byo_kill.yaml", ranks=None), tmp_path)


def test_a_user_job_s_candidates_are_variants_that_set_its_timeout_through_its_knob(tmp_path):
    stages = Stages(options(scenario_file=REPO / "scenarios" / "byo_link_down.yaml", ranks=4), tmp_path)
    cands = candidates(measured(period=0.0, max_s=0.3, formation_s=None), with_retries=False)
    assert [c.timeout for c in cands] == [1.0, 3.0, 9.0] and all(len(c.rules) == 1 for c in cands)
    assert "(the longest interval between a rank's steps: 0.300 s)" in cands[1].rules[0]
    assert all(c.max_retries == 0 for c in cands) and "a group formed" not in measured(formation_s=None).line()
    assert stages.probe().scenario.settle_steps == 8
    assert stages.measure(0.25).scenario.settle_steps == 40  # --measure 10 s at the probe's 0.25 s
    control = stages.control(0, cands, 0.5)
    assert control.policies == ("tuned_1s", "tuned_3s", "tuned_9s")
    job = control.scenario.job
    assert control.scenario.variants["tuned_3s"].applied_to(job).command[-2:] == ("--timeout", "3")
    assert Path(job.workdir).resolve() == REPO / "examples"  # the stage's file is in the tune folder: made absolute
    silent = stages.silent(0, cands)
    assert silent.policies == ("tuned_1s", "tuned_3s", "tuned_9s", "document_30s", "as_written")
    assert silent.scenario.variants["document_30s"].args == ("--timeout", "30")
    assert silent.scenario.variants["as_written"].args == () and silent.scenario.hang_cap == 35.0
    text = recommendation_text(Findings(measured(period=0.0, max_s=0.3), cands, {}, "tuned_3s",
                               [Reference("as_written", None, "hung", math.nan, 40.0)], 0.5, None,
                               stages.side(3.0)))
    assert "For your job: --timeout 3 on its command line (job.tune.timeout)" in text
    assert 'tuned_3s: {"args": ["--timeout", "3"]}' in text and "| as_written | the job's own |" in text
    assert "policies:" not in text
    busy = recommendation_text(Findings(measured(), cands, {}, None, [], 0.5, None, hogs=2))
    assert "Every stage ran beside 2 busy CPU process(es) (--hogs 2): a busy node." in busy


def test_a_job_s_step_interval_is_the_median_of_its_steps():
    events = [{"kind": "step", "t": i * 0.3, "dur": None if i == 0 else 0.3 + 0.01 * (i % 3)} for i in range(9)]
    assert step_interval_s(events) == pytest.approx(0.31)
    with pytest.raises(ValueError, match="no two steps in a row"):
        step_interval_s([{"kind": "step", "t": 1.0, "dur": None}])


def test_a_tune_is_its_scenario_and_options_but_not_its_budget():
    assert options().digest() == options(budget_s=60.0).digest()  # stopped by the budget: go on with more
    assert options().digest() != options(repeat=3).digest() and options().digest() != options(ranks=8).digest()
    assert options().digest() != options(hogs=2).digest()  # measured beside a busy node: another tune


def test_a_retry_wave_is_every_rank_s_first_re_join_and_the_most_in_a_tenth_of_a_second():
    together = [{"kind": "retry", "t": 10.0 + 0.001 * r, "attempt": 1} for r in range(15)]
    later = [{"kind": "retry", "t": 20.0, "attempt": 2}, {"kind": "backoff", "t": 9.5, "attempt": 1}]
    assert rejoin_wave(together + later) == (15, pytest.approx(0.014), pytest.approx(150.0))
    spread = [{"kind": "retry", "t": 10.0 + 0.25 * r, "attempt": 1} for r in range(4)]
    assert rejoin_wave(spread) == (4, pytest.approx(0.75), pytest.approx(10.0))
    assert rejoin_wave([])[0] == 0 and math.isnan(rejoin_wave([])[2])


def test_the_wave_keeps_the_candidate_s_jitter_only_where_its_wave_recovered(tmp_path):
    c = candidates(measured())[1]
    own = Wave(c.name, c.jitter, 15, 0.09, 60.0, 3.4, "recovered")
    document = Wave(f"{c.name}_document_jitter", (0.1, 1.0), 15, 0.85, 20.0, 4.2, "recovered")
    assert wave_jitter(c, [own, document]) == (0.0, 0.1)
    assert wave_jitter(c, [replace(own, outcome="hung"), document]) == (0.1, 1.0)
    evidence = {c.name: Evidence([0], [30.0], [0], [2.8], [2.6], ["failed-fast"])}
    text = recommendation_text(Findings(measured(), (c,), evidence, c.name, [], 0.5, None, waves=[own, document]))
    assert "| 0-0.1 s (tuned_2_5s) | 15 | 0.09 s | 60 | 3.40 s | recovered |" in text
    assert text.index("## A retry wave") < text.index("## Recommended") and '"jitter": [0.0, 0.1]' in text
    failed = recommendation_text(Findings(measured(), (c,), evidence, c.name, [], 0.5, None,
                                 waves=[replace(own, outcome="hung"), document]))
    assert '"jitter": [0.1, 1.0]' in failed and "the narrower one's retry wave did not recover" in failed
    wave = Stages(options(), tmp_path).wave(c)
    assert wave.policies == ("tuned_2_5s", "tuned_2_5s_document_jitter")
    assert wave.scenario.policy("tuned_2_5s_document_jitter").jitter == (0.1, 1.0)
    assert wave.scenario.faults[0].duration == 3.0  # 0.5 s longer than the timeout


# -- per fault: --faults, its stages, the breaker ---------------------------------------------

def test_faults_are_kinds_with_an_optional_duration_and_bad_ones_name_the_fix(tmp_path):
    assert parse_faults("link_down:10s, kill,blackhole") == (
        FaultChoice("link_down", 10.0), FaultChoice("kill", None), FaultChoice("blackhole", None))
    assert parse_faults("none") == ()
    assert [f.label for f in parse_faults("pause:2.5s,blackhole,kill")] == ["pause 2.5 s", "blackhole for good", "kill"]
    assert FaultChoice("pause", 2.5).stage == "fault-pause-2_5-s"
    with pytest.raises(UsageError, match="'loss' is not one of link_down, blackhole, pause, kill; give e.g."):
        parse_faults("loss:10s")
    with pytest.raises(UsageError, match="a kill does not heal; give kill without a duration"):
        parse_faults("kill:5s")
    with pytest.raises(UsageError, match="--faults soon: "):
        parse_faults("pause:soon")
    assert [f.label for f in Stages(options(), tmp_path).faults] == \
        ["link_down 10 s", "pause 2 s", "pause 10 s", "kill", "blackhole for good"]
    assert [f.label for f in Stages(options(backend="local"), tmp_path).faults] == ["pause 2 s", "pause 10 s", "kill"]
    with pytest.raises(UsageError, match="--faults link_down:10s: the local backend cannot put faults on links"):
        Stages(options(backend="local", faults=(FaultChoice("link_down", 10.0),)), tmp_path)


def test_a_fault_stage_runs_the_choice_with_and_without_a_breaker_beside_the_document_and_pytorch(tmp_path):
    stages = Stages(options(), tmp_path)
    c = candidates(measured())[1]  # 2.5 s, 5 retries from 0.5 s, capped at 4 s
    cell = stages.fault(FaultChoice("link_down", 10.0), c)
    assert cell.policies == ("tuned_2_5s", "tuned_2_5s_breaker", "document", "pytorch_default")
    s = cell.scenario
    assert (s.policy("tuned_2_5s").base, s.policy("tuned_2_5s_breaker").base) == ("retry", "isolation")
    assert s.policy("document").timeout == 30.0 and s.policy("document").breaker
    assert s.policy("pytorch_default").timeout == 1800.0
    # the document's longest quiet: 30 s + its third backoff (8 s) + 1 s of jitter, and 5 s past it
    assert s.hang_cap == 44.0 and [(f.fault.kind, f.start, f.duration) for f in s.faults] == [("link_down", 2.0, 10.0)]
    alone = Stages(options(references=False), tmp_path).fault(FaultChoice("kill", None), c)
    assert alone.policies == ("tuned_2_5s", "tuned_2_5s_breaker") and alone.scenario.faults[0].duration is None
    assert alone.scenario.hang_cap == 2.5 + 4.0 + 0.1 + 5.0
    job = Stages(options(scenario_file=REPO / "scenarios" / "byo_link_down.yaml"), tmp_path)
    c = candidates(measured(period=0.0, max_s=0.3, formation_s=None), with_retries=False)[1]
    cell = job.fault(FaultChoice("kill", None), c)
    assert cell.policies == ("tuned_3s", "document_30s", "as_written") and cell.scenario.hang_cap == 35.0
    # measure, two rounds (3 candidates, the references beside them, then the faster 2), the
    # wave, five faults by default, the detector's 2 thresholds twice and its default once; a
    # job: its probe, no wave, the restarts, per fault under torchrun too, a host gone (kill,
    # blackhole), no detector
    rounds = (3 + 3 + 2) + (2 + 2)
    assert trial_count(stages) == 1 + rounds + 2 + 5 * 4 + (2 * 2 + 1)
    assert trial_count(job) == 2 + rounds + 3 + 5 * 4 + 2 * 2


def result(fault: str, setting: str, outcome: str, back: float = math.nan, breaker: float = math.nan) -> FaultResult:
    return FaultResult(fault, fault != "kill", setting, outcome, 16, 2.5, 2.6, breaker, back, 40.0, 44.0)


def test_the_breaker_is_recommended_only_where_it_came_back_wherever_the_retries_did():
    flap = [result("link_down 10 s", "c", "recovered", back=12.1), result("link_down 10 s", "c_breaker", "isolated",
                                                                            breaker=2.6)]
    kill = [result("kill", "c", "retries-exhausted"), result("kill", "c_breaker", "isolated", breaker=9.4)]
    assert breaker_verdict(flap + kill, "c") == (False, "no breaker: under link_down 10 s it ended isolated where "
                                                        "the retries alone brought every rank back (recovered in "
                                                        "12.10 s)")
    yes = breaker_verdict(kill, "c")
    assert yes is not None and yes[0] and yes[1].endswith("it opened under kill in 9.40 s")
    assert breaker_verdict([result("kill", "c", "retries-exhausted")], "c") is None  # not measured: not said


def test_the_report_shows_each_fault_and_pastes_the_breaker_only_when_recommended():
    cands = candidates(measured())
    c = cands[1]
    evidence = {c.name: Evidence([0], [30.0], [0], [2.8], [2.6], ["failed-fast"])}
    kill = [result("kill", c.name, "retries-exhausted"), result("kill", c.name + "_breaker", "isolated", breaker=9.4),
            result("kill", "pytorch_default", "hung")]
    text = recommendation_text(Findings(measured(), cands, evidence, c.name, [], 0.5, per_fault=kill))
    assert "## What the settings do, per fault" in text and "| kill | tuned_2_5s_breaker | 2.50 s, 2.60 s (16 ranks) " \
        "| 9.40 s | - | 40 | isolated |" in text
    assert "| kill | pytorch_default | 2.50 s, 2.60 s (16 ranks) | - | - | >= 40 (to the cap) | hung >= 44 s (cap) |" \
        in text
    assert '"base": "isolation"' in text and "(the breaker)" in text
    flap = [result("link_down 10 s", c.name, "recovered", back=12.1),
            result("link_down 10 s", c.name + "_breaker", "isolated", breaker=2.6)]
    text = recommendation_text(Findings(measured(), cands, evidence, c.name, [], 0.5, per_fault=flap + kill))
    assert '"base": "retry"' in text and "no breaker: under link_down 10 s it ended isolated" in text


def test_a_flap_the_chosen_timeout_does_not_come_back_from_is_said_where_a_reference_did():
    """A user's job without retries: its short timeout turns a 10 s flap that 30 s absorbs
    into a crash; the report says so beside the figures (and a kill is nobody's flap)."""
    cands = candidates(measured(period=0.0, max_s=0.3, formation_s=None), with_retries=False)
    c = cands[1]
    runs = [result("link_down 10 s", c.name, "crashed"), result("link_down 10 s", "document_30s", "absorbed"),
            result("link_down 10 s", "as_written", "absorbed"), result("kill", c.name, "crashed"),
            result("kill", "document_30s", "crashed")]
    [warning] = flap_warnings(runs, c.name)
    assert warning.startswith("Under link_down 10 s, `tuned_3s` ended crashed where document_30s, as_written came back")
    assert flap_warnings(runs[:1] + runs[3:], c.name) == []  # no reference came back: nothing to compare with
    text = recommendation_text(Findings(measured(period=0.0, max_s=0.3), cands, {}, c.name, [], 0.5,
                                        variant={"args": ["--timeout", "3"]}, per_fault=runs))
    assert warning in text and "`document_30s`: the document's 30 s through the job's knob" in text
    assert "`as_written`: the job as its command is written" in text and "_breaker" not in text


# -- the failure detector's threshold ----------------------------------------------------------

def gaps(max_s: float = 0.054, n: int = 1750) -> HeartbeatGaps:
    return HeartbeatGaps(gaps=n, max_s=max_s, max_rank=1, watched_s=22.0, buckets={bucket_of(0.05): n - 1,
                                                                                     bucket_of(max_s): 1})


def test_detector_thresholds_are_margins_over_the_longest_gap_in_heartbeat_periods():
    regular = detector_candidates(gaps(0.054), 0.05)  # 2 x 0.054 -> 0.15, under 4 periods; 5 x -> 0.3
    assert [(d.name, d.suspect_after) for d in regular] == [("detector_0_2s", 0.2), ("detector_0_3s", 0.3)]
    assert regular[1].rule.startswith("suspect_after 0.3 s: 5 x the longest fault-free heartbeat gap (0.054 s, "
                                      "rank 1, of 1750 gaps) rounded up to the 0.05 s heartbeat period")
    busy = detector_candidates(gaps(0.41), 0.05)  # a node whose hearts fell silent for 0.41 s
    assert [d.suspect_after for d in busy] == [0.85, 2.05]
    assert [d.suspect_after for d in detector_candidates(gaps(0.01), 0.05)] == [0.2]  # one per distinct value


def detector_evidence(trips: int = 0, every: float = 0.3, suspect_after: float = 0.3) -> DetectorEvidence:
    return DetectorEvidence(suspect_after, [trips], [30.0], [every], [every - 0.01], ["continued"])


def test_the_detector_chosen_tripped_nothing_and_every_rank_knew_soonest_with_it():
    d = detector_candidates(gaps(0.054), 0.05)
    found = {"detector_0_2s": detector_evidence(trips=1, every=0.19, suspect_after=0.2),
             "detector_0_3s": detector_evidence(every=0.29), DETECTOR_DEFAULT: detector_evidence(every=0.1, suspect_after=0.4)}
    assert choose_detector(found, d) == "detector_0_3s"  # the default is beside them, not a candidate
    missed = {"detector_0_3s": DetectorEvidence(0.3, [0], [30.0], [math.nan], [0.2], ["continued"])}
    assert choose_detector(missed, d) is None
    assert choose_detector({"detector_0_2s": detector_evidence(every=0.3, suspect_after=0.2),
                            "detector_0_3s": detector_evidence(every=0.3)}, d) == "detector_0_3s"  # tie: larger


def test_the_report_pastes_the_elastic_policy_with_the_chosen_threshold_or_says_none_passed():
    cands, d = candidates(measured()), detector_candidates(gaps(0.054), 0.05)
    c = cands[1]
    ok = {c.name: Evidence([0], [30.0], [0], [2.8], [2.6], ["failed-fast"])}
    found = {"detector_0_2s": detector_evidence(every=0.19, suspect_after=0.2), "detector_0_3s": detector_evidence(),
             DETECTOR_DEFAULT: detector_evidence(every=0.38, suspect_after=0.4)}
    findings = Findings(measured(), cands, ok, c.name, [], 0.5, gaps=gaps(), detectors=d, detector_evidence=found,
                        detector_interval_s=0.05)
    text = recommendation_text(findings)
    assert "## The failure detector (elastic policies)" in text and "max 0.054 s (rank 1)" in text
    assert "| detector_default | 0.4 s | 0 in 30 s over 1 controls | median 0.38 s of 1 | yes |" in text
    assert ('  tuned_2_5s_elastic: {"base": "elastic", "timeout": 2.5, "detector": {"interval": 0.05, '
            '"suspect_after": 0.2}}') in text and "`detector_0_2s` (the elastic policies' failure detector)" in text
    assert json.loads(tune_json(findings))["detector"] == "detector_0_2s"
    tripped = {name: replace(e, false_trips=[2]) for name, e in found.items()}
    text = recommendation_text(replace(findings, detector_evidence=tripped))
    assert "no threshold passed" in text and "_elastic" not in text


def test_the_detector_stage_runs_each_threshold_as_an_elastic_policy_then_stops_a_rank(tmp_path):
    stages = Stages(options(), tmp_path)
    c, d = candidates(measured())[1], detector_candidates(gaps(0.054), 0.05)
    cell = stages.detector(0, c, d)
    assert cell.policies == ("detector_0_2s", "detector_0_3s", DETECTOR_DEFAULT)
    spec = cell.scenario.policy("detector_0_2s")
    assert spec.elastic and spec.timeout == 2.5 and spec.detector.suspect_after == 0.2
    assert cell.scenario.policy(DETECTOR_DEFAULT).detector.suspect_after == DetectorSpec().suspect_after
    [fault] = cell.scenario.faults
    assert (fault.fault.kind, fault.start, fault.duration, fault.target.rank) == ("pause", 5.0, None, 3)
    assert stages.detector(1, c, d).policies == ("detector_0_2s", "detector_0_3s")  # the default once
    measure = stages.measure(0.25).scenario.policy(FAULT_FREE)  # the hearts beat; no silence judged
    assert measure.detector is not None and measure.detector.suspect_after >= 60


# -- torchrun's restarts (a user's job with job.tune.max_restarts: torchrun) ---------------------

def restart(setting: str, n: int, own: bool, outcome: str, used: int = 1, back: float = math.nan) -> RestartResult:
    return RestartResult(setting, n, own, outcome, used, back, 120.0, 48.0)


def test_the_restarts_stage_runs_the_chosen_timeout_under_torchrun_paused_past_it(tmp_path):
    stages = Stages(options(scenario_file=REPO / "scenarios" / "byo_link_down.yaml", ranks=4), tmp_path)
    assert stages.tunes_restarts
    c = candidates(measured(period=0.0, max_s=0.3, formation_s=None), with_retries=False)[1]  # 3 s
    cell = stages.restarts(c)
    assert cell.policies == ("restarts_0", "restarts_3", "restarts_3_own_store")
    s = cell.scenario
    jobs = {name: s.variants[name].applied_to(s.job) for name in cell.policies}
    assert {(j.launcher, j.max_restarts, j.command[-2:]) for j in jobs.values()} == \
        {("torchrun", 0, ("--timeout", "3")), ("torchrun", 3, ("--timeout", "3"))}
    assert jobs["restarts_3_own_store"].env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] == "1"
    assert "TORCH_DISABLE_SHARE_RDZV_TCP_STORE" not in jobs["restarts_3"].env
    [pause] = s.faults
    assert (pause.fault.kind, pause.target.rank, pause.duration) == ("pause", stages.target, 6.0)  # 3 s past 3 s
    assert s.hang_cap == 6.0 + 45.0
    no_refs = Stages(options(scenario_file=REPO / "scenarios" / "byo_link_down.yaml", ranks=4, references=False),
                     tmp_path)
    assert no_refs.restarts(c).policies == ("restarts_3", "restarts_3_own_store")
    # restarts_0; the references of the rounds and of the five faults; torch's rendezvous
    # defaults in the hosts stages of the two for good (kill, blackhole)
    assert trial_count(stages) == trial_count(no_refs) + 1 + 2 + 2 * 5 + 2
    assert not Stages(options(), tmp_path).tunes_restarts  # the built-in workload: no torchrun


def test_a_torchrun_knob_is_the_word_torchrun(tmp_path):
    text = (REPO / "scenarios" / "byo_link_down.yaml").read_text().replace("max_restarts: torchrun", "max_restarts: 3")
    (tmp_path / "job.yaml").write_text(text.replace("workdir: ../examples", f"workdir: {REPO / 'examples'}"))
    with pytest.raises(Exception, match=r"job\.tune\.max_restarts.*'torchrun'"):
        Stages(options(scenario_file=tmp_path / "job.yaml"), tmp_path / "stages")


def test_max_restarts_is_an_episode_s_restarts_times_the_episodes_and_the_store_only_where_it_mattered():
    shared, own = restart("restarts_3", 3, False, "recovered", back=21.0), restart("restarts_3_own_store", 3, True,
                                                                                  "recovered", back=19.0)
    none = restart("restarts_0", 0, False, "crashed")
    assert restart_choice([none, shared, own]) == shared  # both came back: no environment to set
    assert restart_choice([none]) is None and restart_choice([restart("restarts_3", 3, False, "hung")]) is None
    n, rule = max_restarts_of(shared)
    assert n == 3 and rule.startswith("--max-restarts 3: 3 fault episodes") and "(the trial ran" not in rule
    twice = replace(own, used=2)
    assert max_restarts_of(twice)[0] == 6 and max_restarts_of(twice)[1].endswith("(the trial ran --max-restarts 3)")
    cands = candidates(measured(period=0.0, max_s=0.3, formation_s=None), with_retries=False)
    stuck = replace(shared, outcome="hung", back_s=math.nan)
    text = recommendation_text(Findings(measured(period=0.0, max_s=0.3), cands, {}, cands[1].name, [], 0.5,
                                        variant={"args": ["--timeout", "3"]}, restarts=[none, stuck, own]))
    assert "## torchrun's restarts" in text and "| restarts_3 | 3 | shared (default) | 1 | - | >= 120 (to the cap) " \
        "| hung >= 48 s (cap) |" in text
    assert "TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 torchrun --max-restarts 3 ..." in text
    assert "with the shared store the restarted job ended hung where its own store brought it back" in text
    assert json.loads(tune_json(Findings(measured(), cands, {}, None, [], 0.5, restarts=[none, stuck, own])))[
        "max_restarts"]["env"] == {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}
    lost = recommendation_text(Findings(measured(period=0.0, max_s=0.3), cands, {}, cands[1].name, [], 0.5,
                                        variant={"args": ["--timeout", "3"]}, restarts=[none, stuck]))
    assert "no --max-restarts tried brought every rank back" in lost and "torchrun --max-restarts" not in lost


def test_a_job_s_fault_stage_runs_the_chosen_timeout_under_torchrun_with_the_restarts_chosen(tmp_path):
    stages = Stages(options(scenario_file=REPO / "scenarios" / "byo_link_down.yaml", ranks=4), tmp_path)
    c = candidates(measured(period=0.0, max_s=0.3, formation_s=None), with_retries=False)[1]  # 3 s
    own = restart("restarts_3_own_store", 3, True, "recovered", used=2, back=31.0)
    cell = stages.fault(FaultChoice("link_down", 10.0), c, own)
    assert cell.policies == ("tuned_3s", "tuned_3s_torchrun", "document_30s", "as_written")
    s = cell.scenario
    job = s.variants["tuned_3s_torchrun"].applied_to(s.job)
    assert (job.launcher, job.max_restarts, job.command[-2:]) == ("torchrun", 6, ("--timeout", "3"))  # 2 x 3 episodes
    assert job.env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] == "1"
    assert s.hang_cap == 10.0 + 45.0  # the flap, then a restart of every agent
    killed = stages.fault(FaultChoice("kill", None), c, replace(own, own_store=False, used=1))
    job = killed.scenario.variants["tuned_3s_torchrun"].applied_to(killed.scenario.job)
    assert job.max_restarts == 3 and "TORCH_DISABLE_SHARE_RDZV_TCP_STORE" not in job.env
    assert killed.scenario.hang_cap == 3.0 + 45.0
    assert stages.fault(FaultChoice("kill", None), c).policies == ("tuned_3s", "document_30s", "as_written")
    # the report: the flap the timeout alone did not come back from, which torchrun's restarts did
    cands = candidates(measured(period=0.0, max_s=0.3, formation_s=None), with_retries=False)
    flap = [FaultResult("link_down 10 s", True, "tuned_3s", "crashed", 3, 3.1, 3.2, math.nan, math.nan, 30.0, 55.0),
            FaultResult("link_down 10 s", True, "tuned_3s_torchrun", "recovered", 3, 3.1, 3.2, math.nan, 38.5, 90.0,
                        55.0),
            FaultResult("link_down 10 s", True, "as_written", "absorbed", 0, math.nan, math.nan, math.nan, math.nan,
                        40.0, 55.0)]
    killed = [FaultResult("kill", False, "tuned_3s_torchrun", "hung", 10, 0.1, 2.4, math.nan, math.nan, 764.0, 48.0,
                          "15 torchrun agents in rendezvous for 16 nodes (--nnodes): _delay (utils.py:181)"),
              FaultResult("kill", False, "tuned_3s", "crashed", 15, 0.1, 0.5, math.nan, math.nan, 0.0, 48.0)]
    stuck = replace(own, setting="restarts_3", own_store=False, outcome="hung", back_s=math.nan,
                    stuck_in="1 worker in init_process_group: ...")
    text = recommendation_text(Findings(measured(period=0.0, max_s=0.3), cands, {}, "tuned_3s", [], 0.5,
                                        variant={"args": ["--timeout", "3"]}, per_fault=flap + killed,
                                        restarts=[stuck, own]))
    # where the hung trials were at the cap, under the table each is in
    assert ("- kill, `tuned_3s_torchrun`: stuck in: 15 torchrun agents in rendezvous for 16 nodes (--nnodes): "
            "_delay (utils.py:181)") in text
    assert "- `restarts_3`: stuck in: 1 worker in init_process_group: ..." in text
    assert text.index("- `restarts_3`") < text.index("## What the settings do") < text.index("- kill, `tuned_3s_t")
    assert text.count("stuck in:") == 2  # not the trials that ended
    assert "Under kill, torchrun's restarts did not bring the job back: a host gone for good" in text
    assert "`job.min_hosts`" in text and text.count("torchrun's restarts did not bring") == 1  # not the flap
    assert "`*_torchrun`: the same timeout under torchrun" in text
    assert text.index("## torchrun's restarts") < text.index("## What the settings do, per fault")
    assert ("Under link_down 10 s, `tuned_3s` ended crashed; under torchrun with the restarts recommended below it "
            "came back: every rank stepping again 38.50 s after the fault began.") in text
    assert "where as_written came back" not in text


def test_an_agent_s_restarts_are_its_rank_s_processes_begun_after_the_fault():
    events = [{"kind": "rank_start", "rank": r, "t": 0.1} for r in range(4)] + [
        {"kind": "fault_applied", "t": 2.0}, {"kind": "rank_start", "rank": 1, "t": 9.0},
        {"kind": "rank_start", "rank": 1, "t": 15.0}, {"kind": "rank_start", "rank": 2, "t": 9.1}]
    assert restarts_used(events, 2.0) == 2 and restarts_used(events[:4], 2.0) == 0
    # torchrun's restart count where the hook recorded it: a restart for a host that joined
    # (rank 0's second and third processes) spends none, a failed worker's (rank 1's) one each
    counted = [{"kind": "rank_start", "rank": r, "t": 0.1, "restart": 0} for r in range(2)] + [
        {"kind": "rank_start", "rank": 0, "t": 9.0, "restart": 1}, {"kind": "rank_start", "rank": 1, "t": 9.0,
                                                                    "restart": 1},
        *({"kind": "rank_start", "rank": 0, "t": t, "restart": 1} for t in (10.6, 12.7)),
        *({"kind": "rank_start", "rank": 1, "t": t, "restart": n} for t, n in ((10.6, 2), (12.7, 3)))]
    assert restarts_used(counted, 2.0) == 3
    assert restarts_used([e for e in counted if e["rank"] == 0], 2.0) == 1
    assert restarts_used(counted, 10.0) == 2  # rank 1 began at count 1 before then


def test_a_host_gone_for_good_is_tried_with_nnodes_one_short_and_a_rendezvous_conf_from_the_measurement(tmp_path):
    stages = Stages(options(scenario_file=REPO / "scenarios" / "byo_link_down.yaml", ranks=4), tmp_path)
    fast = measured(period=0.0, max_s=0.3, formation_s=None)
    c = candidates(fast, with_retries=False)[1]  # 3 s
    conf, rule = rdzv_conf_for(fast)
    assert conf == {"keep_alive_interval": 1, "last_call_timeout": 2}  # 2 x 0.3 s -> 1 s, at least 2 s
    assert rdzv_conf_for(measured(period=0.0, max_s=1.2))[0]["last_call_timeout"] == 3  # 2.4 s, whole seconds
    assert "dropped 3 s (3 missed keep-alives" in rule and "not 30 s" in rule
    assert (rdzv_wait_s({}), rdzv_wait_s(conf)) == (5 * 3 + 30, 1 * 3 + 2)
    own = restart("restarts_3_own_store", 3, True, "recovered", used=1, back=25.0)
    cell = stages.hosts(FaultChoice("kill", None), c, own, conf)
    assert cell.policies == ("tuned_3s_min_hosts", "tuned_3s_min_hosts_torch_rdzv")
    assert cell.scenario.name.endswith("-hosts-kill")
    jobs = {n: cell.scenario.variants[n].applied_to(cell.scenario.job) for n in cell.policies}
    assert {(j.launcher, j.max_restarts, j.min_hosts, j.env.get("TORCH_DISABLE_SHARE_RDZV_TCP_STORE"))
            for j in jobs.values()} == {("torchrun", 3, 3, "1")}
    assert jobs["tuned_3s_min_hosts"].rdzv_conf == conf and jobs["tuned_3s_min_hosts_torch_rdzv"].rdzv_conf == {}
    [kill] = cell.scenario.faults
    assert (kill.fault.kind, kill.target.rank, kill.duration) == ("kill", stages.target, None)
    assert cell.scenario.hang_cap == 3.0 + 45.0 + 45.0  # torch's rendezvous waits longest, then the restart
    alone = Stages(options(scenario_file=REPO / "scenarios" / "byo_link_down.yaml", ranks=4, references=False),
                   tmp_path).hosts(FaultChoice("kill", None), c, own, conf)
    assert alone.policies == ("tuned_3s_min_hosts",) and alone.scenario.hang_cap == 3.0 + 5.0 + 45.0
    # any fault for good: a host killed, cut off or frozen never comes back while the harness watches
    assert all(FaultChoice(kind, None).for_good for kind in ("kill", "blackhole", "link_down", "pause"))
    assert not FaultChoice("blackhole", 10.0).for_good
    cut_off = Stages(options(scenario_file=REPO / "scenarios" / "byo_link_down.yaml", ranks=4,
                             faults=(FaultChoice("blackhole", None),)), tmp_path)
    assert trial_count(cut_off) == trial_count(Stages(options(
        scenario_file=REPO / "scenarios" / "byo_link_down.yaml", ranks=4, faults=(FaultChoice("kill", None),)),
        tmp_path))
    [blackhole] = cut_off.hosts(FaultChoice("blackhole", None), c, own, conf).scenario.faults
    assert (blackhole.fault.kind, blackhole.target.rank, blackhole.duration) == ("blackhole", stages.target, None)
    cut = FaultResult("blackhole for good", False, "tuned_3s_torchrun", "hung", 1, 3.2, 3.2, math.nan, math.nan,
                      103.0, 48.0)
    [note] = dead_host_notes([cut], "tuned_3s")
    assert note.startswith("Under blackhole for good,") and "the next table" in note


def hosts(setting: str, conf: dict, outcome: str, back: float = math.nan, world: int | None = 15) -> HostsResult:
    return HostsResult("kill", setting, 15, 16, conf, outcome, world, 1, back, 120.0, 93.0)


def test_going_on_without_a_host_recommends_the_soonest_back_and_says_when_none_came_back():
    conf, rule = rdzv_conf_for(measured(period=0.0, max_s=0.3, formation_s=None))
    quick, slow = hosts("tuned_3s_min_hosts", conf, "continued", back=14.2), hosts("tuned_3s_min_hosts_torch_rdzv", {},
                                                                                  "continued", back=52.0)
    assert hosts_choice([slow, quick]) == (quick,) and hosts_choice([replace(quick, outcome="hung"), slow]) == (slow,)
    assert hosts_choice([replace(quick, outcome="hung", world=None)]) == ()
    # two faults for good: the setting back under both, the sooner at its slowest
    cut_quick, cut_slow = replace(quick, fault="blackhole for good", back_s=38.2), replace(slow, fault="blackhole for good",
                                                                                           back_s=66.0)
    assert hosts_choice([quick, slow, cut_quick, cut_slow]) == (quick, cut_quick)
    assert hosts_choice([quick, slow, replace(cut_quick, outcome="hung"), cut_slow]) == (slow, cut_slow)
    cands = candidates(measured(period=0.0, max_s=0.3, formation_s=None), with_retries=False)
    own = restart("restarts_3_own_store", 3, True, "recovered", used=1, back=25.0)
    killed = [FaultResult("kill", False, "tuned_3s_torchrun", "hung", 10, 0.1, 2.4, math.nan, math.nan, 764.0, 48.0)]

    def report(rows: list[HostsResult]) -> str:
        return recommendation_text(Findings(measured(period=0.0, max_s=0.3), cands, {}, "tuned_3s", [], 0.5,
                                            variant={"args": ["--timeout", "3"]}, per_fault=killed, restarts=[own],
                                            hosts=rows))
    text = report([quick, slow])
    assert "## A host gone for good, under torchrun" in text and "--nnodes 15:16 (job.min_hosts 15)" in text
    assert ("| kill | tuned_3s_min_hosts | keep_alive_interval=1,last_call_timeout=2 | 15 | 1 | 14.20 s | 120 | "
            "continued |") in text
    assert "| kill | tuned_3s_min_hosts_torch_rdzv | torch's defaults | 15 | 1 | 52.00 s |" in text
    assert text.index("## What the settings do") < text.index("## A host gone for good") < text.index("## Recommended")
    assert "lets the others go on without it: the next table" in text
    assert ("TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 torchrun --nnodes 15:16 --max-restarts 3 --rdzv-conf "
            "keep_alive_interval=1,last_call_timeout=2 ...") in text
    assert ("Under kill the others went on as 15 hosts, every rank stepping again 14.20 s after the fault began "
            "(torch's rendezvous defaults: 52.00 s, continued)") in text
    both = report([quick, slow, cut_quick, cut_slow])
    assert ("Under kill the others went on as 15 hosts, every rank stepping again 14.20 s after the fault began "
            "(torch's rendezvous defaults: 52.00 s, continued); under blackhole for good the others went on as 15 "
            "hosts, every rank stepping again 38.20 s after the fault began (torch's rendezvous defaults: 66.00 s, "
            "continued).") in both
    assert "Under kill, blackhole for good, no --nnodes 15:16 setting tried brought the other hosts back every time" in \
        report([replace(quick, outcome="hung"), slow, cut_quick, replace(cut_slow, outcome="hung")])
    slow_only = report([replace(quick, outcome="hung", back_s=math.nan, world=None), slow])
    assert "torchrun --nnodes 15:16 --max-restarts 3 ..." in slow_only and "torch's rendezvous defaults (the" in slow_only
    none = report([replace(quick, outcome="hung", back_s=math.nan, world=None)])
    assert "no --nnodes 15:16 setting tried brought the other hosts back" in none and "torchrun --nnodes" not in none
    found = json.loads(tune_json(Findings(measured(period=0.0, max_s=0.3), cands, {}, "tuned_3s", [], 0.5,
                                          hosts=[quick, slow])))
    assert found["min_hosts"] == {"min_hosts": 15, "rdzv_conf": conf, "from": "tuned_3s_min_hosts", "rule": rule}
