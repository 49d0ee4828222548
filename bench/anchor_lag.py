"""How long after its event an anchored fault lands (harness.scenario.anchors): the lag from the
event's `t` (the rank wrote it) to the fault's `t` (the kernel acknowledged the apply), on
the built-in workload, beside its step period.

    sudo .venv/bin/python bench/anchor_lag.py [--ranks 16] [--backend netns] [--repeat 4]
        [--out FILE.json]

Each trial runs one scenario with several anchored faults that barely move the job: a
100 ms pause of rank i on the (2i)th step after warm-up (i = 1..6), then a kill of the last
rank when the third checkpoint save after warm-up begins (the timeout policy then ends the
job). Every fault_applied with an `anchor_t` is one sample. Prints the median and the worst
lag over all samples, per event, with the median time from one step to the next, and writes them as JSON with
the machine line and the command (--out).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent
PAUSES = 6


def scenario(ranks: int, backend: str) -> dict:
    faults = [{"kind": "pause", "target": {"rank": i}, "duration": "100ms",
               "start": {"on": "step", "nth": 2 * i}} for i in range(1, PAUSES + 1)]
    faults.append({"kind": "kill", "target": {"rank": ranks - 1}, "start": {"on": "checkpoint_save", "nth": 3}})
    return {"name": "anchor_lag", "cluster": {"ranks": ranks, "backend": backend},
            "workload": {"step_period": "250ms", "checkpoint_every": 10}, "warmup_steps": 8,
            "hang_cap": "30s", "faults": faults, "policies": {"timeout": {"timeout": "5s"}}}


def one_trial(ranks: int, backend: str, folder: Path) -> tuple[list[dict], list[float]]:
    """The anchored faults' lags of one trial ({event, lag_s}) and the times from each
    rank's step to its next."""
    folder.mkdir(parents=True)
    path = folder / "anchor_lag.yaml"
    path.write_text(yaml.safe_dump(scenario(ranks, backend), sort_keys=False))
    out = folder / "runs"
    done = subprocess.run([sys.executable, "-m", "harness.cli", "run", str(path), "--out", str(out), "--quiet"],
                          cwd=REPO, capture_output=True, text=True, timeout=900)
    run = max(out.glob("anchor_lag-*"), key=lambda p: p.stat().st_mtime)
    events = [json.loads(line) for line in (run / "trials" / "timeout" / "events.jsonl").read_text().splitlines()]
    plan = yaml.safe_load(path.read_text())["faults"]
    lags = [{"event": plan[e["index"]]["start"]["on"], "lag_s": e["t"] - e["anchor_t"]}
            for e in events if e.get("kind") == "fault_applied" and "anchor_t" in e]
    by_rank: dict[int, list[float]] = {}
    for e in events:
        if e.get("kind") == "step":
            by_rank.setdefault(e["rank"], []).append(e["t"])
    steps = [b - a for times in by_rank.values() for a, b in zip(times, times[1:], strict=False)]
    if not lags:
        raise SystemExit(f"no anchored fault applied (exit {done.returncode}): {done.stderr[-2000:]}")
    return lags, steps


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=16)
    parser.add_argument("--backend", default="netns")
    parser.add_argument("--repeat", type=int, default=4, help="trials (default 4)")
    parser.add_argument("--out", type=Path, help="also write the figures as JSON here")
    args = parser.parse_args(argv)
    lags: list[dict] = []
    steps: list[float] = []
    with tempfile.TemporaryDirectory(prefix="chaos-bench-anchor-") as tmp:
        for trial in range(args.repeat):
            got, durations = one_trial(args.ranks, args.backend, Path(tmp) / str(trial))
            lags += got
            steps += durations
            print(f"trial {trial + 1}: " + ", ".join(f"{g['event']} {g['lag_s'] * 1000:.1f} ms" for g in got),
                  flush=True)
    step_s = statistics.median(steps)
    rows = []
    for event in sorted({g["event"] for g in lags}) + ["all"]:
        values = [g["lag_s"] for g in lags if event in ("all", g["event"])]
        rows.append({"event": event, "samples": len(values), "median_s": statistics.median(values),
                     "worst_s": max(values)})
        print(f"{event:16} {len(values):3} samples  median {rows[-1]['median_s'] * 1000:6.1f} ms  "
              f"worst {rows[-1]['worst_s'] * 1000:6.1f} ms")
    worst = rows[-1]["worst_s"]
    print(f"median step {step_s * 1000:.0f} ms: the worst lag is {'under' if worst < step_s else 'NOT under'} a step")
    if args.out:
        args.out.write_text(json.dumps({
            "rows": rows, "step_s": step_s, "lags": lags, "ranks": args.ranks, "backend": args.backend,
            "machine": f"{os.cpu_count()}-CPU {platform.machine()}, load {os.getloadavg()[0]:.2f} at the end",
            "command": " ".join(["bench/anchor_lag.py", *(argv if argv is not None else sys.argv[1:])])}, indent=1))
    return 0 if worst < step_s else 1


if __name__ == "__main__":
    sys.exit(main())
