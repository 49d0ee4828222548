"""One trial twice: as the local harness records it (one clock), and as a cluster shows it.

`LocalTrial` collects a trial's events the way the orchestrator writes them. `write_local`
stores them as a local run folder; `cluster` shows the same trial as the Kubernetes API
would after running the exported manifests: V1Pod objects (deserialized by the client from
the API's JSON, as `list_namespaced_pod` returns them), pod logs with the kubelet's RFC 3339
timestamps (as `read_namespaced_pod_log(timestamps=True)` returns them), and Chaos Mesh
objects as the watch stream yields them (ADDED, MODIFIED with status records, DELETED with
the last state).

Clocks: local t is one monotonic clock; the nodes' wall clocks agree (NTP) and read
WALL_AT_ZERO + t; node-a's monotonic clock reads t - 50, node-b's t + 1234.5. The runtime
stamps a log line LAG after the rank wrote it (a rank's first line at once).
"""
from __future__ import annotations

import datetime
import json
import math
from pathlib import Path
from typing import Any

import yaml
from kubernetes.client import ApiClient

from harness.k8s.export import FAULTS_FILE, JOB_FILE, export_trial
from harness.k8s.jobs import PLAN_SUFFIX
from harness.k8s.kube import WORKFLOW_LABEL
from harness.k8s.observe import CONTROLLED_BY
from harness.k8s.operators import OPERATORS
from harness.scenario.scenario import load_scenario
from harness.trial.plan import build_plan
from runfolder import events as kinds
from runfolder.events import EVENTS_FILE
from runfolder.info import RunInfo, TrialInfo, write_run_info, write_trial_info
from runfolder.layout import SCENARIO_FILE, trial_dir

WALL_AT_ZERO = 1_700_000_000.0
SHIFT = {"node-a": -50.0, "node-b": 1234.5}
LAG = 0.002
PERIOD = 0.25
NAMESPACE = "default"


def node_of(rank: int) -> str:
    return "node-a" if rank < 8 else "node-b"


