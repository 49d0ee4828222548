"""The docker backend: every rank in its own container, wired to the same switch as netns.

The network has the netns backend's shape, so every fault lands the same way:

    chaos-<run>-sw          the switch namespace: bridge br0 (10.77.0.1/16) with the control
                            plane (TCPStore, `harness.job.control`, started by the rank launcher
                            with setns) and one port p<rank> per container
    chaos-<run>-r<NNN>      one container per rank, created from the rank template of
                            docker-compose.yml (`x-rank`), with network_mode "none"; once it
                            runs, the harness finds its namespace (State.Pid ->
                            /proc/PID/ns/net), pins it under this name (as `ip netns attach`
                            does: the host outlives the rank's process, as a netns host
                            does) and moves the other end of the veth in as eth0 with
                            10.77.x.y/16. The rank (`python -m harness.cluster.container rank
                            --config --barrier`) loads torch, waits until eth0 is up with an
                            address and until every rank has loaded (ready files in the run
                            folder: containers start one by one, each importing torch for
                            seconds), then joins the rendezvous like a forked netns rank.

Containers are labelled with the run id (`LABEL_RUN`) and written to the ledger before
they are created (op ``docker_container``); pauses through the engine are recorded as
``docker_unpause``. Both undo operations are registered here into `chaos.mechanism.UNDO`,
so importing this module is what lets `chaos heal` undo docker entries; `heal_containers`
also removes labelled containers whose ledger was lost. No docker network is created: the
switch namespace is the network. `chaos/` never imports docker.

Images: the rank template names the GPU image built from the top-level Dockerfile. Where
that image is not in the engine (this CI machine: no registry, no base image), the backend
imports a tiny local root filesystem (`LOCAL_IMAGE`: a few symlinks and /etc files) and
bind-mounts the host's Python environment and the project read-only at the same paths.

The docker SDK is imported lazily: this module imports without it.
"""
from __future__ import annotations

import hashlib
import io
import json
import os
import re
import signal
import sys
import tarfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from pyroute2 import netns as pyroute2_netns

from chaos import netlink, proc
from chaos.api import Host
from chaos.errors import ChaosError, HarnessError
from chaos.faults import FaultBase, Kill
from chaos.heal import SWEEPS, HealReport, namespace_name, owner_alive
from chaos.inject import undo_outstanding
from chaos.ledger import Entry, Ledger
from chaos.mechanism import Mechanism, undo
from harness.cluster.api import STORE_PORT, Backend, Cluster, ClusterSpec, RankExit
from harness.cluster.launcher import Launcher
from harness.cluster.netns import (
    BRIDGE,
    MAX_RANKS,
    NETWORK,
    SWITCH_ADDRESS,
    build_switch,
    host_address,
    port_name,
    rank_name,
    start_control,
)

PROJECT_ROOT = Path(__file__).resolve().parent.parent
COMPOSE_FILE = PROJECT_ROOT / "docker-compose.yml"

LABEL_RUN = "io.chaos-harness.run"
LABEL_RANK = "io.chaos-harness.rank"
LABEL_ROLE = "io.chaos-harness.role"
LABEL_IMAGE = "io.chaos-harness.image"
LOCAL_IMAGE = "chaos-harness-local"
IMAGE_ENV = "CHAOS_DOCKER_IMAGE"        # force an image; "local" forces the local test image
DOCKER_HOST_ENV = "DOCKER_HOST"
DEFAULT_DOCKER_HOST = "unix:///var/run/docker.sock"
API_TIMEOUT_S = 60
EXIT_WAIT_S = 10.0
LINK_TIMEOUT_S = 120.0                 # how long a rank waits for its eth0 (16 starts on 2 cores)
BARRIER_TIMEOUT_S = 180.0              # how long a loaded rank waits for the others to load
CREATE_THREADS = 4
NOT_RUNNING = "/nonexistent/chaos-rank-not-running"  # the ns_path of a host whose rank is not running


# --- the engine -----------------------------------------------------------------------------

def engine_url() -> str:
    return os.environ.get(DOCKER_HOST_ENV, DEFAULT_DOCKER_HOST)


