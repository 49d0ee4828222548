"""TorchElastic (torchrun --max-restarts) against a SIGKILLed worker, beside our elastic policy.

    sudo flock /tmp/chaos-cpu.lock .venv/bin/python bench/torchrun_kill.py [--nodes 16] [--out DIR]

Builds the harness's namespace topology (harness.cluster.netns: switch `chaos-<run>-sw` with br0
10.77.0.1, one namespace per node with eth0 10.77.0.(10+n)), every namespace in the run's
ledger. A c10d rendezvous store runs on the switch (10.77.0.1:29400); one torchrun agent per
node namespace (`--nnodes=N --nproc-per-node=1 --max-restarts=3 --rdzv-backend=c10d`),
each worker the harness's MLP (harness.job.workload) with a gloo all-reduce, paced to 4 steps/s,
writing one JSON line per event with time.monotonic() (one clock: one kernel).

After warm-up (every worker stepping), the worker process of node 5 (not its agent) gets
SIGKILL. Measured from the kill:
  noticed   per survivor, the first of: its worker's gloo error, its old worker process
            gone (polled every 20 ms), its agent logging the restart. First / last node.
  restart   every node's agent joined the new rendezvous round; every new worker booted,
            imported torch, formed the gloo group, and stepped (last node).
  wasted    rank-seconds without step progress from the kill until the end of the window,
            the harness's way (gaps > 3x the median pre-fault step interval).
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
import json
import math
import os
import re
import secrets
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

STORE_PORT = 29400
STEP_PERIOD = 0.25
VICTIM = 5
WARMUP_STEPS = 12
SETTLE_STEPS = 8
DOCUMENT = {"ttd": 15.0, "ttr": 12.0, "breaker": 30.0}


# ----------------------------------------------------------------------------- worker
def worker_main(out: Path) -> None:
    t_boot = time.monotonic()
    node = int(os.environ["CHAOS_NODE"])
    gen = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    log = open(out / f"node{node:03d}.jsonl", "a", buffering=1)

    def emit(kind: str, **kw) -> None:
        log.write(json.dumps({"e": kind, "node": node, "gen": gen, "pid": os.getpid(),
                              "t": time.monotonic(), **kw}) + "\n")

    emit("boot", t_boot=t_boot)
    import torch
    import torch.distributed as dist

    from harness.job.workload import Workload, WorkloadSpec
    torch.set_num_threads(1)
    emit("imported")
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    emit("pg", rank=rank, world=world)
    work = Workload(WorkloadSpec(step_period=STEP_PERIOD), seed=1, rank=rank)
    tick = time.monotonic()
    try:
        while True:
            work.train_step(lambda t: dist.all_reduce(t), world)
            emit("step", step=work.step, rank=rank)
            tick += STEP_PERIOD
            now = time.monotonic()
            if tick > now:
                time.sleep(tick - now)
            else:
                tick = now
    except Exception as exc:  # a gloo error: say so, then fail like an unhandled error
        emit("error", msg=str(exc)[:200])
        log.flush()
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
    """Tails the workers' JSON-lines files."""

    def __init__(self, out: Path, nodes: int) -> None:
        self.paths = [out / f"node{n:03d}.jsonl" for n in range(nodes)]
        self.offsets = [0] * nodes
        self.by_node: list[list[dict]] = [[] for _ in range(nodes)]

    def poll(self) -> None:
        for n, path in enumerate(self.paths):
            try:
                with open(path, "rb") as f:
                    f.seek(self.offsets[n])
                    data = f.read()
            except FileNotFoundError:
                continue
            end = data.rfind(b"\n") + 1
            self.offsets[n] += end
            for line in data[:end].splitlines():
                try:
                    self.by_node[n].append(json.loads(line))
                except json.JSONDecodeError:
                    pass

    def steps(self, n: int, pid: int | None = None, exclude_pid: int | None = None,
              after: float = -math.inf) -> list[dict]:
        return [e for e in self.by_node[n] if e["e"] == "step" and e["t"] >= after
                and (pid is None or e["pid"] == pid) and e["pid"] != exclude_pid]

    def current_pid(self, n: int) -> int | None:
        boots = [e for e in self.by_node[n] if e["e"] == "boot"]
        return boots[-1]["pid"] if boots else None


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


def waste(step_times: list[float], lo: float, hi: float, threshold: float) -> float:
    """Sum of gaps between consecutive steps longer than `threshold`, clipped to [lo, hi]."""
    before = [t for t in step_times if t < lo]
    marks = ([before[-1]] if before else [lo]) + [t for t in step_times if lo <= t <= hi] + [hi]
    total = 0.0
    for a, b in zip(marks, marks[1:]):
        if b - a > threshold:
            total += min(b, hi) - max(a, lo)
    return total


def fmt(x: float) -> str:
    return "-" if x is None or math.isnan(x) else f"{x:.2f} s"


