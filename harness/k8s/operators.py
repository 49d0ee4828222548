"""The two training operators a trial can run under, and how their pods are told apart.

    trainjob    Kubeflow Trainer v2: a TrainJob (trainer.kubeflow.org/v1alpha1) on a
                ClusterTrainingRuntime of the torch kind; the operator makes a JobSet whose
                replicated job `node` is one Indexed Job with a pod per rank, and this
                export adds the replicated job `control` (the rendezvous store)
    pytorchjob  the training operator v1: a PyTorchJob (kubeflow.org/v1); its Master replica
                is the control plane (the operator's master service names it), its Worker
                replicas are the ranks

Every pod of a trial carries the operator's labels: one naming the job, one the replica
(`role`), and on a rank's pod its index. A rank's CHAOS_RANK is read from that index label
(the downward API) and the faults select pods by the same label, so the rank a fault hits
is the rank that reports on it.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from chaos.errors import UsageError

NAME_LIMIT = 40  # a JobSet pod's hostname "<job>-control-0-0" must stay within 63 characters
_NAME = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")  # DNS-1035: the training operator's rule for job names


@dataclass(frozen=True)
class Operator:
    api: str                  # the --api value
    job_label: str            # on every pod of the job: the job's name
    role_label: str           # which replica a pod is
    rank_role: str            # its value on a rank's pod
    control_role: str         # its value on the control plane's pod
    index_label: str          # the rank, on a rank's pod
    rank_container: str       # the container that runs the rank
    control_container: str
    control_address: str      # the control plane's DNS name in the namespace, of {job}

    def control_host(self, job: str) -> str:
        return self.control_address.format(job=job)

    def job_pods(self, job: str) -> str:
        """The label selector of every pod of the job."""
        return f"{self.job_label}={job}"


TRAINJOB = Operator(api="trainjob", job_label="jobset.sigs.k8s.io/jobset-name",
                    role_label="jobset.sigs.k8s.io/replicatedjob-name", rank_role="node",
                    control_role="control", index_label="batch.kubernetes.io/job-completion-index",
                    rank_container="node", control_container="control",
                    # JobSet's pod DNS: <jobset>-<replicated job>-<job index>-<pod index>.<subdomain>
                    control_address="{job}-control-0-0.{job}")
# The operator lower-cases the replica type in its label; both containers must be "pytorch".
PYTORCHJOB = Operator(api="pytorchjob", job_label="training.kubeflow.org/job-name",
                      role_label="training.kubeflow.org/replica-type", rank_role="worker",
                      control_role="master", index_label="training.kubeflow.org/replica-index",
                      rank_container="pytorch", control_container="pytorch",
                      control_address="{job}-master-0")  # the operator's service of the master pod
OPERATORS = {op.api: op for op in (TRAINJOB, PYTORCHJOB)}


@dataclass(frozen=True)
class Pods:
    """Chaos Mesh pod selectors of one job, in one namespace."""

    operator: Operator
    job: str
    namespace: str

    def _selector(self, labels: dict[str, str], expressions: list[dict[str, Any]]) -> dict[str, Any]:
        selector: dict[str, Any] = {"namespaces": [self.namespace], "labelSelectors": labels}
        if expressions:
            selector["expressionSelectors"] = expressions
        return {"mode": "all", "selector": selector}

    def everyone(self) -> dict[str, Any]:
        """Every pod of the job: the ranks and the control plane."""
        return self._selector({self.operator.job_label: self.job}, [])

    def ranks(self, ranks: tuple[int, ...], operator: str = "In") -> dict[str, Any]:
        """The ranks' pods (operator "In"), or every other rank's pod ("NotIn")."""
        op = self.operator
        return self._selector({op.job_label: self.job, op.role_label: op.rank_role},
                              [{"key": op.index_label, "operator": operator, "values": [str(r) for r in ranks]}])


def job_name(scenario: str, policy: str, given: str | None) -> str:
    """The job's name: `given`, or "<scenario>-<policy>" made a DNS label."""
    name = given if given is not None else re.sub(r"[^a-z0-9-]+", "-", f"{scenario}-{policy}".lower()).strip("-")
    if not _NAME.match(name) or len(name) > NAME_LIMIT:
        raise UsageError(f"job name {name!r}: expected lower-case letters, digits and '-', starting with a "
                         f"letter and ending with a letter or digit, at most {NAME_LIMIT} characters; "
                         "pass --name NAME")
    return name
