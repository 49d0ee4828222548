"""A rank's environment on Kubernetes: the CHAOS_* variables the container entry point reads.

The rank container runs `python -m harness.cluster.container rank`, which builds its
RankConfig from CHAOS_* variables (`harness.cluster.container.config_from_env`). The
export writes those variables and then reads them back through that same function: what
the pods would run must equal the trial's plan (policy, workload, seed, world size), or
the export is refused naming each field the environment cannot carry.
"""
from __future__ import annotations

import json
from typing import Any

from chaos.errors import UsageError
from harness.cluster.container import STORE_PORT, config_from_env
from runfolder.plan import TrialPlan

RUN_DIR = "/runs"          # an emptyDir per pod: the rank's run folder
EVENTS_LINK = f"{RUN_DIR}/events.jsonl"  # a link to the rank's stdout: events leave as log lines
IFNAME = "eth0"            # the pod's one link: gloo and NCCL bind to it, Chaos Mesh shapes it
RANK_VARIABLE = "CHAOS_RANK"


def duration_text(seconds: float) -> str:
    """Seconds as a duration both Go (time.ParseDuration) and chaos.units read: whole s, ms
    or us (netem and Chaos Mesh work in microseconds)."""
    micros = round(seconds * 1e6)
    if micros % 1_000_000 == 0:
        return f"{micros // 1_000_000}s"
    if micros % 1000 == 0:
        return f"{micros // 1000}ms"
    return f"{micros}us"


def rank_variables(plan: TrialPlan, control_host: str) -> dict[str, str]:
    """Every CHAOS_* value of a rank except its index (the same for every rank)."""
    spec = plan.policy_spec
    return {
        "CHAOS_WORLD_SIZE": str(plan.ranks),
        "CHAOS_STORE_ADDRESS": control_host,
        "CHAOS_STORE_PORT": str(STORE_PORT),
        "CHAOS_RUN_DIR": RUN_DIR,
        "CHAOS_SEED": str(plan.seed),
        "CHAOS_MAX_STEPS": "",  # train until stopped, as under the harness: the trial ends by its rules
        "CHAOS_POLICY": spec["name"],
        "CHAOS_POLICY_TIMEOUT": duration_text(spec["timeout"]),
        "CHAOS_MAX_RETRIES": str(spec["max_retries"]),
        # the rest of the policy (its base for a label such as retry_fd, backoff, breaker,
        # detector...), so that every policy reaches the rank exactly
        "CHAOS_POLICY_OVERRIDES": json.dumps({k: v for k, v in spec.items()
                                              if k not in ("name", "timeout", "max_retries")}, sort_keys=True),
        "CHAOS_STEP_PERIOD": duration_text(plan.workload["step_period"]),
        "GLOO_SOCKET_IFNAME": IFNAME,
        "NCCL_SOCKET_IFNAME": IFNAME,
    }


def check_reaches_rank(plan: TrialPlan, variables: dict[str, str], where: str) -> None:
    """Refuse a plan whose rank config the environment cannot carry: read `variables` back
    as the entry point does and name every field that would differ."""
    config = config_from_env({**variables, RANK_VARIABLE: "0"})
    wanted: dict[str, Any] = {"policy": plan.policy_spec, "workload": plan.workload}
    differ = [f"{part} {key}: {value!r} (a rank would run {config[part].get(key)!r})"
              for part, values in wanted.items() for key, value in values.items()
              if config[part].get(key) != value]
    differ += [f"{key}: {value!r} (a rank would run {config[key]!r})"
               for key, value in (("seed", plan.seed), ("world_size", plan.ranks)) if config[key] != value]
    if differ:
        raise UsageError(
            f"{where}: trial {plan.policy!r} cannot reach a rank on Kubernetes: the rank container's entry "
            f"point builds its config from CHAOS_* variables (harness/cluster/container.py), which cannot "
            f"carry: {'; '.join(differ)}. Export a policy that sets only what those variables carry, or run "
            "this one with `chaos run`")


def rank_env(plan: TrialPlan, control_host: str, index_label: str, where: str) -> list[dict[str, Any]]:
    """The rank container's env: CHAOS_RANK from the pod's index label, then the rest."""
    variables = rank_variables(plan, control_host)
    check_reaches_rank(plan, variables, where)
    index = {"name": RANK_VARIABLE,
             "valueFrom": {"fieldRef": {"fieldPath": f"metadata.labels['{index_label}']"}}}
    return [index] + [{"name": k, "value": v} for k, v in variables.items()]
