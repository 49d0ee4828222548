"""The outcome of one trial: the first rule of OUTCOME_RULES that applies to its facts
(reports.trial_facts), with a one-line reason; inconclusive when none does. The order and
what each rule means are written out in reports.metrics' definitions; a new policy's
outcome is one more rule in that tuple, and its name in runfolder.plan.OUTCOMES."""
from __future__ import annotations

from typing import Callable

from reports.trial_facts import TrialFacts


def ranks_text(ranks: list[int]) -> str:
    """`r0-r4, r6, r7, r9-r63`: three or more consecutive ranks as a range, so that a
    64-rank row stays readable."""
    runs: list[list[int]] = []
    for r in sorted(set(ranks)):
        if runs and r == runs[-1][-1] + 1:
            runs[-1].append(r)
        else:
            runs.append([r])
    return ", ".join(f"r{run[0]}-r{run[-1]}" if len(run) > 2 else ", ".join(f"r{r}" for r in run)
                     for run in runs)


def _incomplete(f: TrialFacts) -> str | None:
    if not f.stopped_at:
        return None
    if f.end_reason == "error":
        if f.stopped_by:
            return f"the harness stopped the trial: {f.stopped_by} ({f.stopped_at})"
        return f"the harness stopped the trial on an error ({f.stopped_at}); its command said why"
    return f"no trial_end: the trial did not finish ({f.stopped_at})"


def _no_fault(f: TrialFacts) -> str | None:
    if f.faults or f.hang is not None or f.departures:
        return None  # a control run that hung or lost ranks raised a false alarm: the rules below
    ended = f" (the trial ended: {f.end_reason})" if f.end_reason else ""
    return f"no fault was applied: no fault_applied event{ended}"


def _bypassed(f: TrialFacts) -> str | None:
    missed = [t for t in f.traffic if t.bypassed]
    if not missed:
        return None
    first = missed[0]
    return (f"fault {first.index} did not reach the job: its links carried {first.before} bytes in the "
            f"{first.before_s:.1f} s before it, less than half of one gradient copy per step")


def _hung(f: TrialFacts) -> str | None:
    if f.hang is None:
        return None
    return f"no step and no policy action for {f.hang.cap:g} s (the harness cap); stopped watching"


def _preempted_outcome(f: TrialFacts) -> str | None:
    p = f.preempted
    if p is None:
        return None
    ends = sorted({d.how for d in f.departures.values()})
    how = f"ranks ended by {', '.join(ends)}" if ends else "every rank exited cleanly"
    if p.saved_step is None:
        return f"the scheduler ended the job ({how}); nothing was saved: a resume starts from scratch"
    when = "on the signal" if p.on_signal else f"{p.t - p.saved_t:.1f} s before the preemption"
    return (f"the scheduler ended the job ({how}); the newest checkpoint is step {p.saved_step}, saved {when}: "
            f"a resume redoes {p.steps_lost} steps")


def _crashed(f: TrialFacts) -> str | None:
    crashes = f.crashes
    if not crashes:
        return None
    first = min(crashes, key=lambda d: d.t)
    detail = f": {first.error}" if first.error else ""
    said = f"{ranks_text([d.rank for d in crashes])} crashed (first r{first.rank}, {first.how}{detail})"
    if all(d.in_teardown for d in crashes):
        said += (" in teardown, after destroy_process_group(): its training was done; not counted as "
                 "a detection of the fault")
    return said


def _exited_clean(f: TrialFacts) -> str | None:
    if f.steps_observed or f.end_reason != "all-exited":
        return None
    killed = [d.rank for d in f.departures.values() if d.how == "killed"]
    by_fault = f", {ranks_text(killed)} killed by the fault" if killed else ""
    return f"every rank's process ended, none by an error{by_fault}; steps not observed"


def _running_at_cap(f: TrialFacts) -> str | None:
    if f.steps_observed or f.end_reason != "cap":
        return None
    return (f"{len(f.survivors)} of {len(f.ranks)} ranks still running at the harness cap after the last "
            "fault action; steps not observed, so hung cannot be told from still training")


def _continued(f: TrialFacts) -> str | None:
    if not (f.detections and f.all_survivors_resumed and f.final_world is not None
            and f.final_world < len(f.ranks)):
        return None
    left = f" ({ranks_text(list(f.left_out))} left out)" if f.left_out else ""
    return f"{len(f.going_on)} survivors went on in a world of {f.final_world}{left}"


def _recovered(f: TrialFacts) -> str | None:
    if not (f.detections and not f.departures and f.all_survivors_resumed):
        return None
    if f.requeue is None:
        return f"every rank stepped again after {len(f.detections)} detected the fault"
    q = f.requeue
    restored = (f"every rank restored step {q.restored} ({q.steps_lost} steps lost) and stepped again"
                if q.restored is not None and q.steps_lost is not None else "every rank stepped again")
    return (f"the scheduler started the job again (restart {q.restarts}, {q.waited_s:.1f} s after its "
            f"last rank ended); {restored}")


def _isolated(f: TrialFacts) -> str | None:
    if not f.breaker_opens:
        return None
    return f"the breaker opened on {len(f.breaker_opens)} of {len(f.ranks)} ranks"


def _left_by(reason: str) -> Callable[[TrialFacts], str | None]:
    def rule(f: TrialFacts) -> str | None:
        left = [d.rank for d in f.departures.values() if d.how == reason]
        return f"{len(left)} of {len(f.ranks)} ranks exited {reason}" if left else None
    return rule


def _absorbed(f: TrialFacts) -> str | None:
    if f.detections or f.departures or not f.all_survivors_resumed:
        return None
    return "no rank saw an error and every rank stepped after the fault"


OUTCOME_RULES: tuple[tuple[str, Callable[[TrialFacts], str | None]], ...] = (
    ("incomplete", _incomplete),
    ("no-fault", _no_fault),
    ("bypassed", _bypassed),
    ("hung", _hung),
    ("preempted", _preempted_outcome),
    ("crashed", _crashed),
    ("exited-clean", _exited_clean),
    ("running-at-cap", _running_at_cap),
    ("continued", _continued),
    ("recovered", _recovered),
    ("isolated", _isolated),
    ("retries-exhausted", _left_by("retries-exhausted")),
    ("failed-fast", _left_by("failed-fast")),
    ("absorbed", _absorbed),
)


def classify(facts: TrialFacts) -> tuple[str, str]:
    """The trial's outcome and a one-line reason (see OUTCOME_RULES for the order)."""
    for name, rule in OUTCOME_RULES:
        reason = rule(facts)
        if reason is not None:
            return name, reason
    stalled = [r for r in facts.survivors if r not in facts.resumed]
    return "inconclusive", (f"{len(facts.detections)} ranks detected the fault, "
                            f"{len(facts.departures)} left, {len(stalled)} survivors never stepped "
                            "again, and the harness saw no hang")
