"""A fault mix: failure categories with their shares and source, each mapped to what the
harness injects for it (docs/campaign.md). The default is Llama 3's (llama3.yaml here).

    name: llama3
    source: "where the shares come from"
    categories:
      faulty_gpu: {share: 0.301, inject: [{kind: kill}]}
      network_switch_cable: {share: 0.084, inject: [{kind: link_down, duration: {min: 5s, max: 30s}}]}
      host_maintenance: {share: 0.076, inject: [{kind: preempt}, {kind: kill, signal: SIGTERM}]}
      silent_data_corruption: {share: 0.014, inject: []}

`inject` lists the kinds in order of preference: the first the run's backend can inject is
used (`Mix.mapping`); a category none of whose kinds it can inject is said and left out:
its faults are drawn and listed, never injected, never merged into another category. A mix
of your own may name a default category without `inject` (it takes llama3's mapping).
Errors name the file, the line, the field and the fix (UsageError: exit 2).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from chaos import units
from chaos.errors import UsageError
from chaos.reach import why_unreadable
from harness.scenario.scenario import FAULT_CLASSES, FaultEvent, Scenario
from harness.scenario.yaml_errors import duplicate_keys, line_of

MIXES_DIR = Path(__file__).resolve().parent
DEFAULT_MIX = "llama3"
SHARES_TOLERANCE = 0.005  # shares quoted to 0.1% add to 1 within rounding


@dataclass(frozen=True)
class Draw:
    """A fault's duration: fixed (low == high) or drawn uniformly in [low, high] seconds."""

    low: float
    high: float

    def text(self) -> str:
        if self.low == self.high:
            return units.format_duration(self.low)
        return f"{units.format_duration(self.low)}..{units.format_duration(self.high)} (uniform)"


@dataclass(frozen=True)
class Injection:
    """What the harness injects for a category: a fault kind with its parameters, and its
    duration (None: the kind has no end, a kill)."""

    fault: dict[str, Any]   # kind and parameters, as a scenario's fault entry
    duration: Draw | None

    @property
    def kind(self) -> str:
        return str(self.fault["kind"])

    def text(self) -> str:
        params = ", ".join(f"{k}={v}" for k, v in self.fault.items() if k != "kind")
        return (f"{self.kind}({params})" if params else self.kind) + (
            f" for {self.duration.text()}" if self.duration else "")


@dataclass(frozen=True)
class Category:
    name: str
    share: float
    inject: tuple[Injection, ...]   # in order of preference


@dataclass(frozen=True)
class Mapped:
    """A category on one backend: the injection used, or why it is left out."""

    category: Category
    injection: Injection | None
    left_out: str | None = None     # why no kind of it can be injected there

    def text(self) -> str:
        return self.injection.text() if self.injection else f"left out: {self.left_out}"


@dataclass(frozen=True)
class Mix:
    name: str
    source: str
    path: Path
    categories: tuple[Category, ...]

    def mapping(self, backend: str, ranks: int) -> tuple[Mapped, ...]:
        """Each category as the `backend` injects it (its Traits decide, through the same
        checks a scenario's faults get)."""
        mapped = []
        for category in self.categories:
            reasons = []
            for injection in category.inject:
                why = cannot_inject(injection, backend, ranks)
                if why is None:
                    mapped.append(Mapped(category, injection))
                    break
                reasons.append(f"{injection.kind}: {why}")
            else:
                mapped.append(Mapped(category, None, "; ".join(reasons) or "the mix maps it to no fault kind"))
        return tuple(mapped)


def cannot_inject(injection: Injection, backend: str, ranks: int) -> str | None:
    """Why `backend` cannot inject `injection` (the scenario loader's own refusal), or None."""
    duration = None if injection.duration is None else injection.duration.high
    try:
        Scenario.model_validate({"name": "mix-check", "cluster": {"ranks": ranks, "backend": backend},
                                 "faults": [{**injection.fault, "target": {"rank": 0}, "start": 0,
                                             **({"duration": duration} if duration is not None else {})}]})
    except ValidationError as exc:
        message = str(exc.errors()[0]["msg"]).removeprefix("Value error, ")
        return message.split(": ", 1)[1] if message.startswith("faults.0.kind: ") else message
    return None


def mix_path(name_or_file: str) -> Path:
    """`--mix`: a shipped mix's name (llama3) or a file's path."""
    shipped = MIXES_DIR / f"{name_or_file}.yaml"
    if "/" not in name_or_file and not name_or_file.endswith((".yaml", ".yml")) and shipped.exists():
        return shipped
    return Path(name_or_file)


def shipped_mixes() -> list[str]:
    return sorted(p.stem for p in MIXES_DIR.glob("*.yaml"))


