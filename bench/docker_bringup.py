"""Bring-up and teardown of a docker-backend cluster (16 containers by default).

    sudo .venv/bin/python bench/docker_bringup.py [--ranks 16] [--steps 3] [--backend docker|netns] [--keep]

Phases, each timed on the monotonic clock:
    up        switch namespace + bridge, containers created (labelled, ledger first), control plane
    start     every rank started: `docker start` + veth wired into /proc/PID/ns/net
    ready     every rank has completed its first training step (torch imported, group formed)
    stop      SIGTERM through the engine, exits collected
    close     containers removed, switch namespace removed (nothing labelled with the run id left)
Prints one line per phase and a JSON summary; exits 1 if anything labelled with the run id remains.
"""
from __future__ import annotations

import argparse
import json
import secrets
import shutil
import sys
import tempfile
import time
from pathlib import Path

from chaos import netlink
from chaos.undo import record_owner
from chaos.ledger import Ledger
from harness.cluster.spec import ClusterSpec
from harness.cluster.launcher import LauncherPool
from runfolder.events import read_events
from harness.job.policies import policy_spec
from harness.job.workload import WorkloadSpec


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ranks", type=int, default=16)
    p.add_argument("--steps", type=int, default=3, help="steps every rank makes before the stop")
    p.add_argument("--backend", choices=["docker", "netns"], default="docker")
    p.add_argument("--keep", action="store_true", help="keep the run folder (events, logs)")
    args = p.parse_args()

    if args.backend == "docker":
        from harness.cluster.docker.cluster import DockerBackend
        from harness.cluster.docker.engine import LABEL_RUN, engine
        backend = DockerBackend()
    else:
        from harness.cluster.netns import NetnsBackend
        backend = NetnsBackend()
    run_id = "b" + secrets.token_hex(3)
    run_dir = Path(tempfile.mkdtemp(prefix=f"chaos-bench-{run_id}-"))
    ledger = Ledger(run_id)
    record_owner(ledger)
    figures: dict[str, float] = {}

    def phase(name: str, since: float) -> float:
        now = time.monotonic()
        figures[name] = round(now - since, 3)
        print(f"{name:6s} {figures[name]:7.2f} s", flush=True)
        return now

    launchers = LauncherPool()
    t0 = time.monotonic()
    cluster = backend.up(ClusterSpec(run_id, args.ranks, run_dir), ledger, launchers)
    try:
        t = phase("up", t0)
        pol = policy_spec("timeout", {"timeout": "30s"}).model_dump(mode="json")
        for r in range(args.ranks):
            cluster.start_rank(r, dict(
                rank=r, world_size=args.ranks, seed=1, store_address=cluster.store_address,
                store_port=cluster.store_port, events_path=str(run_dir / "events.jsonl"),
                checkpoint_dir=str(run_dir / "ckpt"), policy=pol,
                workload=WorkloadSpec().model_dump(mode="json")))
        t = phase("start", t)
        first: dict[int, float] = {}   # rank -> time of its first step
        steps: dict[int, int] = {}     # rank -> steps made
        offset = 0
        deadline = time.monotonic() + 300
        while len(steps) < args.ranks or min(steps.values()) < args.steps:
            events, offset = read_events(run_dir / "events.jsonl", offset)
            for e in events:
                if e["kind"] == "step":
                    first.setdefault(e["rank"], e["t"])
                    steps[e["rank"]] = max(steps.get(e["rank"], 0), e["step"] + 1)
            if cluster.reap():
                raise SystemExit(f"a rank exited during bring-up; see {run_dir}/logs")
            if time.monotonic() > deadline:
                raise SystemExit(f"ranks not ready within 300 s; see {run_dir}/logs")
            if len(first) == args.ranks and "ready" not in figures:
                figures["ready"] = round(max(first.values()) - t, 3)
                print(f"ready  {figures['ready']:7.2f} s  (first step on every rank, after start)",
                      flush=True)
            time.sleep(0.05)
        t = time.monotonic()
        cluster.stop_ranks(10.0)
        t = phase("stop", t)
    finally:
        tc = time.monotonic()
        cluster.close()
        launchers.close()
        figures["close"] = round(time.monotonic() - tc, 3)
        print(f"close  {figures['close']:7.2f} s", flush=True)
    ledger.close_if_clean()
    figures["bringup_total"] = round(figures["up"] + figures["start"] + figures.get("ready", 0), 3)
    figures["teardown_total"] = round(figures.get("stop", 0) + figures["close"], 3)

    left = [n for n in netlink.list_namespaces() if n.startswith(f"chaos-{run_id}-")]
    if args.backend == "docker":
        client = engine()
        left += [c.name for c in client.containers.list(all=True, filters={"label": f"{LABEL_RUN}={run_id}"})]
        client.close()
    print(json.dumps({"backend": args.backend, "ranks": args.ranks, "run_id": run_id,
                      "seconds": figures, "left_behind": left}))
    if not args.keep:
        shutil.rmtree(run_dir, ignore_errors=True)
    return 1 if left else 0


if __name__ == "__main__":
    sys.exit(main())
