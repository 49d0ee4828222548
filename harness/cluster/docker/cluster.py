"""The docker cluster and its backend: one container per rank on the harness's own switch.

Bring-up: the switch (`chaos.topology`), the containers created from the rank template
(labelled with the run id, each written to the ledger first), the control plane on the
switch. A rank's start is `docker start`, then its namespace pinned under the host's name
and plugged into the switch (`chaos.topology.make_namespace` with its pid, `plug`).
Teardown undoes the ledger with every backend's undo table. While the cluster is up the
harness holds a lease file in the run folder (`harness.job.lease`); a rank whose lease is
not renewed for a few seconds (the harness died) leaves, so its container stops.
"""
from __future__ import annotations

import json
import os
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from chaos import netlink, proc, topology
from chaos.api import Host
from chaos.errors import ChaosError, HarnessError
from chaos.undo import undo_outstanding
from chaos.ledger import Ledger
from chaos.mechanism import Mechanism
from chaos.inject import DutyCycle, slow_mechanism
from chaos.storage import share_below
from harness.cluster.api import Backend, Cluster
from harness.cluster.spec import STORE_PORT, ClusterSpec, RankExit, Traits
from harness.cluster.undos import undo_table
from harness.cluster.docker.engine import (
    LABEL_LEDGER,
    LABEL_OWNER,
    LABEL_RANK,
    LABEL_ROLE,
    LABEL_RUN,
    conflict,
    engine,
    engine_url,
    not_found,
    translated,
)
from harness.cluster.docker.heal import undo_pause
from harness.cluster.docker.image import IMAGE_ENV, resolve_image
from harness.cluster.docker.mechanisms import EngineKill, EnginePause
from harness.cluster.docker.template import COMPOSE_FILE, RankTemplate
from harness.cluster.launcher import Launcher, LauncherPool
from harness.cluster.control_plane import start_control
from harness.job import lease

EXIT_WAIT_S = 10.0
LINK_TIMEOUT_S = 120.0                 # how long a rank waits for its eth0 (16 starts on 2 cores)
BARRIER_TIMEOUT_S = 180.0              # how long a loaded rank waits for the others to load
CREATE_THREADS = 4
NOT_RUNNING = "/nonexistent/chaos-rank-not-running"  # the ns_path of a host whose rank is not running


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


@dataclass
class _Rank:
    name: str                       # container name
    pid: int | None = None          # host pid of the container's process (the rank) while it runs
    started: int | None = None      # its start time, so a reused pid is never taken for it
    runs: int = 0                   # how many times the container was started
    tapped: bool = False            # it runs a user's job, whose tap writes the host's log