def engine(base_url: str | None = None) -> Any:
    """A docker SDK client that answers, or HarnessError saying why not."""
    try:
        import docker
    except ImportError as exc:
        raise HarnessError("the docker backend needs the Docker SDK for Python: "
                           "pip install 'chaos-harness[docker]'") from exc
    url = base_url or engine_url()
    try:
        client = docker.DockerClient(base_url=url, version="auto", timeout=API_TIMEOUT_S)
        client.ping()
    except Exception as exc:  # docker.errors.DockerException, requests' ConnectionError
        raise HarnessError(f"no Docker engine answers at {url}: {exc} "
                           "(start one with .ci/docker-engine.sh)") from exc
    return client


def engine_unavailable_reason() -> str | None:
    """None when an engine answers; otherwise the reason (for pytest skips)."""
    try:
        engine().close()
    except HarnessError as exc:
        return str(exc)
    return None


def _not_found(exc: BaseException) -> bool:
    import docker.errors
    return isinstance(exc, docker.errors.NotFound)


def _conflict(exc: BaseException) -> bool:
    """409: the container is not running / not paused / already paused."""
    import docker.errors
    return isinstance(exc, docker.errors.APIError) and exc.status_code == 409


class _translated:
    """Turn docker SDK errors into HarnessError once, at this edge."""

    def __init__(self, what: str) -> None:
        self.what = what

    def __enter__(self) -> None:
        return None

    def __exit__(self, typ: object, exc: BaseException | None, tb: object) -> bool:
        if exc is None or isinstance(exc, (ChaosError, KeyboardInterrupt, SystemExit)):
            return False
        import docker.errors
        import requests
        if isinstance(exc, (docker.errors.DockerException, requests.RequestException)):
            raise HarnessError(f"{self.what}: {exc}") from exc
        return False


# --- the compose file -----------------------------------------------------------------------

_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::?-([^}]*))?\}")


def _interpolate(value: Any) -> Any:
    """Compose's ${VAR} / ${VAR:-default} / ${VAR-default}, from this process's environment."""
    if isinstance(value, str):
        return _VAR.sub(lambda m: os.environ.get(m.group(1)) or (m.group(2) or ""), value)
    if isinstance(value, list):
        return [_interpolate(v) for v in value]
    if isinstance(value, dict):
        return {k: _interpolate(v) for k, v in value.items()}
    return value


def _env_dict(env: Any) -> dict[str, str]:
    if env is None:
        return {}
    if isinstance(env, list):
        return dict(item.split("=", 1) if "=" in item else (item, os.environ.get(item, ""))
                    for item in env)
    return {str(k): "" if v is None else str(v) for k, v in env.items()}


@dataclass(frozen=True)
class RankTemplate:
    """What the harness takes from the compose file's rank service (`x-rank`)."""

    image: str
    environment: dict[str, str] = field(default_factory=dict)
    cap_add: tuple[str, ...] = ()
    shm_size: str | None = None
    ulimits: dict[str, Any] = field(default_factory=dict)
    stop_signal: str = "SIGTERM"
    gpu_requests: tuple[dict[str, Any], ...] = ()

    @classmethod
    def from_compose(cls, path: Path = COMPOSE_FILE) -> RankTemplate:
        try:
            doc = yaml.safe_load(path.read_text())
        except (OSError, yaml.YAMLError) as exc:
            raise HarnessError(f"cannot read the compose file {path}: {exc}") from exc
        services = doc.get("services") or {}
        rank = doc.get("x-rank") or next(
            (s for s in services.values() if (s.get("labels") or {}).get(LABEL_ROLE) == "rank"), None)
        if not rank:
            raise HarnessError(f"{path}: no rank template (an `x-rank` block or a service "
                               f"labelled {LABEL_ROLE}=rank)")
        rank = _interpolate(rank)
        devices = (((rank.get("deploy") or {}).get("resources") or {}).get("reservations") or {}) \
            .get("devices") or []
        return cls(
            image=rank["image"],
            # CHAOS_* configure a rank started by `docker compose up`; the harness passes a config file.
            environment={k: v for k, v in _env_dict(rank.get("environment")).items()
                         if not k.startswith("CHAOS_")},
            cap_add=tuple(rank.get("cap_add") or ()),
            shm_size=str(rank["shm_size"]) if rank.get("shm_size") else None,
            ulimits=dict(rank.get("ulimits") or {}),
            stop_signal=str(rank.get("stop_signal") or "SIGTERM"),
            gpu_requests=tuple(d for d in devices if "gpu" in _flat(d.get("capabilities"))),
        )


