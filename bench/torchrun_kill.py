"""TorchElastic (torchrun --max-restarts) against a SIGKILLed worker, beside our elastic policy.

    sudo flock /tmp/chaos-cpu.lock .venv/bin/python bench/torchrun_kill.py [--nodes 16] [--out DIR]

Builds the harness's namespace topology (chaos.topology: switch `chaos-<run>-sw` with br0
10.77.0.1, one namespace per node with eth0 10.77.0.(10+n)), every namespace in the run's
ledger. A c10d rendezvous store runs on the switch (10.77.0.1:29400); one torchrun agent per
node namespace (`--nnodes=N --nproc-per-node=1 --max-restarts=3 --rdzv-backend=c10d`),
each worker the harness's MLP (harness.job.workload) with a gloo all-reduce, paced to 4 steps/s.

The job writes a normal run folder (runfolder) at --out: run.json, trials/torchrun/ with
trial.json (the plan: SIGKILL node 5's worker after warm-up) and events.jsonl, as the
harness's own trials do. Each worker writes rank events for its node (rank = node number):
rank_start, group_ready, step, collective_error and exit crashed on a gloo error, and
restored (source initial: a restarted worker begins again at step 0). The driver writes the
harness events: trial_start, warmup_done, fault_applied, rank_exited when a worker process
is gone, trial_end; and, for each survivor, a `suspect` (via agent) at the first line its
torchrun agent logged about restarting the group: TorchElastic's failure detector. So
`chaos report DIR` (reports.metrics) measures it like any trial: time to detect, first and
last node; time to recover (every node stepping again, from the kill); wasted rank-seconds;
steps rolled back. This bench prints the restart's phases from the same events and the
agents' logs (trials/torchrun/logs/agentNNN.log).
Options for the restart's rendezvous/store wiring (the default is the setup above):
  --no-share-store  TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 in the agents' environment: the
                    workers do not reuse the agent's rendezvous TCPStore; each round's rank-0
                    worker hosts a fresh store at MASTER_ADDR/MASTER_PORT (node 0's address,
                    a free port chosen per round).
  --rdzv-on-node0   no separate store on the switch: --rdzv-endpoint=10.77.0.10:29400 and
                    torchrun's c10d backend hosts the store in node 0's agent
                    (--rdzv-conf=is_host=true there, is_host=false elsewhere). Node 0 is not
                    the victim, so the store outlives the fault.
Measured here (16 nodes, one run each): with torchrun's defaults every survivor knows within
0.13-0.46 s, but all three restarts fail forming the gloo group ("connectFullMesh ...
Connection refused": the workers reuse the agent's store, whose keys outlive the round) and
an agent gives up after ~60 s; with --no-share-store the job recovers after one restart,
all 16 ranks stepping again 13.6 s after the kill (most of it: 16 workers importing torch
at once on 2 cores), 217 rank-s wasted; --rdzv-on-node0 alone fails like the default.
Ends (also on error or Ctrl-C) by stopping agents, workers and store and removing every
namespace through the ledger. With `--worker` this file is the worker torchrun starts.
"""
from __future__ import annotations

import argparse
import datetime
import math
import os
import re
import secrets
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from runfolder import events as kinds  # noqa: E402  (standard library only: light in every worker)
from runfolder.events import EVENTS_FILE, EventRecorder, read_events  # noqa: E402
from runfolder.info import RunInfo, TrialInfo, write_run_info, write_trial_info  # noqa: E402
from runfolder.layout import LOGS_DIR, TORCHRUN_LOGS_DIR, trial_dir  # noqa: E402
from runfolder.plan import APPLY, Action, PlannedFault, TrialPlan  # noqa: E402

STORE_PORT = 29400
STEP_PERIOD = 0.25
VICTIM = 5
WARMUP_STEPS = 12
SETTLE_STEPS = 8
DOCUMENT = {"ttd": 15.0, "ttr": 12.0, "breaker": 30.0}
POLICY = "torchrun"  # the trial's name in the run folder
KILL = {"kind": "kill", "signal": signal.SIGKILL.value}
# an agent's first line about its worker group failing: TorchElastic noticed
AGENT_NOTICED = r"will restart worker group|Stopping worker group"


