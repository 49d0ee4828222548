"""Running a campaign: a fault-free reference, then one long trial per policy under the
drawn schedule (docs/campaign.md).

Each trial is the orchestrator's own (harness.trial.orchestrator.Trial) on a scenario built
from the user's: the schedule's faults as its timeline and enough settle steps to train to
the window's end. A policy that ends before then (the document's baseline and timeout end at
their first fault; any policy whose ranks all leave, or that hangs to the cap) is started
again the way a scheduler would: a new job (a new trial, its segment) on a new cluster,
resuming from the newest checkpoint the last one wrote, with the faults still ahead of it,
until the window is spent. The time between two segments counts as lost (restart).

    CAMPAIGN_DIR/campaign.json            the mix, its mapping, the schedule, every segment
    CAMPAIGN_DIR/<policy>/<run folder>/   one run folder per segment (`chaos report` reads it)
    CAMPAIGN_DIR/reference/<run folder>/  the fault-free run of the same window
"""
from __future__ import annotations

import datetime
import json
import math
import secrets
import shutil
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

import yaml
from pydantic import ValidationError

from chaos.errors import HarnessError, UsageError
from harness.cluster.api import Backend
from harness.cluster.launcher import LauncherPool
from harness.job.device import Placement
from harness.scenario.scenario import Scenario, trial_dir_paths
from harness.signals import Terminated
from harness.studies.campaign.mix import Mapped, Mix
from harness.studies.campaign.prepare import CampaignPlan
from harness.studies.campaign.schedule import ScheduledFault
from harness.trial.orchestrator import Trial
from harness.trial.scenario_run import start_run
from harness.trial.plan import build_plan
from harness.trial.progress import Progress
from runfolder.events import EVENTS_FILE, TRIAL_END, TRIAL_START, WARMUP_DONE, read_events
from runfolder.layout import CAMPAIGN_FILE, CAMPAIGN_FORMAT, CHECKPOINT_DIR, trial_dir

REFERENCE = "reference"
# a job started again with less than this left of the window would spend it all starting
MIN_SEGMENT_S = 5.0


@dataclass
class Segment:
    """One job of a policy's campaign: its run folder, where in the window it was planned to
    start (its faults were shifted by it), and which schedule faults it carried."""

    run_dir: str
    planned_offset_s: float
    faults: list[int]              # schedule index of each of its faults, in its order
    end: str = ""                  # the trial's end (settled, all-exited, hung, ...)
    started_at_s: float | None = None   # its warm-up done, s after the window's start


@dataclass
class PolicyCampaign:
    policy: str
    segments: list[Segment] = field(default_factory=list)
    error: str | None = None       # what stopped it early, besides its own faults


def segment_scenario(base: Scenario, policy: str, schedule: tuple[ScheduledFault, ...], offset: float,
                     remaining: float, name: str, label: str | None = None) -> tuple[Scenario, list[int]]:
    """The scenario of a job that starts `offset` s into the window with `remaining` s of it
    left: the schedule's injectable faults still ahead, shifted to its own time, each cut at
    the window's end; and the settle steps that keep it training until then. `label` names
    its one policy where it is not `policy` itself (the reference: `policy` under its name)."""
    chosen = [i for i, f in enumerate(schedule) if f.fault is not None and offset <= f.at < offset + remaining]
    faults, last = [], 0.0
    for i in chosen:
        f = schedule[i]
        start = round(f.at - offset, 3)
        entry: dict[str, Any] = {**f.fault, "target": {"rank": f.target}, "start": start}  # type: ignore[dict-item]
        if f.duration is not None:
            entry["duration"] = round(max(0.001, min(f.duration, remaining - start)), 3)
        faults.append(entry)
        last = max(last, start + entry.get("duration", 0.0))
    data = base.model_dump(mode="json", exclude={"faults", "expect", "tier", "policies", "variants", "name",
                                                 "settle_steps"})
    period = base.workload.step_period
    if base.job is not None:  # a user's job: its variant, under the label (the reference: the first's)
        variant = base.variants.get(policy)
        data["variants"] = {label or policy: {} if variant is None else variant.model_dump(mode="json",
                                                                                          exclude_unset=True)}
    else:
        overrides = dict(base.policies.get(policy, {}))
        if label is not None and label != policy:
            overrides["base"] = base.policy(policy).base
        data["policies"] = {label or policy: overrides}
    data.update(name=name, faults=faults, expect={}, settle_steps=max(1, math.ceil((remaining - last) / period)))
    try:
        return Scenario.model_validate(data), chosen
    except ValidationError as exc:  # the schedule's draw keeps to what a scenario allows: a harness bug
        raise HarnessError(f"the campaign's job {name} is not a valid scenario: "
                           f"{exc.errors()[0]['msg'].removeprefix('Value error, ')}") from None