class DockerCluster(Cluster):
    def __init__(self, spec: ClusterSpec, ledger: Ledger, launchers: LauncherPool, layout: tuple[Host, ...],
                 client: Any, template: RankTemplate, image: str, mounts: dict[str, dict[str, str]],
                 python: str, gpus: bool) -> None:
        self.spec = spec
        self._ledger = ledger
        self._launchers = launchers
        self._layout = layout           # the hosts as the topology lays them out
        self.client = client
        self.engine_url = engine_url()
        self.template = template
        self.image = image
        self._mounts = mounts
        self._python = python
        self._gpus = gpus
        self.store_address = topology.SWITCH_ADDRESS
        self.store_port = STORE_PORT
        self.switch_ns = topology.switch_namespace(spec.run_id)
        self._launcher: Launcher | None = None
        self._ranks = [_Rank(self.container_name(r)) for r in range(spec.ranks)]
        self._lock = threading.Lock()
        self.timings: dict[str, float] = {}
        self._lease = lease.Holder(lease.lease_path(spec.run_dir.resolve()))

    # names and hosts
    def namespace(self, rank: int) -> str:
        """The name the container's network namespace is pinned under (as on the netns backend)."""
        return Path(self._layout[rank].ns_path).name

    def container_name(self, rank: int) -> str:
        """The same as its pinned namespace's (chaos-<run>-r<NNN>): a heal finds both by the run."""
        return self.namespace(rank)

    @property
    def hosts(self) -> tuple[Host, ...]:  # type: ignore[override]
        """The hosts now: pid is the container's current process; ns_path its pinned
        network namespace, which outlives the process like a netns host. A rank never
        started has a namespace path that does not exist (never "": netlink would take
        that for this process's own namespace)."""
        return tuple(
            replace(host, pid=st.pid, ns_path=host.ns_path if st.runs else f"{NOT_RUNNING}/{st.name}")
            for host, st in zip(self._layout, self._ranks, strict=True))

    def mechanisms(self) -> dict[str, Mechanism]:
        """Process faults through the engine (`docker kill`, `docker pause`/`unpause`), to
        merge over `chaos.inject.default_mechanisms()`; link faults need nothing of docker.
        `slow`'s CPU share by the duty cycle: a container's processes are in the engine's
        cgroup, which the harness's CPU quota would take them out of (its GPU settings are
        the machine's, as on the netns backend)."""
        return {"kill": EngineKill(self), "pause": EnginePause(self), "slow": slow_mechanism(DutyCycle())}

    # bring-up
    def build_switch(self) -> None:
        topology.build_switch(self._ledger, self.switch_ns)

    def _create_kwargs(self, rank: int) -> dict[str, Any]:
        run_dir = str(self.spec.run_dir.resolve())
        volumes = dict(self._mounts)
        # rslave: a storage fault's mount below the trial folder, made after the container
        # started, reaches it (the folder is shared: `up`)
        volumes[run_dir] = {"bind": run_dir, "mode": "rw,rslave"}
        job_dir = self.spec.job_dir and str(self.spec.job_dir.resolve())
        if job_dir and not any(job_dir == p or job_dir.startswith(p + os.sep) for p in volumes):
            volumes[job_dir] = {"bind": job_dir, "mode": "ro"}
        return dict(
            image=self.image, name=self.container_name(rank), hostname=topology.host_name(rank),
            # every host's name resolves to its cluster address, in every container, as a
            # cluster's DNS would have it: torchrun's rendezvous looks its own up, a torchft
            # Manager advertises its own to its peers (harness.cluster.frameworks)
            extra_hosts={topology.host_name(r): topology.host_address(r) for r in range(self.spec.ranks)},
            command=[self._python, "-m", "harness.cluster.container", "rank", "--config", self._config_path(rank),
                     "--link-timeout", str(LINK_TIMEOUT_S), "--barrier", str(BARRIER_TIMEOUT_S),
                     "--lease", str(self._lease.path)],
            labels={LABEL_RUN: self.spec.run_id, LABEL_RANK: str(rank), LABEL_ROLE: "rank",
                    LABEL_OWNER: f"{os.getpid()}:{proc.start_time(os.getpid())}",
                    LABEL_LEDGER: str(self._ledger.path.parent)},
            network_mode="none", volumes=volumes, working_dir="/", init=False, detach=True,
            log_config={"type": "json-file", "config": {}}, **self.template.create_options(self._gpu(rank)))

    def _gpu(self, rank: int) -> int | None:
        """The host GPU `rank`'s container gets as its only one (None: no GPU)."""
        return self.spec.gpus[rank] if self._gpus and self.spec.gpus else None

    def _create(self, rank: int) -> None:
        name = self.container_name(rank)
        with self._lock:
            entry = self._ledger.record("docker_container", name=name, run_id=self.spec.run_id,
                                        engine=self.engine_url)
        with translated(f"create container {name}"):
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
        self._launcher = self._launchers.take()
        start_control(self._launcher, self._ledger, topology.namespace_path(self.switch_ns), self.spec.run_dir,
                      self.store_port)

    # ranks
    def _config_path(self, rank: int) -> str:
        return str((self.spec.run_dir / "ranks" / f"{topology.host_name(rank)}.json").resolve())

    def start_rank(self, rank: int, config: dict) -> int:
        return self._start(rank, config, tapped=False)

    def start_job(self, rank: int, launch: dict) -> int:
        """The container's PID 1 runs the job (`harness.cluster.container`: a config that is a
        launch), as the netns rank launcher does: exec child, tap, the host's log."""
        if not self._mounts:
            raise HarnessError(f"your own job on the docker backend runs in the local test image, which "
                               f"bind-mounts this host's Python and project; {self.image} has its own: "
                               f"set {IMAGE_ENV}=local")
        log = str((self.spec.run_dir / "logs" / f"{topology.host_name(rank)}.log").resolve())
        # no hostname to set: the container has its own, which every container resolves
        return self._start(rank, {**launch, "rank": rank, "world": self.spec.ranks, "log": log,
                                   "ifname": self._layout[rank].ifname, "hostname": None},
                           tapped=True)

    def _start(self, rank: int, config: dict, tapped: bool) -> int:
        """Start the container of `rank` with `config` (a RankConfig or a job's launch, both
        with an `env`)."""
        if self._gpu(rank) is not None:  # its container sees its one GPU only, as device 0
            config = {**config, "env": {**config["env"], "CUDA_VISIBLE_DEVICES": "0"}}
        st = self._ranks[rank]
        if st.pid is not None and proc.start_time(st.pid) == st.started:
            raise HarnessError(f"{topology.host_name(rank)} is still running (pid {st.pid})")
        path = Path(self._config_path(rank))
        tmp = path.with_suffix(".tmp")
        tmp.touch(0o600)  # a job's launch holds the harness's environment
        tmp.write_text(json.dumps(config))
        os.replace(tmp, path)
        if st.runs:  # a restart: the old namespace (still pinned) and its veth go first
            topology.unplug(self.switch_ns, self._layout[rank])
            netlink.remove_namespace(self.namespace(rank))
        with translated(f"start container {st.name}"):
            self.client.api.start(st.name)
            pid = int(self.client.api.inspect_container(st.name)["State"]["Pid"])
        st.runs += 1
        st.tapped = tapped
        st.pid, st.started = (pid, proc.start_time(pid)) if pid else (None, None)
        if st.pid is None:
            return 0  # it ended before it could be seen; reap reports it
        try:
            # Pinned, the namespace outlives the rank's process as a netns host does: a killed
            # rank's address still answers (RST), its last FIN is delivered, and its port
            # stays on the bridge until teardown or a restart.
            topology.make_namespace(self._ledger, self.namespace(rank), pid)
            topology.plug(self.switch_ns, [self._layout[rank]], self._layout, dict(self.spec.sysctls))
        except ChaosError:
            if proc.start_time(pid) == st.started:
                raise
            # the process ended while it was wired: reap reports its exit
        return pid

    def pid(self, rank: int) -> int | None:
        st = self._ranks[rank]
        if st.pid is not None and proc.start_time(st.pid) == st.started:
            return st.pid
        return None

    def _exit_of(self, rank: int, pid: int, t: float) -> RankExit:
        """The exit of a container whose process is gone (asks the engine for the code)."""
        name = self._ranks[rank].name
        with translated(f"wait for {name}"):
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
        with translated(f"kill {name}"):
            try:
                self.client.api.kill(name, signal=int(signum))
            except Exception as exc:
                if not (not_found(exc) or conflict(exc)):  # gone or not running
                    raise

    def _unpause_all(self, ranks: list[int]) -> None:
        with translated("list paused containers"):
            paused = {c.name for c in self.client.containers.list(
                filters={"label": f"{LABEL_RUN}={self.spec.run_id}", "status": "paused"})}
        for r in ranks:
            if self._ranks[r].name in paused:
                undo_pause({"name": self._ranks[r].name, "engine": self.engine_url})

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
        if self._ranks[rank].tapped:
            return  # the job's tap wrote the log
        name = self._ranks[rank].name
        try:
            data = self.client.api.logs(name, stdout=True, stderr=True, timestamps=False)
        except Exception:  # noqa: BLE001  (best effort: a removed container has no log left)
            return
        (self.spec.run_dir / "logs" / f"{topology.host_name(rank)}.log").write_bytes(data)

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
                    launcher, self._launcher = self._launcher, None
                    self._launchers.give_back(launcher)
        finally:
            self._lease.release()
            undo_outstanding(self._ledger, undo_table())
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
    traits = Traits("a Docker container per rank on the harness's own switch",
                    needs_root=True, user_namespace=False, network_faults=True,
                    link_counters=True, host_sysctls=True, storage_faults=True)
    # From the first `start_rank` to the first step on every rank: each container imports
    # torch on its own (16 on 2 shared cores: 25-45 s measured); the netns backend forks
    # loaded ranks in well under a second. An orchestrator's warm-up deadline should allow it.
    start_timeout_s = 180.0

    @classmethod
    def why_not_here(cls) -> str | None:
        from chaos.probe import capabilities
        return super().why_not_here() or (None if capabilities().docker else capabilities().why_not("docker"))

    def __init__(self, compose_file: Path | str = COMPOSE_FILE, image: str | None = None,
                 gpus: bool | None = None) -> None:
        self.compose_file = Path(compose_file)
        self.image = image or os.environ.get(IMAGE_ENV) or None
        self.gpus = gpus

    def up(self, spec: ClusterSpec, ledger: Ledger, launchers: LauncherPool) -> DockerCluster:
        layout = topology.hosts_of(spec.run_id, spec.ranks)  # refuses more ranks than the network holds
        t0 = time.monotonic()
        template = RankTemplate.from_compose(self.compose_file)
        client = engine()
        try:
            image, mounts, python = resolve_image(client, self.image, template.image)
            gpus = self.gpus if self.gpus is not None else "nvidia" in (client.info().get("Runtimes") or {})
        except BaseException:
            client.close()
            raise
        for sub in ("logs", "ranks"):
            (spec.run_dir / sub).mkdir(parents=True, exist_ok=True)
        cluster = DockerCluster(spec, ledger, launchers, layout, client, template, image, mounts, python, gpus)
        try:
            share_below(str(spec.run_dir), ledger)
            cluster.build_switch()
            cluster.create_containers()
            cluster.start_control()
        except BaseException:
            cluster.close()
            raise
        cluster.timings["up_s"] = time.monotonic() - t0
        return cluster