def _flat(caps: Any) -> list[str]:
    out: list[str] = []
    for c in caps or []:
        out += _flat(c) if isinstance(c, list) else [str(c)]
    return out


def _device_requests(requests: tuple[dict[str, Any], ...]) -> list[Any]:
    """Compose's `deploy.resources.reservations.devices` as the engine's DeviceRequests."""
    from docker.types import DeviceRequest
    out = []
    for d in requests:
        ids = [str(i) for i in d.get("device_ids") or []]
        count = d.get("count")
        n = 0 if ids else -1 if count in (None, "all") else int(count)
        out.append(DeviceRequest(driver=d.get("driver", ""), count=n, device_ids=ids,
                                 capabilities=[_flat(d.get("capabilities"))],
                                 options=d.get("options") or {}))
    return out


def _ulimits(ulimits: dict[str, Any]) -> list[Any]:
    """The template's ulimits, capped at this host's hard limits (-1: unlimited). A GPU node
    grants `memlock: -1`; a VM that does not would otherwise refuse to start the container."""
    import resource

    from docker.types import Ulimit
    out = []
    for name, v in ulimits.items():
        soft, hard = (v, v) if not isinstance(v, dict) else (v.get("soft"), v.get("hard"))
        soft, hard = int(soft), int(hard)
        limit = getattr(resource, f"RLIMIT_{name.upper()}", None)
        if limit is not None:
            host_hard = resource.getrlimit(limit)[1]
            if host_hard != resource.RLIM_INFINITY:
                hard = host_hard if hard < 0 else min(hard, host_hard)
                soft = hard if soft < 0 else min(soft, hard)
        out.append(Ulimit(name=name, soft=soft, hard=hard))
    return out


# --- the local test image -------------------------------------------------------------------

def _local_rootfs() -> bytes:
    """A minimal root filesystem: merged-/usr symlinks, /etc basics, mount points. Deterministic."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        def add(name: str, kind: bytes, data: bytes = b"", target: str = "", mode: int = 0o755) -> None:
            info = tarfile.TarInfo(name)
            info.type, info.mode, info.mtime, info.size = kind, mode, 0, len(data)
            info.linkname = target
            tar.addfile(info, io.BytesIO(data) if data else None)
        for d in ("dev", "proc", "sys", "etc", "usr", "run", "var", "root", "work"):
            add(d, tarfile.DIRTYPE)
        add("tmp", tarfile.DIRTYPE, mode=0o1777)
        for link in ("bin", "sbin", "lib", "lib64"):
            add(link, tarfile.SYMTYPE, target=f"usr/{link}")
        add("etc/passwd", tarfile.REGTYPE, b"root:x:0:0:root:/root:/bin/sh\n", mode=0o644)
        add("etc/group", tarfile.REGTYPE, b"root:x:0:\n", mode=0o644)
        add("etc/nsswitch.conf", tarfile.REGTYPE, b"passwd: files\ngroup: files\nhosts: files\n", mode=0o644)
    return buf.getvalue()


def local_image_tag() -> str:
    return f"{LOCAL_IMAGE}:{hashlib.sha256(_local_rootfs()).hexdigest()[:12]}"


def ensure_local_image(client: Any) -> str:
    """Import the local test image if the engine lacks it; returns its tag. No registry needed."""
    import docker.errors
    tag = local_image_tag()
    try:
        client.images.get(tag)
        return tag
    except docker.errors.ImageNotFound:
        pass
    repo, _, version = tag.partition(":")
    with _translated(f"import {tag}"):
        client.api.import_image_from_data(
            _local_rootfs(), repository=repo, tag=version,
            changes=[f"LABEL {LABEL_IMAGE}=local", 'CMD ["/bin/false"]'])
        client.images.get(tag)
    return tag


def host_python_mounts() -> dict[str, dict[str, str]]:
    """Read-only bind mounts that make this host's interpreter and project run in the image."""
    paths = {"/usr", os.path.realpath(sys.base_prefix), str(PROJECT_ROOT)}
    venv = os.path.realpath(sys.prefix)
    if not venv.startswith(str(PROJECT_ROOT) + os.sep):
        paths.add(venv)
    keep = sorted(p for p in paths if not any(p != q and p.startswith(q + os.sep) for q in paths))
    return {p: {"bind": p, "mode": "ro"} for p in keep}


