"""Bring-up, teardown and memory of a job on the namespace backend, per number of ranks.

    sudo .venv/bin/python bench/bringup.py [--ranks 16 32 64] [--repeat 3] [--ready-within 60]
                                           [--launcher cold warm] [--gloo-connects at-start on-first-use]

For each size and each launcher, `--repeat` times on a fresh cluster: namespaces built
(switch + hosts + bridge + veths + neighbour entries: hosts_s), the rank launcher ready
(launcher_s: a cold one, as a run's first trial gets, is a new interpreter importing torch
in parallel with the hosts; a warm one, as every later trial of the run gets, is the
launcher an earlier bring-up gave back, after one unmeasured bring-up), control plane listening
(control_s), every rank forked (spawn_s), every rank's group formed after the last fork
(group_s), the whole of it (ready_total_s), teardown (ranks stopped, hosts removed:
teardown_s), the proportional set size (PSS) of each rank process 3 s into training, and
the share of the machine's CPU time that the virtual machine's host took during the bring-up
(steal_pct, from /proc/stat; "-" where the kernel counts none): on a shared host, a slow
bring-up with a high share is the host's, not the code's.
`--gloo-connects`: gloo connects every pair when the group is made (at-start, the default)
or each pair on first use (workload.gloo_lazy_init; group_s then covers the store's
rendezvous, and the first all-reduce connects its pairs).
Prints one row per size, launcher and way of connecting, the median of the repetitions (the worst in brackets). A size
that fails prints why instead: how many ranks formed the group within `--ready-within`,
what the others did last, and how often the kernel's neighbour table was full meanwhile
(the cause past 16 ranks before `chaos.neighbours`).
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import secrets
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from chaos.errors import ChaosError
from chaos.ledger import Ledger
from chaos.undo import record_owner
from harness.cluster.launcher import LauncherPool
from harness.cluster.netns import NetnsBackend, NetnsCluster
from harness.cluster.spec import ClusterSpec
from harness.job.config import RankConfig, WorkloadSpec
from harness.job.policies import policy_spec
from harness.trial import machine
from runfolder.events import EVENTS_FILE, read_events

TRAIN_S = 3.0  # a few steps in, so that the pages a rank touches while training count
STOP_DEADLINE_S = 3.0
POLL_S = 0.005
FIGURES = ("hosts_s", "launcher_s", "control_s", "spawn_s", "group_s", "ready_total_s",
           "teardown_s", "pss_mb_mean", "pss_mb_max", "steal_pct")
LAUNCHERS = ("cold", "warm")
GLOO_CONNECTS = {"at-start": False, "on-first-use": True}  # --gloo-connects: workload.gloo_lazy_init
TARGETS = "targets (issue 16): ready_total_s <= 1.0 at 16 ranks and <= 3 at 64, teardown_s <= 0.5, pss_mb_max <= 40"


class SizeFailed(Exception):
    """A size that could not be brought up and measured; the message says why."""


def pss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        if line.startswith("Pss:"):
            return int(line.split()[1]) / 1024
    raise SizeFailed(f"no Pss in /proc/{pid}/smaps_rollup")


def neighbour_table_fulls() -> int:
    """How often, since boot, the kernel could not make an ARP entry because its one table
    (shared by every namespace) was full: the last column of /proc/net/stat/arp_cache,
    one row per CPU, in hex."""
    rows = Path("/proc/net/stat/arp_cache").read_text().splitlines()[1:]
    return sum(int(row.split()[-1], 16) for row in rows)


def describe(event: dict[str, Any] | None) -> str:
    if event is None:
        return "nothing (never started)"
    if event["kind"] == "rendezvous":  # reported on arrival, and every 5 s while waiting
        return f"rendezvous of generation {event['gen']}"
    detail = event.get("error") or event.get("reason")
    return f"{event['kind']}: {detail}" if detail else event["kind"]


def not_ready(ranks: int, ready: set[int], last: dict[int, dict[str, Any]], within_s: float,
              fulls: int) -> str:
    """Why the group did not form: the others' last events, the most common first."""
    by_last = collections.defaultdict(list)
    for rank in sorted(set(range(ranks)) - ready):
        by_last[describe(last.get(rank))].append(rank)
    others = "; ".join(f"{len(rs)} with last event {what} (ranks {rs[:8]}{' ...' if len(rs) > 8 else ''})"
                       for what, rs in sorted(by_last.items(), key=lambda kv: -len(kv[1])))
    reason = f"{len(ready)}/{ranks} ranks formed the group within {within_s:g} s; {others}"
    if fulls:
        reason += f"; the kernel's neighbour table was full {fulls} times meanwhile"
    return reason


def start_ranks(cluster: NetnsCluster, ranks: int, run_dir: Path, workload: WorkloadSpec) -> None:
    for r in range(ranks):
        cluster.start_rank(r, RankConfig(
            rank=r, world_size=ranks, seed=0, store_address=cluster.store_address,
            store_port=cluster.store_port, events_path=str(run_dir / EVENTS_FILE),
            checkpoint_dir=str(run_dir / "ckpt"), policy=policy_spec("timeout", {"timeout": "30s"}),
            workload=workload).model_dump(mode="json"))