def measure(nodes: int = 16, out: Path | None = None, no_share_store: bool = False,
            rdzv_on_node0: bool = False, start_cap: float = 240.0,
            recover_cap: float = 240.0) -> dict:
    """One torchrun job, one SIGKILL: prints the phases and returns the figures."""
    from chaos import netlink
    from chaos.inject import record_owner
    from chaos.ledger import Ledger
    from chaos.mechanism import record_process
    from harness.cluster.api import ClusterSpec
    from harness.cluster.netns import SWITCH_ADDRESS, NetnsCluster

    run_id = secrets.token_hex(3)
    out = out or Path(tempfile.mkdtemp(prefix="bench-torchrun-"))
    out.mkdir(parents=True, exist_ok=True)
    (out / "logs").mkdir(exist_ok=True)
    ledger = Ledger(run_id)
    record_owner(ledger)
    cluster = NetnsCluster(ClusterSpec(run_id=run_id, ranks=nodes, run_dir=out), ledger)
    agents: list[Agent] = []
    store: subprocess.Popen | None = None
    worker_pids: set[int] = set()
    namespaces = [cluster.switch_ns] + [Path(h.ns_path).name for h in cluster.hosts]
    print(f"run {run_id}: {nodes} torchrun nodes"
          + ("" if nodes == 16 else f" (NOT 16: --nodes {nodes})") + f", files in {out}", flush=True)
    try:
        t = time.monotonic()
        cluster.build()
        print(f"namespaces built in {time.monotonic() - t:.2f} s", flush=True)
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
                   f"--local-addr={host.address}"]
            if rdzv_on_node0:
                cmd.append(f"--rdzv-conf=is_host={'true' if n == 0 else 'false'}")
            cmd += [str(Path(__file__).resolve()), "--worker", "--out", str(out)]
            p = subprocess.Popen(cmd, env={**env, "CHAOS_NODE": str(n)}, stdin=subprocess.DEVNULL,
                                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                 start_new_session=True)
            record_process(ledger, p.pid)
            agents.append(Agent(n, p, out / "logs" / f"agent{n:03d}.log"))
        ev = Events(out, nodes)

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

        wait_until(lambda: all(ev.steps(n) for n in range(nodes)), start_cap,
                   "all workers stepping", tick, dead_agents)
        t_all = time.monotonic()
        print(f"all {nodes} workers stepping {t_all - t_launch:.1f} s after the agents started",
              flush=True)
        wait_until(lambda: all(len(ev.steps(n)) >= WARMUP_STEPS for n in range(nodes)), 60,
                   "warm-up", tick, dead_agents)
        old = [ev.current_pid(n) for n in range(nodes)]
        victim = old[VICTIM]
        assert ppid_of(victim) == agents[VICTIM].popen.pid, "victim is not the agent's worker"
        os.kill(victim, signal.SIGKILL)
        t0 = time.monotonic()
        print(f"SIGKILL worker pid {victim} of node {VICTIM} (agent pid "
              f"{agents[VICTIM].popen.pid} left alone)", flush=True)

        exit_t: dict[int, float] = {}

        def tick_after() -> None:
            tick()
            now = time.monotonic()
            for n, pid in enumerate(old):
                if n not in exit_t and proc_state(pid) in (None, "Z"):
                    exit_t[n] = now

        def recovered() -> bool:
            return all(len(ev.steps(n, exclude_pid=old[n], after=t0)) >= SETTLE_STEPS
                       for n in range(nodes))

        try:
            wait_until(recovered, recover_cap, "all workers stepping again", tick_after,
                       dead_agents)
            outcome = "recovered"
        except (TimeoutError, RuntimeError) as exc:
            outcome = f"NOT recovered: {exc}"
        t_end = time.monotonic()
        tick_after()

        # ------------------------------------------------------------ figures
        survivors = [n for n in range(nodes) if n != VICTIM]
        noticed = {}
        for n in survivors:
            err = [e["t"] for e in ev.by_node[n] if e["e"] == "error" and e["pid"] == old[n]]
            agent = agents[n].first(r"will restart worker group|Stopping worker group", t0)
            noticed[n] = min([exit_t.get(n, math.nan), *err, agent],
                             key=lambda x: math.inf if math.isnan(x) else x) - t0
        gloo_err = sorted(n for n in survivors if any(e["e"] == "error" and e["pid"] == old[n]
                                                      for e in ev.by_node[n]))
        victim_agent = agents[VICTIM].first(r"Worker group FAILED", t0) - t0

        def last_of(kind: str) -> float:
            ts = []
            for n in range(nodes):
                new = [e["t"] for e in ev.by_node[n] if e["e"] == kind and e["pid"] != old[n]]
                ts.append(min(new) if new else math.nan)
            return max(ts) - t0 if not any(math.isnan(x) for x in ts) else math.nan

        rdzv = [agents[n].first(r"joined round|restart_count=[1-9]", t0) for n in range(nodes)]
        rdzv_last = max(rdzv) - t0 if not any(math.isnan(x) for x in rdzv) else math.nan
        imports = []
        for n in range(nodes):
            b = [e["t"] for e in ev.by_node[n] if e["e"] == "boot" and e["pid"] != old[n]]
            i = [e["t"] for e in ev.by_node[n] if e["e"] == "imported" and e["pid"] != old[n]]
            if b and i:
                imports.append(min(i) - min(b))
        pre = [e["t"] for e in ev.steps(0, pid=old[0]) if e["t"] < t0]
        median_dt = statistics.median(b - a for a, b in zip(pre, pre[1:]))
        wasted = {n: waste([e["t"] for e in ev.steps(n)], t0, t_end, 3 * median_dt)
                  for n in range(nodes)}
        restarts = {n: len({e["pid"] for e in ev.by_node[n] if e["t"] >= t0} - {old[n]})
                    for n in range(nodes)}
        lost = max(e["step"] for e in ev.steps(0, pid=old[0]))
        ttd_first = min(noticed.values())
        ttd_last = max(noticed.values())
        stepping = last_of("step")

        print(f"\noutcome: {outcome}; observed until {t_end - t0:.1f} s after the kill")
        print(f"pre-fault step interval (median) {median_dt * 1000:.0f} ms; "
              f"gloo errors seen by nodes {gloo_err}; node {VICTIM}'s agent saw its worker "
              f"fail at {fmt(victim_agent)}")
        print(f"restart phases (last node): all survivors noticed {fmt(ttd_last)}, "
              f"new rendezvous round joined {fmt(rdzv_last)}, new workers booted "
              f"{fmt(last_of('boot'))}, torch imported {fmt(last_of('imported'))}, gloo group "
              f"{fmt(last_of('pg'))}, first step {fmt(stepping)}")
        if imports:
            print(f"new workers' torch import: median {statistics.median(imports):.1f} s, max "
                  f"{max(imports):.1f} s ({nodes} at once on {os.cpu_count()} cores)")
        print(f"worker processes started per node after the kill: {sorted(set(restarts.values()))}; "
              f"training progress lost: {lost} steps (the new workers start from step 0; "
              "this worker keeps no checkpoint)")
        summary = {"nodes": nodes, "no_share_store": no_share_store,
                   "rdzv_on_node0": rdzv_on_node0, "outcome": outcome, "ttd_first_s": ttd_first,
                   "ttd_last_s": ttd_last, "victim_agent_s": victim_agent,
                   "rdzv_last_s": rdzv_last, "stepping_s": stepping,
                   "wasted_rank_s": sum(wasted.values()),
                   "wasted_survivors_rank_s": sum(wasted[n] for n in survivors),
                   "noticed_s": noticed, "startup_s": t_all - t_launch, "lost_steps": lost,
                   "out": str(out)}
        (out / "summary.json").write_text(json.dumps(summary, indent=1))
        return summary
    finally:
        teardown(agents, store, worker_pids, namespaces, cluster, ledger, netlink)


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
    parser.add_argument("--out", type=Path, default=None)
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
    args = parser.parse_args(argv)
    if args.worker:
        worker_main(args.out)
        return 0
    if args.nodes <= VICTIM:
        parser.error(f"need more than {VICTIM} nodes")
    from harness import signals
    signals.install()  # SIGTERM tears the job down like Ctrl-C
    summary = measure(args.nodes, args.out, args.no_share_store, args.rdzv_on_node0,
                      args.start_cap, args.recover_cap)
    nodes = summary["nodes"]
    print(f"\nSIGKILL of one worker (node {VICTIM}), {nodes} nodes"
          + ("" if nodes == 16 else " -- NOT the 16-node job") + ":\n")
    head = ("", "every survivor knows", f"all {nodes} ranks step again", "wasted rank-s",
            "15 s / x (TTD)", "12 s / x (stepping)")
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    ratio = lambda d, x: "-" if not x or math.isnan(x) else f"{d / x:.0f}x"
    print(f"| torchrun --max-restarts=3 (c10d) | first {fmt(summary['ttd_first_s'])}, last "
          f"{fmt(summary['ttd_last_s'])} | {fmt(summary['stepping_s'])} (restarted from step 0) | "
          f"{summary['wasted_rank_s']:.1f} ({summary['wasted_survivors_rank_s']:.1f} survivors) | "
          f"{ratio(DOCUMENT['ttd'], summary['ttd_last_s'])} | "
          f"{ratio(DOCUMENT['ttr'], summary['stepping_s'])} |")
    print("\nthe harness's policies on the same fault, side by side: bench/detector.py "
          "--faults kill --policies torchrun,timeout,elastic")
    return 0 if summary["outcome"] == "recovered" else 1


if __name__ == "__main__":
    sys.exit(main())
