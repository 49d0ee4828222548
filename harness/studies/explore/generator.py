"""Fault schedules drawn from a scenario's cluster and job, with the seed: the generator of
`chaos explore` (docs/explore.md). Pure: a schedule is a value (the `faults:` list
of a scenario file), and the same scenario, options and seed draw the same schedules.

    options = ExploreOptions(max_faults=3, seed=7)
    for schedule in schedules(scenario, options):   # endless; the caller stops (a budget)
        schedule.faults                              # [{kind: kill, target: {rank: 3}, start: {...}}, ...]

Each schedule has 1 to `max_faults` faults. Per fault, drawn with the weights (`Weights`;
a file can give its own):
  kind      among those the scenario's backend and job take (a probe scenario with that one
            fault must load), `--kinds` narrowing them
  target    one rank (3 in 4) or two
  start     an event (3 in 5: the recovery windows) or seconds after warm-up, uniform in
            [0, 2 T); an event's delay is one of 0, 0.1, 0.5 or 1 s, its nth 1 (3 in 4) or 2;
            only events the job records and one of the policies explored can (no `breaker`
            where none has a breaker: PolicySpec.never_records)
  duration  0.5 T, 1.5 T, 3 T or none (permanent), T being the shortest timeout of the
            policies explored, at most the hang cap (a user's job: a quarter of the hang
            cap); a kill has none
A drawn schedule the scenario loader refuses (two faults of one kind on a rank at once, a
fault after a kill on one clock), with two storage faults (every rank's checkpoint folder
is one), or whose every fault waits for an event only a failure brings (`detect`, `retry`,
...: none would ever be applied; runfolder.shrinking.uncaused) is drawn again, at most
`DRAWS_PER_SCHEDULE` times.
"""
from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any, Iterator, Mapping

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from chaos.faults import FAULT_KINDS
from harness.scenario.anchors import ANCHOR_EVENTS, ANCHOR_NAMES
from harness.scenario.scenario import Scenario
from runfolder.shrinking import uncaused

DRAWS_PER_SCHEDULE = 20
# the parameters of a kind that needs some, as the generator injects it
KIND_PARAMETERS: dict[str, dict[str, Any]] = {"loss": {"percent": "20%"}, "delay": {"latency": "100ms"},
                                              "bandwidth": {"rate": "10mbit"}}
DELAYS_S = (0.0, 0.1, 0.5, 1.0)
STORAGE_KINDS = tuple(cls.model_fields["kind"].default for cls in FAULT_KINDS if cls.acts_on == "storage")
DURATIONS_T = (0.5, 1.5, 3.0, None)  # times T; None: permanent


class Weights(BaseModel):
    """How often each choice is drawn, relative to the others of its kind (0: never). The
    default leans on recovery windows: kills and links cut, anchored on saves, restores,
    detections and new groups."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    kinds: dict[str, float] = Field(default_factory=lambda: {
        "kill": 3, "pause": 2, "link_down": 3, "blackhole": 1, "loss": 1, "disk_full": 1, "read_only": 1})
    events: dict[str, float] = Field(default_factory=lambda: {
        "checkpoint_save": 3, "checkpoint_saved": 1, "restore": 3, "detect": 3, "retry": 2,
        "new_generation": 3, "step": 1, "rank_start": 1, "breaker": 1})
    on_event: float = Field(default=0.6, ge=0, le=1, description="the share of faults that start on an event")
    durations: tuple[float, float, float, float] = (2, 2, 1, 1)  # for DURATIONS_T


@dataclass(frozen=True)
class ExploreOptions:
    max_faults: int = 3
    seed: int = 0
    kinds: tuple[str, ...] = ()      # empty: every kind the scenario takes
    policies: tuple[str, ...] = ()   # empty: every trial of the scenario
    weights: Weights = Weights()


@dataclass(frozen=True)
class Schedule:
    """One drawn schedule: the scenario's `faults:` as a file writes them."""

    number: int                      # from 1, in the order drawn
    faults: tuple[dict[str, Any], ...]


def scale_s(scenario: Scenario, policies: tuple[str, ...]) -> float:
    """T: the shortest timeout of the policies explored, at most the hang cap (a user's job
    has none the harness knows: a quarter of the hang cap), which durations and start times
    are drawn around. A timeout past the hang cap is none to a trial, which calls a job that
    long without a step hung: drawn around the document's 6 h baseline, one schedule took
    hours (a disk_full at 9406 s for 9 h)."""
    if scenario.job is not None:
        return scenario.hang_cap / 4
    return min(min(scenario.policy(name).timeout, scenario.hang_cap)
               for name in policies or scenario.trial_names())


