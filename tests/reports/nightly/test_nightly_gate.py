"""The regression gate on a history of ten seeded nights."""
from __future__ import annotations

import re
import shutil

import numpy as np
import pytest

from reports.nightly import GateRules, append_night, check_gate, read_history
from reports.nightly.gate import DEFAULT_RULES, OUTCOME_SEVERITY
from runfolder.plan import OUTCOMES

from .nightly_fakes import info, night, seed_history, trial, usual_repeats

TONIGHT = 10


@pytest.fixture(scope="module")
def ten_nights(tmp_path_factory):
    db = tmp_path_factory.mktemp("seeded") / "history.sqlite"
    seed_history(db, np.random.default_rng(1))
    return db


@pytest.fixture
def gate_of(tmp_path, ten_nights):
    """The gate's verdict on tonight's repeats after the ten seeded nights."""
    def judge(tonight, rules=DEFAULT_RULES):
        db = tmp_path / f"history-{len(list(tmp_path.iterdir()))}.sqlite"
        shutil.copyfile(ten_nights, db)
        append_night(db, night(TONIGHT, tonight))
        return check_gate(read_history(db), info(TONIGHT).night, rules)
    return judge


def test_a_worse_night_is_named_with_its_figures_nights_and_command(gate_of):
    result = gate_of(usual_repeats(np.random.default_rng(99), ttr=16.0))
    assert not result.passed
    [regression] = result.regressions
    assert (regression.scenario, regression.policy, regression.metric) == ("loss_20pct", "retry", "ttr_s")
    assert regression.night == "2025-01-11"
    # the default window: the seven nights before tonight
    assert regression.nights == tuple(info(i).night for i in range(3, 10))
    assert regression.tonight.startswith("16.") and "n=5" in regression.tonight
    assert regression.before.startswith(("11.", "12.")) and "n=35" in regression.before
    assert "rank-sum p = " in regression.why and "beyond the noise floor" in regression.why
    # the worst repeat tonight, its stored command narrowed to the policy and pinned to its seed
    assert regression.command.startswith("chaos run scenarios/loss_20pct.yaml --backend netns --policy retry --seed 10")
    text = regression.text()
    assert "loss_20pct / retry: time to recover from fault start got worse on night 2025-01-11" in text
    assert "(2025-01-04 .. 2025-01-10)" in text and regression.command in text


def test_a_night_within_noise_passes(gate_of):
    result = gate_of(usual_repeats(np.random.default_rng(99)))
    assert result.passed and result.regressions == ()
    # two series (timeout, retry): outcome and state rules each, ttd_s each, ttr_s and steps/s of retry
    assert result.judged == 2 + 2 + 2 + 2 and result.unjudged == ()


def test_an_outcome_change_fails(gate_of):
    tonight = usual_repeats(np.random.default_rng(99))
    tonight[3][1] = trial(policy="retry", seed=103, outcome="hung", hung_cap=30.0)
    result = gate_of(tonight)
    [regression] = result.regressions
    assert (regression.policy, regression.metric) == ("retry", "outcome")
    assert regression.tonight == "recovered 4/5, hung 1/5"
    assert regression.before == "recovered 35/35"
    assert "hung is worse than any outcome of the window (worst there: recovered)" in regression.why
    assert regression.command.endswith("--policy retry --seed 103")


def test_a_state_that_diverged_after_consistent_nights_fails(gate_of):
    tonight = usual_repeats(np.random.default_rng(99))
    tonight[2][1] = {**tonight[2][1], "state": "diverged",
                     "state_detail": "state diverged: replicas agree: generation 1 resumed at different steps"}
    result = gate_of(tonight)
    [regression] = result.regressions
    assert (regression.policy, regression.metric) == ("retry", "state")
    assert regression.tonight == "consistent 4/5, diverged 1/5" and regression.before == "consistent 35/35"
    assert "resumed at different steps" in regression.why and regression.command.endswith("--seed 102")


def test_an_outcome_the_window_already_saw_passes(tmp_path):
    db = tmp_path / "history.sqlite"
    rng = np.random.default_rng(3)
    for index in range(10):  # a flaky policy: one night in three, every retry fails fast
        append_night(db, night(index, usual_repeats(rng, retry_outcome="failed-fast" if index % 3 == 0 else "recovered")))
    append_night(db, night(TONIGHT, usual_repeats(rng, retry_outcome="failed-fast")))
    assert check_gate(read_history(db), info(TONIGHT).night).passed


def test_a_better_night_passes(gate_of):
    assert gate_of(usual_repeats(np.random.default_rng(99), ttr=6.0, ttd=4.0)).passed


def test_a_significant_shift_below_the_noise_floor_passes(gate_of):
    # timeout's ttd_s sd is 0.05 s: +0.2 s is far outside the window, yet under one step (0.25 s)
    result = gate_of(usual_repeats(np.random.default_rng(99), ttd=5.4))
    assert result.passed
    # and +0.5 s is a regression
    worse = gate_of(usual_repeats(np.random.default_rng(99), ttd=5.7))
    assert [(r.policy, r.metric) for r in worse.regressions] == [("timeout", "ttd_s")]