def run_campaign(base: Scenario, policies: list[str], mix: Mix, mapping: tuple[Mapped, ...],
                 schedule: tuple[ScheduledFault, ...], duration: float, campaign_dir: Path, backend: Backend,
                 placement: Placement, progress: Progress, launchers: LauncherPool,
                  record: dict[str, Any]) -> dict[str, PolicyCampaign]:
    """Run the reference and every policy; `record` (campaign.json's content) is kept
    written as segments finish, so that an interrupted campaign reports what it measured.
    Ctrl-C (KeyboardInterrupt, Terminated) ends it: what finished stays, the record says
    partial, and the signal goes on to the caller."""
    done: dict[str, PolicyCampaign] = {}
    record["policies"] = {}
    try:
        for policy in [REFERENCE, *policies]:
            campaign = PolicyCampaign(policy)
            done[policy] = campaign
            record["policies"][policy] = campaign
            trial_policy = policies[0] if policy == REFERENCE else policy
            try:
                _policy_campaign(base, policy, trial_policy, () if policy == REFERENCE else schedule, duration,
                                 campaign_dir, backend, placement, progress, launchers, campaign, record)
            except HarnessError as exc:
                campaign.error = str(exc)
                progress.phase(policy, f"stopped: {exc}")
            write_record(campaign_dir, record)
    except (KeyboardInterrupt, Terminated):
        record["partial"] = True
        write_record(campaign_dir, record)
        raise
    record["partial"] = False
    write_record(campaign_dir, record)
    return done


def _policy_campaign(base: Scenario, label: str, policy: str, schedule: tuple[ScheduledFault, ...], duration: float,
                     campaign_dir: Path, backend: Backend, placement: Placement, progress: Progress,
                     launchers: LauncherPool, campaign: PolicyCampaign, record: dict[str, Any]) -> None:
    window_start: float | None = None
    offset, resume_from = 0.0, None
    while True:
        k = len(campaign.segments)
        scenario, carried = segment_scenario(base, policy, schedule, offset, duration - offset,
                                             f"{base.name}-{label}-{k}", label)
        folder = campaign_dir / label
        folder.mkdir(parents=True, exist_ok=True)
        scenario_file = folder / f"segment-{k}.yaml"
        scenario_file.write_text(yaml.safe_dump(scenario.model_dump(mode="json"), sort_keys=False))
        run_dir = start_run(folder, scenario, scenario_file, [label], backend.name,
                            record["command"], placement, None)
        segment = Segment(str(run_dir), round(offset, 3), carried)
        campaign.segments.append(segment)
        write_record(campaign_dir, record)
        tdir = trial_dir(run_dir, label)
        if resume_from is not None:  # the scheduler's new job resumes from what the last one kept
            _carry_checkpoint(scenario, label, resume_from, tdir)
        what = "fault-free reference" if label == REFERENCE else f"segment {k}, {len(carried)} faults"
        progress.phase(label, f"{what}: {duration - offset:.0f} s of the window left")
        result = Trial(build_plan(scenario, label), tdir, backend, progress, placement=placement,
                       launchers=launchers).run()
        segment.end = result.end
        events = read_events(tdir / EVENTS_FILE)[0]
        warm = next((e["t"] for e in events if e["kind"] == WARMUP_DONE), None)
        if window_start is None:
            window_start = warm
        if window_start is None:
            raise HarnessError(f"the first job of {label} did not finish its warm-up ({result.end}); see {tdir}")
        if warm is not None:
            segment.started_at_s = round(warm - window_start, 3)
        write_record(campaign_dir, record)
        ended = next((e["t"] for e in events if e["kind"] == TRIAL_END), time.monotonic())
        if result.end == "settled" or ended - window_start >= duration - MIN_SEGMENT_S:
            return
        # the next job: its warm-up will be done about as long after now as this one's took
        began = next(e["t"] for e in events if e["kind"] == TRIAL_START)
        offset = time.monotonic() - window_start + ((warm or ended) - began)
        if duration - offset < MIN_SEGMENT_S:
            return
        progress.phase(label, f"the job ended ({result.end}) at +{ended - window_start:.0f} s: "
                              f"started again as a new job, resuming from its newest checkpoint")
        resume_from = tdir


