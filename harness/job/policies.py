"""The policies a job runs under, as values.

    baseline   the document's "original code": a huge process-group timeout, no retry; an
               error propagates and the process crashes
    timeout    an explicit process-group timeout; on the first failure, clean up and exit
    retry      timeout + bounded retries with exponential backoff and jitter, a health
               check, a re-created process group, restore from the latest checkpoint
    isolation  retry + circuit breaker: when retries run out or the health check fails,
               open the breaker, release the group and accelerator memory, and leave
    elastic    beyond the document: a heartbeat failure detector (harness.job.detector) ends a
               stuck collective within about a second; a rank that stays unreachable for
               `exclude_after` is left out, and the survivors agree on the smaller
               membership through the control plane, restore from a peer's in-memory
               state, and go on; the rank cut off opens its breaker and leaves (or, with
               `rejoin: true`, waits to be let back in: see below)

The document's four take the detector too where their parameters say so
(`detector: {}` or `detector: true`): it ends the wait on a stuck collective early, and
the health check becomes "digests arrive from the control plane".

Rejoin (elastic only, off by default): a rank whose breaker opened releases its group and
accelerator memory but stays; once the control plane hears it again it asks to rejoin,
and the members let it in at the next generation, after the same step (group rank 0
agrees the next membership and tells the others inside that step's all-reduce).

Defaults are the document's runner (max_retries=3, initial_backoff_s=2.0,
nccl_timeout_s=30, jitter uniform(0.1, 1.0) s); a scenario overrides any field. A
scenario may run one policy twice under two names: `retry_fd: {base: retry, detector: {}}`.
"""
from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from chaos.errors import UsageError
from chaos.faults import Seconds, describe_validation_error
from runfolder import events

PolicyName = Literal["baseline", "timeout", "retry", "isolation", "elastic"]
POLICY_NAMES: tuple[str, ...] = ("baseline", "timeout", "retry", "isolation", "elastic")
# bugs on purpose, for proving that `chaos explore` finds them (harness.job.planted)
PlantedDefect = Literal["restore_while_saving", "retries_never_reset"]
LABEL = r"^[a-z][a-z0-9_-]{0,39}$"

_DOCUMENT = {"timeout": "30s", "max_retries": 3, "backoff_base": "2s", "backoff_cap": "60s",
             "jitter": ["100ms", "1s"], "health_check_timeout": "1s"}
POLICY_DEFAULTS: dict[str, dict[str, Any]] = {
    "baseline": {**_DOCUMENT, "timeout": "6h", "max_retries": 0, "catch_errors": False},
    "timeout": {**_DOCUMENT, "max_retries": 0},
    "retry": {**_DOCUMENT},
    "isolation": {**_DOCUMENT, "breaker": True},
    # The collective timeout only bounds how long an abandoned group's threads linger
    # (gloo has no abort); detection and recovery do not wait for it.
    "elastic": {**_DOCUMENT, "timeout": "10s", "rendezvous_timeout": "10s", "max_retries": 3,
                "backoff_base": "20ms", "backoff_cap": "500ms", "jitter": ["0s", "30ms"],
                "breaker": True, "detector": {}, "elastic": True, "restore": "peer"},
}


