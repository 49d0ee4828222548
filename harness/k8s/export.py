"""`chaos export k8s`: one trial (a scenario under one policy) as Kubernetes manifests.

    OUT/job.yaml      the plan's ConfigMap (read back by `chaos collect k8s`) and the job:
                      a ClusterTrainingRuntime and its TrainJob, or a PyTorchJob (--api)
    OUT/faults.yaml   the fault timeline as a Chaos Mesh Workflow (none for a fault-free
                      scenario); apply it once the ranks are warm

Targets and offsets come from the trial's plan (harness.trial.plan.build_plan), the one the
local harness executes. A comment above each document says what every mapping decision
is, and whether it is exact or approximated; what cannot be mapped is refused, naming the
file, the line, the fault and why.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import textwrap

import yaml

from chaos.errors import UsageError
from harness.k8s.env import RUN_DIR, rank_env
from harness.k8s.faults import FaultMapping, map_fault, workflow, workflow_notes
from harness.k8s.jobs import JOB_BUILDERS, plan_config_map
from harness.k8s.operators import OPERATORS, Pods, job_name
from harness.scenario.scenario import load_scenario
from harness.trial.plan import build_plan

JOB_FILE = "job.yaml"
FAULTS_FILE = "faults.yaml"
DEFAULT_IMAGE = "chaos-harness:gpu"  # the tag docker-compose.yml builds the Dockerfile as
COMMENT_WIDTH = 98


@dataclass(frozen=True)
class Export:
    job: str
    namespace: str
    workflow: str | None             # None: the scenario has no fault
    files: dict[str, str]            # file name -> YAML text
    approximated: tuple[str, ...]    # "faults.0: ...", one per approximated decision


class _Dumper(yaml.SafeDumper):
    """Every value written out in full (no anchors and aliases for repeated specs); a text of
    several lines (the scenario in the plan ConfigMap) as a literal block."""

    def ignore_aliases(self, data: Any) -> bool:
        return True

    def represent_str(self, data: str) -> yaml.ScalarNode:
        return self.represent_scalar("tag:yaml.org,2002:str", data, style="|" if "\n" in data else None)


_Dumper.add_representer(str, _Dumper.represent_str)


def yaml_text(comment: list[str], documents: list[dict[str, Any]]) -> str:
    """YAML documents under a comment block; each comment paragraph is wrapped, its
    continuation lines indented two more."""
    head = []
    for paragraph in comment:
        indent = " " * (len(paragraph) - len(paragraph.lstrip()))
        # never inside a word: a flag or a name split at its hyphen would not work pasted
        lines = textwrap.wrap(paragraph, COMMENT_WIDTH, subsequent_indent=indent + "  ",
                              break_on_hyphens=False) or [""]
        head += [f"# {line}".rstrip() + "\n" for line in lines]
    body = "---\n".join(yaml.dump(doc, Dumper=_Dumper, sort_keys=False, default_flow_style=False, width=100)
                        for doc in documents)
    return "".join(head) + body


def _fault_line(text: str, index: int) -> int | None:
    """The line of the scenario file where faults[index] begins."""
    root = yaml.compose(text, Loader=yaml.SafeLoader)
    faults = next((v for k, v in root.value if k.value == "faults"), None) if root is not None else None
    if isinstance(faults, yaml.SequenceNode) and index < len(faults.value):
        return faults.value[index].start_mark.line + 1
    return None


def export_trial(scenario_file: Path, policy: str, image: str = DEFAULT_IMAGE, namespace: str = "default",
                 api: str = "trainjob", name: str | None = None, checkpoint_claim: str | None = None,
                 gpus: int = 0) -> Export:
    """The manifests of one trial; raises UsageError for what cannot run on Kubernetes as it
    runs under the harness."""
    scenario = load_scenario(scenario_file)
    if scenario.job is not None:
        raise UsageError(f"{scenario_file}: job: a scenario that runs your own training job cannot be exported "
                         "yet (the exported ranks run the harness's image and its built-in workload); run it "
                         "with `chaos run`, or export a scenario without 'job:'")
    if policy not in scenario.policies:
        raise UsageError(f"--policy {policy}: not in {scenario_file}'s policies ({', '.join(scenario.policies)}); "
                         "pick one of those")
    built = build_plan(scenario, policy)
    plan = built.trial
    op = OPERATORS[api]
    job = job_name(scenario.name, policy, name)
    env = rank_env(plan, op.control_host(job), op.index_label, f"{scenario_file}: policies.{policy}")
    text = Path(scenario_file).read_text(encoding="utf-8")
    pods = Pods(op, job, namespace)
    mappings: list[FaultMapping] = []
    for planned, fault in zip(plan.faults, built.faults, strict=True):
        line = _fault_line(text, planned.index)
        where = f"{scenario_file}{f':{line}' if line else ''}: faults.{planned.index}"
        if planned.anchor is not None:
            raise UsageError(f"{where}.start: a fault anchored on an event ({planned.anchor.on}) is applied by the "
                             "harness as it reads the trial's events, and an exported Workflow runs at set "
                             "times; give start in seconds, or run it with `chaos run`")
        mappings.append(map_fault(planned, fault, pods, plan.ranks, op.rank_container, where))
    flow = f"{job}-faults" if plan.faults else None
    documents = [plan_config_map(job, namespace, text, str(scenario_file), policy, api, flow or ""),
                 *JOB_BUILDERS[api](job, namespace, plan.ranks, image, env, checkpoint_claim, gpus, plan.sysctls or {})]
    notes = _job_notes(job, namespace, op.api, plan.ranks, op.index_label, flow, plan.sysctls or {})
    files = {JOB_FILE: yaml_text(notes, documents)}
    if flow is not None:
        files[FAULTS_FILE] = yaml_text(workflow_notes(plan, mappings), [workflow(plan, mappings, flow, namespace)])
    approximated = tuple(f"faults.{planned.index}: {note}" for planned, mapping in zip(plan.faults, mappings, strict=True)
                         for note in mapping.approximated)
    return Export(job=job, namespace=namespace, workflow=flow, files=files, approximated=approximated)


def _job_notes(job: str, namespace: str, api: str, ranks: int, index_label: str, flow: str | None,
               sysctls: dict[str, str]) -> list[str]:
    lines = [
        f"One trial of chaos-harness on Kubernetes ({api}): {ranks} ranks and a control plane.",
        "",
        "exact: every rank runs the Dockerfile's entry point, `python -m harness.cluster.container rank`, "
        "configured by the CHAOS_* variables it reads (the export read them back through it and compared "
        f"them with the trial's plan); CHAOS_RANK comes from the pod's label {index_label}, the label the "
        "faults select ranks by.",
        "exact: the control plane is one pod running `... control` (the rendezvous store and the failure "
        "detector's server), reached by name from every rank, as the harness's switch hosts it.",
        "approximated: priority: the pods add no capability, so the control plane and each rank's heart "
        "(the process that sends its heartbeats) run at the pod's nice value, not ahead of the steps as under the harness (without "
        "CAP_SYS_NICE each says so in its log); a rank with cores of its own seldom needs it.",
        "exact: no pod is restarted: a killed or failed rank stays gone and the others go on.",
        "exact: a rank trains until stopped; `chaos collect k8s` ends the trial by the harness's rules "
        "(settled, every rank exited, hung for the cap) and drops what the ranks did after.",
        "approximated: clocks: a rank's events carry its node's monotonic clock; the collector places them "
        "on that node's wall clock through the kubelet's log timestamps, and the run folder says which "
        "figures compare clocks of different nodes.",
        f"events: each rank's {RUN_DIR}/events.jsonl is a link to its stdout (init container "
        "events-to-stdout): the events are JSON lines in the pod's log.",
        *([f"exact: every rank pod has cluster.sysctls ({', '.join(sysctls)}) in its securityContext, set in "
           "its own network namespace as on each host under the harness; a setting outside Kubernetes' safe "
           "set needs the kubelet's --allowed-unsafe-sysctls (else the pod is refused: SysctlForbidden), and "
           "one naming eth0 needs a network plugin that names the pod's interface eth0."] if sysctls else []),
        "",
        "run it:",
        "  kubectl apply -f job.yaml",
        f"  chaos collect k8s --namespace {namespace} --job {job} --out RUN_DIR   # follows the trial",
    ]
    if flow is not None:
        lines.append("  kubectl apply -f faults.yaml      # once the collector says the ranks are warm")
    lines += ["  chaos report RUN_DIR", "  kubectl delete -f job.yaml" + (" -f faults.yaml" if flow else "")]
    return lines


def write_export(export: Export, out: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name, text in export.files.items():
        (out / name).write_text(text)
        written.append(out / name)
    return written
