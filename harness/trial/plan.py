"""A trial's plan, built once from a scenario and a policy, and its text for `--dry-run`.

    plan = build_plan(scenario, "timeout")
    plan.trial.faults[0].targets  # resolved: a `count` target drawn with the seed, once
    plan.trial.actions            # every apply and revert in time order, pulses included
    plan.trial.expect             # typed: outcome names and bounds in float seconds
    plan.faults[0]                # the fault value chaos injects

The orchestrator executes the plan and stores `plan.trial` in trial.json (a
runfolder.plan.TrialPlan, inside runfolder.info.TrialInfo); the reports judge the trial
from the stored plan.
"""
from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from chaos.faults import FaultBase
from harness.cluster.agent import rdzv_conf_text
from harness.job.policies import PolicySpec
from harness.scenario.scenario import Expectation as WrittenExpectation, FaultEvent, Scenario
from harness.scenario.yaml_errors import file_line
from runfolder.frameworks import STORE, coordinator_host
from runfolder.plan import APPLY, REVERT, Action, Anchor, Expectation, PlannedFault, TrialPlan


@dataclass(frozen=True)
class Plan:
    """One trial's plan as the harness executes it: what is stored and judged (`trial`), and
    each fault as the value chaos injects (the stored JSON is for reading: a fault's units
    are parsed from the scenario's strings once, not again from numbers)."""

    trial: TrialPlan
    faults: tuple[FaultBase, ...]    # faults[i] is trial.faults[i]'s value
    ranks_per_node: int = 1          # cluster.ranks_per_node (a scheduler's backend)
    scheduler_args: tuple[str, ...] = ()  # the allocation's (cluster.slurm)


def build_plan(scenario: Scenario, policy: str) -> Plan:
    """The plan of one trial of `scenario` under `policy` (a name in its policies; with a
    user's job, a name of its variants, and no policy of the harness's runner)."""
    job = None
    if scenario.job is not None:
        variant = scenario.variants.get(policy)
        job = (scenario.job if variant is None else variant.applied_to(scenario.job)).model_dump(mode="json")
    trial = TrialPlan(
        policy=policy, policy_spec={} if job else scenario.policy(policy).model_dump(mode="json"),
        workload=scenario.workload.model_dump(mode="json"), ranks=scenario.cluster.ranks,
        seed=scenario.seed, warmup_steps=scenario.warmup_steps, settle_steps=scenario.settle_steps,
        hang_cap=scenario.hang_cap, faults=tuple(_planned(scenario, i, e) for i, e in enumerate(scenario.faults)),
        actions=_actions(scenario.faults, anchored=False), expect=_expectation(scenario.expect.get(policy)), job=job,
        sysctls=dict(scenario.cluster.sysctls) or None, stacks_at_detect=scenario.stacks_at_detect,
        anchored=_actions(scenario.faults, anchored=True), store_host=scenario.cluster.store == "host")
    return Plan(trial, tuple(e.fault for e in scenario.faults), scenario.cluster.ranks_per_node,
                scenario.cluster.slurm.sbatch_args() if scenario.cluster.slurm else ())


# A trial with nothing left to do ends at its deadline (`deadline`, inconclusive): its last
# action, then this many times the larger of the hang cap and the floor, or longer where the
# policy's own time to give up is longer (a retry policy's rendezvous after rendezvous).
DEADLINE_FACTOR, DEADLINE_FLOOR_S = 3, 60.0


def trial_deadline_s(trial: TrialPlan) -> float:
    """Seconds after warm-up at which `trial` ends whatever its ranks do (the orchestrator
    adds the settle steps' own time): the policy, given a fault at the last action, has given
    up by then and had the hang cap to show it. A user's job has no policy of the harness's."""
    give_up = PolicySpec.model_validate(trial.policy_spec).give_up_s if trial.policy_spec else None
    waited = DEADLINE_FACTOR * max(trial.hang_cap, DEADLINE_FLOOR_S)
    return trial.last_action_s + max(waited, (give_up or 0.0) + trial.hang_cap)