class DetectorSpec(BaseModel):
    """The heartbeat failure detector a rank consults while it waits (harness.job.detector)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    # Suspect after eight heartbeat periods: a rank losing 20% of its datagrams
    # (detector_loss) loses eight in a row about once in 400,000. With four (0.4 s after
    # 0.1 s beats) its silence reached 0.3998 s in five 20 s trials (docs/scale-journal.md).
    interval: Seconds = Field(default=0.05, description="heartbeat period")
    suspect_after: Seconds = Field(
        default=0.4, description="silence after which a peer is suspect (and this rank, hearing "
                                 "no digest, knows it is cut off)")
    phi: Annotated[float, Field(gt=0)] | None = Field(
        default=None, description="phi-accrual threshold instead of the fixed silence (e.g. 8)")
    straggler_after: Seconds = Field(
        default=2.0, description="a collective pending this long with every member alive: "
                                 "report the degraded ones as stragglers")
    straggler_loss: Annotated[float, Field(ge=0, le=1)] = Field(
        default=0.05, description="heartbeat loss that marks an alive peer as degraded")

    @model_validator(mode="after")
    def _consistent(self) -> "DetectorSpec":
        if not 0 < self.interval < self.suspect_after / 2:
            raise ValueError(f"interval must be positive and under half of suspect_after "
                             f"(got {self.interval:g}s and {self.suspect_after:g}s)")
        return self


class PolicySpec(BaseModel):
    """How a rank reacts to a failed collective. Frozen; built once by `policy_spec`."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: Annotated[str, Field(pattern=LABEL)] = Field(
        description="the policy's name in a scenario: a base name, or a label with `base`")
    base: PolicyName = Field(description="which of the policies this is")
    timeout: Seconds = Field(description="process-group timeout: a collective fails after it")
    rendezvous_timeout: Seconds | None = Field(
        default=None, description="how long a (re)joining rank waits for the others (default: timeout)")
    max_retries: Annotated[int, Field(ge=0)] = 0
    backoff_base: Seconds = 2.0
    backoff_cap: Seconds = 60.0
    jitter: tuple[Seconds, Seconds] = (0.1, 1.0)
    health_check_timeout: Seconds = 1.0
    breaker: bool = False
    catch_errors: bool = True
    detector: DetectorSpec | None = Field(
        default=None, description="heartbeat failure detector: {} for its defaults, or null")
    elastic: bool = Field(default=False, description="leave unreachable ranks out and go on smaller")
    exclude_after: Seconds = Field(
        default=0.3, description="how long a silent member may stay suspect before it is left "
                                 "out (a rank whose process is gone is left out at once)")
    rejoin: bool = Field(
        default=False, description="a rank left out waits to be let back in at the next "
                                   "generation once it is reachable again (elastic only)")
    rejoin_within: Seconds = Field(
        default=60.0, description="how long a rank left out waits to rejoin before it exits")
    restore: Literal["checkpoint", "peer"] = Field(
        default="checkpoint", description="after a new group forms: the newest checkpoint all "
                                          "ranks have, or the newest in-memory state of a peer")
    planted_defect: PlantedDefect | None = Field(
        default=None, description="a bug planted on purpose, to test `chaos explore` "
                                  "(harness.job.planted, docs/explore.md): never for a real job")

    @field_validator("detector", mode="before")
    @classmethod
    def _detector_switch(cls, value: Any) -> Any:
        if value is True:
            return {}
        return None if value is False else value

    @model_validator(mode="after")
    def _consistent(self) -> "PolicySpec":
        if self.timeout <= 0:
            raise ValueError("timeout must be positive, e.g. \"5s\"")
        if self.jitter[0] > self.jitter[1]:
            raise ValueError(f"jitter must be [low, high] with low <= high, got {list(self.jitter)}")
        if self.breaker and not self.catch_errors:
            raise ValueError("a breaker needs catch_errors: true")
        if self.elastic and (self.detector is None or not self.breaker):
            raise ValueError("elastic needs a detector and a breaker (detector: {}, breaker: true)")
        if self.rejoin and not self.elastic:
            raise ValueError("rejoin needs an elastic policy (base: elastic)")
        if self.planted_defect == "restore_while_saving" and self.restore != "checkpoint":
            raise ValueError("planted_defect restore_while_saving is in the checkpoint restore: "
                             "give restore: checkpoint")
        return self

    @property
    def never_records(self) -> frozenset[str]:
        """The event kinds the runner never records under this policy once its first group
        formed (`chaos explore` anchors no fault on them): no breaker opens without one; no
        retry is made without retries; no group forms again and nothing is restored without
        retries or rejoin (a rank let back in joins a new generation)."""
        never = set() if self.breaker else {events.BREAKER_OPEN}
        if self.max_retries == 0:
            never.add(events.RETRY)
            if not self.rejoin:
                never |= {events.GROUP_READY, events.RESTORED}
        return frozenset(never)

    @property
    def rendezvous_s(self) -> float:
        return self.timeout if self.rendezvous_timeout is None else self.rendezvous_timeout

    @property
    def give_up_s(self) -> float | None:
        """The longest this policy can take from a fault to giving up on its own (failed-fast,
        retries exhausted, isolated, or a rank left out that waited in vain to rejoin), as an
        upper bound: the failed collective's timeout, then per retry the longest backoff with
        its jitter, the health check, a rendezvous that times out and a collective that does.
        None: a policy that does not catch errors never gives up; it waits (`hung`)."""
        if not self.catch_errors:
            return None
        per_try = self.jitter[1] + self.health_check_timeout + self.rendezvous_s + self.timeout
        retrying = sum(self.backoff(attempt) + per_try for attempt in range(1, self.max_retries + 1))
        return self.timeout + retrying + (self.rejoin_within if self.rejoin else 0.0)

    def backoff(self, attempt: int) -> float:
        """Backoff before retry `attempt` (1-based), without jitter: base * 2^(attempt-1), capped."""
        return min(self.backoff_cap, self.backoff_base * 2 ** (attempt - 1))


def policy_spec(name: str, overrides: dict[str, Any] | None = None) -> PolicySpec:
    """The named policy with its defaults, overridden field by field. A name that is not a
    policy is a label: its overrides say which policy it is (`base: retry`)."""
    overrides = dict(overrides or {})
    base = overrides.pop("base", name)
    if not isinstance(base, str) or base not in POLICY_DEFAULTS:
        raise UsageError(f"unknown policy {base!r}; expected one of {', '.join(POLICY_NAMES)}"
                         + ("" if base != name else ", or a label with base: <one of those>"))
    try:
        return PolicySpec.model_validate({**POLICY_DEFAULTS[base], **overrides, "name": name,
                                          "base": base})
    except ValidationError as exc:
        raise UsageError(f"policies.{name}: " + describe_validation_error(exc)) from exc
