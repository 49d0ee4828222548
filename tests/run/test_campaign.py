"""`chaos campaign` without a cluster: the mix's checks, the schedule's draw, the measures'
arithmetic on a scripted event history, the command's refusals and its dry run."""
from __future__ import annotations

import math
from pathlib import Path

import pytest

from chaos.errors import UsageError
from harness.cli import main
from harness.studies.campaign.mix import load_mix
from harness.studies.campaign.schedule import draw_schedule
from reports.campaign import executions, measure

REPO = Path(__file__).resolve().parents[2]
SCENARIO = REPO / "scenarios" / "link_down.yaml"


# -- the mix -------------------------------------------------------------------------------

def test_the_llama3_mix_adds_up_and_says_what_the_backend_cannot_inject() -> None:
    mix = load_mix("llama3")
    assert math.isclose(sum(c.share for c in mix.categories), 1.0, abs_tol=1e-9)
    assert "arXiv:2407.21783" in mix.source
    netns = {m.category.name: m for m in mix.mapping("netns", 16)}
    local = {m.category.name: m for m in mix.mapping("local", 16)}
    assert netns["network_switch_cable"].injection.kind == "link_down"
    # the local backend has no links: said and left out, not merged into another category
    assert local["network_switch_cable"].injection is None
    assert "local backend's hosts have none" in local["network_switch_cable"].left_out
    # host maintenance: a preempt where a scheduler makes one, else a kill with notice
    assert netns["host_maintenance"].injection.fault == {"kind": "kill", "signal": "SIGTERM"}
    assert {m.category.name: m for m in mix.mapping("slurm", 16)}["host_maintenance"].injection.kind == "preempt"
    assert netns["silent_data_corruption"].injection is None