def run_windows(plan: CampaignPlan, parent: Path, progress: Progress, launchers: LauncherPool,
                say: Callable[[str], None]) -> list[Path]:
    """Run every window of `plan` into `parent` (one window: `parent` itself, else
    `parent/window-<r>`), write each window's report and `say` its summary; returns the
    windows' folders. Ctrl-C or an error: what was measured is reported, marked partial,
    and the exception goes on."""
    from harness.cluster.backends import backend_named
    from harness.job.device import PlacementError, choose, visible_gpus
    from harness.trial.plan import placement_problem
    from reports.campaign import write_campaign_report

    scenario = plan.scenario
    try:
        placement = choose(scenario.cluster.device, scenario.cluster.comm, scenario.cluster.ranks, visible_gpus())
    except PlacementError as exc:
        raise UsageError(f"{plan.scenario_file}: {exc}") from None
    problem = placement_problem(scenario, plan.scenario_file, placement.device, placement.reason)
    if problem:
        raise UsageError(problem)
    launchers.start_ahead()
    repeated = len(plan.schedules) > 1
    folders = []
    for r, (seed, schedule) in enumerate(zip(plan.seeds, plan.schedules, strict=True)):
        folder = parent / f"window-{r}" if repeated else parent
        folder.mkdir(exist_ok=True)
        record = {"format": CAMPAIGN_FORMAT, "command": plan.command, "scenario": str(plan.scenario_file),
                  "window": r, "mix": {"name": plan.mix.name, "source": plan.mix.source, "file": str(plan.mix.path)},
                  "mapping": [{"category": m.category.name, "share": m.category.share, "injects": m.text(),
                               "left_out": m.left_out} for m in plan.mapping],
                  "seed": seed, "mtbf_s": plan.mtbf_s, "duration_s": plan.duration_s, "lead_in_s": plan.lead_in_s,
                  "backend": scenario.cluster.backend, "ranks": scenario.cluster.ranks, "schedule": list(schedule),
                  "projection": plan.projection, "partial": True}
        interrupted = None
        try:
            run_campaign(scenario, list(plan.policies), plan.mix, plan.mapping, schedule, plan.duration_s, folder,
                         backend_named(scenario.cluster.backend), placement, progress, launchers, record)
        except BaseException as exc:  # Ctrl-C or an error: what was measured is reported, marked partial
            interrupted = exc
        try:
            say(("" if not repeated else f"\nwindow {r} (seed {seed}):\n") + write_campaign_report(folder))
        except Exception as exc:
            if interrupted is None:
                raise
            print(f"chaos: the campaign's report could not be written ({exc})", file=sys.stderr)
        if interrupted is not None:
            print(f"campaign stopped early: the figures above are partial ({folder})", file=sys.stderr)
            raise interrupted
        folders.append(folder)
    return folders


def _carry_checkpoint(scenario: Scenario, label: str, old: Path, new: Path) -> None:
    """Copy what a job resumes from out of the last job's trial folder into the next one's:
    the runner's checkpoint folder, or every path under {trial_dir} a user's job names (its
    checkpoint file or folder, wherever the command puts it). A path the last job never
    wrote is not copied: the next job starts from scratch, as it would."""
    if scenario.job is None:
        kept = [CHECKPOINT_DIR]
    else:
        variant = scenario.variants.get(label)
        kept = [p.lstrip("/") for p in trial_dir_paths(scenario.job if variant is None else
                                                        variant.applied_to(scenario.job))]
    for relative in (p for p in kept if p):
        source, target = old / relative, new / relative
        if source.is_dir():
            shutil.copytree(source, target, dirs_exist_ok=True)
        elif source.is_file():
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)


def write_record(campaign_dir: Path, record: dict[str, Any]) -> None:
    def plain(value: Any) -> Any:
        if isinstance(value, (Segment, PolicyCampaign, ScheduledFault)):
            return asdict(value)
        raise TypeError(type(value).__name__)
    path = campaign_dir / CAMPAIGN_FILE
    temp = path.with_suffix(".tmp")
    temp.write_text(json.dumps(record, indent=1, default=plain))
    temp.replace(path)


def campaign_folder(out: Path, name: str) -> Path:
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    folder = out.resolve() / f"{name}-campaign-{stamp}-{secrets.token_hex(2)}"
    try:
        folder.mkdir(parents=True)
    except OSError as exc:
        raise UsageError(f"--out {out}: cannot write there ({exc}); pick a writable folder") from None
    return folder