def rfc3339(wall: float, nanos: bool = False) -> str:
    """A wall time as the API writes it: whole seconds (metav1.Time) or nanoseconds (log lines)."""
    whole = math.floor(wall)
    stamp = datetime.datetime.fromtimestamp(whole, datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S")
    return f"{stamp}.{round((wall - whole) * 1e9):09d}Z" if nanos else f"{stamp}Z"


def whole(t: float) -> str:
    """A metav1.Time the test means to be exact: the trial's times there are whole seconds."""
    assert t == int(t), f"{t} is not a whole second; a status record could not say it"
    return rfc3339(WALL_AT_ZERO + t)


class LocalTrial:
    def __init__(self, scenario: Path, policy: str, api: str = "trainjob") -> None:
        self.scenario, self.policy = scenario, policy
        self.plan = build_plan(load_scenario(scenario), policy).trial
        self.export = export_trial(scenario, policy, api=api)
        self.op = OPERATORS[api]
        self.events: list[dict[str, Any]] = []
        self.next_step = {r: 0 for r in range(self.plan.ranks)}

    # -- the local record ----------------------------------------------------------------

    def rank(self, r: int, t: float, kind: str, **fields: Any) -> None:
        self.events.append({"t": t, "src": kinds.RANK, "rank": r, "pid": 200 + r, "kind": kind, **fields})

    def harness(self, t: float, kind: str, rank: int | None = None, **fields: Any) -> None:
        self.events.append({"t": t, "src": kinds.HARNESS, "rank": rank, "pid": 1, "kind": kind, **fields})

    def start(self, t: float) -> None:
        self.harness(t - 1.0, kinds.TRIAL_START, policy=self.policy, ranks=self.plan.ranks, run_id="local",
                     backend="netns", hang_cap=self.plan.hang_cap)
        for r in range(self.plan.ranks):
            self.rank(r, t + r * 0.01, kinds.RANK_START, policy=self.policy, world=self.plan.ranks)
            self.rank(r, t + 0.5, kinds.GROUP_READY, gen=0, world=self.plan.ranks, group_rank=r, secs=0.4)

    def steps(self, t_from: float, t_to: float, ranks: list[int] | None = None) -> None:
        """Every PERIOD from t_from (rank r r ms later) while before t_to."""
        for r in range(self.plan.ranks) if ranks is None else ranks:
            t = t_from + r * 0.001
            while t < t_to:
                self.rank(r, t, kinds.STEP, step=self.next_step[r], gen=0, loss=1.0, dur=0.1)
                self.next_step[r] += 1
                t += PERIOD

    def fault(self, index: int, applied: float, reverted: float | None = None) -> None:
        planned = self.plan.faults[index]
        self.harness(applied, kinds.FAULT_APPLIED, index=index, fault_kind=planned.kind, fault=planned.fault,
                     targets=list(planned.targets), mechanism="local", t_requested=applied)
        if reverted is not None:
            self.harness(reverted, kinds.FAULT_REVERTED, index=index, fault_kind=planned.kind,
                         targets=list(planned.targets))

    def leave(self, ranks: list[int], t: float, cause: str, reaped: float) -> None:
        """Each rank detects at t + r ms, releases and exits failed-fast; reaped at `reaped`."""
        for r in ranks:
            t_r = t + r * 0.001
            self.rank(r, t_r, kinds.COLLECTIVE_ERROR, step=self.next_step[r], gen=0, phase="step", cause=cause,
                      error="Connection closed by peer" if cause == "closed" else "Timed out waiting 5000ms")
            self.rank(r, t_r + 0.1, kinds.GROUP_RELEASED, secs=0.01)
            self.rank(r, t_r + 0.15, kinds.EXIT, reason="failed-fast", code=3)
            self.harness(reaped, kinds.RANK_EXITED, rank=r, pid=200 + r, exitcode=3, signal=None)

    def write_local(self, run_dir: Path) -> Path:
        trial = trial_dir(run_dir, self.policy)
        trial.mkdir(parents=True)
        (run_dir / SCENARIO_FILE).write_text(self.scenario.read_text())
        write_run_info(run_dir, RunInfo(scenario=load_scenario(self.scenario).name, scenario_file=str(self.scenario),
                                        seed=self.plan.seed, backend="netns", policies=(self.policy,),
                                        started_wall="2023-11-14T22:13:20+00:00", command="chaos run",
                                        clock="monotonic, one kernel shared by every rank"))
        write_trial_info(trial, TrialInfo(plan=self.plan, run_id="local", backend="netns", mono_anchor=0.0,
                                          wall_anchor=WALL_AT_ZERO))
        with open(trial / EVENTS_FILE, "w") as f:
            f.writelines(json.dumps(e) + "\n" for e in sorted(self.events, key=lambda e: e["t"]))
        return run_dir

    # -- the same trial, as the cluster shows it -----------------------------------------

    def cluster(self, now: float) -> FakeCluster:
        """The cluster `now` seconds (local clock) into the trial: what happened until then."""
        return FakeCluster(self, now)

    def manifests(self) -> list[dict[str, Any]]:
        return [d for name in (JOB_FILE, FAULTS_FILE) if name in self.export.files
                for d in yaml.safe_load_all(self.export.files[name])]

    def pod_name(self, rank: int) -> str:
        return f"{self.export.job}-{self.op.rank_role}-0-{rank}-x{rank:04d}"


class FakeCluster:
    """ClusterView of a LocalTrial on a cluster, up to `now` (local seconds; a test may move it)."""

    def __init__(self, trial: LocalTrial, now: float) -> None:
        self.trial, self.now = trial, now
        self.delivered: set[tuple[str, str]] = set()  # (object, change) the watch already yielded

    def _seen(self) -> list[dict[str, Any]]:
        return [e for e in self.trial.events if e["t"] <= self.now]

    def config_map(self, name: str) -> dict[str, str] | None:
        (cm,) = [d for d in self.trial.manifests() if d["kind"] == "ConfigMap"]
        return cm["data"] if name == self.trial.export.job + PLAN_SUFFIX else None

    def pods(self, selector: str) -> list[Any]:
        trial, op = self.trial, self.trial.op
        assert selector == op.job_pods(trial.export.job)
        exits = {e["rank"]: e for e in self._seen() if e["kind"] == kinds.RANK_EXITED}
        started = {e["rank"] for e in self._seen() if e["src"] == kinds.RANK}
        items = [self._pod(f"{trial.export.job}-{op.control_role}-0-0-ctrl0", op.control_role, None,
                           op.control_container, "node-a", {"running": {"startedAt": whole(90)}})]
        for r in range(trial.plan.ranks):
            if r not in exits:
                state = {"running": {"startedAt": whole(99)}} if r in started else {"waiting": {"reason": "PodInitializing"}}
            else:
                ex = exits[r]
                code = 128 + ex["signal"] if ex["signal"] is not None else ex["exitcode"]
                state = {"terminated": {"exitCode": code, "reason": "Error", "startedAt": whole(99),
                                        "finishedAt": whole(ex["t"])}}
            items.append(self._pod(trial.pod_name(r), op.rank_role, r, op.rank_container, node_of(r), state))
        body = {"apiVersion": "v1", "kind": "PodList", "metadata": {"resourceVersion": "1000"}, "items": items}
        return ApiClient().deserialize(json.dumps(body), "V1PodList", "application/json").items

    def _pod(self, name: str, role: str, rank: int | None, container: str, node: str,
             state: dict[str, Any]) -> dict[str, Any]:
        op = self.trial.op
        labels = {op.job_label: self.trial.export.job, op.role_label: role}
        if rank is not None:
            labels[op.index_label] = str(rank)
        return {"metadata": {"name": name, "namespace": NAMESPACE, "labels": labels,
                             "creationTimestamp": whole(80)},
                "spec": {"nodeName": node, "containers": [{"name": container, "image": "chaos-harness:gpu"}]},
                "status": {"phase": "Running", "containerStatuses": [{
                    "name": container, "image": "chaos-harness:gpu", "imageID": "sha256:0", "ready": True,
                    "restartCount": 0, "state": state}]}}

    def log(self, pod: str, container: str) -> str:
        trial = self.trial
        assert container == trial.op.rank_container
        (rank,) = [r for r in range(trial.plan.ranks) if trial.pod_name(r) == pod]
        own = [e for e in self._seen() if e["src"] == kinds.RANK and e["rank"] == rank]
        shift = SHIFT[node_of(rank)]
        lines = [f"{rfc3339(WALL_AT_ZERO + own[0]['t'] - 0.5, nanos=True)} loading torch"] if own else []
        for n, e in enumerate(sorted(own, key=lambda e: e["t"])):
            lines.append(f"{rfc3339(WALL_AT_ZERO + e['t'] + (LAG if n else 0.0), nanos=True)} "
                         f"{json.dumps({**e, 't': round(e['t'] + shift, 6)})}")
        return "".join(line + "\n" for line in lines)

    def chaos_changes(self, workflow: str) -> list[dict[str, Any]]:
        """The watch stream's events not yielded yet: each object added when the harness applied
        its fault, modified with its apply records, and deleted with its recover records when
        its template's deadline ends (Chaos Mesh's timer, not the harness's teardown)."""
        assert workflow == self.trial.export.workflow
        (flow,) = [d for d in self.trial.manifests() if d["kind"] == "Workflow"]
        templates = {t["name"]: t for t in flow["spec"]["templates"]}
        phases: dict[int, int] = {}
        changes = []
        seen = self._seen()
        for e in seen:
            if e["kind"] != kinds.FAULT_APPLIED:
                continue
            index = e["index"]
            phases[index] = phases.get(index, 0) + 1
            template = templates[f"f{index}-on{phases[index]}-p0"]
            healed = e["t"] + float(template["deadline"].removesuffix("s")) if "deadline" in template else math.inf
            changes += self._object_changes(workflow, template, e["t"], healed if healed <= self.now else None)
        new = [c for c in changes if (c["object"]["metadata"]["name"], c["type"]) not in self.delivered]
        self.delivered |= {(c["object"]["metadata"]["name"], c["type"]) for c in new}
        return new

    def _object_changes(self, workflow: str, template: dict[str, Any], applied: float,
                        reverted: float | None) -> list[dict[str, Any]]:
        kind = template["templateType"]
        spec = template[kind[0].lower() + kind[1:]]
        node = f"{template['name']}-n{int(applied):04d}"
        ranks = [int(v) for v in spec["selector"]["expressionSelectors"][0]["values"]]
        ids = [f"{NAMESPACE}/{self.trial.pod_name(r)}" + (f"/{self.trial.op.rank_container}" if kind == "PodChaos" else "")
               for r in ranks]
        records = [{"id": i, "selectorKey": ".", "phase": "Injected", "injectedCount": 1, "recoveredCount": 0,
                    "events": [{"operation": "Apply", "type": "Succeeded", "timestamp": whole(applied)}]} for i in ids]
        if "target" in spec:  # every pod of the job: Chaos Mesh shapes their way to the rank too
            records += [{"id": f"{NAMESPACE}/{self.trial.pod_name(r)}", "selectorKey": ".Target", "phase": "Injected",
                         "injectedCount": 1, "recoveredCount": 0,
                         "events": [{"operation": "Apply", "type": "Succeeded", "timestamp": whole(applied)}]}
                        for r in range(self.trial.plan.ranks)]
        obj = {"apiVersion": "chaos-mesh.org/v1alpha1", "kind": kind,
               "metadata": {"name": f"{node}-c{int(applied):04d}", "namespace": NAMESPACE, "resourceVersion": "1",
                            "creationTimestamp": whole(applied),
                            "labels": {CONTROLLED_BY: node, WORKFLOW_LABEL: workflow}},
               "spec": spec}
        added = {"type": "ADDED", "object": obj}
        applied_obj = {**obj, "status": {"experiment": {"desiredPhase": "Run", "containerRecords": records}}}
        changes = [added, {"type": "MODIFIED", "object": applied_obj}]
        if reverted is not None:
            recovered = [{**r, "phase": "NotInjected", "recoveredCount": 1, "events": r["events"] + [
                {"operation": "Recover", "type": "Succeeded", "timestamp": whole(reverted)}]} for r in records]
            changes.append({"type": "DELETED", "object": {**obj, "status": {"experiment": {
                "desiredPhase": "Stop", "containerRecords": recovered}}}})
        return changes