def test_a_metric_where_higher_is_better_regresses_downwards(gate_of):
    tonight = usual_repeats(np.random.default_rng(99))
    for repeat in tonight:
        repeat[1]["steps_per_s_after"] = 2.0
    [regression] = gate_of(tonight).regressions
    assert regression.metric == "steps_per_s_after"
    assert re.match(r"median down 1\.9\d steps/s, beyond the noise floor 0\.\d+ steps/s; rank-sum p = ", regression.why)


def test_one_run_tonight_is_judged_on_the_shift_alone_and_says_so(gate_of):
    [regression] = gate_of(usual_repeats(np.random.default_rng(99), repeats=1, ttr=16.0)).regressions
    assert regression.metric == "ttr_s" and regression.tonight.endswith("(n=1, one run: no spread)")
    assert "n=1 tonight against n=35: too few for the rank-sum test, judged on the shift alone" in regression.why


def test_one_run_within_noise_passes(gate_of):
    assert gate_of(usual_repeats(np.random.default_rng(99), repeats=1)).passed


def test_too_short_a_history_is_not_judged(tmp_path):
    db = tmp_path / "history.sqlite"
    rng = np.random.default_rng(5)
    for index in range(2):
        append_night(db, night(index, usual_repeats(rng)))
    append_night(db, night(2, usual_repeats(rng, ttr=30.0)))
    result = check_gate(read_history(db), info(2).night)
    assert result.regressions == () and result.judged == 0
    assert result.unjudged == ("loss_20pct / timeout: run on 2 of the 2 earlier nights (3 needed)",
                               "loss_20pct / retry: run on 2 of the 2 earlier nights (3 needed)")


def test_a_metric_new_tonight_is_listed_as_not_judged(gate_of):
    tonight = usual_repeats(np.random.default_rng(99))
    for repeat in tonight:
        repeat[1]["breaker_open_s"] = 8.0
    result = gate_of(tonight)
    assert result.passed
    assert result.unjudged == ("loss_20pct / retry breaker_open_s: measured on 0 of the 7 earlier nights (3 needed)",)


def test_the_window_is_the_nights_before_tonight(tmp_path, ten_nights):
    # judging an older night ignores the nights after it
    db = tmp_path / "history.sqlite"
    shutil.copyfile(ten_nights, db)
    append_night(db, night(TONIGHT, usual_repeats(np.random.default_rng(99), ttr=16.0)))
    assert check_gate(read_history(db), info(9).night).passed
    narrow = check_gate(read_history(db), info(TONIGHT).night, GateRules(window=3, min_nights=3))
    assert narrow.regressions[0].nights == tuple(info(i).night for i in (7, 8, 9))


def test_every_outcome_has_a_severity():
    assert set(OUTCOME_SEVERITY) == set(OUTCOMES)


@pytest.mark.parametrize("rules", [dict(min_nights=0), dict(window=2, min_nights=3), dict(alpha=1.5)])
def test_gate_rules_are_checked(rules):
    with pytest.raises(ValueError, match="GateRules"):
        GateRules(**rules)


def _machine_history(tmp_path, tonight: dict, before: list[dict]):
    db = tmp_path / "history.sqlite"
    rng = np.random.default_rng(3)
    for index, speed in enumerate(before):
        append_night(db, night(index, usual_repeats(rng), **speed))
    append_night(db, night(len(before), usual_repeats(rng, ttr=16.0), **tonight))
    return check_gate(read_history(db), info(len(before)).night)


def test_a_slower_machine_tonight_is_named_beside_the_regressions_it_may_explain(tmp_path):
    usual = [{"loop_ns": 70.0 + i, "wake_us": 9.0} for i in range(7)]
    result = _machine_history(tmp_path, {"loop_ns": 146.0, "wake_us": 10.0}, usual)
    assert not result.passed  # it judges nothing: the regression stands
    assert result.machine == ("tonight's machine differed from the window's nights: a Python loop step 146 ns "
                              "against the window's median 73 ns (2.00x) (harness/trial/machine.py); a time "
                              "that got worse may be the machine, not the code")


@pytest.mark.parametrize("tonight, before", [
    ({"loop_ns": 80.0, "wake_us": 10.0}, [{"loop_ns": 70.0, "wake_us": 9.0}] * 3),   # within 1.25x
    ({"loop_ns": 140.0, "wake_us": 20.0}, [{}] * 3),                                   # never measured before
    ({}, [{"loop_ns": 70.0, "wake_us": 9.0}] * 3),                                     # not measured tonight
])
def test_no_machine_note_within_the_margin_or_without_figures_on_both_sides(tmp_path, tonight, before):
    assert _machine_history(tmp_path, tonight, before).machine == ""
