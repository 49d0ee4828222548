"""The scaling rule: past 8 ranks per core a scenario's times are stretched so that every
relation it was written with still holds (`chaos run --ranks`; docs/scale.md)."""
from __future__ import annotations

import os
from typing import Any

from pydantic import BaseModel

from harness.scenario.scenario import Scenario

# The shipped scenarios' step period, timeouts, hang caps and bounds were set and measured
# with 16 ranks on 2 cores. Past that every rank gets a smaller share of a core, and a step
# slows in proportion; past 64 ranks also with the ring: gloo's all-reduce takes 2(N-1)
# rounds, each waiting for every rank to get a core (a step's median on 2 cores: 0.08,
# 0.20, 0.72, 2.88 s at 16, 32, 64, 128 ranks; docs/scale-journal.md).
REFERENCE_RANKS_PER_CORE = 8
REFERENCE_RING = 64


def scale_factor(ranks: int, cores: int) -> float:
    """How many times slower than the reference a step runs: ranks per core over 8, times
    ranks over 64 past 64 ranks; never below 1."""
    per_core = max(1.0, ranks / max(cores, 1) / REFERENCE_RANKS_PER_CORE)
    return per_core * max(1.0, ranks / REFERENCE_RING)


def usable_cores() -> int:
    return len(os.sched_getaffinity(0))


MEASURED_RANKS_PER_CORE = 32  # 64 ranks on 2 cores ran every shipped scenario's policies; 96
# ran elastic_kill; 128 ran control.yaml (no detector), and elastic_kill in 6 runs of 8 (in
# two earlier ones ranks cut themselves off from the control plane; two since ranks greet it)


def scaling_note(ranks: int, cores: int | None = None, job: bool = False) -> str | None:
    """The line that says a scenario's times were stretched, or None when they were not;
    with a user's `job`, that its own arguments were not (the harness cannot tell which
    of them are times, and a timeout given to init_process_group also bounds the start)."""
    cores = usable_cores() if cores is None else cores
    k = scale_factor(ranks, cores)
    if k == 1.0:
        return None
    note = (f"{ranks} ranks on {cores} cores: every time in the scenario is stretched "
            f"x{k:g} (step period, faults, timeouts, hang cap, bounds; docs/scale.md)")
    if ranks / cores > MEASURED_RANKS_PER_CORE:
        note += (f"; past {MEASURED_RANKS_PER_CORE} ranks per core the scenarios are not all known to hold "
                 "(the failure detector has cut ranks off while the first group formed: docs/scale.md)")
    return note + ("; your job's own command, args and env are not (a timeout it passes to "
                   "init_process_group also bounds its start-up: docs/scale.md)" if job else "")


# A policy's waits that stretch with the scale factor. The failure detector's heartbeat
# period, silence threshold and exclude_after do not: its threads run ahead of the ranks'
# steps (harness.job.detector.run_ahead) and were measured to keep up at 64 ranks on 2
# cores beside two CPU hogs (docs/scale.md). straggler_after is a wait on a step: it does.
_POLICY_WAITS = ("timeout", "rendezvous_timeout", "backoff_base", "backoff_cap", "health_check_timeout",
                 "rejoin_within")
_DETECTOR_WAITS = ("straggler_after",)
_BOUNDS = ("detect_within", "recover_within", "breaker_within")


def _stretched(model: BaseModel, fields: tuple[str, ...], k: float) -> dict[str, Any]:
    return {f: getattr(model, f) * k for f in fields if getattr(model, f) is not None}


def scaled_to_cores(scenario: Scenario, cores: int | None = None) -> Scenario:
    """`scenario` with every time in it stretched by scale_factor(ranks, cores; default: the
    cores this process may run on), so that each relation it was written with holds (a link
    down longer than the timeout, a flap shorter than it): the step period, the fault
    timeline, each policy's timeouts, backoff and waits (its failure detector's straggler
    wait, not its heartbeats and silence threshold), the hang cap and the expectations' bounds."""
    k = scale_factor(scenario.cluster.ranks, usable_cores() if cores is None else cores)
    if k == 1.0:
        return scenario
    policies = {}
    for name, overrides in scenario.policies.items():
        spec = scenario.policy(name)
        policies[name] = {**overrides, **_stretched(spec, _POLICY_WAITS, k),
                          "jitter": [spec.jitter[0] * k, spec.jitter[1] * k],
                          "detector": spec.detector and spec.detector.model_copy(
                              update=_stretched(spec.detector, _DETECTOR_WAITS, k)).model_dump()}
    faults = tuple(event.model_copy(update={
        **_stretched(event, ("duration",), k),
        "start": event.start.model_copy(update=_stretched(event.start, ("delay", "within"), k))
        if event.anchor else event.start * k,
        "pulses": event.pulses and event.pulses.model_copy(update=_stretched(event.pulses, ("on_for", "off_for"), k))})
        for event in scenario.faults)
    return scenario.model_copy(update={
        "workload": scenario.workload.model_copy(update={"step_period": scenario.workload.step_period * k}),
        "faults": faults, "hang_cap": scenario.hang_cap * k, "policies": policies,
        "expect": {name: e.model_copy(update=_stretched(e, _BOUNDS, k)) for name, e in scenario.expect.items()}})