# --- undo operations (registered into chaos.inject.UNDO) ------------------------------------

def _labelled(container: Any, run_id: str) -> bool:
    return (container.labels or {}).get(LABEL_RUN) == run_id


@undo("docker_container")
def _undo_container(args: dict[str, Any]) -> None:
    """Remove the container (killing it first); only if it carries the run's label."""
    client = engine(args.get("engine"))
    try:
        try:
            container = client.containers.get(args["name"])
        except Exception as exc:
            if _not_found(exc):
                return
            raise
        if not _labelled(container, args["run_id"]):
            return  # a foreign container took the name: not ours to remove
        with _translated(f"remove container {args['name']}"):
            try:
                container.remove(force=True, v=True)
            except Exception as exc:
                if not _not_found(exc) and not _removal_in_progress(exc):
                    raise
    finally:
        client.close()


def _removal_in_progress(exc: BaseException) -> bool:
    return _conflict(exc) and "already in progress" in str(exc)


@undo("docker_unpause")
def _undo_pause(args: dict[str, Any]) -> None:
    client = engine(args.get("engine"))
    try:
        with _translated(f"unpause {args['name']}"):
            try:
                client.api.unpause(args["name"])
            except Exception as exc:
                if not (_not_found(exc) or _conflict(exc)):  # gone, or not paused any more
                    raise
    finally:
        client.close()


def heal_containers(run_id: str | None = None, everything: bool = False,
                    report: HealReport | None = None, directory: Path | None = None) -> HealReport:
    """Remove containers labelled with a run id: one run, or those whose owner is dead, or all.

    The ledger path (`chaos.heal.heal`, with this module imported) covers what a run
    recorded; this finds what a lost or torn ledger no longer names. Without an engine it
    finds nothing and returns the report as it was.
    """
    report = report or HealReport()
    try:
        client = engine()
    except HarnessError:
        return report  # no engine (or no SDK) here: no container can be running or found
    try:
        with _translated("list labelled containers"):
            filters = {"label": f"{LABEL_RUN}={run_id}" if run_id else LABEL_RUN}
            containers = client.containers.list(all=True, filters=filters)
        by_run: dict[str, list[Any]] = {}
        for c in containers:
            by_run.setdefault(c.labels[LABEL_RUN], []).append(c)
        for rid, found in sorted(by_run.items()):
            if run_id is None and not everything and owner_alive(Ledger(rid, directory)):
                if rid not in report.skipped_live:
                    report.skipped_live.append(rid)
                continue
            for c in found:
                _undo_container({"name": c.name, "run_id": rid})
                report.undone.append(f"docker container {c.name}")
            if rid not in report.runs:
                report.runs.append(rid)
    finally:
        client.close()
    return report


SWEEPS.append(heal_containers)  # `chaos heal` and every run's pre-run heal find labelled containers


# --- fault mechanisms through the engine ---------------------------------------------------

class EngineKill(Mechanism):
    name = "docker kill (signal through the engine)"

    def __init__(self, cluster: DockerCluster) -> None:
        self.cluster = cluster

    def apply(self, fault: FaultBase, host: Host, ledger: Ledger) -> list[Entry]:
        assert isinstance(fault, Kill)
        self.cluster.kill(int(host.name[1:]), fault.signal)
        return []