def wait_for_group(cluster: NetnsCluster, ranks: int, run_dir: Path, within_s: float) -> None:
    """Until every rank reported its group formed; SizeFailed at the deadline or when one exits."""
    fulls_before = neighbour_table_fulls()
    ready: set[int] = set()
    last: dict[int, dict[str, Any]] = {}
    offset = 0
    deadline = time.monotonic() + within_s
    while len(ready) < ranks:
        events, offset = read_events(run_dir / EVENTS_FILE, offset)
        for e in events:  # an error stays a rank's last word over what followed it
            if "error" in e or "error" not in last.get(e["rank"], {}):
                last[e["rank"]] = e
        ready |= {e["rank"] for e in events if e["kind"] == "group_ready"}
        exits = cluster.reap()
        if exits or time.monotonic() > deadline:
            reason = not_ready(ranks, ready, last, within_s, neighbour_table_fulls() - fulls_before)
            if exits:
                reason = f"rank(s) {sorted(x.rank for x in exits)} exited; " + reason
            raise SizeFailed(reason)
        time.sleep(POLL_S)


def one(ranks: int, workdir: Path, within_s: float, launchers: LauncherPool,
        workload: WorkloadSpec) -> dict[str, float]:
    """Bring up `ranks` ranks, measure, tear down; SizeFailed (or a ChaosError) says why not."""
    run_id = "b" + secrets.token_hex(3)
    run_dir = workdir / run_id
    run_dir.mkdir()
    ledger = Ledger(run_id)
    record_owner(ledger)
    try:
        t0, steal_before = time.monotonic(), machine.steal_s()
        cluster = NetnsBackend().up(ClusterSpec(run_id, ranks, run_dir), ledger, launchers)
        t_up = time.monotonic()
        try:
            start_ranks(cluster, ranks, run_dir, workload)
            t_spawned = time.monotonic()
            wait_for_group(cluster, ranks, run_dir, within_s)
            t_ready, steal_ready = time.monotonic(), machine.steal_s()
            time.sleep(TRAIN_S)
            if exits := cluster.reap():
                raise SizeFailed(f"rank(s) {sorted(x.rank for x in exits)} exited while training")
            pss = [pss_mb(pid) for r in range(ranks) if (pid := cluster.pid(r)) is not None]
            t_stop = time.monotonic()
            cluster.stop_ranks(STOP_DEADLINE_S)
        finally:
            cluster.close()
        t_down = time.monotonic()
    finally:
        ledger.close_if_clean()
    steal = {} if steal_before is None or steal_ready is None else \
        {"steal_pct": 100 * (steal_ready - steal_before) / (len(os.sched_getaffinity(0)) * (t_ready - t0))}
    return {**cluster.timings, "spawn_s": t_spawned - t_up, "group_s": t_ready - t_spawned,
            "ready_total_s": t_ready - t0, "teardown_s": t_down - t_stop,
            "pss_mb_mean": statistics.mean(pss), "pss_mb_max": max(pss), **steal}


def measure(ranks: int, repeat: int, within_s: float, launcher: str, connects: str) -> list[dict[str, float]]:
    workload = WorkloadSpec(gloo_lazy_init=GLOO_CONNECTS[connects])
    with tempfile.TemporaryDirectory(prefix="chaos-bench-") as tmp:
        if launcher == "cold":  # a pool per bring-up: each starts its own launcher
            rows = []
            for _ in range(repeat):
                with LauncherPool() as launchers:
                    rows.append(one(ranks, Path(tmp), within_s, launchers, workload))
            return rows
        with LauncherPool() as launchers:
            one(ranks, Path(tmp), within_s, launchers, workload)  # warms the launcher: not measured
            return [one(ranks, Path(tmp), within_s, launchers, workload) for _ in range(repeat)]


def label(ranks: int, launcher: str, connects: str) -> str:
    return f"{ranks:6d}  {launcher:>8s}  {connects:>12s}"


def cell(rows: list[dict[str, float]], figure: str) -> str:
    """The median and, in brackets, the worst; '-' for a figure not counted in every repetition."""
    if any(figure not in r for r in rows):
        return f"{'-':>16s}"
    return f"{statistics.median(r[figure] for r in rows):7.2f} ({max(r[figure] for r in rows):6.2f})"


def row(ranks: int, launcher: str, connects: str, rows: list[dict[str, float]]) -> str:
    cells = [cell(rows, k) for k in FIGURES]
    return f"{label(ranks, launcher, connects)}  {f'{ranks}/{ranks}':>9s}  " + "  ".join(cells)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[16], help="one or more sizes")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--ready-within", type=float, default=60.0,
                        help="seconds from the last fork for every rank to form the group")
    parser.add_argument("--launcher", nargs="+", choices=LAUNCHERS, default=list(LAUNCHERS),
                        help="cold: a new launcher per bring-up (a run's first trial); warm: the "
                             "launcher an earlier bring-up gave back (every later trial)")
    parser.add_argument("--gloo-connects", nargs="+", choices=GLOO_CONNECTS, default=["at-start"],
                        help="at-start: gloo connects every pair when the group is made (the default); "
                             "on-first-use: each pair on its first collective (workload.gloo_lazy_init)")
    args = parser.parse_args()
    print(f"netns backend, median of {args.repeat} (worst in brackets); {machine.line_now()}")
    print(f"{'ranks':>6s}  {'launcher':>8s}  {'gloo connects':>12s}  {'ready':>9s}  " + "  ".join(f"{k:>16s}" for k in FIGURES),
          flush=True)
    results: dict[str, Any] = {}
    failed = False
    for ranks in args.ranks:
        for launcher in args.launcher:
            for connects in args.gloo_connects:
                key = f"{ranks} {launcher} {connects}"
                try:
                    results[key] = rows = measure(ranks, args.repeat, args.ready_within, launcher, connects)
                    print(row(ranks, launcher, connects, rows), flush=True)
                except (SizeFailed, ChaosError, OSError) as exc:  # a size that fails says why; the next one runs
                    failed = True
                    results[key] = {"failed": f"{type(exc).__name__}: {exc}"}
                    print(f"{label(ranks, launcher, connects)}  failed: {exc}", flush=True)
    print(TARGETS)
    print(json.dumps(results), file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