def load_mix(name_or_file: str) -> Mix:
    """Read and validate a mix; raises UsageError naming file, line, field and the fix."""
    path = mix_path(name_or_file)
    try:
        text = path.read_text(encoding="utf-8")
    except PermissionError as exc:
        raise UsageError(f"--mix {name_or_file}: {why_unreadable(path) or exc.strerror}") from None
    except OSError as exc:
        raise UsageError(f"--mix {name_or_file}: no such mix ({exc.strerror}); give one of "
                         f"{', '.join(shipped_mixes())} or the path of a mix file (docs/campaign.md)") from None
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        raise UsageError(f"{path}{f':{mark.line + 1}' if mark else ''}: not valid YAML: "
                         f"{getattr(exc, 'problem', None) or exc}") from None
    twice = duplicate_keys(root, path)
    if twice:
        raise UsageError("\n".join(twice))

    def refuse(loc: tuple[Any, ...], problem: str) -> UsageError:
        line = line_of(root, loc)
        field = ".".join(map(str, loc))
        return UsageError(f"{path}{f':{line}' if line else ''}: {field}: {problem}")

    if not isinstance(data, dict):
        raise UsageError(f"{path}: a mix is a mapping (name, source, categories), not {type(data).__name__}")
    unknown = sorted(set(data) - {"name", "source", "categories"})
    if unknown:
        raise refuse((unknown[0],), "not a field of a mix; the fields are name, source, categories")
    source = data.get("source")
    if not isinstance(source, str) or not source.strip():
        raise refuse(("source",), "missing; say where the shares come from (a paper, an incident log)")
    categories = data.get("categories")
    if not isinstance(categories, dict) or not categories:
        raise refuse(("categories",), "expected a mapping of category: {share: 0.3, inject: [...]}")
    defaults = _default_categories() if path != MIXES_DIR / f"{DEFAULT_MIX}.yaml" else {}
    parsed = tuple(_category(str(name), entry, defaults, refuse) for name, entry in categories.items())
    total = sum(c.share for c in parsed)
    if abs(total - 1) > SHARES_TOLERANCE:
        raise refuse(("categories",), f"the shares add up to {total:.3f}, not 1; make them add up to 1 "
                                      f"(a category such as other: {{share: {max(0.0, 1 - total):.3f}, "
                                      "inject: []} holds what is not mapped)")
    return Mix(str(data.get("name") or path.stem), " ".join(source.split()), path, parsed)


def _default_categories() -> dict[str, Category]:
    return {c.name: c for c in load_mix(DEFAULT_MIX).categories}


def _category(name: str, entry: Any, defaults: dict[str, Category], refuse: Any) -> Category:
    where = ("categories", name)
    if isinstance(entry, (int, float)) and not isinstance(entry, bool):
        entry = {"share": entry}
    if not isinstance(entry, dict):
        raise refuse(where, "expected {share: 0.3, inject: [{kind: kill}]}")
    extra = sorted(set(entry) - {"share", "inject"})
    if extra:
        raise refuse((*where, extra[0]), "not a field of a category; the fields are share and inject")
    share = entry.get("share")
    if isinstance(share, bool) or not isinstance(share, (int, float)) or not 0 < share <= 1 \
            or not math.isfinite(share):
        raise refuse((*where, "share"), f"{share!r}; expected a fraction above 0 and at most 1, e.g. 0.084")
    if "inject" not in entry:
        if name not in defaults:
            known = ", ".join(defaults) or "none"
            raise refuse(where, f"unknown category {name!r} with no inject list; give its inject list "
                                f"([{{kind: kill}}], [] to leave it out) or use a known category ({known})")
        return Category(name, float(share), defaults[name].inject)
    inject = entry["inject"]
    if not isinstance(inject, list):
        raise refuse((*where, "inject"), "expected a list of faults in order of preference, e.g. "
                                         "[{kind: preempt}, {kind: kill, signal: SIGTERM}] ([] leaves it out)")
    return Category(name, float(share), tuple(_injection(item, (*where, "inject", i), refuse)
                                              for i, item in enumerate(inject)))


def _injection(item: Any, where: tuple[Any, ...], refuse: Any) -> Injection:
    if not isinstance(item, dict) or "kind" not in item:
        raise refuse(where, "expected a fault such as {kind: link_down, duration: {min: 5s, max: 30s}}")
    fault = {k: v for k, v in item.items() if k != "duration"}
    duration = _draw(item["duration"], (*where, "duration"), refuse) if "duration" in item else None
    event = {**fault, "target": {"rank": 0}, "start": 0}
    if duration is not None:
        event["duration"] = duration.high
    try:
        FaultEvent.model_validate(event)
    except ValidationError as exc:
        error = exc.errors()[0]
        message = str(error["msg"]).removeprefix("Value error, ")
        field = ".".join(str(p) for p in error["loc"] if p not in ("fault", item["kind"]))
        raise refuse(where, f"{field + ': ' if field and field not in message else ''}{message}") from None
    if duration is None and FAULT_CLASSES[item["kind"]].reversible:
        raise refuse(where, f"a {item['kind']} needs a duration here (a mix's faults that can end do end); "
                            "add duration: {min: 5s, max: 30s}")
    return Injection(fault, duration)


def _draw(value: Any, where: tuple[Any, ...], refuse: Any) -> Draw:
    form = f"{units.DURATION_FORM}, or {{min: 5s, max: 30s}} drawn uniformly"
    try:
        if isinstance(value, dict):
            if set(value) != {"min", "max"}:
                raise ValueError(f"expected exactly min and max; {form}")
            low, high = units.parse_duration(value["min"]), units.parse_duration(value["max"])
        else:
            low = high = units.parse_duration(value)
    except ValueError as exc:
        raise refuse(where, str(exc)) from None
    if not (0 < low <= high) or not math.isfinite(high):
        raise refuse(where, f"{value!r}: durations must be above 0 and finite, with min <= max")
    return Draw(low, high)