class EnginePause(Mechanism):
    name = "docker pause / unpause (cgroup freezer)"

    def __init__(self, cluster: DockerCluster) -> None:
        self.cluster = cluster

    def apply(self, fault: FaultBase, host: Host, ledger: Ledger) -> list[Entry]:
        name = self.cluster.container_name(int(host.name[1:]))
        entry = ledger.record("docker_unpause", name=name, engine=self.cluster.engine_url)
        with _translated(f"pause {name}"):
            self.cluster.client.api.pause(name)
        ledger.mark(entry, "done")
        return [entry]


def _catches(pid: int, signum: int) -> bool:
    """Whether process `pid` has a handler for `signum` (SigCgt of /proc/PID/status)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("SigCgt:"):
                    return bool(int(line.split()[1], 16) >> (signum - 1) & 1)
    except OSError:
        pass
    return False


# --- the cluster ----------------------------------------------------------------------------

@dataclass
class _Rank:
    name: str                       # container name
    pid: int | None = None          # host pid of the container's process (the rank) while it runs
    started: int | None = None      # its start time, so a reused pid is never taken for it
    runs: int = 0                   # how many times the container was started


class DockerCluster(Cluster):
    def __init__(self, spec: ClusterSpec, ledger: Ledger, client: Any, template: RankTemplate,
                 image: str, mounts: dict[str, dict[str, str]], python: str, gpus: bool) -> None:
        self.spec = spec
        self._ledger = ledger
        self.client = client
        self.engine_url = engine_url()
        self.template = template
        self.image = image
        self._mounts = mounts
        self._python = python
        self._gpus = gpus
        self.store_address = SWITCH_ADDRESS
        self.store_port = STORE_PORT
        self.switch_ns = namespace_name(spec.run_id, "sw")
        self._launcher: Launcher | None = None
        self._ranks = [_Rank(self.container_name(r)) for r in range(spec.ranks)]
        self._lock = threading.Lock()
        self.timings: dict[str, float] = {}

    # names and hosts
    def container_name(self, rank: int) -> str:
        return namespace_name(self.spec.run_id, rank_name(rank))

    @property
    def hosts(self) -> tuple[Host, ...]:  # type: ignore[override]
        """The hosts now: pid is the container's current process; ns_path its pinned
        network namespace, which outlives the process like a netns host. A rank never
        started has a namespace path that does not exist (never "": netlink would take
        that for this process's own namespace)."""
        return tuple(
            Host(name=rank_name(r), address=host_address(r), switch_ns=self.switch_ns,
                 port=port_name(r), pid=st.pid,
                 ns_path=f"/run/netns/{self.namespace(r)}" if st.runs else f"{NOT_RUNNING}/{st.name}")
            for r, st in enumerate(self._ranks))

    def mechanisms(self) -> dict[str, Mechanism]:
        """Process faults through the engine (`docker kill`, `docker pause`/`unpause`), to
        merge over `chaos.inject.default_mechanisms()`; link faults need nothing of docker."""
        return {"kill": EngineKill(self), "pause": EnginePause(self)}

    # bring-up
    def build_switch(self) -> None:
        build_switch(self._ledger, self.switch_ns)

    def _create_kwargs(self, rank: int) -> dict[str, Any]:
        t = self.template
        run_dir = str(self.spec.run_dir.resolve())
        volumes = dict(self._mounts)
        volumes[run_dir] = {"bind": run_dir, "mode": "rw"}
        kwargs: dict[str, Any] = dict(
            image=self.image, name=self.container_name(rank), hostname=rank_name(rank),
            command=[self._python, "-m", "harness.cluster.container", "rank", "--config", self._config_path(rank),
                     "--link-timeout", str(LINK_TIMEOUT_S), "--barrier", str(BARRIER_TIMEOUT_S)],
            labels={LABEL_RUN: self.spec.run_id, LABEL_RANK: str(rank), LABEL_ROLE: "rank"},
            network_mode="none", environment={**t.environment, "PYTHONUNBUFFERED": "1"},
            volumes=volumes, working_dir="/", cap_add=list(t.cap_add) or None,
            stop_signal=t.stop_signal, init=False, detach=True,
            log_config={"type": "json-file", "config": {}})
        if t.shm_size:
            kwargs["shm_size"] = t.shm_size
        if t.ulimits:
            kwargs["ulimits"] = _ulimits(t.ulimits)
        if self._gpus and t.gpu_requests:
            kwargs["device_requests"] = _device_requests(t.gpu_requests)
        return kwargs

    def _create(self, rank: int) -> None:
        name = self.container_name(rank)
        with self._lock:
            entry = self._ledger.record("docker_container", name=name, run_id=self.spec.run_id,
                                        engine=self.engine_url)
        with _translated(f"create container {name}"):
            self.client.containers.create(**self._create_kwargs(rank))
        with self._lock:
            self._ledger.mark(entry, "done")

    def create_containers(self) -> None:
        t0 = time.monotonic()
        with ThreadPoolExecutor(min(CREATE_THREADS, self.spec.ranks)) as pool:
            for fut in [pool.submit(self._create, r) for r in range(self.spec.ranks)]:
                fut.result()
        self.timings["create_s"] = time.monotonic() - t0

    def start_control(self) -> None:
        self._launcher = Launcher(self._ledger)
        start_control(self._launcher, self.switch_ns, self.spec.run_dir, self.store_port)

    # ranks
    def _config_path(self, rank: int) -> str:
        return str((self.spec.run_dir / "ranks" / f"{rank_name(rank)}.json").resolve())

    def start_rank(self, rank: int, config: dict) -> int:
        st = self._ranks[rank]
        if st.pid is not None and proc.start_time(st.pid) == st.started:
            raise HarnessError(f"{rank_name(rank)} is still running (pid {st.pid})")
        path = Path(self._config_path(rank))
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(config))
        os.replace(tmp, path)
        if st.runs:  # a restart: the old namespace (still pinned) and its veth go first
            self._remove_port(rank)
            netlink.remove_namespace(self.namespace(rank))
        with _translated(f"start container {st.name}"):
            self.client.api.start(st.name)
            pid = int(self.client.api.inspect_container(st.name)["State"]["Pid"])
        st.runs += 1
        st.pid, st.started = (pid, proc.start_time(pid)) if pid else (None, None)
        if st.pid is None:
            return 0  # it ended before it could be seen; reap reports it
        try:
            self._pin(rank, pid)
            self._wire(rank)
        except ChaosError:
            if proc.start_time(pid) == st.started:
                raise
            # the process ended while it was wired: reap reports its exit
        return pid

    def namespace(self, rank: int) -> str:
        """The name the container's network namespace is pinned under (as on the netns backend)."""
        return namespace_name(self.spec.run_id, rank_name(rank))

    def _pin(self, rank: int, pid: int) -> None:
        """Name the container's network namespace (/proc/PID/ns/net -> /run/netns/<name>, as
        `ip netns attach` does), so that the host outlives the rank's process as a netns
        host does: a killed rank's address still answers (RST), its last FIN is delivered,
        and its port stays on the bridge until teardown or a restart."""
        name = self.namespace(rank)
        entry = self._ledger.record("netns", name=name)
        with netlink.translated(f"pin the namespace of {self._ranks[rank].name} as {name}"):
            pyroute2_netns.attach(name, pid)
        self._ledger.mark(entry, "done")

    def _wire(self, rank: int) -> None:
        """veth p<rank> on the bridge <-> eth0 in the container's namespace, with its address."""
        ns_path = f"/run/netns/{self.namespace(rank)}"
        port = port_name(rank)
        with netlink.translated(f"wire {rank_name(rank)}"):
            with netlink.route(self.switch_ns) as ipr:
                ipr.link("add", ifname=port, kind="veth", peer={"ifname": "eth0", "net_ns_fd": ns_path})
                ipr.link("set", index=netlink.link_index(ipr, port),
                         master=netlink.link_index(ipr, BRIDGE), state="up")
            with netlink.route(ns_path) as ipr:
                eth = netlink.link_index(ipr, "eth0")
                ipr.addr("add", index=eth, address=host_address(rank), prefixlen=NETWORK.prefixlen)
                ipr.link("set", index=netlink.link_index(ipr, "lo"), state="up")
                ipr.link("set", index=eth, state="up")

    def _remove_port(self, rank: int) -> None:
        with netlink.translated(f"remove port {port_name(rank)}", gone_ok=True), \
                netlink.route(self.switch_ns) as ipr:
            found = ipr.link_lookup(ifname=port_name(rank))
            if found:
                ipr.link("del", index=found[0])

    def pid(self, rank: int) -> int | None:
        st = self._ranks[rank]
        if st.pid is not None and proc.start_time(st.pid) == st.started:
            return st.pid
        return None

    def _exit_of(self, rank: int, pid: int, t: float) -> RankExit:
        """The exit of a container whose process is gone (asks the engine for the code)."""
        name = self._ranks[rank].name
        with _translated(f"wait for {name}"):
            code = int(self.client.api.wait(name, timeout=EXIT_WAIT_S)["StatusCode"])
        self._collect_log(rank)
        if 128 < code <= 128 + 64:  # docker reports death by signal N as 128 + N
            return RankExit(rank, pid, None, code - 128, t)
        return RankExit(rank, pid, code, None, t)

    def reap(self) -> list[RankExit]:
        out = []
        for rank, st in enumerate(self._ranks):
            if st.pid is not None and proc.start_time(st.pid) != st.started:
                pid, st.pid, st.started = st.pid, None, None
                out.append(self._exit_of(rank, pid, time.monotonic()))
        return out

    def _live(self) -> list[int]:
        return [r for r, st in enumerate(self._ranks) if st.pid is not None]

    def kill(self, rank: int, signum: int) -> None:
        name = self._ranks[rank].name
        with _translated(f"kill {name}"):
            try:
                self.client.api.kill(name, signal=int(signum))
            except Exception as exc:
                if not (_not_found(exc) or _conflict(exc)):  # gone or not running
                    raise

    def _unpause_all(self, ranks: list[int]) -> None:
        with _translated("list paused containers"):
            paused = {c.name for c in self.client.containers.list(
                filters={"label": f"{LABEL_RUN}={self.spec.run_id}", "status": "paused"})}
        for r in ranks:
            if self._ranks[r].name in paused:
                _undo_pause({"name": self._ranks[r].name, "engine": self.engine_url})

    def stop_ranks(self, deadline_s: float) -> list[RankExit]:
        """SIGTERM every live rank, SIGKILL (through the engine) what is left at the deadline.

        SIGTERM goes straight to each rank's process (what `docker kill` does, minus an API
        round trip of 10-25 ms per container), so all ranks get it within a millisecond as
        from the netns launcher; serial API calls would spread it over ~0.4 s for 16 ranks,
        and the ranks still running would report the early ones' closed sockets as
        collective errors. A rank is PID 1 of its container, and the kernel drops a signal
        PID 1 has no handler for: a rank that has not yet installed its SIGTERM handler (it
        just started) gets the signal once it has."""
        deadline = time.monotonic() + deadline_s
        pending = set(self._live())  # not yet sent SIGTERM
        exits: list[RankExit] = []
        killed = False
        while self._live():
            for r in sorted(pending):
                st = self._ranks[r]
                if st.pid is None or proc.start_time(st.pid) != st.started:
                    pending.discard(r)
                elif _catches(st.pid, signal.SIGTERM):
                    proc.send_signal(st.pid, signal.SIGTERM, st.started, gone_ok=True)
                    pending.discard(r)
            exits += self.reap()
            if not self._live():
                break
            if time.monotonic() >= deadline and not killed:
                left = self._live()
                self._unpause_all(left)
                for r in left:
                    proc.send_signal(self._ranks[r].pid, signal.SIGCONT, self._ranks[r].started,
                                     gone_ok=True)
                    self.kill(r, signal.SIGKILL)
                killed = True
            time.sleep(0.01)
        return exits

    # logs and teardown
    def _collect_log(self, rank: int) -> None:
        name = self._ranks[rank].name
        try:
            data = self.client.api.logs(name, stdout=True, stderr=True, timestamps=False)
        except Exception:  # noqa: BLE001  (best effort: a removed container has no log left)
            return
        (self.spec.run_dir / "logs" / f"{rank_name(rank)}.log").write_bytes(data)

    def collect_logs(self) -> None:
        for rank in range(self.spec.ranks):
            self._collect_log(rank)

    def close(self) -> None:
        t0 = time.monotonic()
        try:
            try:
                live = self._live()
                if live:
                    self._unpause_all(live)
                    for r in live:
                        st = self._ranks[r]
                        if st.pid is not None:
                            proc.send_signal(st.pid, signal.SIGKILL, st.started, gone_ok=True)
                self.collect_logs()
            finally:
                if self._launcher is not None:
                    self._launcher.close()
        finally:
            undo_outstanding(self._ledger)
            for st in self._ranks:
                st.pid = st.started = None
            self.timings["close_s"] = time.monotonic() - t0