# ----------------------------------------------------------------------------- worker
def worker_main(events_path: Path) -> None:
    t_boot = time.monotonic()
    node = int(os.environ["CHAOS_NODE"])
    gen = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    recorder = EventRecorder(events_path, kinds.RANK, node)
    recorder.emit(kinds.RANK_START, t=t_boot, policy=POLICY, world=int(os.environ["WORLD_SIZE"]))
    import torch
    import torch.distributed as dist

    from harness.job.config import WorkloadSpec
    from harness.job.group import classify
    from harness.job.workload import Workload
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    recorder.emit(kinds.GROUP_READY, gen=gen, world=world, group_rank=rank,
                  secs=round(time.monotonic() - t_boot, 3))  # most of it: importing torch
    work = Workload(WorkloadSpec(step_period=STEP_PERIOD), seed=1, rank=rank)
    if gen:  # a restarted worker keeps no state: it begins again from the seeded weights
        recorder.emit(kinds.RESTORED, step=0, gen=gen, source="initial")
    tick = time.monotonic()
    step = work.step
    try:
        while True:
            step, started = work.step, time.monotonic()
            loss = work.train_step(lambda t: dist.all_reduce(t), world)
            recorder.emit(kinds.STEP, step=step, gen=gen, loss=round(loss, 5), dur=round(time.monotonic() - started, 4))
            tick += STEP_PERIOD
            now = time.monotonic()
            if tick > now:
                time.sleep(tick - now)
            else:
                tick = now
    except Exception as exc:  # a gloo error: say so, then fail like an unhandled error
        error = str(exc)[:200]
        recorder.emit(kinds.COLLECTIVE_ERROR, step=step, gen=gen, phase="step", cause=classify(error), error=error)
        recorder.emit(kinds.EXIT, reason="crashed", code=1, error=error)
        os._exit(1)


# ----------------------------------------------------------------------------- driver
def proc_state(pid: int) -> str | None:
    """The /proc state letter, None when the pid is gone."""
    try:
        return open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return None


def ppid_of(pid: int) -> int | None:
    try:
        return int(open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[1])
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return None


def pids_in_namespaces(inodes: set[int]) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != os.getpid():
            try:
                if os.stat(f"/proc/{entry}/ns/net").st_ino in inodes:
                    found.append(int(entry))
            except (FileNotFoundError, PermissionError, ProcessLookupError):
                pass
    return found


class Agent:
    """One torchrun agent's output, each line stamped on arrival with time.monotonic()."""

    def __init__(self, node: int, popen: subprocess.Popen, log_path: Path) -> None:
        self.node, self.popen = node, popen
        self.lines: list[tuple[float, str]] = []
        self._log = open(log_path, "w")
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        for raw in self.popen.stdout:
            t = time.monotonic()
            line = raw.decode(errors="replace").rstrip()
            self.lines.append((t, line))
            self._log.write(f"{t:.3f} {line}\n")
            self._log.flush()

    def first(self, pattern: str, after: float) -> float:
        rx = re.compile(pattern)
        return next((t for t, line in list(self.lines) if t >= after and rx.search(line)), math.nan)


class Events:
    """Tails the trial's events file: the workers' events, by node."""

    def __init__(self, path: Path, nodes: int) -> None:
        self.path = path
        self.offset = 0
        self.by_node: list[list[dict]] = [[] for _ in range(nodes)]

    def poll(self) -> None:
        new, self.offset = read_events(self.path, self.offset)
        for event in new:
            if event["src"] == kinds.RANK:
                self.by_node[event["rank"]].append(event)

    def of(self, n: int, kind: str, after: float = -math.inf, exclude_pid: int | None = None) -> list[dict]:
        return [e for e in self.by_node[n] if e["kind"] == kind and e["t"] >= after and e["pid"] != exclude_pid]

    def current_pid(self, n: int) -> int | None:
        starts = self.of(n, kinds.RANK_START)
        return starts[-1]["pid"] if starts else None

    def last_node(self, kind: str, after: float, old: list[int | None]) -> float:
        """When the last node had a new worker's first `kind` event after `after` (NaN if one never did)."""
        firsts = [min((e["t"] for e in self.of(n, kind, after, old[n])), default=math.nan)
                  for n in range(len(self.by_node))]
        return max(firsts) - after if not any(math.isnan(t) for t in firsts) else math.nan


