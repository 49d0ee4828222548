"""Bring-up, teardown and memory of a 16-rank job on the namespace backend.

    sudo .venv/bin/python bench/bringup.py [--ranks 16] [--repeat 3]

Prints: namespaces built (switch + hosts + bridge + veths: hosts_s), the rank launcher
ready (one interpreter importing torch, in parallel with the hosts: launcher_s), control
plane listening (control_s), all ranks ready for their first step after they were forked
(every rank's group formed: ready_after_spawn_s), the whole of it (ready_total_s),
teardown (ranks stopped, hosts removed), and the proportional set size (PSS) of each rank
process while training. Targets on 2 cores: ready <= 2 s, teardown <= 0.5 s, <= 40 MB PSS per rank.
"""
from __future__ import annotations

import argparse
import json
import secrets
import statistics
import sys
import tempfile
import time
from pathlib import Path

from chaos.inject import record_owner
from chaos.ledger import Ledger
from harness.cluster.api import ClusterSpec
from runfolder.events import EVENTS_FILE, read_events
from harness.cluster.netns import NetnsBackend
from harness.job.policies import policy_spec
from harness.job.rank import RankConfig
from harness.job.workload import WorkloadSpec


def pss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        if line.startswith("Pss:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no Pss for {pid}")


def one(ranks: int, workdir: Path) -> dict[str, float]:
    run_id = "b" + secrets.token_hex(3)
    run_dir = workdir / run_id
    run_dir.mkdir()
    ledger = Ledger(run_id)
    record_owner(ledger)
    t0 = time.monotonic()
    cluster = NetnsBackend().up(ClusterSpec(run_id, ranks, run_dir), ledger)
    t_up = time.monotonic()
    try:
        for r in range(ranks):
            cluster.start_rank(r, RankConfig(
                rank=r, world_size=ranks, seed=0, store_address=cluster.store_address,
                store_port=cluster.store_port, events_path=str(run_dir / EVENTS_FILE),
                checkpoint_dir=str(run_dir / "ckpt"), policy=policy_spec("timeout", {"timeout": "30s"}),
                workload=WorkloadSpec()).model_dump(mode="json"))
        ready: set[int] = set()
        offset = 0
        deadline = time.monotonic() + 60
        while len(ready) < ranks:
            if time.monotonic() > deadline:
                raise RuntimeError(f"only {len(ready)}/{ranks} ranks ready within 60 s")
            events, offset = read_events(run_dir / EVENTS_FILE, offset)
            ready |= {e["rank"] for e in events if e["kind"] == "group_ready"}
            time.sleep(0.005)
        t_ready = time.monotonic()
        time.sleep(3)  # a few steps in, so the pages a rank touches while training count
        pss = [pss_mb(cluster.pid(r)) for r in range(ranks)]
        t_stop = time.monotonic()
        cluster.stop_ranks(3.0)
    finally:
        cluster.close()
    t_down = time.monotonic()
    ledger.close_if_clean()
    return {"hosts_s": cluster.timings["hosts_s"], "launcher_s": cluster.timings["launcher_s"],
            "control_s": cluster.timings["control_s"], "hosts_and_control_s": t_up - t0, "ready_after_spawn_s": t_ready - t_up,
            "ready_total_s": t_ready - t0, "teardown_s": t_down - t_stop,
            "pss_mb_mean": statistics.mean(pss), "pss_mb_max": max(pss)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=16)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="chaos-bench-") as tmp:
        rows = [one(args.ranks, Path(tmp)) for _ in range(args.repeat)]
    print(f"{args.ranks} ranks, netns backend, {args.repeat} repetitions")
    for key in rows[0]:
        values = [r[key] for r in rows]
        print(f"  {key:22s} median {statistics.median(values):8.3f}   "
              f"min {min(values):8.3f}   max {max(values):8.3f}")
    print("targets: ready_total_s <= 2, teardown_s <= 0.5, pss_mb_max <= 40")
    print(json.dumps(rows), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
