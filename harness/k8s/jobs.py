"""The job of one trial: a TrainJob on its ClusterTrainingRuntime, or a PyTorchJob; and the
ConfigMap that carries the trial's scenario to `chaos collect k8s`.

Every rank is one pod running the Dockerfile's entry point
(`python -m harness.cluster.container rank`) with its CHAOS_* environment (harness.k8s.env);
the control plane (`... control`, the rendezvous store and the failure detector's server)
is one more pod. A rank's events leave as JSON lines on its stdout: an init container links
the run folder's events.jsonl to /dev/stdout, and the kubelet stamps each line with its
node's wall clock. Pods are never restarted (restartPolicy Never; for the TrainJob a failed
index is not retried and does not stop the others), so a killed rank stays dead as under
the harness.
"""
from __future__ import annotations

from typing import Any

from harness.cluster.container import STORE_PORT
from harness.k8s.env import EVENTS_LINK, RUN_DIR
from harness.k8s.operators import PYTORCHJOB, TRAINJOB, Operator

TRAINER_API = "trainer.kubeflow.org/v1alpha1"
PYTORCHJOB_API = "kubeflow.org/v1"
ENTRY = ["python", "-m", "harness.cluster.container"]
RUNS_VOLUME = "runs"
CHECKPOINTS_VOLUME = "checkpoints"
SHM_VOLUME = "dshm"
PLAN_SUFFIX = "-chaos-plan"
# Keys of the plan ConfigMap.
SCENARIO_KEY, SCENARIO_FILE_KEY, POLICY_KEY, API_KEY, WORKFLOW_KEY = (
    "scenario.yaml", "scenario_file", "policy", "api", "workflow")


def plan_config_map(job: str, namespace: str, scenario_text: str, scenario_file: str, policy: str,
                    api: str, workflow: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": job + PLAN_SUFFIX, "namespace": namespace},
            "data": {SCENARIO_KEY: scenario_text, SCENARIO_FILE_KEY: scenario_file, POLICY_KEY: policy,
                     API_KEY: api, WORKFLOW_KEY: workflow}}


def _volumes(checkpoint_claim: str | None, gpus: int) -> list[dict[str, Any]]:
    volumes: list[dict[str, Any]] = [{"name": RUNS_VOLUME, "emptyDir": {}}]
    if checkpoint_claim is not None:
        volumes.append({"name": CHECKPOINTS_VOLUME, "persistentVolumeClaim": {"claimName": checkpoint_claim}})
    if gpus:  # NCCL's shared-memory transport needs more than a pod's default 64 MB /dev/shm
        volumes.append({"name": SHM_VOLUME, "emptyDir": {"medium": "Memory"}})
    return volumes


def _mounts(job: str, checkpoint_claim: str | None, gpus: int) -> list[dict[str, Any]]:
    mounts: list[dict[str, Any]] = [{"name": RUNS_VOLUME, "mountPath": RUN_DIR}]
    if checkpoint_claim is not None:  # one folder per trial on the shared volume
        mounts.append({"name": CHECKPOINTS_VOLUME, "mountPath": f"{RUN_DIR}/ckpt", "subPath": job})
    if gpus:
        mounts.append({"name": SHM_VOLUME, "mountPath": "/dev/shm"})
    return mounts


def _events_to_stdout(image: str) -> dict[str, Any]:
    return {"name": "events-to-stdout", "image": image, "command": ["ln", "-sf", "/dev/stdout", EVENTS_LINK],
            "volumeMounts": [{"name": RUNS_VOLUME, "mountPath": RUN_DIR}]}


def _rank_container(op: Operator, image: str, env: list[dict[str, Any]], mounts: list[dict[str, Any]],
                    gpus: int) -> dict[str, Any]:
    container: dict[str, Any] = {"name": op.rank_container, "image": image, "command": [*ENTRY, "rank"],
                                 **({"env": env} if env else {}), "volumeMounts": mounts}
    if gpus:
        container["resources"] = {"limits": {"nvidia.com/gpu": gpus}}
    return container


def _control_container(op: Operator, image: str, port_name: str) -> dict[str, Any]:
    return {"name": op.control_container, "image": image, "command": [*ENTRY, "control"],
            "env": [{"name": "CHAOS_STORE_PORT", "value": str(STORE_PORT)}],
            "ports": [{"name": port_name, "containerPort": STORE_PORT}],
            # ready once the store listens: the ranks start only then (JobSet InOrder, the operator's init)
            "readinessProbe": {"tcpSocket": {"port": STORE_PORT}, "periodSeconds": 1}}