def placement_problem(scenario: Scenario, scenario_file: Path, device: str, reason: str) -> str | None:
    """Why `scenario` cannot run with its ranks on `device` (the run's placement, chosen for
    `reason`), as "file:line: field: problem; fix", or None."""
    job = scenario.job
    if job is not None and job.nproc_per_host > 1 and device == "cuda":
        return (f"{file_line(scenario_file, ('job', 'nproc_per_host'))}: job.nproc_per_host: "
                f"{job.nproc_per_host} on GPUs: each host is given one GPU, and NCCL refuses two ranks on "
                "one GPU; set nproc_per_host: 1 (one host per GPU), or cluster.device: cpu")
    for i, event in enumerate(scenario.faults):
        if event.fault.kind == "gpu_hang" and device != "cuda":
            return (f"{file_line(scenario_file, ('faults', i, 'kind'))}: faults.{i}.kind: 'gpu_hang' spins "
                    f"a kernel on the rank's GPU, but this run places its ranks on the CPU ({reason}); "
                    "run it on a host with an NVIDIA GPU (cluster.device: cuda or auto), or use "
                    "kind: pause for a silent stall on the CPU")
    return None


def _planned(scenario: Scenario, index: int, event: FaultEvent) -> PlannedFault:
    fault, written = event.fault, event.anchor
    anchor = None
    if written is not None:
        # waited for until `within` after warm-up; by default the hang cap after the last fault at a time
        timed = max((t for e in scenario.faults if e.anchor is None for window in e.windows() for t in window
                     if t is not None), default=0.0)
        anchor = Anchor(on=written.on, nth=written.nth, delay=written.delay, rank=written.rank,
                        until=written.within if written.within is not None else timed + scenario.hang_cap)
    return PlannedFault(index=index, kind=fault.kind, fault=fault.model_dump(mode="json"),  # type: ignore[attr-defined]
                        description=fault.describe(), targets=scenario.targets(index),
                        start=event.offset, duration=event.duration, anchor=anchor)


def _actions(faults: tuple[FaultEvent, ...], anchored: bool) -> tuple[Action, ...]:
    """Every apply and revert of the faults at a time (or of the `anchored` ones, after their
    event) in time order (a revert before an apply at the same offset); a pulsed fault
    contributes one pair per on-phase."""
    actions = []
    for i, event in enumerate(faults):
        if (event.anchor is not None) != anchored:
            continue
        for on, off in event.windows():
            actions.append(Action(on, APPLY, i))
            if off is not None:
                actions.append(Action(off, REVERT, i))
    return tuple(sorted(actions, key=lambda a: (a.at, a.verb == APPLY)))


def _expectation(written: WrittenExpectation | None) -> Expectation | None:
    """The expectation as the reports judge it; None when the scenario sets nothing."""
    if written is None or not written.model_dump(exclude_none=True):
        return None
    return Expectation(outcome=written.outcome or (), detect_within=written.detect_within,
                       recover_within=written.recover_within, breaker_within=written.breaker_within,
                       suspects_at_most=written.suspects_at_most, state=written.state,
                       stuck_in=written.stuck_in, steps_lost_at_most=written.steps_lost_at_most,
                       ranks_lost_at_most=written.ranks_lost_at_most, undetected_at_most=written.undetected_at_most)


def ranks_text(ranks: tuple[int, ...]) -> str:
    return ("rank " if len(ranks) == 1 else "ranks ") + ",".join(map(str, ranks))


def _expectation_text(expect: Expectation | None) -> str:
    if expect is None:
        return "nothing"
    wanted = [f"outcome {' or '.join(expect.outcome)}"] if expect.outcome else []
    wanted += [f"{name} {bound:g} s" for name, bound in expect.bounds().items()]
    if expect.suspects_at_most is not None:
        wanted.append(f"at most {expect.suspects_at_most} suspect events")
    if expect.state is not None:
        wanted.append(f"state {expect.state}")
    if expect.stuck_in is not None:
        wanted.append(f"stuck in {expect.stuck_in!r}")
    if expect.ranks_lost_at_most is not None:
        wanted.append(f"at most {expect.ranks_lost_at_most} ranks lost from the world")
    if expect.undetected_at_most is not None:
        wanted.append(f"at most {expect.undetected_at_most} ranks not detecting the fault")
    return ", ".join(wanted)