def wait_until(cond, cap_s: float, what: str, tick, alive) -> float:
    deadline = time.monotonic() + cap_s
    while time.monotonic() < deadline:
        tick()
        if cond():
            return time.monotonic()
        dead = alive()
        if dead:
            raise RuntimeError(f"while waiting for {what}: {dead}")
        time.sleep(0.02)
    raise TimeoutError(f"{what}: not within {cap_s:.0f} s")


def fmt(x: float) -> str:
    return "-" if x is None or math.isnan(x) else f"{x:.2f} s"


def torchrun_plan(nodes: int, no_share_store: bool, rdzv_on_node0: bool, recover_cap: float) -> TrialPlan:
    """The trial as a plan: SIGKILL the worker of node VICTIM right after warm-up."""
    kill = PlannedFault(index=0, kind="kill", fault=KILL, description=f"kill(signal={KILL['signal']})",
                        targets=(VICTIM,), start=0.0, duration=None)
    spec = {"name": POLICY, "base": POLICY, "max_restarts": 3, "rdzv_backend": "c10d",
            "no_share_store": no_share_store, "rdzv_on_node0": rdzv_on_node0}
    return TrialPlan(policy=POLICY, policy_spec=spec, workload={"step_period": STEP_PERIOD}, ranks=nodes,
                     seed=1, warmup_steps=WARMUP_STEPS, settle_steps=SETTLE_STEPS, hang_cap=recover_cap,
                     faults=(kill,), actions=(Action(0.0, APPLY, 0),), expect=None)


