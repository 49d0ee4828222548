"""The plan of one trial as a value: what the harness does, when, and what it expects.

Built once from a scenario and a policy (`harness.trial.plan.build_plan`), printed by
`chaos run --dry-run`, executed by the orchestrator, stored in trial.json, and read back by
the reports, which judge the trial against its `expect`. Times are float seconds; offsets
are after warm-up. Faults and policies are stored as the JSON their own packages write
(`chaos.faults`, `harness.job.policies`), so this module needs neither.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

APPLY = "apply"
REVERT = "revert"
# Every outcome a trial can have, in the order the reports' rules try them
# (reports.outcome.OUTCOME_RULES); "inconclusive" when no rule applies.
OUTCOMES: tuple[str, ...] = ("incomplete", "no-fault", "bypassed", "hung", "preempted", "crashed", "exited-clean",
                             "running-at-cap", "continued", "recovered", "isolated", "retries-exhausted",
                             "failed-fast", "absorbed", "inconclusive")
# The state checker's verdicts (reports.state), beside the outcome and never mixed into it
STATE_VERDICTS: tuple[str, ...] = ("consistent", "diverged", "not observed")


@dataclass(frozen=True)
class Expectation:
    """What a policy is expected to do: one of `outcome` (empty: any) and bounds on the
    measured times, in seconds after the fault started (None: no bound)."""

    outcome: tuple[str, ...] = ()
    detect_within: float | None = None
    recover_within: float | None = None
    breaker_within: float | None = None
    # suspect events from the failure detector; absent from plans written before it: None
    suspects_at_most: int | None = None
    # the state checker's verdict (reports.state); absent from plans written before it: None
    state: str | None = None
    # words the "stuck in" line (reports.stuck) must contain; absent before it: None
    stuck_in: str | None = None
    # steps a resume does again after a scheduler's preemption or requeue; absent before it: None
    steps_lost_at_most: int | None = None
    # the cluster's ranks missing from the last group formed after the fault, and the ranks
    # that never detected it: counts that hold at any cluster size; absent before them: None
    ranks_lost_at_most: int | None = None
    undetected_at_most: int | None = None

    def __post_init__(self) -> None:
        unknown = [o for o in self.outcome if o not in OUTCOMES]
        if unknown:
            raise ValueError(f"outcome {unknown[0]!r} is not one of {', '.join(OUTCOMES)}")
        if self.state is not None and self.state not in STATE_VERDICTS:
            raise ValueError(f"state {self.state!r} is not one of {', '.join(STATE_VERDICTS)}")

    def bounds(self) -> dict[str, float]:
        """The time bounds that are set, by name (detect_within, ...)."""
        return {name: value for name, value in (("detect_within", self.detect_within),
                                                ("recover_within", self.recover_within),
                                                ("breaker_within", self.breaker_within))
                if value is not None}


@dataclass(frozen=True)
class Anchor:
    """When an anchored fault starts: `delay` seconds after the `nth` event `on` (a name of
    harness.scenario.anchors.ANCHOR_EVENTS) of one rank since warm-up, the first rank to see its
    nth (or rank `rank`'s only); waited for until `until` seconds after warm-up, after which
    the fault is not applied."""

    on: str
    nth: int
    delay: float
    until: float
    rank: int | None = None

    def describe(self) -> str:
        """In words: "checkpoint_save #1 of rank 0 + 0.5 s"."""
        whose = f" of rank {self.rank}" if self.rank is not None else ""
        return f"{self.on} #{self.nth}{whose}" + (f" + {self.delay:g} s" if self.delay else "")


@dataclass(frozen=True)
class PlannedFault:
    """One fault of the timeline with its targets resolved (a `count` drawn with the seed)."""

    index: int                       # its place in the scenario's `faults`
    kind: str
    fault: dict[str, Any]            # the fault's kind and parameters (chaos.faults, as JSON)
    description: str                 # "loss(percent=0.2, correlation=0.0)"
    targets: tuple[int, ...]         # ranks, sorted
    start: float                     # after warm-up, or after its anchor's event (then the delay)
    duration: float | None           # None: it never heals while the harness watches
    # the event it starts on (harness.scenario.anchors); None: at `start` after warm-up. Absent
    # from trial.json written before anchors: None
    anchor: Anchor | None = None


@dataclass(frozen=True)
class Action:
    """Apply or revert fault `index`, `at` seconds after warm-up (an anchored fault's: after
    its anchor's event)."""

    at: float
    verb: str                        # APPLY | REVERT
    index: int


@dataclass(frozen=True)
class TrialPlan:
    policy: str
    policy_spec: dict[str, Any]      # harness.job.policies.PolicySpec, as JSON
    workload: dict[str, Any]         # harness.job.config.WorkloadSpec, as JSON
    ranks: int
    seed: int
    warmup_steps: int                # steps every rank makes before the first action
    settle_steps: int                # steps every live rank makes after the last action
    hang_cap: float                  # no step and no policy action this long: hung
    faults: tuple[PlannedFault, ...]  # faults[i].index == i
    actions: tuple[Action, ...]      # in time order; a pulsed fault has one pair per on-phase
    expect: Expectation | None
    # The user's own job instead of the harness's runner (harness.cluster.userjob.JobSpec as
    # JSON, the variant's overrides applied; `policy` is then the variant's name); None: the
    # runner under `policy_spec`. Absent from trial.json written before it: None.
    job: dict[str, Any] | None = None
    # Every host's own net.* settings (scenario cluster.sysctls, chaos.sysctl); absent from
    # trial.json written before it, and None: the kernel's defaults.
    sysctls: dict[str, str] | None = None
    # Every live process's stacks at each fault's first detection (stacks/detect-<i>/);
    # absent from trial.json written before it: False, none were taken.
    stacks_at_detect: bool = False
    # The actions of anchored faults, `at` after their anchor's event, in time order; not in
    # `actions` (their time is known only once the event came). Absent before anchors: ().
    anchored: tuple[Action, ...] = ()
    # The runner's control plane on the last host, a fault target, not on the switch (scenario
    # cluster.store: host); absent from trial.json written before it: False.
    store_host: bool = False

    @property
    def last_action_s(self) -> float:
        """The latest an action can come after warm-up: an anchored one's, if its event comes
        as late as it is waited for."""
        latest = [a.at for a in self.actions]
        latest += [anchor.until + a.at for a in self.anchored if (anchor := self.faults[a.index].anchor)]
        return max(latest, default=0.0)
