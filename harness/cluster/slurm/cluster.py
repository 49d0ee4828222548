"""The slurm backend: a trial's ranks on the nodes of a Slurm allocation, from a login node.

    allocation   sbatch of a placeholder batch script named chaos-<run id> (a batch job,
                 so that Slurm can requeue it), recorded in the ledger before it is
                 submitted; waited for with a deadline, saying why it is pending
    node agents  one per node, `srun --jobid J --nodelist NODE --overlap python -m
                 harness.cluster.slurm.agent`: the node's rank launcher (it forks the
                 node's ranks from one warm interpreter, as the other backends do) and its
                 faults; the harness talks to it through srun's standard input and output
    ranks        rank r on node r // ranks_per_node; the control plane (rendezvous store,
                 failure detector) on the first node
    events       the ranks write them into the run folder, which must be on a filesystem
                 every node mounts at the same path: each agent writes its facts there
                 first, and the bring-up stops with the fix where the harness cannot read them

The node agents' clocks are read against the harness's at bring-up; a node under another
kernel (another machine) gets its offset (half a round trip's precision), which its agent
hands to every process it starts, so that the events are written on the harness's clock
(runfolder.events); under one kernel the clock is one and the offset 0. Each node's offset
is in its facts (nodes/<node>.json). A link fault acts on the node's
interface, all its ranks at once, reverted by the agent itself at the end of its on-phase
(harness.cluster.slurm.agent). The teardown closes the agents' input (each kills its
ranks, reverts its faults and exits), then cancels the job.
"""
from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence

from chaos.api import AppliedFault, Host, Injection, Injector
from chaos.cmdfile import COMMAND_KINDS
from chaos.errors import DeadlineExceeded, HarnessError, UnsupportedFault
from chaos.faults import FaultBase, NodeDown, Preempt, Requeue
from chaos.inject import LedgerInjection, NetlinkInjector
from chaos.ledger import Entry, Ledger
from chaos.mechanism import Mechanism
from chaos.undotable import UndoTable
from chaos.undo import UNDOS as CHAOS_UNDOS, undo_outstanding
from harness.cluster.api import Backend, Cluster
from harness.cluster.spec import STORE_PORT, ClusterSpec, RankExit, Traits
from harness.cluster.launcher import PRELOAD_TIMEOUT_S, Launcher, LauncherPool, exit_of, wait_for_text
from harness.cluster.slurm import commands
from harness.cluster.slurm.undo import UNDOS
from harness.cluster.slurm.agent import LINK_KINDS, NODES_DIR, boot_id
from harness.job.control import LISTENING

ALLOCATION_TIMEOUT_S = 120.0
AGENTS_READY_TIMEOUT_S = 120.0  # every agent imports torch: 16 at once on 2 cores take ~40 s
REQUEST_TIMEOUT_S = 30.0        # an answer that crosses a link just back (TCP's backoff)
CLOSE_TIMEOUT_S = 10.0
REQUEUE_POLL_S = 0.5            # how often a trial waiting for a requeued job asks Slurm
JOB_PREFIX = "chaos-"


def job_name(run_id: str) -> str:
    return f"{JOB_PREFIX}{run_id}"


def placement(scheduler_args: Sequence[str]) -> list[str]:
    """The allocation's partition and account, for an srun on the same nodes."""
    words = list(scheduler_args)
    return [word for i, key in enumerate(words[:-1]) if key in ("--partition", "--account")
            for word in (key, words[i + 1])]


