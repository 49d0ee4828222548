"""The policies a job runs under, as values (see DESIGN.md section 5).

    baseline   the document's "original code": a huge process-group timeout, no retry; an
               error propagates and the process crashes
    timeout    an explicit process-group timeout; on the first failure, clean up and exit
    retry      timeout + bounded retries with exponential backoff and jitter, a health
               check, a re-created process group, restore from the latest checkpoint
    isolation  retry + circuit breaker: when retries run out or the health check fails,
               open the breaker, release the group and accelerator memory, and leave

Defaults are the document's runner (max_retries=3, initial_backoff_s=2.0,
nccl_timeout_s=30, jitter uniform(0.1, 1.0) s); a scenario overrides any field.
"""
from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from chaos.errors import UsageError
from chaos.faults import Seconds, describe_validation_error

PolicyName = Literal["baseline", "timeout", "retry", "isolation"]
POLICY_NAMES: tuple[str, ...] = ("baseline", "timeout", "retry", "isolation")

_DOCUMENT = {"timeout": "30s", "max_retries": 3, "backoff_base": "2s", "backoff_cap": "60s",
             "jitter": ["100ms", "1s"], "health_check_timeout": "1s"}
POLICY_DEFAULTS: dict[str, dict[str, Any]] = {
    "baseline": {**_DOCUMENT, "timeout": "6h", "max_retries": 0, "catch_errors": False},
    "timeout": {**_DOCUMENT, "max_retries": 0},
    "retry": {**_DOCUMENT},
    "isolation": {**_DOCUMENT, "breaker": True},
}


class PolicySpec(BaseModel):
    """How a rank reacts to a failed collective. Frozen; built once by `policy_spec`."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: PolicyName
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

    @model_validator(mode="after")
    def _consistent(self) -> "PolicySpec":
        if self.timeout <= 0:
            raise ValueError("timeout must be positive, e.g. \"5s\"")
        if self.jitter[0] > self.jitter[1]:
            raise ValueError(f"jitter must be [low, high] with low <= high, got {list(self.jitter)}")
        if self.breaker and not self.catch_errors:
            raise ValueError("a breaker needs catch_errors: true")
        return self

    @property
    def rendezvous_s(self) -> float:
        return self.timeout if self.rendezvous_timeout is None else self.rendezvous_timeout

    def backoff(self, attempt: int) -> float:
        """Backoff before retry `attempt` (1-based), without jitter: base * 2^(attempt-1), capped."""
        return min(self.backoff_cap, self.backoff_base * 2 ** (attempt - 1))


def policy_spec(name: str, overrides: dict[str, Any] | None = None) -> PolicySpec:
    """The named policy with the document's defaults, overridden field by field."""
    if name not in POLICY_DEFAULTS:
        raise UsageError(f"unknown policy {name!r}; expected one of {', '.join(POLICY_NAMES)}")
    try:
        return PolicySpec.model_validate({**POLICY_DEFAULTS[name], **(overrides or {}), "name": name})
    except ValidationError as exc:
        raise UsageError(f"policies.{name}: " + describe_validation_error(exc)) from exc