def _rank_pod(op: Operator, image: str, env: list[dict[str, Any]], job: str, checkpoint_claim: str | None,
              gpus: int, sysctls: dict[str, str]) -> dict[str, Any]:
    pod = {"restartPolicy": "Never", "initContainers": [_events_to_stdout(image)],
           "containers": [_rank_container(op, image, env, _mounts(job, checkpoint_claim, gpus), gpus)],
           "volumes": _volumes(checkpoint_claim, gpus)}
    if sysctls:  # the pod's own network namespace, as each host's under the harness (chaos.sysctl)
        pod["securityContext"] = {"sysctls": [{"name": k, "value": v} for k, v in sysctls.items()]}
    return pod


def train_job(job: str, namespace: str, ranks: int, image: str, env: list[dict[str, Any]],
              checkpoint_claim: str | None, gpus: int, sysctls: dict[str, str]) -> list[dict[str, Any]]:
    """A ClusterTrainingRuntime of the torch kind, named after the trial, and its TrainJob."""
    op = TRAINJOB
    control = {"name": op.control_role, "replicas": 1, "template": {"spec": {
        "parallelism": 1, "completions": 1, "backoffLimit": 0,
        "template": {"spec": {"restartPolicy": "Never",
                              "containers": [_control_container(op, image, "store")]}}}}}
    node = {"name": op.rank_role, "replicas": 1, "template": {
        # the Trainer applies the TrainJob's trainer (image, command, env, numNodes) to this job
        "metadata": {"labels": {"trainer.kubeflow.org/trainjob-ancestor-step": "trainer"}},
        "spec": {"completionMode": "Indexed", "parallelism": ranks, "completions": ranks,
                 # a failed rank is not retried and the others go on (the Job fails once all ended)
                 "backoffLimitPerIndex": 0,
                 "template": {"spec": _rank_pod(op, image, [], job, checkpoint_claim, gpus, sysctls)}}}}
    runtime = {"apiVersion": TRAINER_API, "kind": "ClusterTrainingRuntime",
               "metadata": {"name": job, "labels": {"trainer.kubeflow.org/framework": "torch"}},
               "spec": {"mlPolicy": {"numNodes": ranks, "torch": {"numProcPerNode": 1}},
                        "template": {"spec": {
                            "network": {"enableDNSHostnames": True},
                            "startupPolicy": {"startupPolicyOrder": "InOrder"},  # the store first
                            "successPolicy": {"operator": "All", "targetReplicatedJobs": [op.rank_role]},
                            "replicatedJobs": [control, node]}}}}
    trainer: dict[str, Any] = {"image": image, "env": env, "numNodes": ranks}
    if gpus:
        trainer["resourcesPerNode"] = {"limits": {"nvidia.com/gpu": gpus}}
    trainjob = {"apiVersion": TRAINER_API, "kind": "TrainJob", "metadata": {"name": job, "namespace": namespace},
                "spec": {"runtimeRef": {"name": job, "apiGroup": "trainer.kubeflow.org",
                                        "kind": "ClusterTrainingRuntime"},
                         "trainer": trainer}}
    return [runtime, trainjob]


def pytorch_job(job: str, namespace: str, ranks: int, image: str, env: list[dict[str, Any]],
                checkpoint_claim: str | None, gpus: int, sysctls: dict[str, str]) -> list[dict[str, Any]]:
    """A PyTorchJob: the Master replica is the control plane, the Workers are the ranks."""
    op = PYTORCHJOB
    # the operator's master service exposes the port it finds under this name
    master = {"replicas": 1, "restartPolicy": "Never", "template": {"spec": {
        "containers": [_control_container(op, image, "pytorchjob-port")]}}}
    worker = {"replicas": ranks, "restartPolicy": "Never", "template": {
        "spec": _rank_pod(op, image, env, job, checkpoint_claim, gpus, sysctls)}}
    return [{"apiVersion": PYTORCHJOB_API, "kind": "PyTorchJob", "metadata": {"name": job, "namespace": namespace},
             # a failed worker fails the job; None leaves the other pods running, as under the harness
             "spec": {"runPolicy": {"cleanPodPolicy": "None"},
                      "pytorchReplicaSpecs": {"Master": master, "Worker": worker}}}]


JOB_BUILDERS = {TRAINJOB.api: train_job, PYTORCHJOB.api: pytorch_job}
