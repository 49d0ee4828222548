"""What a cluster would say when the exported manifests are applied, checked offline.

`schema_problems`: the CRD's openAPIV3Schema (crds/, copied with their source and licence),
with unknown fields refused as `kubectl apply` refuses them (strict field validation).

`webhook_problems`: the rules the projects' admission webhooks apply beyond the schema, as
their Go code states them (chaos-mesh api/v1alpha1: *_webhook.go, common_validation.go,
workflow_webhook.go; kubeflow training-operator pytorchjob_webhook.go; trainer's torch
plugin). Each rule names its source.
"""
from __future__ import annotations

import copy
import functools
import re
from pathlib import Path
from typing import Any

import jsonschema
import yaml

CRDS = Path(__file__).parent / "crds"
CRD_FILES = {
    ("chaos-mesh.org/v1alpha1", "NetworkChaos"): "chaos-mesh/chaos-mesh.org_networkchaos.yaml",
    ("chaos-mesh.org/v1alpha1", "PodChaos"): "chaos-mesh/chaos-mesh.org_podchaos.yaml",
    ("chaos-mesh.org/v1alpha1", "Workflow"): "chaos-mesh/chaos-mesh.org_workflows.yaml",
    ("trainer.kubeflow.org/v1alpha1", "TrainJob"): "kubeflow/trainer.kubeflow.org_trainjobs.yaml",
    ("trainer.kubeflow.org/v1alpha1", "ClusterTrainingRuntime"):
        "kubeflow/trainer.kubeflow.org_clustertrainingruntimes.yaml",
    ("kubeflow.org/v1", "PyTorchJob"): "kubeflow/kubeflow.org_pytorchjobs.yaml",
}
# Go's time.ParseDuration: a sequence of decimal numbers, each with a unit ("1h30m", "250ms").
GO_DURATION = re.compile(r"^(0|([0-9]+(\.[0-9]*)?|\.[0-9]+)(ns|us|µs|ms|s|m|h))+$")
# strconv.ParseFloat's decimal form (what Chaos Mesh's FloatStr accepts; no "%").
GO_FLOAT = re.compile(r"^[+-]?([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][+-]?[0-9]+)?$")
DNS_1123_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
DNS_1035_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
RATE_UNITS = ("tbps", "gbps", "mbps", "kbps", "bps")
CHAOS_FIELDS = {"NetworkChaos": "networkChaos", "PodChaos": "podChaos"}


def _strict(schema: Any) -> Any:
    """The schema with additionalProperties: false wherever it lists properties and keeps no
    unknown fields: the API server's strict field validation."""
    if isinstance(schema, dict):
        out = {k: _strict(v) for k, v in schema.items()}
        if "properties" in out and "additionalProperties" not in out \
                and not out.get("x-kubernetes-preserve-unknown-fields"):
            out["additionalProperties"] = False
        return out
    if isinstance(schema, list):
        return [_strict(v) for v in schema]
    return schema


@functools.cache
def crd_schema(api_version: str, kind: str) -> dict[str, Any]:
    crd = yaml.safe_load((CRDS / CRD_FILES[(api_version, kind)]).read_text())
    version = api_version.split("/")[1]
    (served,) = [v for v in crd["spec"]["versions"] if v["name"] == version]
    schema = copy.deepcopy(served["schema"]["openAPIV3Schema"])
    schema["properties"]["metadata"] = {"type": "object"}  # ObjectMeta is the API server's, checked below
    return _strict(schema)


def schema_problems(doc: dict[str, Any]) -> list[str]:
    validator = jsonschema.Draft7Validator(crd_schema(doc["apiVersion"], doc["kind"]))
    return [f"{doc['kind']} {'.'.join(map(str, e.absolute_path))}: {e.message}"
            for e in validator.iter_errors(doc)]


# -- the webhooks' rules ------------------------------------------------------------------

