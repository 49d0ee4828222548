"""`chaos collect k8s`: follow one exported trial on a cluster until it is over, then write
it as a normal run folder (runfolder.layout) that `chaos report` reads unchanged.

    RUN_DIR/run.json, scenario.yaml, trials/<policy>/{trial.json, events.jsonl, logs/rNNN.log}

The trial's scenario and policy come from the plan ConfigMap the export wrote beside the
job, so the run folder holds the same plan a local run of that trial holds. Start it right
after `kubectl apply -f job.yaml`: it says when the ranks are warm (apply faults.yaml
then), watches the chaos objects as Chaos Mesh makes, records and deletes them, and stops
when the harness's rules end the trial (harness.k8s.observe), or at its deadline.
"""
from __future__ import annotations

import datetime
import json
import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from chaos.errors import DeadlineExceeded, HarnessError, UsageError
from chaos.topology import host_name
from harness.k8s.jobs import API_KEY, PLAN_SUFFIX, POLICY_KEY, SCENARIO_FILE_KEY, SCENARIO_KEY, WORKFLOW_KEY
from harness.k8s.kube import ClusterView
from harness.k8s.observe import Observed, RankPod, observe, wall_seconds
from harness.k8s.operators import OPERATORS, Operator
from harness.scenario.scenario import load_scenario
from harness.trial.plan import build_plan
from runfolder.events import EVENTS_FILE
from runfolder.info import RunInfo, TrialInfo, write_run_info, write_trial_info
from runfolder.layout import LOGS_DIR, SCENARIO_FILE, trial_dir
from runfolder.plan import TrialPlan

POLL_S = 2.0
BACKEND = "kubernetes"
MECHANISM = "Chaos Mesh"


def rank_pods(view: ClusterView, op: Operator, job: str, ranks: int) -> dict[int, RankPod]:
    """The job's rank pods by rank, with the logs of those whose rank container started."""
    found: dict[int, RankPod] = {}
    for pod in view.pods(op.job_pods(job)):
        labels = pod.metadata.labels or {}
        if labels.get(op.role_label) != op.rank_role:
            continue
        rank = int(labels[op.index_label])
        if rank in found:
            raise HarnessError(f"two pods for rank {rank} ({found[rank].name}, {pod.metadata.name}): the operator "
                               "started it again, which a trial never does; delete the job and run it afresh")
        state = next((s.state for s in pod.status.container_statuses or [] if s.name == op.rank_container), None)
        started = state is not None and (state.running is not None or state.terminated is not None)
        ended = state.terminated if state is not None else None
        found[rank] = RankPod(rank=rank, name=pod.metadata.name, node=pod.spec.node_name or "",
                              log=view.log(pod.metadata.name, op.rank_container) if started else "",
                              exit_code=ended.exit_code if ended is not None else None,
                              finished=wall_seconds(ended.finished_at) if ended is not None else None)
    return found


@dataclass(frozen=True)
class Exported:
    """What the export left in the plan ConfigMap, and the plan it stands for."""

    data: dict[str, str]
    scenario: str                    # the scenario's name
    plan: TrialPlan


def _exported(view: ClusterView, job: str, namespace: str) -> Exported:
    name = job + PLAN_SUFFIX
    data = view.config_map(name)
    if data is None:
        raise UsageError(f"--job {job}: no ConfigMap {name} in namespace {namespace}: not a trial "
                         "exported by `chaos export k8s` (apply its job.yaml first), or another namespace")
    with tempfile.TemporaryDirectory() as tmp:  # the loader reads a file
        copy = Path(tmp) / Path(data[SCENARIO_FILE_KEY]).name
        copy.write_text(data[SCENARIO_KEY])
        try:
            scenario = load_scenario(copy)
        except UsageError as exc:
            raise UsageError(str(exc).replace(str(copy), f"{data[SCENARIO_FILE_KEY]} (ConfigMap {name})")) from None
    return Exported(data, scenario.name, build_plan(scenario, data[POLICY_KEY]).trial)


