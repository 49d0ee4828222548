"""The regression gate: tonight against a window of earlier nights, per scenario x policy.

Three rules, each judged only where at least `min_nights` nights of the window ran the same
scenario x policy (fewer: the series is listed as not judged, never passed silently):

  outcome   a trial tonight whose outcome is worse than every outcome the window saw
            (OUTCOME_SEVERITY: the job went on < the policy left cleanly < a crash < no
            verdict < a hang). "Recovered last week, hung tonight" fails; an outcome the
            window already saw (a flaky scenario) does not.
  state     a trial tonight whose state diverged (reports.state) where the window's trials
            came out consistent and never diverged: a recovery that came back wrong fails
            whatever its times.
  metric    for every metric of NIGHTLY_METRICS measured tonight, pooling the repeats:
            (a) tonight's median is worse than the window's median by more than the largest
                of `iqr_factor` x the window's interquartile range, `relative` x the window's
                median, and the metric's resolution (the noise floor), and
            (b) the one-sided Mann-Whitney rank-sum test (reports.nightly.stats) says
                tonight's values are worse with p < alpha. Where the sizes cannot reach
                alpha at all (one run tonight, or too short a window), (a) decides alone
                and the regression says so.
            Both, because with many repeats a shift far below the noise floor is
            significant yet harmless, and with few a shift above it can be chance.

  bar       a campaign cell's policy (reports.nightly.campaign) whose ETTR missed the plan's
            bar tonight (stored as the trial's failed expectation): judged on tonight alone,
            from the first night, since the bar is the plan's, not the history's.

Each regression names the metric, tonight's and the window's figures, the window's nights
and the command that reproduces the worst trial tonight (its stored command with --seed).

The machine: where tonight's speed figures (harness.trial.machine, stored with each night)
differ from the window's median by MACHINE_DIFFERS or more either way, the result says so
(`machine`), so that a slower machine is not read as slower code; it judges nothing.
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass

import pandas as pd

from reports.nightly.campaign import is_campaign
from reports.nightly.history import HIGHER, MACHINE_FIGURES, NIGHTLY_METRICS, History, Metric, reproduce_command
from reports.nightly.stats import counts, figure_text, number_text, quartiles, rank_sum_greater, smallest_rank_sum_p

# Outcome classes, best first: the job went on; the policy acted and left cleanly; a crash;
# the harness could not tell; the job hung (the document's failure).
OUTCOME_SEVERITY: dict[str, int] = {
    "no-fault": 0, "absorbed": 0, "recovered": 0, "continued": 0,
    "isolated": 1, "failed-fast": 1, "retries-exhausted": 1, "exited-clean": 1,
    "preempted": 1,
    "crashed": 2, "running-at-cap": 3, "inconclusive": 3, "incomplete": 3, "bypassed": 3, "hung": 4,  # bypassed: the fault tested nothing
}
SERIES_KEY = ["scenario", "policy"]
ETTR = next(m for m in NIGHTLY_METRICS if m.column == "ettr_pct")
MACHINE_DIFFERS = 1.25  # tonight's machine figure against the window's median, either way


@dataclass(frozen=True)
class GateRules:
    window: int = 7            # earlier nights compared against
    min_nights: int = 3        # nights of the window that must have run the series
    alpha: float = 0.05        # significance of the one-sided rank-sum test
    iqr_factor: float = 1.5    # a shift must exceed this many of the window's IQRs,
    relative: float = 0.10     # this fraction of the window's median, and the metric's resolution

    def __post_init__(self) -> None:
        if not 1 <= self.min_nights <= self.window:
            raise ValueError(f"GateRules: min_nights {self.min_nights} must be from 1 to window {self.window}")
        if not 0 < self.alpha < 1:
            raise ValueError(f"GateRules: alpha {self.alpha} must be between 0 and 1")


DEFAULT_RULES = GateRules()


@dataclass(frozen=True)
class Regression:
    night: str
    scenario: str
    policy: str
    metric: str                # a NIGHTLY_METRICS column, or "outcome"
    label: str
    tonight: str               # tonight's figures in words
    before: str                # the window's figures in words
    nights: tuple[str, ...]    # the window's nights that ran the series
    why: str                   # the rule that fired, with its numbers
    command: str               # reproduces the worst trial tonight

    def text(self) -> str:
        if not self.nights:  # the bar rule: the plan's bar, not earlier nights
            return (f"{self.scenario} / {self.policy}: {self.label} below the plan's bar on night {self.night}: "
                    f"tonight {self.tonight}; the bar: {self.before}; {self.why}. Reproduce: {self.command}")
        return (f"{self.scenario} / {self.policy}: {self.label} got worse on night {self.night}: "
                f"tonight {self.tonight}; before {self.before} over {len(self.nights)} nights "
                f"({self.nights[0]} .. {self.nights[-1]}); {self.why}. Reproduce: {self.command}")


@dataclass(frozen=True)
class GateResult:
    night: str
    regressions: tuple[Regression, ...]
    judged: int                  # comparisons made (outcome and metric rules)
    unjudged: tuple[str, ...]    # series with too little history, one line each
    machine: str = ""            # how tonight's machine differed from the window's; "" if it did not

    @property
    def passed(self) -> bool:
        return not self.regressions


def _outcome_rule(night: str, tonight: pd.DataFrame, before: pd.DataFrame, nights: tuple[str, ...]) -> Regression | None:
    worst_before = max(OUTCOME_SEVERITY[o] for o in before["outcome"])
    worse = tonight[tonight["outcome"].map(OUTCOME_SEVERITY) > worst_before]
    if not len(worse):
        return None
    first = worse.iloc[0]
    seen = sorted({o for o in before["outcome"] if OUTCOME_SEVERITY[o] == worst_before})
    return Regression(
        night=night, scenario=str(first["scenario"]), policy=str(first["policy"]), metric="outcome",
        label="outcome", tonight=counts(tonight["outcome"]).text(), before=counts(before["outcome"]).text(),
        nights=nights, why=f"{first['outcome']} is worse than any outcome of the window (worst there: "
                           f"{' or '.join(seen)})", command=reproduce_command(first))


def _state_rule(night: str, tonight: pd.DataFrame, before: pd.DataFrame, nights: tuple[str, ...]) -> Regression | None:
    states = set(before.get("state", pd.Series(dtype=object)))
    if "consistent" not in states or "diverged" in states:
        return None
    diverged = tonight[tonight.get("state", pd.Series("", index=tonight.index)) == "diverged"]
    if not len(diverged):
        return None
    first = diverged.iloc[0]
    return Regression(
        night=night, scenario=str(first["scenario"]), policy=str(first["policy"]), metric="state",
        label="state", tonight=counts(tonight["state"]).text(), before=counts(before["state"]).text(),
        nights=nights, why=f"consistent in the window, diverged tonight: {first['state_detail']}",
        command=reproduce_command(first))


def _metric_rule(night: str, metric: Metric, tonight: pd.DataFrame, before: pd.DataFrame,
                 nights: tuple[str, ...], trials: pd.DataFrame, rules: GateRules) -> Regression | None:
    sign = -1.0 if metric.better == HIGHER else 1.0  # worse is larger after the sign
    now, then = quartiles(tonight["value"]), quartiles(before["value"])
    shift = sign * (now.median - then.median)
    floor = max(rules.iqr_factor * then.iqr, rules.relative * abs(then.median), metric.resolution)
    if not shift > floor:
        return None
    testable = smallest_rank_sum_p(now.n, then.n) < rules.alpha
    p = rank_sum_greater(sign * tonight["value"].to_numpy(), sign * before["value"].to_numpy())
    if testable and not p < rules.alpha:
        return None
    test = (f"rank-sum p = {p:.2g} < {rules.alpha:g}" if testable else
            f"n={now.n} tonight against n={then.n}: too few for the rank-sum test, judged on the shift alone")
    worst = tonight.loc[(sign * tonight["value"]).idxmax()]
    trial = trials[trials["repeat"] == worst["repeat"]].iloc[0]
    return Regression(
        night=night, scenario=str(trial["scenario"]), policy=str(trial["policy"]), metric=metric.column,
        label=metric.label, tonight=figure_text(now, metric.unit), before=figure_text(then, metric.unit), nights=nights,
        why=(f"median {'down' if sign < 0 else 'up'} {number_text(shift)} {metric.unit}, beyond the noise floor "
             f"{number_text(floor)} {metric.unit}; {test}"), command=reproduce_command(trial))


def _bar_rule(night: str, tonight: pd.DataFrame, metrics: pd.DataFrame) -> Regression | None:
    missed = tonight[tonight["expect_failures"] != ""]
    if not len(missed):
        return None
    first = missed.iloc[0]
    values = metrics[(metrics["repeat"] == first["repeat"]) & (metrics["metric"] == ETTR.column)]["value"]
    return Regression(
        night=night, scenario=str(first["scenario"]), policy=str(first["policy"]), metric=ETTR.column, label=ETTR.label,
        tonight=f"{values.iloc[0]:.1f} {ETTR.unit}" if len(values) else "not measured", before=str(first["expect"]),
        nights=(), why=str(first["expect_failures"]), command=reproduce_command(first))


def _nights_short(subject: str, verb: str, nights: tuple[str, ...], window: tuple[str, ...],
                  rules: GateRules) -> str | None:
    """Why a comparison is not made; None when there are enough nights to make it."""
    if len(nights) >= rules.min_nights:
        return None
    return f"{subject}: {verb} {len(nights)} of the {len(window)} earlier nights ({rules.min_nights} needed)"


def _nights_in(window: tuple[str, ...], rows: pd.DataFrame) -> tuple[str, ...]:
    seen = set(rows["night"])
    return tuple(n for n in window if n in seen)


def machine_difference(history: History, night: str, window: tuple[str, ...]) -> str:
    """Tonight's machine figures that differ from the window's median by MACHINE_DIFFERS or
    more, in words; "" where none does or either side was not measured."""
    tonight, differences = history.info(night), []
    for name, (what, unit) in MACHINE_FIGURES.items():
        before = [value for n in window if (value := getattr(history.info(n), name)) is not None]
        if (now := getattr(tonight, name)) is None or not before:
            continue
        median = statistics.median(before)
        if not 1 / MACHINE_DIFFERS < now / median < MACHINE_DIFFERS:
            differences.append(f"{what} {now:.3g} {unit} against the window's median {median:.3g} {unit} "
                               f"({now / median:.2f}x)")
    if not differences:
        return ""
    return (f"tonight's machine differed from the window's nights: {'; '.join(differences)} "
            "(harness/trial/machine.py); a time that got worse may be the machine, not the code")


def check_gate(history: History, night: str, rules: GateRules = DEFAULT_RULES) -> GateResult:
    """Tonight (`night`, stored in `history`) against the `rules.window` nights before it."""
    window = history.nights_before(night, rules.window)
    trials, metrics = history.trials, history.metrics
    past_trials = {key: g for key, g in trials[trials["night"].isin(window)].groupby(SERIES_KEY)}
    past_metrics = {key: g for key, g in metrics[metrics["night"].isin(window)].groupby([*SERIES_KEY, "metric"])}
    tonight_metrics = {key: g for key, g in metrics[metrics["night"] == night].groupby([*SERIES_KEY, "metric"])}
    found: list[Regression | None] = []
    unjudged: list[str] = []
    for key, tonight in trials[trials["night"] == night].groupby(SERIES_KEY, sort=False):
        if is_campaign(key[0]) and (tonight["expect"] != "").any():
            found.append(_bar_rule(night, tonight, tonight_metrics.get((*key, ETTR.column), metrics.iloc[:0])))
        before = past_trials.get(key, trials.iloc[:0])
        ran = _nights_in(window, before)
        short = _nights_short(f"{key[0]} / {key[1]}", "run on", ran, window, rules)
        if short:
            unjudged.append(short)
            continue
        found.append(_outcome_rule(night, tonight, before, ran))
        found.append(_state_rule(night, tonight, before, ran))
        for metric in NIGHTLY_METRICS:
            now = tonight_metrics.get((*key, metric.column))
            if now is None:
                continue
            then = past_metrics.get((*key, metric.column), metrics.iloc[:0])
            nights = _nights_in(window, then)
            short = _nights_short(f"{key[0]} / {key[1]} {metric.column}", "measured on", nights, window, rules)
            if short:
                unjudged.append(short)
            else:
                found.append(_metric_rule(night, metric, now, then, nights, tonight, rules))
    return GateResult(night=night, regressions=tuple(r for r in found if r is not None), judged=len(found),
                      unjudged=tuple(unjudged), machine=machine_difference(history, night, window))