def _selector_problems(where: str, selector: dict[str, Any]) -> list[str]:
    """common_validation.go ValidatePodMode, and the label syntax of every selector value."""
    problems = []
    if selector.get("mode") in ("fixed", "fixed-percent", "random-max-percent") and not selector.get("value"):
        problems.append(f"{where}.value: required with mode {selector['mode']}")
    inner = selector.get("selector", {})
    values = list(inner.get("labelSelectors", {}).values())
    values += [v for e in inner.get("expressionSelectors", []) for v in e.get("values", [])]
    problems += [f"{where}: label value {v!r} is not a valid label value" for v in values
                 if len(v) > 63 or not LABEL_VALUE.match(v)]
    problems += [f"{where}.expressionSelectors: operator {e['operator']!r}" for e in inner.get("expressionSelectors", [])
                 if e["operator"] not in ("In", "NotIn", "Exists", "DoesNotExist")]
    return problems


def _float_strs(where: str, values: dict[str, Any], keys: tuple[str, ...]) -> list[str]:
    """FloatStr.Validate: strconv.ParseFloat(value, 32): a plain number, no '%'."""
    return [f"{where}.{k}: {values[k]!r} is not a float string" for k in keys
            if k in values and not GO_FLOAT.match(str(values[k]))]


def network_chaos_problems(where: str, spec: dict[str, Any]) -> list[str]:
    """networkchaos_webhook.go and its field types (Duration, FloatStr, Rate)."""
    problems = _selector_problems(where, spec)
    if "target" in spec:
        problems += _selector_problems(f"{where}.target", spec["target"])
    if spec["action"] != "partition" and spec.get("direction") in ("from", "both") and "target" not in spec:
        problems.append(f"{where}.direction: `from` and `both` cannot be used when targets is empty in netem action")
    delay = spec.get("delay", {})
    problems += [f"{where}.delay.{k}: {delay[k]!r} is not a Go duration" for k in ("latency", "jitter")
                 if k in delay and not GO_DURATION.match(delay[k])]
    problems += _float_strs(f"{where}.delay", delay, ("correlation",))
    problems += _float_strs(f"{where}.delay.reorder", delay.get("reorder", {}), ("reorder", "correlation"))
    for action in ("loss", "duplicate", "corrupt"):
        problems += _float_strs(f"{where}.{action}", spec.get(action, {}), (action, "correlation"))
    if "bandwidth" in spec:  # ConvertUnitToBytes: an unsigned integer and a bytes-per-second unit
        rate = spec["bandwidth"]["rate"].strip().lower()
        unit = next((u for u in RATE_UNITS if rate.endswith(u)), None)
        if unit is None or not rate[:-len(unit)].strip().isdigit():
            problems.append(f"{where}.bandwidth.rate: {spec['bandwidth']['rate']!r}: invalid unit "
                            f"(an integer and one of {', '.join(RATE_UNITS)})")
    return problems


def pod_chaos_problems(where: str, spec: dict[str, Any]) -> list[str]:
    """podchaos_webhook.go: container-kill needs container names."""
    problems = _selector_problems(where, spec)
    if spec["action"] == "container-kill" and not spec.get("containerNames"):
        problems.append(f"{where}.containerNames: the name of container is empty on container-kill action")
    return problems