def _mix(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "mine.yaml"
    path.write_text(text)
    return path


@pytest.mark.parametrize("categories, wanted", [
    ("  a: {share: 0.5, inject: [{kind: kill}]}\n  b: {share: 0.3, inject: [{kind: kill}]}\n",
     ":4: categories: the shares add up to 0.800, not 1"),
    ("  faulty_gpu: 0.5\n  cosmic_ray: 0.5\n", ":5: categories.cosmic_ray: unknown category 'cosmic_ray'"),
    ("  a: {share: 1.0, inject: [{kind: meteor}]}\n", ":4: categories.a.inject.0: kind: unknown fault kind 'meteor'"),
    ("  a: {share: 1.0, inject: [{kind: kill, duration: 5s}]}\n", "cannot be undone; remove 'duration'"),
    ("  a: {share: 1.0, inject: [{kind: link_down, duration: {min: 9s, max: 2s}}]}\n", "min <= max"),
    ("  a: {share: 0, inject: []}\n  b: 1.0\n", ":4: categories.a.share: 0; expected a fraction above 0"),
])
def test_a_bad_mix_is_refused_naming_file_line_field_and_fix(tmp_path: Path, categories: str, wanted: str) -> None:
    path = _mix(tmp_path, f"name: mine\nsource: my incident log\ncategories:\n{categories}")
    with pytest.raises(UsageError) as caught:
        load_mix(str(path))
    assert str(caught.value).startswith(str(path)) and wanted in str(caught.value), caught.value


def test_a_mix_of_known_categories_takes_llama3s_mapping(tmp_path: Path) -> None:
    mix = load_mix(str(_mix(tmp_path, "source: x\ncategories:\n  faulty_gpu: 0.7\n  nic: 0.3\n")))
    assert [i.kind for c in mix.categories for i in c.inject] == ["kill", "link_down"]


# -- the schedule --------------------------------------------------------------------------

def test_the_schedule_is_a_function_of_the_seed_and_never_hits_a_killed_rank() -> None:
    mapping = load_mix("llama3").mapping("netns", 8)
    first = draw_schedule(mapping, 20.0, 1200.0, 3.0, 8, seed=7)
    assert first == draw_schedule(mapping, 20.0, 1200.0, 3.0, 8, seed=7)
    assert first != draw_schedule(mapping, 20.0, 1200.0, 3.0, 8, seed=8)
    # the same arrival times on a backend that injects less: only what is injected differs
    local = draw_schedule(load_mix("llama3").mapping("local", 8), 20.0, 1200.0, 3.0, 8, seed=7)
    assert [f.at for f in local] == [f.at for f in first]
    assert all(3.0 < f.at < 1200.0 for f in first)
    gaps = [b.at - a.at for a, b in zip(first, first[1:], strict=False)]
    assert 10.0 < sum(gaps) / len(gaps) < 30.0   # exponential gaps of mean 20 s, ~60 of them
    killed: set[int] = set()
    for f in first:
        assert f.target not in killed
        if f.kind == "kill":
            killed.add(f.target)
    assert len(killed) <= 6 and any(f.left_out and "no rank left" in f.left_out for f in first)
    assert all(f.duration is None or f.at + f.duration <= 1200.0 for f in first)


# -- the measures --------------------------------------------------------------------------

def _steps(segment: int, gen: int, first: int, count: int, t0: float, period: float, ranks: int = 2) -> list[dict]:
    return [{"t": t0 + i * period + r * 0.001, "src": "rank", "rank": r, "kind": "step", "segment": segment,
             "gen": gen, "step": first + i} for i in range(count) for r in range(ranks)]


def test_ettr_and_the_lost_time_add_up_on_a_scripted_history() -> None:
    """Two ranks step every P s. A fault at F; the first detection D s later; the ranks
    restore the checkpoint at step C and step again R s after the detection (generation 1),
    redoing C+1..L; later the job hangs to the cap and a new job (segment 1) resumes from
    the newest checkpoint after a restart gap."""
    P, F, D, R, C, L, cap, gap = 0.25, 10.0, 2.0, 3.0, 30, 40, 5.0, 4.0
    start = 0.0
    events = _steps(0, 0, 1, L, start + P, P)                         # steps 1..40, the last at 10.0
    events.append({"t": F, "src": "harness", "rank": None, "kind": "fault_applied", "segment": 0, "index": 0,
                   "fault_kind": "link_down"})
    events.append({"t": F + D, "src": "rank", "rank": 0, "kind": "collective_error", "segment": 0})
    resumed = F + D + R
    events += _steps(0, 1, C + 1, 40, resumed, P)                      # steps 31..70
    last = resumed + 39 * P                                            # step 70
    hang_at = last + cap
    events.append({"t": hang_at, "src": "harness", "rank": None, "kind": "hang_detected", "segment": 0,
                   "cap": cap, "idle_since": last})
    events.append({"t": hang_at + 0.5, "src": "harness", "rank": None, "kind": "trial_end", "segment": 0})
    again = hang_at + gap
    events += _steps(1, 0, 61, 20, again, P)                           # a new job from checkpoint 60: 61..80
    end = again + 19 * P + 0.001                                     # its last rank's step
    m = measure(sorted(events, key=lambda e: e["t"]), start, end)

    kept = executions(events, start, end)
    assert [e.step for e in kept if e.kept] == list(range(1, 81))
    redone = (L - C) + (70 - 60)                                       # 31..40 of gen 0, 61..70 of gen 1
    assert m.kept_steps == 80 and len([e for e in kept if not e.kept]) == redone
    assert math.isclose(m.kept_s, 80 * P + 0.002, abs_tol=0.01)        # each step's own period (its ranks' finish)
    assert math.isclose(m.lost_s["recompute"], redone * P, abs_tol=0.01)
    assert math.isclose(m.lost_s["hang"], cap, abs_tol=0.01)
    assert math.isclose(m.lost_s["detection"], (F + D) - L * P, abs_tol=0.01)  # the stall up to the first detection
    # after the detection: to the first step of the restored generation; after the hang: the new job's start
    assert math.isclose(m.lost_s["restart"], (resumed - P - (F + D)) + (again - P - hang_at), abs_tol=0.01)
    assert math.isclose(sum(m.lost_s.values()) + m.kept_s, end - start, abs_tol=1e-6)
    assert math.isclose(m.ettr, m.kept_s / (end - start))
    assert math.isclose(m.goodput, 80 / (end - start))
    [fault] = m.faults
    assert math.isclose(fault.detect_s, D) and math.isclose(fault.resume_s, D + R + 0.001, abs_tol=0.01)
    assert not fault.hung and m.hangs == 1 and m.segments == 2 and m.final_ranks == 2


def test_a_job_restarted_faster_than_a_step_still_loses_its_restart() -> None:
    """A kill ends the job at E (a detection just before); the new job starts 0.1 s later and
    makes its first step 0.1 s after its restore, sooner than a step of P takes: that step's
    time is the 0.1 s, so the stall from the old job's last step to the restore is lost to
    detection and restart, not hidden in the new job's first step (CI caught it so)."""
    P, E = 0.25, 5.0
    events = _steps(0, 0, 1, 19, P, P)                                 # steps 1..19, the last at 4.75
    events.append({"t": E - 0.1, "src": "rank", "rank": 0, "kind": "collective_error", "segment": 0})
    events.append({"t": E, "src": "harness", "rank": None, "kind": "trial_end", "segment": 0,
                   "reason": "all-exited"})
    events.append({"t": E + 0.1, "src": "harness", "rank": None, "kind": "trial_start", "segment": 1})
    restore = E + 0.2
    events += [{"t": restore, "src": "rank", "rank": r, "kind": "restored", "segment": 1, "gen": 0, "step": 16}
               for r in range(2)]
    events += _steps(1, 0, 17, 8, restore + 0.1, P)                    # steps 17..24
    end = restore + 0.1 + 7 * P + 0.001
    m = measure(sorted(events, key=lambda e: e["t"]), 0.0, end)
    [first] = [e for e in executions(events, 0.0, end) if e.segment == 1 and e.step == 17]
    assert math.isclose(first.seconds, 0.1 + 0.001, abs_tol=1e-6)
    assert math.isclose(m.lost_s["detection"], (E - 0.1) - 19 * P, abs_tol=0.01)
    assert math.isclose(m.lost_s["restart"], restore - (E - 0.1), abs_tol=0.01)
    assert math.isclose(sum(m.lost_s.values()) + m.kept_s, end, abs_tol=1e-6)


def test_the_ranks_at_the_end_count_every_rank_of_the_last_step_the_window_cut() -> None:
    """Three ranks finish each step 1 ms apart; the window ends after the first of them
    finished its last step: the job still ends with 3 ranks."""
    events = _steps(0, 0, 1, 8, 0.25, 0.25, ranks=3)
    end = 8 * 0.25 + 0.0005
    assert measure(events, 0.0, end).final_ranks == 3


# -- the command -----------------------------------------------------------------------------

@pytest.mark.parametrize("args, wanted", [
    (["--mtbf", "0s"], "--mtbf 0s: must be above 0"),
    (["--duration=-5m"], "is negative"),
    (["--mtbf", "60s", "--duration", "40s"], "less than one fault is expected"),
    (["--policy", "nope"], "--policy nope: not in"),
    (["--repeat", "0"], "--repeat 0: must be at least 1"),
    (["--nodes", "2000"], "--nodes and --node-mtbf go together"),
    (["--mix", "nowhere"], "--mix nowhere: no such mix"),
    (["--ranks", "1"], "cluster.ranks"),
])
def test_bad_values_are_refused_before_anything_runs(capsys, args: list[str], wanted: str) -> None:
    assert main(["campaign", str(SCENARIO), "--dry-run", *args]) == 2
    assert wanted in capsys.readouterr().err


def test_the_dry_run_prints_the_mapping_and_the_same_schedule_for_a_seed(capsys) -> None:
    args = ["campaign", str(SCENARIO), "--dry-run", "--mtbf", "45s", "--duration", "10m", "--seed", "5",
            "--policy", "retry", "--policy", "elastic"]
    assert main(args) == 0
    first = capsys.readouterr().out
    assert main(args) == 0
    assert capsys.readouterr().out == first
    assert "network_switch_cable       8.4%  link_down for 5s..30s (uniform)" in first
    assert "silent_data_corruption     1.4%  left out" in first
    assert "the same for every policy" in first and "policies: retry, elastic" in first


def test_ranks_and_backend_override_the_scenarios_as_chaos_run_s_do(capsys) -> None:
    assert main(["campaign", str(SCENARIO), "--dry-run", "--mtbf", "45s", "--duration", "10m", "--seed", "5",
                 "--ranks", "8", "--backend", "local"]) == 0
    out = capsys.readouterr().out
    assert "mapping on the local backend:" in out and "network_switch_cable       8.4%  left out" in out
    # the schedule's targets are among the 8 ranks (the scenario's 16 would draw some above)
    targets = [int(word[1:]) for line in out.splitlines() for word in line.split() if word[:1] == "r" and word[1:].isdigit()]
    assert len(targets) > 5 and max(targets) < 8


def test_the_projection_gives_back_the_measured_ettr_at_the_campaigns_own_fault_rate() -> None:
    from reports.campaign import FaultCost, PolicyMeasures, project
    lost = {"detection": 6.0, "restart": 9.0, "recompute": 3.0, "hang": 0.0, "other": 0.5}
    faults = [FaultCost(i, "kill", 10.0 * i, 1.0, 2.0, False) for i in range(3)]
    m = PolicyMeasures(wall_s=100.0, kept_steps=300, kept_s=100.0 - sum(lost.values()), lost_s=lost, faults=faults)
    e0 = 0.99
    own_rate = project(m, e0, nodes=1, node_mtbf_s=m.wall_s / len(faults))
    assert math.isclose(own_rate.ettr, m.ettr) and own_rate.dominant == "restart"
    scaled = project(m, e0, nodes=2000, node_mtbf_s=1000 * 3600.0)
    assert math.isclose(scaled.job_mtbf_s, 1800.0)
    assert math.isclose(scaled.ettr, e0 * (1 - own_rate.cost_s / 1800.0))
    assert project(PolicyMeasures(100.0, 400, 99.0, dict.fromkeys(lost, 0.0)), e0, 2000, 3600.0) is None


def test_a_heal_able_kind_without_a_duration_and_another_campaign_format_are_refused(tmp_path: Path) -> None:
    from reports.campaign import write_campaign_report
    from runfolder.info import RunFolderError
    path = _mix(tmp_path, "source: x\ncategories:\n  flaky: {share: 1.0, inject: [{kind: loss, percent: 20%}]}\n")
    with pytest.raises(UsageError, match=r"mine.yaml:3: categories.flaky.inject.0: a loss needs a duration"):
        load_mix(str(path))
    (tmp_path / "campaign.json").write_text('{"format": 0}')
    with pytest.raises(RunFolderError, match="campaign format 0; this harness reads format 1"):
        write_campaign_report(tmp_path)


def test_the_spread_over_windows_gives_each_policys_median_and_range(tmp_path: Path) -> None:
    import json

    from reports.campaign import spread_text
    from runfolder.layout import CAMPAIGN_FILE, CAMPAIGN_FORMAT, TRIAL_FILE

    def window(r: int, stall: float) -> Path:
        """A window where `ranks` step every 0.25 s for 10 s; the policy stalls `stall` s once."""
        folder = tmp_path / f"window-{r}"
        policies = {}
        for policy, gap in (("reference", 0.0), ("retry", stall)):
            trial = folder / policy / "run" / "trials" / policy
            trial.mkdir(parents=True)
            (trial / TRIAL_FILE).write_text("{}")
            steps = [{**e, "t": e["t"] + (gap if e["step"] > 20 else 0.0)} for e in _steps(0, 0, 1, 40, 0.25, 0.25)]
            warm = {"t": 0.0, "src": "harness", "rank": None, "kind": "warmup_done", "step": 0}
            (trial / "events.jsonl").write_text("".join(json.dumps({k: v for k, v in e.items() if k != "segment"}) + "\n"
                                                        for e in [warm, *steps]))
            policies[policy] = {"segments": [{"run_dir": str(folder / policy / "run"), "faults": []}]}
        (folder / CAMPAIGN_FILE).write_text(json.dumps({"format": CAMPAIGN_FORMAT, "duration_s": 10.0,
                                                        "partial": False, "policies": policies}))
        return folder

    stalls = [1.0, 3.0, 2.0]
    text = spread_text([window(r, s) for r, s in enumerate(stalls)], tmp_path)
    row = next(line for line in text.splitlines() if line.startswith("| retry |"))
    # every policy is measured over the 10 s window: the stall pushes steps out of it
    ettrs = sorted((10.0 - stall) / 10.0 for stall in stalls)
    assert row.startswith(f"| retry | 3 | {ettrs[1]:.1%} ({ettrs[0]:.1%}-{ettrs[2]:.1%}) |"), row
    assert (tmp_path / "spread.md").read_text().count("| retry |") == 1


def test_a_restarted_job_carries_the_faults_still_ahead_shifted_and_trains_to_the_windows_end() -> None:
    from harness.scenario.scenario import load_scenario
    from harness.studies.campaign.run import segment_scenario
    from harness.studies.campaign.schedule import ScheduledFault
    base = load_scenario(SCENARIO)
    schedule = (ScheduledFault(10.0, "faulty_gpu", {"kind": "kill"}, None, 3),
                ScheduledFault(50.0, "nic", {"kind": "link_down"}, 40.0, 4),
                ScheduledFault(70.0, "other", None, None, None, "not mapped"))
    first, carried = segment_scenario(base, "timeout", schedule, 0.0, 80.0, "w-timeout-0")
    assert carried == [0, 1] and [f.start for f in first.faults] == [10.0, 50.0]
    assert first.faults[1].duration == 30.0          # cut at the window's end
    assert first.settle_steps == 1 and first.expect == {} and list(first.policies) == ["timeout"]
    later, carried = segment_scenario(base, "timeout", schedule, 20.0, 60.0, "w-timeout-1")
    assert carried == [1] and later.faults[0].start == 30.0 and later.faults[0].duration == 30.0
    quiet, carried = segment_scenario(base, "retry", schedule, 55.0, 25.0, "w-reference", label="reference")
    assert carried == [] and quiet.settle_steps == math.ceil(25.0 / base.workload.step_period)
    assert quiet.policy("reference").base == "retry" and quiet.policy("reference").timeout == 5.0


def test_a_users_job_campaigns_its_variants_and_a_new_job_resumes_from_the_checkpoint_it_names(
        tmp_path: Path) -> None:
    from harness.studies.campaign.prepare import load_campaign_scenario, plan_campaign
    from harness.studies.campaign.run import _carry_checkpoint, segment_scenario
    byo = REPO / "scenarios" / "byo_kill.yaml"
    base, own_faults = load_campaign_scenario(byo, {"cluster.ranks": 4, "seed": 2})
    assert own_faults and base.faults == () and base.expect == {}
    plan = plan_campaign(base, byo, None, "llama3", "15s", "60s")
    assert plan.policies == ("default", "timeout_5s")  # the job's variants
    with pytest.raises(UsageError, match="--policy elastic: not a variant of the job in .* \\(default, timeout_5s\\)"):
        plan_campaign(base, byo, ["elastic"], "llama3", "15s", "60s")
    # one variant per job, under its label: the reference is the first variant's job as it is
    job, _ = segment_scenario(base, "timeout_5s", plan.schedules[0], 0.0, 60.0, "w-timeout_5s-0")
    assert job.trial_names() == ["timeout_5s"] and job.variants["timeout_5s"].args == ("--timeout", "5")
    reference, _ = segment_scenario(base, "default", (), 0.0, 60.0, "w-reference", label="reference")
    assert reference.trial_names() == ["reference"] and reference.job == base.job
    # the job keeps its checkpoint at {trial_dir}/checkpoint.pt: the next job finds it there
    old, new = tmp_path / "old", tmp_path / "new"
    old.mkdir(), new.mkdir()
    (old / "checkpoint.pt").write_bytes(b"step 40")
    (old / "events.jsonl").write_text("{}\n")
    _carry_checkpoint(job, "timeout_5s", old, new)
    assert sorted(p.name for p in new.iterdir()) == ["checkpoint.pt"] and (new / "checkpoint.pt").read_bytes() == b"step 40"


def _states(segment: int, first_step: int, count: int, t0: float, period: float, fingerprint_at) -> list[dict]:
    """A user's job's rank 0 `state` events: its start state, then one per step (hook counts)."""
    start = {"t": t0 - 0.01, "src": "rank", "rank": 0, "kind": "state", "segment": segment, "gen": 0, "step": 0,
             "at": "start", "fingerprint": fingerprint_at(segment, 0), "optim": "o"}
    return [start] + [{"t": t0 + i * period + 0.0005, "src": "rank", "rank": 0, "kind": "state", "segment": segment,
                       "gen": 0, "step": first_step + i, "at": "step", "fingerprint": fingerprint_at(segment, first_step + i),
                       "optim": "o"} for i in range(count)]


def test_a_users_job_that_resumed_counts_its_steps_from_the_step_its_checkpoint_held() -> None:
    """The hook counts a process's steps from 1: job 1 resumed from job 0's step 30 (its
    start state equals the state job 0 recorded there) and counts 1..20, which are 31..50;
    only 31..34 of job 0 were rolled back. A job whose start state matches nothing began
    from scratch: all before it is rolled back."""
    from reports.campaign import resumed_steps
    P = 0.25

    def resumed_from_30(segment: int, step: int) -> str:
        return "s30" if (segment, step) in ((0, 30), (1, 0)) else f"{segment}/{step}"

    events = sorted(_steps(0, 0, 1, 34, P, P) + _states(0, 1, 34, P, P, resumed_from_30)
                    + _steps(1, 0, 1, 20, 10.0, P) + _states(1, 1, 20, 10.0, P, resumed_from_30), key=lambda e: e["t"])
    renumbered = resumed_steps(events)
    assert sorted({e["step"] for e in renumbered if e["kind"] == "step" and e["segment"] == 1}) == list(range(31, 51))
    m = measure(renumbered, P, 10.0 + 20 * P)
    assert m.kept_steps == 50 and math.isclose(m.lost_s["recompute"], 4 * P, abs_tol=1e-6)
    scratch = resumed_steps(sorted(_steps(0, 0, 1, 34, P, P) + _states(0, 1, 34, P, P, lambda s, n: f"{s}/{n}")
                                   + _steps(1, 0, 1, 20, 10.0, P) + _states(1, 1, 20, 10.0, P, lambda s, n: f"{s}/{n}"),
                                   key=lambda e: e["t"]))
    assert measure(scratch, P, 10.0 + 20 * P).kept_steps == 20
    # the built-in runner records no start state: its steps are training steps, left as they are
    builtin = _steps(0, 0, 1, 10, P, P)
    assert resumed_steps(builtin) == builtin
