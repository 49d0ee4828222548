"""A campaign checked whole before anything runs: the scenario, the policies, the mix on the
scenario's backend, and each window's schedule, as one value (CampaignPlan). `chaos campaign`
and a night's campaign cell (harness.studies.nightly.plan) both make it here; only the way a
refusal names its input differs (an option, or a plan file's field)."""
from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from chaos import units
from chaos.errors import UsageError
from harness.scenario.scenario import Scenario
from harness.studies.campaign.mix import Mapped, Mix, load_mix
from harness.studies.campaign.schedule import ScheduledFault, draw_schedule, expected_faults

CLI_NAMES = {"mtbf": "--mtbf", "duration": "--duration", "seed": "--seed", "policies": "--policy",
             "repeat": "--repeat"}


class CampaignInputError(UsageError):
    """A refused campaign input; `field` is which (mtbf, duration, seed, policies, repeat)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


@dataclass(frozen=True)
class CampaignPlan:
    scenario: Scenario            # with the seed, ranks and backend asked for
    scenario_file: Path
    policies: tuple[str, ...]
    mix: Mix
    mapping: tuple[Mapped, ...]
    seeds: tuple[int, ...]        # one per window
    schedules: tuple[tuple[ScheduledFault, ...], ...]
    mtbf_s: float
    duration_s: float
    lead_in_s: float
    projection: dict[str, Any] | None
    command: str                  # the `chaos` line that runs it again


def load_campaign_scenario(path: Path, overrides: dict[str, Any]) -> tuple[Scenario, bool]:
    """The scenario a campaign runs, and whether the file had faults of its own: those are
    replaced by the mix's, so they are not checked against the overrides (a link fault the
    local backend cannot make, a rank past --ranks); its expectations are per single fault,
    so they go too. The scenario's times follow --ranks as `chaos run --ranks`'s do."""
    from harness.scenario.scaling import scaled_to_cores
    from harness.scenario.scenario import load_scenario

    own_faults = bool(load_scenario(path).faults)
    scenario = load_scenario(path, {**overrides, "faults": [], "expect": {}})
    return (scaled_to_cores(scenario) if overrides.get("cluster.ranks") is not None else scenario), own_faults


def seconds_of(name: str, value: str, names: dict[str, str]) -> float:
    """A duration of the campaign's (`name`: mtbf, duration, ...), above 0."""
    try:
        seconds = units.parse_duration(value)
    except ValueError as exc:
        raise CampaignInputError(name, f"{names.get(name, name)} {value}: {exc}") from None
    if not 0 < seconds < float("inf"):
        raise CampaignInputError(name, f"{names.get(name, name)} {value}: must be above 0; give "
                                       f"{units.DURATION_FORM}")
    return seconds


def plan_campaign(scenario: Scenario, scenario_file: Path, policies: list[str] | None, mix_name: str,
                  mtbf: str, duration: str, repeat: int = 1, projection: dict[str, Any] | None = None,
                  command: str = "", names: dict[str, str] = CLI_NAMES) -> CampaignPlan:
    """Check a campaign of `scenario` (already loaded with its overrides) and draw its
    schedules; `names` spells each input the way the user gave it (CLI_NAMES: the options)."""
    from harness.job.policies import POLICY_NAMES

    mtbf_s, duration_s = seconds_of("mtbf", mtbf, names), seconds_of("duration", duration, names)
    if repeat < 1:
        raise CampaignInputError("repeat", f"{names['repeat']} {repeat}: must be at least 1 (windows per policy)")
    chosen = list(policies or scenario.trial_names())
    for policy in chosen:
        if scenario.job is not None and policy not in scenario.trial_names():  # a user's job compares its variants
            raise CampaignInputError("policies", f"{names['policies']} {policy}: not a variant of the job in "
                                                 f"{scenario_file} ({', '.join(scenario.trial_names())}); "
                                                 "name one of those")
        if scenario.job is None and policy not in scenario.policies and policy not in POLICY_NAMES:
            raise CampaignInputError("policies", f"{names['policies']} {policy}: not in {scenario_file}'s policies "
                                                 f"nor a harness policy "
                                                 f"({', '.join(dict.fromkeys([*scenario.policies, *POLICY_NAMES]))})")
    if len(set(chosen)) != len(chosen):
        raise CampaignInputError("policies", f"{names['policies']} {next(p for p in chosen if chosen.count(p) > 1)} "
                                             "given twice; give it once")
    mix = load_mix(mix_name)
    mapping = mix.mapping(scenario.cluster.backend, scenario.cluster.ranks)
    # the first fault comes once the job has trained as long as its warm-up did
    lead_in = scenario.warmup_steps * scenario.workload.step_period
    if expected_faults(mtbf_s, duration_s, lead_in) < 1:
        raise CampaignInputError("mtbf", f"{names['mtbf']} {mtbf} over {names['duration']} {duration}: less than one "
                                         f"fault is expected after the {lead_in:g} s lead-in (the scenario's warm-up); "
                                         f"make {names['duration']} at least "
                                         f"{units.format_duration(mtbf_s + lead_in)} or {names['mtbf']} shorter")
    seeds = tuple(scenario.seed + r for r in range(repeat))
    schedules = tuple(draw_schedule(mapping, mtbf_s, duration_s, lead_in, scenario.cluster.ranks, seed)
                      for seed in seeds)
    for seed, schedule in zip(seeds, schedules, strict=True):
        if not any(f.fault for f in schedule):
            raise CampaignInputError("seed", f"{names['seed']} {seed}: the schedule holds no fault the "
                                             f"{scenario.cluster.backend} backend can inject ({len(schedule)} drawn); "
                                             f"give another {names['seed']} or a longer {names['duration']}")
    return CampaignPlan(scenario, Path(scenario_file), tuple(chosen), mix, mapping, seeds, schedules, mtbf_s,
                        duration_s, lead_in, projection, command)


def campaign_command_line(scenario_file: Path, policies: tuple[str, ...], mix: str, mtbf: str, duration: str,
                          seed: int, ranks: int | None = None, backend: str | None = None) -> str:
    """The `chaos campaign` line that runs a campaign again (a night's cell stores it)."""
    words = ["chaos", "campaign", str(scenario_file), "--mix", mix, "--mtbf", mtbf, "--duration", duration]
    for option, value in (("--ranks", ranks), ("--backend", backend)):
        if value is not None:
            words += [option, str(value)]
    for policy in policies:
        words += ["--policy", policy]
    return shlex.join([*words, "--seed", str(seed)])