class SlurmCluster(Cluster):
    def __init__(self, spec: ClusterSpec, ledger: Ledger) -> None:
        self.spec = spec
        self._ledger = ledger
        per = spec.ranks_per_host
        if spec.ranks % per:
            raise HarnessError(f"{spec.ranks} ranks do not split into nodes of {per}")
        self.node_count = spec.ranks // per
        self.job_id: str | None = None
        self.nodes: list[str] = []
        self.agents: list[Launcher] = []
        self.offsets: list[float] = []   # node clock - harness clock, per node
        self.kernels: list[bool] = []    # per node: under the harness's own kernel (one machine)
        self.timings: dict[str, float] = {}
        self.hosts: tuple[Host, ...] = ()
        self._nodes_entry: Entry | None = None  # the nodes the agents run on (slurm_nodes)
        self.store_port = STORE_PORT
        self._gone: set[int] = set()     # nodes whose agent ended
        self.restarts = 0                # the job's restarts seen (Slurm's RestartCnt)
        self.requeue_expected = False    # a fault asked Slurm to start the job again
        self._next_look = 0.0            # when requeue_state asks Slurm again
        self.scheduler_problem = ""      # what a fault's delayed action (a preemption's end) met

    # -- bring-up ---------------------------------------------------------------------------
    def bring_up(self, say) -> None:
        began = time.monotonic()
        (self.spec.run_dir / "logs").mkdir(parents=True, exist_ok=True)
        try:
            commands.ping()
            self._allocate(say)
            allocated = time.monotonic()
            self._start_agents()
            agents = time.monotonic()
            self._start_control()
            self.timings = {"allocation_s": allocated - began, "agents_s": agents - allocated,
                            "control_s": time.monotonic() - agents}
        except BaseException:
            self.close()
            raise

    def _allocate(self, say) -> None:
        name = job_name(self.spec.run_id)
        # by name and with its slurm.conf: a heal from another shell still reaches the cluster
        self._ledger.mark(self._ledger.record("slurm_job", name=name, conf=commands.conf_path()), "done")
        # --exclusive: a node's faults (its link down) hit whatever else runs there, and its
        # ports (the control plane's, MASTER_PORT) would be shared; nodes of their own also
        # keep `chaos nightly --parallel`'s cells apart
        argv = ["sbatch", "--parsable", "--job-name", name, "--nodes", str(self.node_count), "--exclusive",
                "--ntasks-per-node", "1", "--output", "/dev/null", *self.spec.scheduler_args,
                "--wrap", "exec sleep infinity"]
        # A submission cut off (the harness SIGKILLed or stopped while sbatch ran) may still
        # register its job a moment later, after a cancel by name found none: its own entry,
        # whose undo waits for the job to show, taken back once sbatch has answered. And
        # sbatch dies with the harness rather than submit after its heal (bench/harness_kill.py:
        # 2 of 20 kills left a job holding every node, before both).
        in_flight = self._ledger.record("slurm_submission", name=name, conf=commands.conf_path())
        self._ledger.mark(in_flight, "done")
        self.job_id = commands.run(argv, dies_with_caller=True).strip().split(";")[0]
        self._ledger.mark(in_flight, "undone")
        deadline = time.monotonic() + ALLOCATION_TIMEOUT_S
        said = ""
        while True:
            state, reason, nodelist = commands.job_state(self.job_id)
            if state == "RUNNING":
                break
            if state not in ("PENDING", "CONFIGURING"):
                raise HarnessError(f"Slurm job {self.job_id} ({name}) is {state or 'gone'} before it ran "
                                   f"(reason {reason or 'none given'}); see `scontrol show job {self.job_id}`")
            if reason != said and reason not in ("None", ""):
                say(f"allocation: job {self.job_id} pending ({reason}); waiting up to {ALLOCATION_TIMEOUT_S:.0f} s")
                said = reason
            if time.monotonic() > deadline:
                raise DeadlineExceeded(
                    f"Slurm did not grant {self.node_count} nodes within {ALLOCATION_TIMEOUT_S:.0f} s (job "
                    f"{self.job_id} pending: {reason}); free nodes (`sinfo`), ask for fewer (--ranks, "
                    "cluster.ranks_per_node) or another --partition")
            time.sleep(0.2)
        self.nodes = commands.hostnames(nodelist)

    def _start_agents(self) -> None:
        run_dir = self.spec.run_dir
        # An agent killed before it took its faults back leaves them on its node, recorded in
        # the node's ledger there: a heal on those nodes, unless every agent ends clean
        self._nodes_entry = self._ledger.record(
            "slurm_nodes", name=job_name(self.spec.run_id), conf=commands.conf_path(), nodes=self.nodes,
            run_id=self.spec.run_id, python=sys.executable, placement=placement(self.spec.scheduler_args))
        self._ledger.mark(self._nodes_entry, "done")
        addresses = [commands.node_info(node).get("NodeAddr", node) for node in self.nodes]
        for node, address in zip(self.nodes, addresses, strict=False):
            argv = ["srun", "--jobid", self.job_id or "", "--nodelist", node, "--nodes", "1", "--ntasks", "1",
                    "--overlap", "--unbuffered", "--kill-on-bad-exit=0", "--job-name", job_name(self.spec.run_id),
                    "--error", str(run_dir / "logs" / f"agent-{node}.log"),
                    sys.executable, "-m", "harness.cluster.slurm.agent", "--run-id", self.spec.run_id,
                    "--run-dir", str(run_dir), "--address", address]
            self.agents.append(Launcher(self._ledger, argv=argv, remote=True,
                                        log=run_dir / "logs" / f"srun-{node}.log"))
        deadline = time.monotonic() + AGENTS_READY_TIMEOUT_S
        for node, agent in zip(self.nodes, self.agents, strict=False):
            left = deadline - time.monotonic()
            try:
                agent.wait_ready(max(left, 0.1))
            except HarnessError as exc:
                log = run_dir / "logs" / f"agent-{node}.log"
                tail = log.read_text(errors="replace").strip().splitlines()[-2:] if log.exists() else []
                raise HarnessError(f"the agent on {node} did not start ({exc}): {' | '.join(tail) or log}") from None
            if not (run_dir / NODES_DIR / f"{node}.json").exists():
                raise HarnessError(
                    f"the agent on {node} wrote {run_dir / NODES_DIR / (node + '.json')}, and the harness cannot "
                    "read it: the slurm backend needs the run folder (--out) on a filesystem every node mounts "
                    "at the same path (a shared home, NFS, Lustre); run from there")
            sent = time.monotonic()
            clock = agent.request({"op": "clock"}, REQUEST_TIMEOUT_S)
            # under one kernel one monotonic clock: exactly 0, not a round trip's noise
            same_kernel = clock["boot_id"] == boot_id()
            offset = 0.0 if same_kernel else clock["t"] - (sent + time.monotonic()) / 2
            self.kernels.append(same_kernel)
            agent.request({"op": "clock_offset", "offset": offset}, REQUEST_TIMEOUT_S)
            self.offsets.append(offset)
            facts = run_dir / NODES_DIR / f"{node}.json"
            facts.write_text(json.dumps({**json.loads(facts.read_text()), "clock_offset_s": offset}) + "\n")
        self.hosts = tuple(
            Host(name=f"r{rank:03d}", address=addresses[self.node_of(rank)], switch_ns=None, port=None,
                 ns_path=None, ifname=self.agents[self.node_of(rank)].hello["ifname"])
            for rank in range(self.spec.ranks))
        self.store_address = self.hosts[0].address

    def _start_control(self) -> None:
        log = self.spec.run_dir / "logs" / "control.log"
        from runfolder.heartbeats import HEARTBEAT_GAPS_FILE
        self.agents[0].spawn(self._ledger, "control", "control", None, str(log),
                             {"port": self.store_port, "host": "0.0.0.0",
                              "gaps": str(self.spec.run_dir / HEARTBEAT_GAPS_FILE)})
        wait_for_text(log, LISTENING, 20.0)

    # -- ranks ------------------------------------------------------------------------------
    def node_of(self, rank: int) -> int:
        return rank // self.spec.ranks_per_host

    def not_here(self, rank: int) -> str | None:
        node = self.node_of(rank)
        return None if self.kernels[node] else (f"on node {self.nodes[node]}, another machine: py-spy and "
                                                "signals reach this machine's processes only")

    def refuses(self, kind: str, rank: int) -> str | None:
        node = self.node_of(rank)
        why = self.agents[node].hello.get("kinds", {}).get(kind, "yes")  # kinds no node check covers: any node
        return None if why == "yes" else f"node {self.nodes[node]} does not allow it: {why}"

    def ranks_of(self, node: int) -> list[int]:
        per = self.spec.ranks_per_host
        return list(range(node * per, (node + 1) * per))

    def _agent(self, rank: int) -> Launcher:
        return self.agents[self.node_of(rank)]

    def start_rank(self, rank: int, config: dict) -> int:
        return self._spawn(rank, "rank", config)

    def start_job(self, rank: int, launch: dict) -> int:
        if launch["start"] == "preloaded":
            self._agent(rank).preload(launch["preload"], PRELOAD_TIMEOUT_S)
        return self._spawn(rank, "exec", {**launch, "rank": rank})

    def _spawn(self, rank: int, entry: str, config: dict) -> int:
        name = self.hosts[rank].name
        log = str(self.spec.run_dir / "logs" / f"{name}.log")
        return self._agent(rank).spawn(self._ledger, name, entry, None, log, config)

    def pid(self, rank: int) -> int | None:
        return self._agent(rank).pids.get(self.hosts[rank].name)

    def _exits(self, node: int, msgs: list[dict]) -> list[RankExit]:
        exits = []
        for msg in msgs:
            if msg["name"].startswith("r"):
                exits.append(exit_of(int(msg["name"][1:]), {**msg, "t": msg["t"] - self.offsets[node]}))
        return exits

    def reap(self) -> list[RankExit]:
        exits: list[RankExit] = []
        for node, agent in enumerate(self.agents):
            if node in self._gone:
                continue
            try:
                exits += self._exits(node, agent.exits())
            except HarnessError:  # the agent ended (Slurm killed its step): its ranks with it
                self._gone.add(node)
                now = time.monotonic()
                exits += [RankExit(rank, pid, None, signal.SIGKILL, now)
                          for rank in self.ranks_of(node) if (pid := agent.pids.pop(self.hosts[rank].name, None))]
        return exits

    def signal(self, rank: int, signum: int) -> None:
        self._agent(rank).request({"op": "signal", "target": self.hosts[rank].name, "signal": signum},
                                  REQUEST_TIMEOUT_S)

    def stop_ranks(self, deadline_s: float) -> list[RankExit]:
        live = [r for r in range(self.spec.ranks) if self.node_of(r) not in self._gone and self.pid(r)]
        for rank in live:
            try:
                self.signal(rank, signal.SIGTERM)
            except HarnessError:
                pass  # its agent cannot be reached; the close below ends it
        deadline = time.monotonic() + deadline_s
        exits: list[RankExit] = []
        killed = False
        while any(self.pid(r) for r in live if self.node_of(r) not in self._gone):
            if time.monotonic() > deadline:
                if killed:
                    break
                for rank in live:
                    if self.pid(rank):
                        for signum in (signal.SIGCONT, signal.SIGKILL):
                            try:
                                self.signal(rank, signum)
                            except HarnessError:
                                pass
                killed, deadline = True, time.monotonic() + deadline_s
            exits += self.reap()
            time.sleep(0.05)
        return exits

    def injector(self, ledger: Ledger, mechanisms: dict[str, Mechanism]) -> Injector:
        return AgentInjector(self, NetlinkInjector(ledger, {kind: mechanisms[kind] for kind in COMMAND_KINDS},
                                                   undos=CHAOS_UNDOS),
                             ledger)

    def requeue_state(self) -> str | None:
        """Once every rank ended: None when the job is over (no requeue was asked for, or
        Slurm ended it for good); "pending" while it is to start again (a preemption's
        grace, queued, starting); "ready" once it runs again and its agents and control
        plane are up, for the ranks to start."""
        if self.scheduler_problem:
            raise HarnessError(f"Slurm refused a fault's action: {self.scheduler_problem}")
        if not self.requeue_expected or self.job_id is None:
            return None
        if time.monotonic() < self._next_look:
            return "pending"
        self._next_look = time.monotonic() + REQUEUE_POLL_S
        state, reason, nodelist = commands.job_state(self.job_id)
        restarts = commands.restart_count(self.job_id)
        if restarts <= self.restarts:
            return "pending" if state in ("RUNNING", "COMPLETING", "PENDING", "REQUEUED", "CONFIGURING") else None
        if state != "RUNNING":
            return "pending" if state in ("PENDING", "REQUEUED", "REQUEUE_HOLD", "CONFIGURING", "COMPLETING") else None
        began = time.monotonic()
        self.restarts, self.requeue_expected = restarts, False
        for agent in self.agents:
            agent.close(1.0)
        self._forget_agents()
        self.nodes = commands.hostnames(nodelist)
        self._start_agents()
        self._start_control()
        self.timings = {**self.timings, "requeue_agents_s": time.monotonic() - began}
        return "ready"

    def _forget_agents(self) -> None:
        """The agents have ended: where each ended clean (its exit status says so), their nodes
        need no heal."""
        if self.agents and self._nodes_entry is not None and all(agent.returncode == 0 for agent in self.agents):
            self._ledger.mark(self._nodes_entry, "undone")
        self.agents, self.offsets, self.kernels, self._gone = [], [], [], set()

    def link_bytes(self) -> tuple[int, ...]:
        raise HarnessError("the slurm backend does not count a node's link bytes")

    def backlog_drops(self) -> int | None:
        return None

    def close(self) -> None:
        try:
            for agent in self.agents:
                agent.close_input()
            deadline = time.monotonic() + CLOSE_TIMEOUT_S
            for agent in self.agents:
                agent.close(max(0.1, deadline - time.monotonic()))
            self._forget_agents()
        finally:
            undo_outstanding(self._ledger, UndoTable.combine({"chaos": CHAOS_UNDOS, "slurm": UNDOS}))