def measure(nodes: int = 16, out: Path | None = None, no_share_store: bool = False,
            rdzv_on_node0: bool = False, start_cap: float = 240.0,
            recover_cap: float = 240.0) -> Path:
    """One torchrun job, one SIGKILL, written as a run folder at `out` (returned); prints
    the phases of the restart."""
    from chaos import netlink
    from chaos.undo import record_owner
    from chaos.ledger import Ledger
    from chaos.mechanism import record_process
    from harness.cluster.spec import ClusterSpec
    from chaos.topology import SWITCH_ADDRESS
    from harness.cluster.netns import NetnsCluster

    run_id = secrets.token_hex(3)
    out = out or Path(tempfile.mkdtemp(prefix="bench-torchrun-"))
    trial = trial_dir(out, POLICY)
    (trial / LOGS_DIR).mkdir(parents=True, exist_ok=True)
    write_run_info(out, RunInfo(
        scenario="torchrun_kill", scenario_file=str(Path(__file__).resolve()), seed=1, backend="netns",
        policies=(POLICY,), started_wall=datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        command=shlex.join([sys.executable, *sys.argv]), clock="monotonic, one kernel shared by every rank"))
    write_trial_info(trial, TrialInfo(plan=torchrun_plan(nodes, no_share_store, rdzv_on_node0, recover_cap),
                                      run_id=run_id, backend="netns", mono_anchor=time.monotonic(),
                                      wall_anchor=time.time()))
    events_path = trial / EVENTS_FILE
    recorder = EventRecorder(events_path, kinds.HARNESS)
    t_started = recorder.emit(kinds.TRIAL_START, policy=POLICY, ranks=nodes, run_id=run_id, backend="netns",
                              hang_cap=recover_cap)
    ledger = Ledger(run_id)
    record_owner(ledger)
    cluster = NetnsCluster(ClusterSpec(run_id=run_id, ranks=nodes, run_dir=trial), ledger)
    agents: list[Agent] = []
    store: subprocess.Popen | None = None
    worker_pids: set[int] = set()
    namespaces = [cluster.switch_ns] + [Path(h.ns_path).name for h in cluster.hosts]
    end, t_end = "error", None
    print(f"run {run_id}: {nodes} torchrun nodes"
          + ("" if nodes == 16 else f" (NOT 16: --nodes {nodes})") + f", run folder {out}", flush=True)
    try:
        cluster.build()
        up = recorder.emit(kinds.CLUSTER_UP, secs=round(time.monotonic() - t_started, 3))
        print(f"namespaces built in {up - t_started:.2f} s", flush=True)
        env = {**os.environ, "GLOO_SOCKET_IFNAME": "eth0", "OMP_NUM_THREADS": "1",
               "LOGLEVEL": "INFO", "PYTHONUNBUFFERED": "1", "PYTHONPATH": str(REPO)}
        if no_share_store:
            env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"
        rdzv_addr = cluster.hosts[0].address if rdzv_on_node0 else SWITCH_ADDRESS
        print(f"rendezvous endpoint {rdzv_addr}:{STORE_PORT} ("
              + ("node 0's agent" if rdzv_on_node0 else "separate store on the switch")
              + "); workers " + ("get their own store (TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1)"
                                 if no_share_store else "share the agent's store"),
              flush=True)
        store_code = ("import sys,time,torch.distributed as d;"
                      f"s=d.TCPStore('{SWITCH_ADDRESS}',{STORE_PORT},is_master=True,"
                      "wait_for_workers=False);print('store ready',flush=True);time.sleep(1e9)")
        if not rdzv_on_node0:
            store = subprocess.Popen(["ip", "netns", "exec", cluster.switch_ns, sys.executable,
                                      "-c", store_code], env=env, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, start_new_session=True)
            record_process(ledger, store.pid)
            said = []
            for raw in store.stdout:  # a c10d warning may come first
                said.append(raw.decode(errors="replace").rstrip())
                if "store ready" in said[-1]:
                    break
            else:
                raise RuntimeError(f"the rendezvous store did not start: {said[-5:]}")
        t_launch = time.monotonic()
        for n, host in enumerate(cluster.hosts):
            cmd = ["ip", "netns", "exec", Path(host.ns_path).name, sys.executable, "-m",
                   "torch.distributed.run", f"--nnodes={nodes}", "--nproc-per-node=1",
                   "--max-restarts=3", "--rdzv-backend=c10d",
                   f"--rdzv-endpoint={rdzv_addr}:{STORE_PORT}", f"--rdzv-id={run_id}",
                   f"--local-addr={host.address}", f"--log-dir={trial / LOGS_DIR / TORCHRUN_LOGS_DIR / host.name}"]
            if rdzv_on_node0:
                cmd.append(f"--rdzv-conf=is_host={'true' if n == 0 else 'false'}")
            cmd += [str(Path(__file__).resolve()), "--worker", "--events", str(events_path)]
            p = subprocess.Popen(cmd, env={**env, "CHAOS_NODE": str(n)}, stdin=subprocess.DEVNULL,
                                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                 start_new_session=True)
            record_process(ledger, p.pid)
            recorder.emit(kinds.RANK_SPAWNED, rank=n, pid=p.pid)  # the node's agent
            agents.append(Agent(n, p, trial / LOGS_DIR / f"agent{n:03d}.log"))
        ev = Events(events_path, nodes)

        def tick() -> None:
            ev.poll()
            for n in range(nodes):
                pid = ev.current_pid(n)
                if pid is not None and pid not in worker_pids:
                    worker_pids.add(pid)
                    if proc_state(pid) not in (None, "Z"):
                        record_process(ledger, pid)

        def dead_agents() -> str:
            gone = [a.node for a in agents if a.popen.poll() is not None]
            return f"agents of nodes {gone} exited" if gone else ""

        wait_until(lambda: all(ev.of(n, kinds.STEP) for n in range(nodes)), start_cap,
                   "all workers stepping", tick, dead_agents)
        t_all = time.monotonic()
        print(f"all {nodes} workers stepping {t_all - t_launch:.1f} s after the agents started",
              flush=True)
        wait_until(lambda: all(len(ev.of(n, kinds.STEP)) >= WARMUP_STEPS for n in range(nodes)), 60,
                   "warm-up", tick, dead_agents)
        recorder.emit(kinds.WARMUP_DONE, step=min(ev.of(n, kinds.STEP)[-1]["step"] for n in range(nodes)))
        old = [ev.current_pid(n) for n in range(nodes)]
        victim = old[VICTIM]
        assert victim is not None and ppid_of(victim) == agents[VICTIM].popen.pid, "victim is not the agent's worker"
        t_requested = time.monotonic()
        os.kill(victim, signal.SIGKILL)
        t0 = recorder.emit(kinds.FAULT_APPLIED, t_requested=round(t_requested, 6), index=0, fault_kind="kill",
                           fault=KILL, targets=[VICTIM], mechanism="SIGKILL of the worker (its agent left alone)")
        print(f"SIGKILL worker pid {victim} of node {VICTIM} (agent pid "
              f"{agents[VICTIM].popen.pid} left alone)", flush=True)

        gone: set[int] = set()

        def tick_after() -> None:
            tick()
            for n, pid in enumerate(old):
                if n not in gone and proc_state(pid) in (None, "Z"):  # type: ignore[arg-type]
                    gone.add(n)
                    recorder.emit(kinds.RANK_EXITED, rank=n, pid=pid, exitcode=None,
                                  signal=signal.SIGKILL.value if n == VICTIM else None)

        def recovered() -> bool:
            return all(len(ev.of(n, kinds.STEP, t0, exclude_pid=old[n])) >= SETTLE_STEPS for n in range(nodes))

        try:
            wait_until(recovered, recover_cap, "all workers stepping again", tick_after, dead_agents)
            end = "settled"
        except (TimeoutError, RuntimeError) as exc:
            end = "deadline"
            print(f"NOT recovered: {exc}", flush=True)
        t_end = time.monotonic()
        tick_after()
        for n, agent in enumerate(agents):  # TorchElastic's detector: the agent stops the group
            noticed = agent.first(AGENT_NOTICED, t0)
            if n != VICTIM and not math.isnan(noticed):
                EventRecorder(events_path, kinds.RANK, n).emit(
                    kinds.SUSPECT, t=noticed, peer=None, via="agent", cause="agent", silent_s=None,
                    gen=old_generation(ev, n, old[n]), waited_s=None)
        print_phases(ev, agents, t0, old)
        return out
    finally:
        recorder.emit(kinds.TRIAL_END, t=t_end, reason=end)  # t_end: when it stopped watching
        recorder.close()
        teardown(agents, store, worker_pids, namespaces, cluster, ledger, netlink)


