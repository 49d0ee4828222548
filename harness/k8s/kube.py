"""The edge to a cluster: what `chaos collect k8s` reads, through the official `kubernetes`
client (imported only here, and only when a collection starts).

Chaos Mesh deletes a Workflow's chaos objects when their node ends, records and all, so
the collector watches them (a DELETED event carries the object's last state) instead of
listing them once at the end.
"""
from __future__ import annotations

from typing import Any, Protocol

from chaos.errors import HarnessError, UsageError
from harness.k8s.faults import API_VERSION, CHAOS_PLURALS

WORKFLOW_LABEL = "chaos-mesh.org/workflow"  # on every chaos object a Workflow made
WATCH_S = 1                                 # how long one watch call waits for changes
HTTP_GONE = 410                             # the watch's resource version expired: list again


class ClusterView(Protocol):
    """What the collector reads from one namespace."""

    def config_map(self, name: str) -> dict[str, str] | None: ...

    def pods(self, selector: str) -> list[Any]: ...              # V1Pod

    def log(self, pod: str, container: str) -> str: ...          # lines prefixed by RFC 3339 times

    def chaos_changes(self, workflow: str) -> list[dict[str, Any]]: ...  # watch events since the last call


class Kubernetes:
    """ClusterView through the kubernetes client and the current kubeconfig (or the pod's
    service account when run inside the cluster)."""

    def __init__(self, namespace: str) -> None:
        try:
            from kubernetes import client, config, watch
        except ImportError:
            raise UsageError("chaos collect k8s needs the kubernetes client: pip install kubernetes "
                             "(or install chaos-harness with its k8s extra)") from None
        try:
            config.load_kube_config()
        except config.ConfigException:
            try:
                config.load_incluster_config()
            except config.ConfigException as exc:
                raise UsageError(f"no cluster to talk to: no kubeconfig and not inside a pod ({exc}); "
                                 "set KUBECONFIG or run `kubectl config use-context NAME`") from None
        self.namespace = namespace
        self.core = client.CoreV1Api()
        self.custom = client.CustomObjectsApi()
        self.watch = watch
        self.api_error = client.ApiException
        self.versions: dict[str, str | None] = {plural: None for plural in CHAOS_PLURALS.values()}

    def _call(self, what: str, call: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return call(*args, **kwargs)
        except self.api_error as exc:
            raise HarnessError(f"{what} in namespace {self.namespace}: {exc.status} {exc.reason}") from exc

    def config_map(self, name: str) -> dict[str, str] | None:
        try:
            return self.core.read_namespaced_config_map(name, self.namespace).data or {}
        except self.api_error as exc:
            if exc.status == 404:
                return None
            raise HarnessError(f"read ConfigMap {name} in namespace {self.namespace}: {exc.status} "
                               f"{exc.reason}") from exc

    def pods(self, selector: str) -> list[Any]:
        return self._call("list pods", self.core.list_namespaced_pod, self.namespace, label_selector=selector).items

    def log(self, pod: str, container: str) -> str:
        return self._call(f"read the log of {pod}", self.core.read_namespaced_pod_log, pod, self.namespace,
                          container=container, timestamps=True)

    def chaos_changes(self, workflow: str) -> list[dict[str, Any]]:
        group, version = API_VERSION.split("/")
        changes = []
        for plural, since in self.versions.items():
            try:
                stream = self.watch.Watch().stream(
                    self.custom.list_namespaced_custom_object, group, version, self.namespace, plural,
                    label_selector=f"{WORKFLOW_LABEL}={workflow}", resource_version=since, timeout_seconds=WATCH_S)
                for change in stream:
                    changes.append(change)
                    self.versions[plural] = change["object"]["metadata"]["resourceVersion"]
            except self.api_error as exc:
                if exc.status != HTTP_GONE:
                    raise HarnessError(f"watch {plural} in namespace {self.namespace}: {exc.status} "
                                       f"{exc.reason}") from exc
                self.versions[plural] = None  # list again from now: what changed meanwhile is seen anew
        return changes