class AgentInjection(Injection):
    def __init__(self, applied: AppliedFault, cluster: SlurmCluster, index: int, nodes: list[int]) -> None:
        self.applied = applied
        self._cluster = cluster
        self._index = index
        self._nodes = nodes
        self._t: float | None = None

    def revert(self) -> float:
        while self._nodes:
            node = self._nodes.pop()
            try:
                t = self._cluster.agents[node].request({"op": "revert", "id": self._index}, REQUEST_TIMEOUT_S)["t"]
            except HarnessError:  # the agent is gone (Slurm ended its step): it reverted on its way out
                continue
            self._t = max(self._t or 0.0, t - self._cluster.offsets[node])
        return self._t if self._t is not None else time.monotonic()


class AgentInjector(Injector):
    """Faults through the node agents: each applies on its node what is aimed at it."""

    def __init__(self, cluster: SlurmCluster, local: Injector, ledger: Ledger) -> None:
        self.cluster = cluster
        # the kinds a rank plays from a command file: the harness writes it into the run
        # folder, which every node shares, as on any backend
        self.local = local
        self.ledger = ledger
        self._count = 0

    def mechanism(self, fault: FaultBase) -> str:
        kind = fault.kind  # type: ignore[attr-defined]
        if kind in COMMAND_KINDS:
            return self.local.mechanism(fault)
        return SlurmBackend.planned_mechanism(fault) or kind

    def apply(self, fault: FaultBase, hosts: Sequence[Host], revert_after: float | None = None,
              heals_after: float | None = None) -> Injection:
        kind = fault.kind  # type: ignore[attr-defined]
        if kind in COMMAND_KINDS:
            return self.local.apply(fault, hosts, revert_after)
        if fault.acts_on == "scheduler" and kind != "slurmd_kill":
            return self._scheduler(fault, hosts)
        if kind == "slurmd_kill":  # the controller may end the job when it finds the node gone
            self.cluster.requeue_expected = True
        if fault.acts_on == "link" and kind not in LINK_KINDS:
            raise UnsupportedFault(f"{kind} cannot be injected on a Slurm node's own link")
        self._count += 1
        by_node: dict[int, list[str]] = {}
        for host in hosts:
            by_node.setdefault(self.cluster.node_of(int(host.name[1:])), []).append(host.name)
        t_requested, t_applied, mechanism, done = None, 0.0, "", []
        for node, names in by_node.items():
            answer = self.cluster.agents[node].request(
                {"op": "fault", "id": self._count, "fault": fault.model_dump(mode="json"), "targets": names,
                 "heals_after": heals_after, "revert_after": revert_after}, REQUEST_TIMEOUT_S)
            done.append(node)
            offset = self.cluster.offsets[node]
            t_requested = min(t_requested or answer["t_requested"] - offset, answer["t_requested"] - offset)
            t_applied = max(t_applied, answer["t"] - offset)
            mechanism = f"{answer['mechanism']} on {'node ' + self.cluster.nodes[node]}"
        # a link fault is the node's: it reaches every rank there, not only the targets
        reached = ([self.cluster.hosts[r].name for node in by_node for r in self.cluster.ranks_of(node)]
                   if fault.acts_on == "link" else [h.name for h in hosts])
        applied = AppliedFault(fault, tuple(reached), mechanism, t_applied, t_requested)
        return AgentInjection(applied, self.cluster, self._count, done if fault.reversible else [])


    def _scheduler(self, fault: FaultBase, hosts: Sequence[Host]) -> Injection:
        """What Slurm does, asked of Slurm: the signals of a preemption, a requeue, a node's state."""
        cluster, job = self.cluster, self.cluster.job_id or ""
        t_requested = time.monotonic()
        entries = []
        if isinstance(fault, Preempt):
            if fault.signal is not None:  # sbatch --signal's warning, to every task of every step
                commands.run(["scancel", f"--signal={fault.signal}", job])
            grace = fault.grace if fault.grace is not None else commands.config_seconds("KillWait", 30.0)
            end = ["scontrol", "requeue", job] if fault.requeue else ["scancel", job]
            cluster.requeue_expected = fault.requeue

            def preempt_now() -> None:  # as Slurm preempts: SIGCONT and SIGTERM to every task at once
                for name in ("CONT", "TERM"):
                    commands.run(["scancel", f"--signal={name}", job])
                _after(cluster, grace, lambda: commands.run(end))
            # at the grace's end each node's agent SIGKILLs its ranks' trees, then Slurm ends the job
            for agent in cluster.agents:
                agent.request({"op": "kill_after", "seconds": fault.lead + grace}, REQUEST_TIMEOUT_S)
            _after(cluster, fault.lead, preempt_now)
        elif isinstance(fault, Requeue):
            cluster.requeue_expected = True
            commands.run(["scontrol", "requeue", job])
        else:  # node_down, drain: the nodes of the target ranks
            state = "DOWN" if isinstance(fault, NodeDown) else "DRAIN"
            cluster.requeue_expected = state == "DOWN"
            for node in sorted({cluster.nodes[cluster.node_of(int(h.name[1:]))] for h in hosts}):
                entry = self.ledger.record("slurm_node_state", node=node, conf=commands.conf_path())
                commands.set_node_state(node, state, reason=f"chaos-{cluster.spec.run_id}")
                self.ledger.mark(entry, "done")
                entries.append(entry)
        applied = AppliedFault(fault, tuple(h.name for h in hosts), self.mechanism(fault), time.monotonic(),
                               t_requested)
        return LedgerInjection(applied, entries, self.ledger, UndoTable.combine({"slurm": UNDOS}))


