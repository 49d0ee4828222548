"""A night's plan: the plan file validated once into frozen values (errors name
file:line: field), expanded into cells, one plan entry x repeat each, with their seeds."""
from __future__ import annotations

import glob
import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from chaos.errors import UsageError
from chaos.reach import why_unreadable
from harness.cluster.backends import BACKEND_NAMES, DEFAULT_BACKEND
from harness.studies.campaign.mix import DEFAULT_MIX
from harness.studies.campaign.prepare import (CampaignInputError, CampaignPlan, campaign_command_line, load_campaign_scenario,
                                         plan_campaign)
from harness.scenario.scaling import scaled_to_cores
from harness.scenario.scenario import Scenario, load_scenario, reproduce_command
from harness.scenario.yaml_errors import describe_errors, line_of

REPO = Path(__file__).resolve().parent.parent.parent.parent
PLANS = REPO / "nightly"
DEFAULT_PLAN, QUICK_PLAN = PLANS / "default.yaml", PLANS / "quick.yaml"


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class PlanEntry(_Frozen):
    scenario: Annotated[str, Field(min_length=1, description="a scenario file or a glob, relative to the plan")]
    policies: tuple[str, ...] | None = Field(default=None, min_length=1,
                                              description="policies of the scenario to run; default all")
    ranks: Annotated[int, Field(ge=2, le=4096)] | None = None
    repeat: Annotated[int, Field(ge=1, le=1000)] | None = None


Fraction = Annotated[float, Field(gt=0, le=1)]


class EttrGate(_Frozen):
    """A campaign policy's bar: the night fails the cell when its ETTR is below either."""

    ettr_at_least: Fraction | None = Field(default=None, description="the ETTR, 0..1")
    ettr_of_reference_at_least: Fraction | None = Field(
        default=None, description="the ETTR over the fault-free reference's ETTR, 0..1")

    @model_validator(mode="after")
    def _some_bar(self) -> EttrGate:
        if self.ettr_at_least is None and self.ettr_of_reference_at_least is None:
            raise ValueError("no bar; give ettr_at_least: 0.8 (the ETTR) or ettr_of_reference_at_least: 0.9 "
                             "(a share of the fault-free reference's ETTR), or both")
        return self


class CampaignEntry(_Frozen):
    """A campaign cell (`chaos campaign`, docs/campaign.md): one window a night, its ETTR per
    policy gated by `gate`."""

    scenario: Annotated[str, Field(min_length=1, description="a scenario file, relative to the plan")]
    policies: tuple[str, ...] | None = Field(default=None, min_length=1,
                                              description="policies to run; default the scenario's")
    duration: Annotated[str, Field(min_length=1, description="the window, e.g. 45s")]
    mtbf: Annotated[str, Field(min_length=1, description="mean time between faults, e.g. 15s")]
    seed: Annotated[int, Field(ge=0, le=2**32 - 1)] | None = None  # the schedule's; default the scenario's
    mix: str = DEFAULT_MIX
    ranks: Annotated[int, Field(ge=2, le=4096)] | None = None
    gate: dict[str, EttrGate] = Field(default_factory=dict, description="policy -> its ETTR bar")


class NightPlan(_Frozen):
    seed: Annotated[int, Field(ge=0, le=2**63 - 1)] = 1
    repeat: Annotated[int, Field(ge=1, le=1000)] = 3
    backend: Literal[BACKEND_NAMES] = DEFAULT_BACKEND  # type: ignore[valid-type]  (harness.cluster.backends)
    device: str = "cpu"
    runs: tuple[PlanEntry, ...] = ()
    campaigns: tuple[CampaignEntry, ...] = ()

    @field_validator("device")
    @classmethod
    def _cpu_only(cls, value: str) -> str:
        # nights run on the CPU only: GPU nodes have no night plan yet
        if value != "cpu":
            raise ValueError(f"{value!r}: the ranks' workload trains on the CPU only today; use device: cpu")
        return value

    @model_validator(mode="after")
    def _some(self) -> NightPlan:
        if not self.runs and not self.campaigns:
            raise ValueError("runs: empty; list at least one entry such as - {scenario: ../scenarios/kill_rank.yaml} "
                             "(or a campaign under campaigns:)")
        return self


