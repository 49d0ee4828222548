"""Faults are values: one frozen, typed class per kind, validated once when built.

A fault says *what* happens to a host (its kind and parameters, with units parsed from
strings such as "250ms", "20%", "10mbit"); *where* and *when* belong to the scenario.
`parse_fault(dict)` builds the right class from its ``kind`` and raises `InvalidFault`
naming the field, the value and the accepted form.
"""
from __future__ import annotations

import signal
from typing import Annotated, Any, ClassVar, Literal, Union

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, TypeAdapter, ValidationError

from chaos import units
from chaos.errors import InvalidFault

Seconds = Annotated[float, BeforeValidator(units.parse_duration), Field(ge=0)]
Fraction = Annotated[float, BeforeValidator(units.parse_percent)]
BitsPerSecond = Annotated[float, BeforeValidator(units.parse_rate)]
Bytes = Annotated[int, BeforeValidator(units.parse_size)]


class FaultBase(BaseModel):
    """Common shape of every fault kind: frozen, no unknown fields."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    # Faults on a link act on its switch side ("wire" semantics) unless a kind says otherwise.
    acts_on: ClassVar[str] = "link"  # "link" | "process"
    # Whether the fault has a natural end that the harness reverts after `duration`.
    reversible: ClassVar[bool] = True

    def describe(self) -> str:
        params = ", ".join(f"{k}={v}" for k, v in self.model_dump(exclude={"kind"}).items())
        return f"{self.kind}({params})" if params else self.kind  # type: ignore[attr-defined]


class LinkDown(FaultBase):
    """The host's link goes down (switch-side port): a pulled cable the port notices."""

    kind: Literal["link_down"] = "link_down"


def _signal_number(value: Any) -> int:
    if isinstance(value, int) and not isinstance(value, bool):
        return signal.Signals(value).value
    if isinstance(value, str):
        name = value.upper()
        name = name if name.startswith("SIG") else "SIG" + name
        if name in signal.Signals.__members__:
            return signal.Signals[name].value
    raise ValueError(f"{value!r} is not a signal name such as \"SIGKILL\" or \"TERM\"")


class Kill(FaultBase):
    """The rank's process receives `signal` (SIGKILL by default): it dies, it does not come back."""

    kind: Literal["kill"] = "kill"
    signal: Annotated[int, BeforeValidator(_signal_number)] = signal.SIGKILL.value
    acts_on: ClassVar[str] = "process"
    reversible: ClassVar[bool] = False


class Pause(FaultBase):
    """The rank's process is frozen with SIGSTOP and thawed with SIGCONT (a GC or scheduler stall)."""

    kind: Literal["pause"] = "pause"
    acts_on: ClassVar[str] = "process"


# The closed set of kinds. A new kind is one class here plus its mechanism in chaos.inject.
FAULT_KINDS: tuple[type[FaultBase], ...] = (LinkDown, Kill, Pause)
Fault = Annotated[Union[LinkDown, Kill, Pause], Field(discriminator="kind")]
_FAULT_ADAPTER: TypeAdapter[Any] = TypeAdapter(Fault)


def kind_names() -> list[str]:
    return [cls.model_fields["kind"].default for cls in FAULT_KINDS]


def parse_fault(data: dict[str, Any]) -> FaultBase:
    """Build a fault value from a mapping, or raise InvalidFault naming field, value and form."""
    kind = data.get("kind") if isinstance(data, dict) else None
    if kind not in kind_names():
        raise InvalidFault(f"kind: unknown fault kind {kind!r}; expected one of {', '.join(kind_names())}")
    try:
        return _FAULT_ADAPTER.validate_python(data)
    except ValidationError as exc:
        raise InvalidFault(describe_validation_error(exc, prefix=f"{kind}.")) from exc


def describe_validation_error(exc: ValidationError, prefix: str = "") -> str:
    """One line per problem: field path, the value given, and what was expected."""
    lines = []
    for err in exc.errors():
        loc = ".".join(str(p) for p in err["loc"] if not str(p).startswith("function-"))
        msg = err["msg"].removeprefix("Value error, ")
        value = err.get("input")
        if err["type"] == "extra_forbidden":
            msg = "unknown field"
        lines.append(f"{prefix}{loc}: {msg} (got {value!r})" if value is not None and
                     err["type"] != "missing" else f"{prefix}{loc}: {msg}")
    return "; ".join(lines)