def _after(cluster: SlurmCluster, seconds: float, action: Callable[[], object]) -> None:
    """`action` now, or on a timer thread `seconds` from now (a preemption's warning lead,
    its grace): the harness's loop goes on meanwhile, and hears of a failure at its next
    look at the job (`requeue_state`)."""
    if seconds <= 0:
        action()
        return

    def act() -> None:
        try:
            action()
        except HarnessError as exc:
            cluster.scheduler_problem = str(exc)
    timer = threading.Timer(seconds, act)
    timer.daemon = True
    timer.start()


class SlurmBackend(Backend):
    name = "slurm"
    traits = Traits("a Slurm allocation: a node agent per node, started by srun",
                    needs_root=False, user_namespace=False, network_faults=True,
                    link_counters=False, host_sysctls=False, link_kinds=LINK_KINDS, ranks_per_host=True,
                    scheduler_kinds=("preempt", "requeue", "node_down", "drain", "slurmd_kill"),
                    parallel_trials=True)
    start_timeout_s = ALLOCATION_TIMEOUT_S + AGENTS_READY_TIMEOUT_S

    @classmethod
    def planned_mechanism(cls, fault: object) -> str | None:
        kind = getattr(fault, "kind", "")
        if kind in ("kill", "pause"):
            return "a signal from the node's agent to the rank's process tree"
        if kind in LINK_KINDS:
            return "the node's agent, on the node's own interface (every rank of the node)"
        if kind == "preempt":
            return ("Slurm: scancel --signal (warning, SIGCONT, SIGTERM), SIGKILL after the grace (KillWait), "
                    "then scancel or scontrol requeue")
        if kind == "requeue":
            return "Slurm: scontrol requeue"
        if kind == "slurmd_kill":
            return "the node's agent: SIGKILL to the node's slurmd, started again as it was at the revert"
        if kind in ("node_down", "drain"):
            return f"Slurm: scontrol update state={'DOWN' if kind == 'node_down' else 'DRAIN'} of the ranks' nodes, RESUME after"
        return None

    @classmethod
    def why_not_here(cls) -> str | None:
        if not os.environ.get("SLURM_CONF") and not os.path.exists("/etc/slurm/slurm.conf"):
            return "no Slurm cluster configured (SLURM_CONF unset, no /etc/slurm/slurm.conf)"
        return None

    def up(self, spec: ClusterSpec, ledger: Ledger, launchers: LauncherPool) -> SlurmCluster:
        cluster = SlurmCluster(spec, ledger)
        cluster.bring_up(spec.say or (lambda text: None))
        return cluster