def follow(view: ClusterView, job: str, namespace: str, timeout_s: float, say: Callable[[str], None],
           clock: Callable[[], float] = time.time, sleep: Callable[[float], None] = time.sleep
           ) -> tuple[Exported, Observed, dict[int, RankPod]]:
    """Read the trial until the harness's rules end it; raises DeadlineExceeded after
    `timeout_s` seconds."""
    exported = _exported(view, job, namespace)
    data, plan = exported.data, exported.plan
    op = OPERATORS[data[API_KEY]]
    objects: dict[str, dict[str, Any]] = {}
    deadline = clock() + timeout_s
    said = ""
    while True:
        if data[WORKFLOW_KEY]:
            for change in view.chaos_changes(data[WORKFLOW_KEY]):
                objects[change["object"]["metadata"]["name"]] = change["object"]  # DELETED: its last state
        pods = rank_pods(view, op, job, plan.ranks)
        now = clock()
        seen = observe(plan, pods, objects, now, job, f"{BACKEND} ({op.api})", MECHANISM, os.getpid())
        if seen.over:
            return exported, seen, pods
        if seen.status != said:
            say(seen.status)
            said = seen.status
        if now > deadline:
            raise DeadlineExceeded(f"the trial was not over after {timeout_s:g} s ({seen.status}); "
                                   "run the collector again with a longer --timeout")
        sleep(POLL_S)


def clock_note(nodes: dict[int, str]) -> str:
    """run.json's clock: the domains, and which figures cross them."""
    by_node: dict[str, list[int]] = {}
    for rank, node in sorted(nodes.items()):
        by_node.setdefault(node, []).append(rank)
    placed = "; ".join(f"{node}: ranks {_spans(ranks)}" for node, ranks in sorted(by_node.items()))
    across = (" The spread of detection over ranks (first, median, last) compares ranks on different nodes: "
              "it crosses node clocks, as close as NTP keeps them." if len(by_node) > 1 else "")
    return (f"wall clock of each node, not one domain ({placed}); a rank's monotonic t is placed on its node's "
            "wall clock by the kubelet's log times. Fault start and end are on the Chaos Mesh controller's "
            "clock in whole seconds, a killed rank's end on its kubelet's in whole seconds. Every figure "
            "counted from the fault's start or end (the times to detect, recover, open the breaker and "
            "release; the windows of the step rates, stalls and wasted rank-seconds) crosses from the "
            "controller's clock to a node's and carries that 1 s resolution." + across)


def _spans(ranks: list[int]) -> str:
    """"0-7,9" for [0, 1, ..., 7, 9]."""
    runs: list[list[int]] = []
    for rank in ranks:
        if runs and runs[-1][1] == rank - 1:
            runs[-1][1] = rank
        else:
            runs.append([rank, rank])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)


def write_run(run_dir: Path, exported: Exported, seen: Observed, pods: dict[int, RankPod], job: str,
              command: str) -> Path:
    """The run folder of one collected trial; returns its trial folder."""
    data, plan = exported.data, exported.plan
    trial = trial_dir(run_dir, plan.policy)
    (trial / LOGS_DIR).mkdir(parents=True)
    (run_dir / SCENARIO_FILE).write_text(data[SCENARIO_KEY])
    started = datetime.datetime.fromtimestamp(seen.anchor).astimezone()
    write_run_info(run_dir, RunInfo(scenario=exported.scenario, scenario_file=data[SCENARIO_FILE_KEY],
                                    seed=plan.seed, backend=f"{BACKEND} ({data[API_KEY]})", policies=(plan.policy,),
                                    started_wall=started.isoformat(timespec="seconds"), command=command,
                                    clock=clock_note(seen.nodes)))
    write_trial_info(trial, TrialInfo(plan=plan, run_id=job, backend=f"{BACKEND} ({data[API_KEY]})",
                                      mono_anchor=0.0, wall_anchor=seen.anchor))
    with open(trial / EVENTS_FILE, "w") as f:
        f.writelines(json.dumps(e) + "\n" for e in sorted(seen.events, key=lambda e: e["t"]))
    for rank, pod in pods.items():
        (trial / LOGS_DIR / f"{host_name(rank)}.log").write_text(pod.log)
    return trial


def collect(view: ClusterView, job: str, namespace: str, run_dir: Path, timeout_s: float,
            say: Callable[[str], None], command: str, clock: Callable[[], float] = time.time,
            sleep: Callable[[float], None] = time.sleep) -> Path:
    """Follow the trial and write its run folder at `run_dir` (new or empty)."""
    if run_dir.exists() and (not run_dir.is_dir() or any(run_dir.iterdir())):
        raise UsageError(f"--out {run_dir}: exists and is not an empty folder; name a new run folder")
    exported, seen, pods = follow(view, job, namespace, timeout_s, say, clock, sleep)
    write_run(run_dir, exported, seen, pods, job, command)
    say(f"{seen.status}; wrote {run_dir}")
    return run_dir