def load_night_plan(path: Path, repeat: int | None = None, backend: str | None = None) -> NightPlan:
    """Read and validate a plan file; `repeat` and `backend` (the command line's) override it.
    Raises UsageError with file:line: field: problem, one line per problem."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
        root = yaml.compose(text, Loader=yaml.SafeLoader)
        data = yaml.safe_load(text)
    except FileNotFoundError:
        raise UsageError(f"{path}: no such plan file; pass a .yaml plan (see nightly/ for examples)") from None
    except PermissionError as exc:
        raise UsageError(f"{path}: {why_unreadable(path) or exc.strerror}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"{path}: cannot read the plan: {exc}") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        raise UsageError(f"{path}{f':{mark.line + 1}' if mark else ''}: not valid YAML: "
                         f"{getattr(exc, 'problem', None) or exc}") from None
    if not isinstance(data, dict):
        raise UsageError(f"{path}: a plan is a mapping of fields (seed, repeat, backend, device, runs), "
                         f"not {type(data).__name__}")
    data.update({k: v for k, v in (("repeat", repeat), ("backend", backend)) if v is not None})
    try:
        return NightPlan.model_validate(data)
    except ValidationError as exc:
        raise UsageError("\n".join(f"{path}{f':{line}' if (line := line_of(root, loc)) else ''}: "
                                   f"{_plan_words(message)}"
                                   for loc, message in describe_errors(exc))) from None


def _plan_words(message: str) -> str:
    """yaml_errors.describe_errors' text, about a plan file."""
    if message.startswith("scenario: "):
        message = "plan: " + message.removeprefix("scenario: ")
    return message.replace("`chaos schema` lists the fields",
                                                               "docs/nightly.md lists the plan's fields")


@dataclass(frozen=True)
class Cell:
    """One plan entry x repeat of a night: a run folder with one trial per policy."""

    scenario: Scenario       # with the cell's seed, ranks and backend
    scenario_file: Path
    policies: tuple[str, ...]
    repeat: int
    command: str             # `chaos run ...` that runs the cell again
    kind: ClassVar[str] = "run"

    @property
    def key(self) -> str:
        # the policies too: a plan may run a scenario's policies (or variants) in two entries
        return f"{self.scenario.name}/{self.repeat}/{'+'.join(self.policies)}"

    @property
    def trials(self) -> int:
        return len(self.policies)


@dataclass(frozen=True)
class CampaignCell:
    """A campaign of a night: one window, a fault-free reference and a trial per policy
    (each started again as often as its jobs end), each policy's ETTR judged by its bar."""

    campaign: CampaignPlan
    gate: dict[str, EttrGate]   # policy -> its bar (only the policies the plan gates)
    command: str                # `chaos campaign ...` that runs the cell again
    repeat: int = 0             # a campaign runs one window a night
    kind: ClassVar[str] = "campaign"

    @property
    def scenario(self) -> Scenario:
        return self.campaign.scenario

    @property
    def policies(self) -> tuple[str, ...]:
        return self.campaign.policies

    @property
    def key(self) -> str:
        return f"campaign/{self.scenario.name}/{'+'.join(self.policies)}"

    @property
    def trials(self) -> int:
        return len(self.policies) + 1  # and the reference


def seed_for(base: int, scenario: str, repeat: int) -> int:
    """Repeat `repeat` of `scenario`'s seed: distinct per repeat, the same every night."""
    digest = hashlib.sha256(f"{base}/{scenario}/{repeat}".encode()).digest()
    return int.from_bytes(digest[:4], "big")


def _where(plan_file: Path, *loc: str | int) -> str:
    """file:line: field, for a problem found after the plan was validated."""
    line = line_of(yaml.compose(plan_file.read_text(encoding="utf-8"), Loader=yaml.SafeLoader), loc)
    return f"{plan_file}{f':{line}' if line else ''}: {'.'.join(map(str, loc))}"


def _files(pattern: str, plan_file: Path, where: str) -> list[Path]:
    full = os.path.normpath(pattern if Path(pattern).is_absolute() else plan_file.parent / pattern)
    found = sorted(Path(p) for p in glob.glob(full)) if glob.has_magic(pattern) else [Path(full)]
    if not found:
        raise UsageError(f"{where}: {pattern!r} matches no scenario file (relative to {plan_file.parent})")
    return found


