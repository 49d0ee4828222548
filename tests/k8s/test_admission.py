"""The offline admission check itself: it refuses what the API server or a webhook would, so
a manifest it passes is one they pass."""
from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml

from harness.k8s.export import FAULTS_FILE, JOB_FILE, export_trial
from tests.k8s.admission import admission_problems

REPO = Path(__file__).resolve().parents[2]


def _manifests(scenario: str, api: str = "trainjob") -> list[dict]:
    export = export_trial(REPO / "scenarios" / scenario, "timeout", api=api)
    return [d for name in (JOB_FILE, FAULTS_FILE) for d in yaml.safe_load_all(export.files[name])]


def _chaos(docs: list[dict], kind: str = "networkChaos") -> dict:
    flow = next(d for d in docs if d["kind"] == "Workflow")
    return next(t for t in flow["spec"]["templates"] if kind in t)


@pytest.mark.parametrize("scenario, change, problem", [
    ("loss_20pct.yaml", lambda d: _chaos(d)["networkChaos"]["loss"].update(loss="20%"), "is not a float string"),
    ("bandwidth_10mbit.yaml", lambda d: _chaos(d)["networkChaos"]["bandwidth"].update(rate="10mbit"),
     "invalid unit"),
    ("delay_50ms.yaml", lambda d: _chaos(d)["networkChaos"]["delay"].update(latency="50"), "not a Go duration"),
    ("delay_50ms.yaml", lambda d: _chaos(d)["networkChaos"].update(duration="10s"), "should not define duration"),
    ("delay_50ms.yaml", lambda d: _chaos(d)["networkChaos"].pop("target"), "`from` and `both` cannot be used"),
    ("delay_50ms.yaml", lambda d: _chaos(d)["networkChaos"].update(direction="sideways"), "is not one of"),
    ("delay_50ms.yaml", lambda d: next(t for t in d[-1]["spec"]["templates"] if t["templateType"] == "Suspend")
     .pop("deadline"), "type Suspend could not be empty"),
    ("delay_50ms.yaml", lambda d: d[-1]["spec"].update(entry="nowhere"), "can not find a template"),
    ("kill_rank.yaml", lambda d: _chaos(d, "podChaos")["podChaos"].pop("containerNames"),
     "the name of container is empty"),
    ("kill_rank.yaml", lambda d: d[1]["spec"]["template"]["spec"]["replicatedJobs"][1]["template"]["spec"]
     .update(backoffLimitPerIndexx=0), "Additional properties are not allowed"),
    ("kill_rank.yaml", lambda d: d[2]["spec"]["trainer"]["env"].append({"name": "PET_NNODES", "value": "2"}),
     "reserved by the torch plugin"),
    ("kill_rank.yaml", lambda d: d[2]["spec"]["runtimeRef"].update(name="torch-distributed"),
     "no ClusterTrainingRuntime named torch-distributed"),
])
def test_the_check_refuses_what_a_cluster_would_refuse(scenario, change, problem):
    docs = copy.deepcopy(_manifests(scenario))
    assert admission_problems(docs) == []
    change(docs)
    assert any(problem in p for p in admission_problems(docs)), admission_problems(docs)


@pytest.mark.parametrize("change, problem", [
    (lambda job: job["spec"]["pytorchReplicaSpecs"]["Master"].update(replicas=2), "Master.replicas: must be 1"),
    (lambda job: job["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]
     .update(name="rank"), "there is no container named pytorch"),
    (lambda job: job["metadata"].update(name="1-job"), "not a DNS-1035 label"),
    (lambda job: job["spec"]["pytorchReplicaSpecs"]["Worker"].update(replicas="16"), "is not of type 'integer'"),
])
def test_the_check_applies_the_pytorchjob_webhook(change, problem):
    docs = copy.deepcopy(_manifests("kill_rank.yaml", api="pytorchjob"))
    change(next(d for d in docs if d["kind"] == "PyTorchJob"))
    assert any(problem in p for p in admission_problems(docs)), admission_problems(docs)
