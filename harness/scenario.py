"""Scenario files: one YAML file is one experiment, validated once into frozen values.

    name: link-down                     # defaults to the file name
    description: ...
    seed: 1                             # all randomness (jitter, target choice) comes from it
    cluster: {ranks: 16, backend: netns}
    workload: {step_period: 250ms, checkpoint_every: 10}
    warmup_steps: 8                     # steps every rank completes before the first fault
    faults:                             # the timeline, offsets after warm-up
      - {kind: link_down, target: {rank: 5}, start: 2s, duration: 20s}
    hang_cap: 30s                       # no step and no policy action this long = hung
    settle_steps: 8                     # steps every live rank makes after the faults end
    policies:                           # the policies to compare, with overrides
      baseline: {}
      timeout: {timeout: 5s}
    expect:                             # what each policy is expected to do
      timeout: {outcome: failed-fast, detect_within: 7s}

Errors name the file, the line, the field, the value given and the accepted form.
"""
from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from chaos.errors import InvalidFault, UsageError
from chaos.faults import FaultBase, Seconds, describe_validation_error, parse_fault
from harness.policies import POLICY_NAMES, PolicySpec, policy_spec
from harness.workload import WorkloadSpec

OUTCOMES = ("absorbed", "recovered", "failed-fast", "isolated", "hung", "crashed", "continued")


class Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class ClusterConfig(Frozen):
    ranks: Annotated[int, Field(ge=2, le=4096)] = 16
    backend: Literal["netns", "docker"] = "netns"


class Target(Frozen):
    rank: Annotated[int, Field(ge=0)]


class FaultEvent(Frozen):
    """One entry of the timeline: what (fault), where (target), when (start, duration)."""

    fault: FaultBase
    target: Target
    start: Seconds = 0.0
    duration: Seconds | None = None  # None: the fault never heals within the trial

    @model_validator(mode="before")
    @classmethod
    def _split(cls, data: Any) -> Any:
        if not isinstance(data, dict) or "fault" in data:
            return data
        timing = {k: data[k] for k in ("target", "start", "duration") if k in data}
        return {**timing, "fault": {k: v for k, v in data.items() if k not in timing}}

    @field_validator("fault", mode="before")
    @classmethod
    def _fault(cls, value: Any) -> FaultBase:
        if isinstance(value, FaultBase):
            return value
        try:
            return parse_fault(value)
        except InvalidFault as exc:
            raise ValueError(str(exc)) from None

    @model_validator(mode="after")
    def _duration_fits_kind(self) -> "FaultEvent":
        if not self.fault.reversible and self.duration is not None:
            raise ValueError(f"a {self.fault.kind} fault cannot be undone: remove 'duration'")  # type: ignore[attr-defined]
        return self


class Expectation(Frozen):
    outcome: Literal[OUTCOMES] | None = None  # type: ignore[valid-type]
    detect_within: Seconds | None = None
    recover_within: Seconds | None = None
    breaker_within: Seconds | None = None


class Scenario(Frozen):
    name: str
    description: str = ""
    seed: int = 0
    cluster: ClusterConfig = ClusterConfig()
    workload: WorkloadSpec = WorkloadSpec()
    warmup_steps: Annotated[int, Field(ge=1)] = 8
    faults: list[FaultEvent] = []
    hang_cap: Seconds = 60.0
    settle_steps: Annotated[int, Field(ge=1)] = 8
    policies: dict[str, dict[str, Any]] = Field(default_factory=lambda: {p: {} for p in POLICY_NAMES})
    expect: dict[str, Expectation] = {}

    @model_validator(mode="after")
    def _consistent(self) -> "Scenario":
        for i, event in enumerate(self.faults):
            if event.target.rank >= self.cluster.ranks:
                raise ValueError(f"faults.{i}.target.rank: rank {event.target.rank} is outside the "
                                 f"cluster (ranks 0..{self.cluster.ranks - 1})")
        for name in self.policies:
            try:
                policy_spec(name, self.policies[name])
            except UsageError as exc:
                raise ValueError(str(exc)) from None
        for name in self.expect:
            if name not in self.policies:
                raise ValueError(f"expect.{name}: no such policy in 'policies' "
                                 f"({', '.join(self.policies)})")
        return self

    def policy(self, name: str) -> PolicySpec:
        return policy_spec(name, self.policies.get(name, {}))

    @property
    def last_action_s(self) -> float:
        """Offset (after warm-up) of the last scheduled fault action."""
        return max((e.start + (e.duration or 0.0) for e in self.faults), default=0.0)


def _line_of(node: yaml.Node | None, loc: tuple[Any, ...]) -> int | None:
    """The 1-based line of the YAML node at pydantic location `loc`, as deep as it exists."""
    line = node.start_mark.line + 1 if node is not None else None
    for key in loc:
        if isinstance(node, yaml.MappingNode):
            node = next((v for k, v in node.value if k.value == str(key)), None)
        elif isinstance(node, yaml.SequenceNode) and isinstance(key, int) and key < len(node.value):
            node = node.value[key]
        else:
            break
        if node is None:
            break
        line = node.start_mark.line + 1
    return line


def load_scenario(path: Path | str, overrides: dict[str, Any] | None = None) -> Scenario:
    """Read and validate a scenario file; raises UsageError with file:line: field: problem.

    `overrides` maps dotted field paths ("cluster.ranks", "seed") to values given on the
    command line; they are merged before validation, so they are checked like the file."""
    path = Path(path)
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise UsageError(f"{path}: no such scenario file; pass the path of a .yaml file "
                         "(see scenarios/ for examples)") from None
    except OSError as exc:
        raise UsageError(f"{path}: cannot read: {exc.strerror}") from exc
    try:
        root = yaml.compose(text)
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f":{mark.line + 1}" if mark else ""
        raise UsageError(f"{path}{where}: not valid YAML: {getattr(exc, 'problem', exc)}") from exc
    if not isinstance(data, dict):
        raise UsageError(f"{path}: a scenario is a mapping of fields (name, faults, policies, ...)")
    data.setdefault("name", path.stem)
    for dotted, value in (overrides or {}).items():
        *parents, leaf = dotted.split(".")
        node = data
        for key in parents:
            node = node.setdefault(key, {})
        node[leaf] = value
    try:
        return Scenario.model_validate(data)
    except ValidationError as exc:
        message = describe_validation_error(exc)
        loc = tuple(exc.errors()[0]["loc"]) or _leading_path(message)
        line = _line_of(root, loc)
        where = f":{line}" if line else ""
        raise UsageError(f"{path}{where}: {message}") from exc


def _leading_path(message: str) -> tuple[Any, ...]:
    """("faults", 0, "target") from a cross-field message "faults.0.target: ..."."""
    head = message.split(": ", 1)[0]
    return tuple(int(p) if p.isdigit() else p for p in head.split("."))
