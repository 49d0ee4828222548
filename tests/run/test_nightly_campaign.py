"""A night's campaign cell without a cluster: the plan's `campaigns:` entry expands into a
cell that `chaos campaign` would run (its schedule, its command), a bad entry is refused
naming the plan's file, line and field, and the night's history, gate and files fail the
cell, naming the policy, its ETTR and the bar, when its ETTR is below the bar."""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from chaos.errors import UsageError
from harness.scenario.scenario import load_scenario
from harness.studies.campaign.prepare import plan_campaign
from harness.studies.nightly import CampaignCell, expand, load_night_plan
from harness.studies.nightly.matrix import campaign_bars
from harness.studies.nightly.plan import plan_digest
from reports.nightly import (EttrBar, NightRun, append_night, judge_ettr, markdown_summary, night_history,
                             night_report, read_history)
from reports.nightly.campaign import CAMPAIGN_SUFFIX
from reports.nightly.outputs import junit_xml
from tests.reports.nightly.nightly_fakes import info

SCENARIO = """\
name: camp
cluster: {ranks: 4}
workload: {step_period: 250ms, checkpoint_every: 8}
warmup_steps: 4
hang_cap: 20s
policies:
  timeout: {timeout: 3s}
  elastic: {}
"""
PLAN = """\
seed: 1
runs: []
campaigns:
  - scenario: camp.yaml
    policies: [timeout, elastic]
    duration: 40s
    mtbf: 10s
    seed: 2
    gate:
      elastic: {ettr_at_least: 0.8}
      timeout: {ettr_of_reference_at_least: 0.5}
"""


def plan_file(tmp_path: Path, text: str = PLAN) -> Path:
    (tmp_path / "camp.yaml").write_text(SCENARIO)
    (tmp_path / "plan.yaml").write_text(text)
    return tmp_path / "plan.yaml"


def test_a_campaign_entry_is_the_campaign_chaos_campaign_runs_with_its_bars(tmp_path: Path) -> None:
    path = plan_file(tmp_path)
    [cell] = expand(load_night_plan(path), path)
    assert isinstance(cell, CampaignCell)
    assert cell.key == "campaign/camp/timeout+elastic" and cell.trials == 3  # and the fault-free reference
    # the schedule is the one `chaos campaign camp.yaml --seed 2 ...` draws: the same every night
    same = plan_campaign(load_scenario(tmp_path / "camp.yaml", {"seed": 2, "cluster.backend": "netns"}),
                         tmp_path / "camp.yaml", ["timeout", "elastic"], "llama3", "10s", "40s")
    assert cell.campaign.schedules == same.schedules and any(f.fault for f in same.schedules[0])
    assert cell.command == (f"chaos campaign {tmp_path / 'camp.yaml'} --mix llama3 --mtbf 10s --duration 40s "
                            "--backend netns --policy timeout --policy elastic --seed 2")
    assert campaign_bars((cell,))[cell.key] == ("camp", cell.command, {
        "elastic": EttrBar(at_least=0.8), "timeout": EttrBar(of_reference_at_least=0.5)})
    # another bar is another plan: a night resumes only under the same digest
    (tmp_path / "other").mkdir()
    other = plan_file(tmp_path / "other", PLAN.replace("0.8", "0.7"))
    assert plan_digest(load_night_plan(path), (cell,)) != plan_digest(load_night_plan(other),
                                                                      expand(load_night_plan(other), other))


@pytest.mark.parametrize("change, wanted", [
    (("0.8", "1.5"), ":10: campaigns.0.gate.elastic.ettr_at_least: Input should be less than or equal to 1"),
    (("{ettr_at_least: 0.8}", "{}"), ":10: campaigns.0.gate.elastic: no bar; give ettr_at_least: 0.8"),
    (("      elastic:", "      retry:"), ":10: campaigns.0.gate.retry: 'retry' is not a policy of this campaign "
                                         "(timeout, elastic); gate one of those"),
    (("mtbf: 10s", "mtbf: 5m"), ":7: campaigns.0.mtbf: mtbf 5m over duration 40s: less than one fault is expected"),
    (("mtbf: 10s", "mtbf: soon"), ":7: campaigns.0.mtbf: mtbf soon:"),
    (("[timeout, elastic]", "[timeout, shrug]"), ":5: campaigns.0.policies: policies shrug: not in "),
    (("camp.yaml", "c*.yaml"), ":4: campaigns.0.scenario: 'c*.yaml': a campaign runs one scenario"),
    (("    seed: 2\n", "    seed: 2\n    ranks: 1\n"), ":9: campaigns.0.ranks: Input should be greater than or equal to 2"),
])
def test_a_bad_campaign_entry_is_refused_naming_file_line_field_and_fix(tmp_path: Path, change: tuple[str, str],
                                                                         wanted: str) -> None:
    path = plan_file(tmp_path, PLAN.replace(*change))
    with pytest.raises(UsageError) as caught:
        expand(load_night_plan(path), path)
    assert str(caught.value).startswith(str(path)) and wanted in str(caught.value), caught.value


def test_a_scenario_x_policy_is_campaigned_once_a_night(tmp_path: Path) -> None:
    entry = PLAN.split("campaigns:\n", 1)[1]
    path = plan_file(tmp_path, PLAN + entry.replace("[timeout, elastic]", "[elastic]").replace(
        "      timeout: {ettr_of_reference_at_least: 0.5}\n", ""))
    with pytest.raises(UsageError, match=rf"{path}:12: campaigns.1: a campaign of camp / elastic is already run by "
                                         "campaigns.0"):
        expand(load_night_plan(path), path)