def _probe(scenario: Scenario, faults: list[dict[str, Any]]) -> Scenario | None:
    """`scenario` with these faults, or None where the loader refuses them."""
    data = scenario.model_dump(mode="json", exclude={"faults"}, exclude_defaults=True)
    data["name"] = scenario.name
    try:
        return Scenario.model_validate({**data, "faults": faults})
    except ValidationError:
        return None


def explorable_kinds(scenario: Scenario, options: ExploreOptions) -> tuple[str, ...]:
    """The kinds with a weight that a scenario of this cluster and job takes (one fault of
    the kind on rank 0 loads), narrowed to `options.kinds` where given."""
    wanted = options.kinds or tuple(k for k, w in options.weights.kinds.items() if w > 0)
    return tuple(kind for kind in wanted if _probe(scenario, [{
        "kind": kind, **KIND_PARAMETERS.get(kind, {}), "target": {"rank": 0}, "start": 1}]) is not None)


def explorable_events(scenario: Scenario, options: ExploreOptions) -> tuple[str, ...]:
    """The anchors with a weight that this scenario's job can record (a kill anchored on it
    loads) and, on the harness's runner, that one of the policies explored can record (its
    `never_records`: no `breaker` without a breaker, no `retry` without retries)."""
    def recorded(event: str) -> bool:
        if scenario.job is not None:
            return True
        kinds = set(ANCHOR_EVENTS[event].runner)
        policies = options.policies or scenario.trial_names()
        return any(kinds - scenario.policy(name).never_records for name in policies)
    return tuple(event for event in ANCHOR_NAMES if options.weights.events.get(event, 0) > 0 and recorded(event)
                 and _probe(scenario, [{"kind": "kill", "target": {"rank": 0}, "start": {"on": event}}]) is not None)


def _pick(draw: random.Random, weights: Mapping[Any, float]) -> Any:
    choices = [c for c, w in weights.items() if w > 0]
    return draw.choices(choices, weights=[weights[c] for c in choices])[0]


def _fault(draw: random.Random, scenario: Scenario, kinds: tuple[str, ...], events: tuple[str, ...],
           t: float, weights: Weights) -> dict[str, Any]:
    kind = _pick(draw, {k: weights.kinds.get(k, 1.0) for k in kinds})
    ranks = sorted(draw.sample(range(scenario.cluster.ranks), 1 if draw.random() < 0.75 else 2))
    target = {"rank": ranks[0]} if len(ranks) == 1 else {"ranks": ranks}
    if events and draw.random() < weights.on_event:
        event = _pick(draw, {e: weights.events[e] for e in events})
        start: Any = {"on": event, "nth": 1 if draw.random() < 0.75 else 2, "delay": f"{draw.choice(DELAYS_S):g}s"}
    else:
        start = f"{round(draw.uniform(0, 2 * t), 1):g}s"
    fault = {"kind": kind, **KIND_PARAMETERS.get(kind, {}), "target": target, "start": start}
    if kind != "kill":
        factor = _pick(draw, dict(zip(DURATIONS_T, weights.durations, strict=True)))
        if factor is not None:
            fault["duration"] = f"{round(factor * t, 1):g}s"
    return fault


def schedules(scenario: Scenario, options: ExploreOptions) -> Iterator[Schedule]:
    """Schedules for `scenario`, endless, the same ones for the same seed. Raises ValueError
    where no kind can be drawn."""
    kinds = explorable_kinds(scenario, options)
    if not kinds:
        raise ValueError(f"no fault kind to explore: of {', '.join(options.kinds or options.weights.kinds)}, "
                         f"the {scenario.cluster.backend} backend and this job take none")
    events = explorable_events(scenario, options)
    t = scale_s(scenario, options.policies)
    draw = random.Random(f"explore/{options.seed}")
    number = 0
    while True:
        count = _pick(draw, {n: 1.0 if n == 1 else 2.0 for n in range(1, options.max_faults + 1)})
        for _ in range(DRAWS_PER_SCHEDULE):
            faults = [_fault(draw, scenario, kinds, events, t, options.weights) for _ in range(count)]
            # every rank's checkpoint folder is one on this machine: one storage fault at a time
            # (on different clocks the loader cannot tell whether two overlap)
            if (sum(f["kind"] in STORAGE_KINDS for f in faults) <= 1 and uncaused(tuple(faults)) is None
                    and _probe(scenario, faults) is not None):
                number += 1
                yield Schedule(number, tuple(faults))
                break