def _policy_text(plan: TrialPlan) -> str:
    if plan.job is not None:
        job = plan.job
        return (f"{shlex.join(job['command'])} in {job['workdir']}, launcher {job['launcher']}, "
                f"max_restarts {job['max_restarts']}"
                + (f", min_hosts {job['min_hosts']} (--nnodes {job['min_hosts']}:{plan.ranks})"
                   if job.get("min_hosts") is not None else "")
                + (f", --rdzv-conf {rdzv_conf_text(job['rdzv_conf'])}" if job.get("rdzv_conf") else "")
                + (f", {job['nproc_per_host']} processes per host" if job["nproc_per_host"] > 1 else "")
                + (f", its coordinator on r{host:03d} (the last host; the others train)"
                   if (host := coordinator_host(plan.ranks, job)) is not None else "")
                + (f", {job['launcher']}: " + ", ".join(f"{k} {v:g}" if isinstance(v, float) else f"{k} {v}"
                                                        for k, v in settings.items() if v is not None)
                   if isinstance(settings := job.get(job["launcher"]), dict) else "")
                + (f", env {' '.join(f'{k}={v}' for k, v in job['env'].items())}" if job["env"] else ""))
    spec = plan.policy_spec
    return (f"timeout {spec['timeout']:g} s, {spec['max_retries']} retries "
            f"(backoff {spec['backoff_base']:g}..{spec['backoff_cap']:g} s), "
            f"breaker {'on' if spec['breaker'] else 'off'}"
            + (", failure detector" if spec["detector"] is not None else "")
            + (", elastic" if spec["elastic"] else "")
            + (f", rejoin within {spec['rejoin_within']:g} s" if spec["rejoin"] else "")
            + (f", PLANTED DEFECT {spec['planted_defect']} (harness.job.planted)"
               if spec.get("planted_defect") else "")
            + (f", {STORE} on r{plan.ranks - 1:03d} (the last host; the others are the ranks)"
               if plan.store_host else ""))


def plan_text(scenario: Scenario, scenario_file: Path, policies: list[str],
              mechanism: Callable[[FaultBase], str]) -> str:
    """What a run of `policies` would do, in words: which ranks, which mechanism, when (for
    `chaos run --dry-run`; nothing is built or injected). `mechanism` names the mechanism
    this machine would use for a fault."""
    plans = [build_plan(scenario, name) for name in policies]
    header = (f"scenario {scenario.name} ({scenario_file}), seed {scenario.seed}: "
              + (f"{scenario.cluster.ranks - 1} ranks and the store on {scenario.cluster.ranks} "
                 f"{scenario.cluster.backend} hosts" if scenario.cluster.store == "host"
                 else f"{scenario.cluster.ranks} ranks on {scenario.cluster.backend} hosts"))
    if not plans:
        return f"{header}\nno policy to run: add one under 'policies:'"
    timeline, values = plans[0].trial, plans[0].faults  # the same for every policy
    lines = [header]
    if timeline.sysctls:
        lines.append("every host's own settings: " + ", ".join(f"{k} = {v}" for k, v in timeline.sysctls.items()))
    lines += [f"per policy, on a fresh cluster: {timeline.warmup_steps} warm-up steps on every rank, "
              "then at these offsets after warm-up:"]
    def action_line(action: Action, after: str = "") -> str:
        fault = timeline.faults[action.index]
        what = fault.description if action.verb == APPLY else fault.kind
        how = f" by {mechanism(values[action.index])}" if action.verb == APPLY else ""
        return (f"  {after}+{action.at:7.3f} s  {action.verb:6}  faults.{action.index} {what} "
                f"on {ranks_text(fault.targets)}{how}")
    lines += [action_line(action) for action in timeline.actions]
    for fault in timeline.faults:
        anchor = fault.anchor
        if anchor is None:
            continue
        whose = f"rank {anchor.rank}'s" if anchor.rank is not None else "the first process to see its"
        lines.append(f"  on {whose} {anchor.on} #{anchor.nth} after warm-up (waited for until "
                     f"+{anchor.until:g} s, else not applied), after the event:")
        lines += [action_line(a, "  ") for a in timeline.anchored if a.index == fault.index]
    if not timeline.faults:
        lines.append("  (no fault: a control run)")
    never = [f"faults.{f.index}" for f in timeline.faults if f.duration is None]
    if never:
        lines.append(f"  {', '.join(never)} never heal{'s' if len(never) == 1 else ''} while the harness watches")
    lines.append(f"then watch until every live rank made {timeline.settle_steps} steps after the last "
                 f"action, every rank exited, or nothing moved for the hang cap ({timeline.hang_cap:g} s)")
    lines.append(f"{'variants of your job' if scenario.job else 'policies'}, in this order:")
    lines += [f"  {plan.trial.policy:10} {_policy_text(plan.trial)}; expects {_expectation_text(plan.trial.expect)}"
              for plan in plans]
    return "\n".join(lines)