def old_generation(ev: Events, node: int, pid: int | None) -> int:
    ready = [e for e in ev.of(node, kinds.GROUP_READY) if e["pid"] == pid]
    return ready[-1]["gen"] if ready else 0


def print_phases(ev: Events, agents: list[Agent], t0: float, old: list[int | None]) -> None:
    """The restart, phase by phase, from the events and the agents' logs (last node of each)."""
    nodes = len(agents)
    errors = sorted(n for n in range(nodes) if ev.of(n, kinds.COLLECTIVE_ERROR, t0))
    victim_agent = agents[VICTIM].first(r"Worker group FAILED", t0) - t0
    rdzv = [agent.first(r"joined round|restart_count=[1-9]", t0) for agent in agents]
    rdzv_last = max(rdzv) - t0 if not any(math.isnan(x) for x in rdzv) else math.nan
    print(f"gloo errors seen by nodes {errors}; node {VICTIM}'s agent saw its worker fail at {fmt(victim_agent)}")
    print(f"restart phases (last node): new rendezvous round joined {fmt(rdzv_last)}, new workers "
          f"booted {fmt(ev.last_node(kinds.RANK_START, t0, old))}, gloo group "
          f"{fmt(ev.last_node(kinds.GROUP_READY, t0, old))}, first step {fmt(ev.last_node(kinds.STEP, t0, old))}")
    boot_to_group = [e["secs"] for n in range(nodes) for e in ev.of(n, kinds.GROUP_READY, t0, old[n])]
    if boot_to_group:
        print(f"new workers from boot to gloo group (importing torch, most of it): median "
              f"{statistics.median(boot_to_group):.1f} s, max {max(boot_to_group):.1f} s "
              f"({nodes} at once on {os.cpu_count()} cores)")
    restarts = {len({e["pid"] for e in ev.of(n, kinds.RANK_START, t0)}) for n in range(nodes)}
    print(f"worker processes started per node after the kill: {sorted(restarts)} (the new workers "
          "start from step 0: this worker keeps no checkpoint)")