def test_a_plan_with_neither_runs_nor_campaigns_is_refused(tmp_path: Path) -> None:
    path = plan_file(tmp_path, "seed: 1\nruns: []\n")
    with pytest.raises(UsageError, match="runs: empty; list at least one entry"):
        load_night_plan(path)


# -- the bar's judgement --------------------------------------------------------------------

@pytest.mark.parametrize("bar, ettr, reference, misses", [
    (EttrBar(at_least=0.8), 0.81, 0.95, []),
    (EttrBar(at_least=0.8), 0.80, 0.95, []),
    (EttrBar(at_least=0.8), 0.62, 0.95, ["elastic: ETTR 62.0% is below the bar 80%"]),
    (EttrBar(of_reference_at_least=0.9), 0.86, 0.95, []),  # 90.5% of the reference's
    (EttrBar(of_reference_at_least=0.9), 0.85, 0.95,
     ["elastic: ETTR 85.0% is 89.5% of the fault-free reference's 95.0%, below the bar 90%"]),
    (EttrBar(at_least=0.9, of_reference_at_least=0.9), 0.5, 0.95, ["below the bar 90%", "of the fault-free"]),
    (EttrBar(of_reference_at_least=0.5), 0.5, None, ["the reference measured no ETTR"]),
])
def test_the_bar_fails_a_policy_below_it_naming_policy_ettr_and_bar(bar: EttrBar, ettr: float,
                                                                       reference: float | None,
                                                                       misses: list[str]) -> None:
    found = judge_ettr("elastic", bar, ettr, reference)
    assert len(found) == len(misses) and all(m in f for m, f in zip(misses, found, strict=True)), found


def _campaign_row(policy: str, ettr: float, bar: EttrBar | None) -> dict[str, object]:
    """A row as reports.nightly.campaign_trials makes it."""
    misses = [] if bar is None else judge_ettr(policy, bar, ettr, 0.95)
    return {"scenario": "camp" + CAMPAIGN_SUFFIX, "policy": policy, "policy_base": policy,
            "fault": "llama3 mix, mean 10 s apart over 40 s", "seed": 2, "outcome": "continued",
            "outcome_reason": "(fake)", "hung_cap": math.nan, "timeout_s": math.nan,
            "expect": "" if bar is None else bar.text(), "expect_failures": "; ".join(misses), "run": "runs/camp",
            "state": "", "state_detail": "", "ettr_pct": 100 * ettr}


COMMAND = "chaos campaign camp.yaml --mix llama3 --mtbf 10s --duration 40s --policy timeout --policy elastic --seed 2"


def test_a_missed_bar_fails_the_nights_gate_from_its_first_night_and_its_files_say_so(tmp_path: Path) -> None:
    db = tmp_path / "history.sqlite"
    bar = EttrBar(at_least=0.8)
    append_night(db, night_history(info(0), [NightRun(0, COMMAND, pd.DataFrame(
        [_campaign_row("timeout", 0.70, None), _campaign_row("elastic", 0.62, bar)]))]))
    report = night_report(read_history(db), info(0).night, np.random.default_rng(1))
    [regression] = report.gate.regressions
    assert (regression.scenario, regression.policy, regression.metric) == ("camp-campaign", "elastic", "ettr_pct")
    text = regression.text()
    assert "62.0 %" in text and "ETTR >= 80%" in text and "elastic: ETTR 62.0% is below the bar 80%" in text
    assert text.endswith("--policy elastic --seed 2")  # the campaign of that policy again
    assert "**FAILED**" in markdown_summary(report) and 'name="elastic"' in junit_xml(report)
    assert "<failure" in junit_xml(report).split('name="elastic"', 1)[1]
    # the history keeps the miss: a night read back later judges the same
    stored = read_history(db).trials
    assert stored.loc[stored["policy"] == "elastic", "expect_failures"].item().startswith("elastic: ETTR 62.0%")


def test_a_met_bar_passes_and_a_falling_ettr_is_the_metric_rules(tmp_path: Path) -> None:
    db = tmp_path / "history.sqlite"
    bar = EttrBar(at_least=0.5)
    for index, ettr in enumerate((0.90, 0.91, 0.89, 0.90, 0.60)):
        append_night(db, night_history(info(index), [NightRun(0, COMMAND, pd.DataFrame(
            [_campaign_row("elastic", ettr, bar)]))]))
    history = read_history(db)
    assert night_report(history, info(3).night, np.random.default_rng(1)).gate.passed
    # 60% meets the bar of 50%, but is far below the earlier nights': the noise-aware rule fails it
    [regression] = night_report(history, info(4).night, np.random.default_rng(1)).gate.regressions
    assert regression.metric == "ettr_pct" and regression.nights and "median down 30" in regression.why


def test_a_campaigns_rows_are_no_row_of_the_documents_table(tmp_path: Path) -> None:
    db = tmp_path / "history.sqlite"
    append_night(db, night_history(info(0), [NightRun(0, COMMAND, pd.DataFrame(
        [_campaign_row("timeout", 0.9, None)]))]))
    report = night_report(read_history(db), info(0).night, np.random.default_rng(1))
    assert all(check.scenario == "" for check in report.claims)  # "not run": a campaign is no single-fault trial


def test_a_campaign_of_a_users_job_runs_its_variants(tmp_path: Path) -> None:
    byo = Path(__file__).resolve().parents[2] / "scenarios" / "byo_kill.yaml"
    path = plan_file(tmp_path, f"campaigns:\n  - {{scenario: {byo}, ranks: 4, seed: 2, duration: 60s, mtbf: 15s}}\n")
    [cell] = expand(load_night_plan(path), path)
    assert cell.policies == ("default", "timeout_5s") and "--policy default --policy timeout_5s" in cell.command