def workflow_problems(doc: dict[str, Any]) -> list[str]:
    """workflow_webhook.go: entry, template names, types and children, deadlines, and each
    embedded chaos by its own webhook (without a duration: the deadline is its duration)."""
    spec, problems = doc["spec"], []
    templates = {t["name"]: t for t in spec["templates"]}
    if len(templates) != len(spec["templates"]):
        problems.append("Workflow templates: template name must be unique")
    if spec["entry"] not in templates:
        problems.append(f"Workflow entry: can not find a template with name {spec['entry']}")
    for name, t in templates.items():
        where = f"Workflow template {name}"
        if not DNS_1123_SUBDOMAIN.match(name):
            problems.append(f"{where}: name must be a DNS-1123 subdomain")
        if "deadline" in t and not GO_DURATION.match(t["deadline"]):
            problems.append(f"{where}.deadline: {t['deadline']!r} is not a Go duration")
        kind = t["templateType"]
        if kind == "Suspend":
            if not t.get("deadline"):
                problems.append(f"{where}: deadline in template with type Suspend could not be empty")
        elif kind in ("Serial", "Parallel"):
            problems += [f"{where}.children: can not find a template with name {c}" for c in t.get("children", [])
                         if c not in templates]
        elif kind in CHAOS_FIELDS:
            chaos = t.get(CHAOS_FIELDS[kind])
            if chaos is None:
                problems.append(f"{where}: the value of chaos {kind} is required")
                continue
            if "duration" in chaos:
                problems.append(f"{where}: should not define duration in chaos when using Workflow")
            check = network_chaos_problems if kind == "NetworkChaos" else pod_chaos_problems
            problems += check(where, chaos)
        else:
            problems.append(f"{where}.templateType: unrecognized template type: {kind}")
        if kind != "Serial" and kind != "Parallel" and t.get("children"):
            problems.append(f"{where}: this template should not contain Children")
    return problems


def pytorchjob_problems(doc: dict[str, Any]) -> list[str]:
    """pytorchjob_webhook.go: a DNS-1035 name, Master and Worker only, a container named
    pytorch with an image in each, one Master."""
    problems = [] if DNS_1035_LABEL.match(doc["metadata"]["name"]) else ["PyTorchJob name: not a DNS-1035 label"]
    for kind, replica in doc["spec"]["pytorchReplicaSpecs"].items():
        containers = replica["template"]["spec"].get("containers", [])
        if kind not in ("Master", "Worker"):
            problems.append(f"PyTorchJob {kind}: not a replica type (Master, Worker)")
        if not any(c["name"] == "pytorch" for c in containers):
            problems.append(f"PyTorchJob {kind}: there is no container named pytorch")
        problems += [f"PyTorchJob {kind} {c['name']}: image must be specified" for c in containers if not c.get("image")]
        if kind == "Master" and replica.get("replicas") != 1:
            problems.append("PyTorchJob Master.replicas: must be 1")
    return problems


def trainjob_problems(doc: dict[str, Any], documents: list[dict[str, Any]]) -> list[str]:
    """The trainer's torch plugin reserves the PET_* variables; the runtime must exist."""
    trainer = doc["spec"].get("trainer", {})
    problems = [f"TrainJob trainer.env {e['name']}: reserved by the torch plugin" for e in trainer.get("env", [])
                if e["name"].startswith("PET_")]
    ref = doc["spec"]["runtimeRef"]
    if not any(d["kind"] == ref.get("kind") and d["metadata"]["name"] == ref["name"] for d in documents):
        problems.append(f"TrainJob runtimeRef: no {ref.get('kind')} named {ref['name']} among the manifests")
    return problems


def webhook_problems(doc: dict[str, Any], documents: list[dict[str, Any]]) -> list[str]:
    kind = doc["kind"]
    if kind == "Workflow":
        return workflow_problems(doc)
    if kind == "NetworkChaos":
        return network_chaos_problems("NetworkChaos spec", doc["spec"])
    if kind == "PodChaos":
        return pod_chaos_problems("PodChaos spec", doc["spec"])
    if kind == "PyTorchJob":
        return pytorchjob_problems(doc)
    if kind == "TrainJob":
        return trainjob_problems(doc, documents)
    return []


def admission_problems(documents: list[dict[str, Any]]) -> list[str]:
    """Everything the API server and the webhooks would refuse, for custom resources; the
    core objects (ConfigMap) only by their name."""
    problems = []
    for doc in documents:
        if not DNS_1123_SUBDOMAIN.match(doc["metadata"]["name"]):
            problems.append(f"{doc['kind']} {doc['metadata']['name']!r}: not a DNS-1123 subdomain")
        if (doc["apiVersion"], doc["kind"]) in CRD_FILES:
            problems += schema_problems(doc) + webhook_problems(doc, documents)
    return problems