class DockerBackend(Backend):
    """Containers from the compose file's rank template, on the harness's own switch.

    `compose_file`: where the rank template is read; `image`: force an image (default: the
    template's if the engine has it, else the local test image with the host's Python
    bind-mounted); `gpus`: pass the template's GPU device requests (default: when the
    engine has the nvidia runtime).
    """

    name = "docker"
    # From the first `start_rank` to the first step on every rank: each container imports
    # torch on its own (16 on 2 shared cores: 25-45 s measured); the netns backend forks
    # loaded ranks in well under a second. An orchestrator's warm-up deadline should allow it.
    start_timeout_s = 180.0

    def __init__(self, compose_file: Path | str = COMPOSE_FILE, image: str | None = None,
                 gpus: bool | None = None) -> None:
        self.compose_file = Path(compose_file)
        self.image = image or os.environ.get(IMAGE_ENV) or None
        self.gpus = gpus

    def _resolve_image(self, client: Any, template: RankTemplate) -> tuple[str, dict, str]:
        import docker.errors
        wanted = self.image or template.image
        if wanted != "local":
            try:
                client.images.get(wanted)
                return wanted, {}, "python"
            except docker.errors.ImageNotFound:
                if self.image:
                    raise HarnessError(f"image {wanted!r} is not in the engine (build it with "
                                       "`docker build -t IMAGE .`)") from None
        return ensure_local_image(client), host_python_mounts(), sys.executable

    def up(self, spec: ClusterSpec, ledger: Ledger) -> DockerCluster:
        if spec.ranks > MAX_RANKS:
            raise HarnessError(f"{spec.ranks} ranks do not fit {NETWORK}; at most {MAX_RANKS}")
        t0 = time.monotonic()
        template = RankTemplate.from_compose(self.compose_file)
        client = engine()
        try:
            image, mounts, python = self._resolve_image(client, template)
            gpus = self.gpus if self.gpus is not None else "nvidia" in (client.info().get("Runtimes") or {})
        except BaseException:
            client.close()
            raise
        for sub in ("logs", "ranks"):
            (spec.run_dir / sub).mkdir(parents=True, exist_ok=True)
        cluster = DockerCluster(spec, ledger, client, template, image, mounts, python, gpus)
        try:
            cluster.build_switch()
            cluster.create_containers()
            cluster.start_control()
        except BaseException:
            cluster.close()
            raise
        cluster.timings["up_s"] = time.monotonic() - t0
        return cluster


# --- command line: `python -m harness.cluster.docker_backend image|heal|check` ---------------------

def _main(argv: list[str] | None = None) -> int:
    import argparse
    p = argparse.ArgumentParser(prog="python -m harness.cluster.docker_backend")
    sub = p.add_subparsers(dest="cmd", required=True)
    sub.add_parser("image", help="import the local test image if the engine lacks it")
    sub.add_parser("check", help="exit 0 if an engine answers, else print why and exit 1")
    h = sub.add_parser("heal", help="remove containers labelled with a run id")
    h.add_argument("run_id", nargs="?")
    h.add_argument("--all", action="store_true")
    args = p.parse_args(argv)
    try:
        if args.cmd == "check":
            reason = engine_unavailable_reason()
            print(reason or "engine answers")
            return 1 if reason else 0
        if args.cmd == "image":
            client = engine()
            try:
                print(ensure_local_image(client))
            finally:
                client.close()
            return 0
        print(heal_containers(args.run_id, args.all).summary())
        return 0
    except ChaosError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    raise SystemExit(_main())