def teardown(agents, store, worker_pids, namespaces, cluster, ledger, netlink) -> None:
    """SIGTERM the agents (they stop their workers), then SIGKILL whatever is left in the
    run's namespaces, then undo the ledger (processes, namespaces)."""
    for a in agents:
        if a.popen.poll() is None:
            os.kill(a.popen.pid, signal.SIGTERM)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(a.popen.poll() is None for a in agents):
        time.sleep(0.05)
    inodes = netlink.namespace_inodes(namespaces)
    for _ in range(50):
        left = set(pids_in_namespaces(inodes)) | {p for p in worker_pids
                                                    if proc_state(p) not in (None, "Z")}
        for p in [a.popen for a in agents] + ([store] if store else []):
            if p.poll() is None:
                left.add(p.pid)
        if not left:
            break
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for p in [a.popen for a in agents] + ([store] if store else []):
            try:
                p.wait(timeout=0.1)
            except subprocess.TimeoutExpired:
                pass
        time.sleep(0.1)
    cluster.close()  # undo the ledger: every process entry, every namespace
    if not ledger.close_if_clean():
        print(f"ledger {ledger.path} still has outstanding entries: run "
              f"`chaos heal --run-id {ledger.run_id}`", file=sys.stderr)
    print(f"torn down: namespaces left of this run: "
          f"{[n for n in netlink.list_namespaces() if n in namespaces]}", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=16)
    parser.add_argument("--out", type=Path, default=None, help="the run folder (default: a temporary folder)")
    parser.add_argument("--start-cap", type=float, default=240.0,
                        help="seconds for every first worker to step")
    parser.add_argument("--recover-cap", type=float, default=240.0,
                        help="seconds after the kill for every new worker to step")
    parser.add_argument("--no-share-store", action="store_true",
                        help="TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1: workers get their own "
                             "MASTER_ADDR/PORT store instead of the agent's rendezvous store")
    parser.add_argument("--rdzv-on-node0", action="store_true",
                        help="rendezvous endpoint on node 0 (10.77.0.10:29400), hosted by node "
                             "0's torchrun agent; no separate store on the switch")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--events", type=Path, help=argparse.SUPPRESS)  # a worker's events file
    args = parser.parse_args(argv)
    if args.worker:
        worker_main(args.events)
        return 0
    if args.nodes <= VICTIM:
        parser.error(f"need more than {VICTIM} nodes")
    import reports
    from harness import signals
    signals.install()  # SIGTERM tears the job down like Ctrl-C
    run_dir = measure(args.nodes, args.out, args.no_share_store, args.rdzv_on_node0,
                      args.start_cap, args.recover_cap)
    row = reports.analyze_run(run_dir).iloc[0]  # the harness's definitions (reports.metrics)
    print(f"\noutcome {row['outcome']}: {row['outcome_reason']}")
    print(f"\nSIGKILL of one worker (node {VICTIM}), {args.nodes} nodes"
          + ("" if args.nodes == 16 else " -- NOT the 16-node job") + ":\n")
    head = ("", "every survivor knows", f"all {args.nodes} ranks step again", "wasted rank-s",
            "15 s / x (TTD)", "12 s / x (stepping)")
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    ratio = lambda d, x: "-" if not x or math.isnan(x) else f"{d / x:.0f}x"
    print(f"| torchrun --max-restarts=3 (c10d) | first {fmt(row['ttd_s'])}, last {fmt(row['ttd_max_s'])} | "
          f"{fmt(row['ttr_s'])} ({row['steps_rolled_back']:.0f} steps rolled back) | {row['wasted_rank_s']:.1f} | "
          f"{ratio(DOCUMENT['ttd'], row['ttd_max_s'])} | {ratio(DOCUMENT['ttr'], row['ttr_s'])} |")
    print(f"\nrun folder {run_dir} (`chaos report {run_dir}` writes its reports); the harness's policies "
          "on the same fault, side by side: bench/detector.py --faults kill --policies torchrun,timeout,elastic")
    return 0 if row["outcome"] == "recovered" else 1


if __name__ == "__main__":
    sys.exit(main())