def expand(plan: NightPlan, plan_file: Path) -> tuple[Cell | CampaignCell, ...]:
    """Every cell of the plan, repeat by repeat (repeat 0 of every entry first, so that an
    interrupted night has every series at least once), then its campaigns; each scenario
    loaded and checked, each campaign's schedule drawn."""
    entries: list[tuple[Path, str, tuple[str, ...], int, int | None]] = []
    owner: dict[tuple[str, str], str] = {}  # (scenario, policy) -> the plan entry that runs it
    for index, entry in enumerate(plan.runs):
        for path in _files(entry.scenario, plan_file, _where(plan_file, "runs", index, "scenario")):
            scenario = load_scenario(path)
            trials = scenario.trial_names()  # the policies, or a user's job's variants
            policies = entry.policies or tuple(trials)
            unknown = [p for p in policies if p not in trials]
            if unknown:
                kind = "a policy of" if scenario.job is None else "a variant of the job in"
                raise UsageError(f"{_where(plan_file, 'runs', index, 'policies')}: {unknown[0]!r} is not {kind} {path} "
                                 f"({', '.join(trials)}); name one of those")
            for policy in policies:
                if (scenario.name, policy) in owner:
                    raise UsageError(f"{_where(plan_file, 'runs', index)}: {scenario.name} / {policy} is already run by "
                                     f"{owner[scenario.name, policy]}; run each scenario x policy once a night")
                owner[scenario.name, policy] = f"runs.{index}"
            entries.append((path, scenario.name, policies, entry.repeat or plan.repeat, entry.ranks))
    cells: list[Cell | CampaignCell] = []
    for repeat in range(max((count for *_, count, _ in entries), default=0)):
        for path, name, policies, count, ranks in entries:
            if repeat < count:
                cells.append(_cell(plan, path, name, policies, repeat, ranks))
    campaigned: dict[tuple[str, str], str] = {}
    for index, entry in enumerate(plan.campaigns):
        cell = _campaign_cell(plan, plan_file, index, entry)
        for policy in cell.policies:
            if (cell.scenario.name, policy) in campaigned:
                raise UsageError(f"{_where(plan_file, 'campaigns', index)}: a campaign of {cell.scenario.name} / "
                                 f"{policy} is already run by {campaigned[cell.scenario.name, policy]}; run each "
                                 "scenario x policy in one campaign a night")
            campaigned[cell.scenario.name, policy] = f"campaigns.{index}"
        cells.append(cell)
    return tuple(cells)


# how a campaign's refusal names its field in a plan file (prepare.CLI_NAMES: as options)
CAMPAIGN_FIELDS = {name: name for name in ("mtbf", "duration", "seed", "policies", "repeat")}


def _campaign_cell(plan: NightPlan, plan_file: Path, index: int, entry: CampaignEntry) -> CampaignCell:
    if glob.has_magic(entry.scenario):
        raise UsageError(f"{_where(plan_file, 'campaigns', index, 'scenario')}: {entry.scenario!r}: a campaign runs "
                         "one scenario; name its file, not a glob")
    path = Path(os.path.normpath(plan_file.parent / entry.scenario))  # an absolute path stays itself
    overrides: dict[str, Any] = {"seed": entry.seed, "cluster.backend": plan.backend, "cluster.ranks": entry.ranks}
    scenario, _ = load_campaign_scenario(path, {k: v for k, v in overrides.items() if v is not None})
    policies = list(entry.policies) if entry.policies else None
    chosen = tuple(policies or scenario.trial_names())
    command = campaign_command_line(path, chosen, entry.mix, entry.mtbf, entry.duration, scenario.seed,
                                    entry.ranks, plan.backend)
    try:
        campaign = plan_campaign(scenario, path, policies, entry.mix, entry.mtbf, entry.duration, command=command,
                                 names=CAMPAIGN_FIELDS)
    except CampaignInputError as exc:
        where = _where(plan_file, "campaigns", index, *([exc.field] if exc.field in entry.model_fields_set else []))
        raise UsageError(f"{where}: {exc}") from None
    for policy in entry.gate:
        if policy not in campaign.policies:
            raise UsageError(f"{_where(plan_file, 'campaigns', index, 'gate', policy)}: {policy!r} is not a policy "
                             f"of this campaign ({', '.join(campaign.policies)}); gate one of those")
    return CampaignCell(campaign, dict(entry.gate), command)


def _cell(plan: NightPlan, path: Path, name: str, policies: tuple[str, ...], repeat: int,
          ranks: int | None) -> Cell:
    seed = seed_for(plan.seed, name, repeat)
    overrides: dict[str, Any] = {"seed": seed, "cluster.backend": plan.backend, "cluster.ranks": ranks}
    scenario = load_scenario(path, {k: v for k, v in overrides.items() if v is not None})
    # like `chaos run --ranks`: the scenario's times follow the ranks per core (docs/scale.md)
    return Cell(scenario if ranks is None else scaled_to_cores(scenario), path, policies, repeat,
                reproduce_command(path, (), seed, overrides))


def plan_digest(plan: NightPlan, cells: tuple[Cell, ...]) -> str:
    """What a night runs: a night resumes only under the same digest."""
    digest = hashlib.sha256(plan.model_dump_json().encode())
    for cell in cells:
        digest.update(json.dumps([cell.key, cell.command, cell.policies,
                                  cell.scenario.model_dump(mode="json")], sort_keys=True).encode())
    return digest.hexdigest()
