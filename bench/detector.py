"""The failure detector against the document's policies, fault by fault, side by side.

    sudo flock /tmp/chaos-cpu.lock .venv/bin/python bench/detector.py \
        [--faults kill,blackhole,link_down,pause,loss] \
        [--policies pytorch_default,timeout,retry,isolation,retry_fd,elastic,elastic_rejoin,torchrun] \
        [--control-runs 10] [--out DIR]
    .venv/bin/python bench/detector.py --analyze DIR    # the table of a stored run, again

For the 16-rank job and each fault on rank 5 (kill; blackhole that never heals; link down
10 s; freeze 10 s; 20% loss for 20 s), every policy runs on a fresh cluster:

    pytorch_default  gloo's default 30 min timeout, no retry (watched up to the hang cap)
    timeout, retry, isolation   the document's policies with its 15 s timeout
    retry_fd         retry with the failure detector and short backoff
    elastic          the detector, and the survivors go on without an unreachable rank
    elastic_rejoin   elastic, and the rank left out is let back in once it is reachable
    torchrun         TorchElastic: one torchrun agent per namespace, --max-restarts=3, c10d
                     rendezvous, workers with their own store (bench/torchrun_kill.py
                     --no-share-store: with torchrun's defaults every restart fails here);
                     the kill fault only (it restarts on a worker's exit; any other fault
                     leaves its workers in gloo's 30 min timeout like pytorch_default)

It prints, per fault and policy: outcome, time-to-detect (first rank and last rank),
time-to-recover (from fault start, and from fault end for faults that heal), breaker
open (our elastic policy: when the survivors left the rank out), survivors stepping
again, wasted rank-seconds, and ratios against the document's 15 s / 12 s / 30 s. Then
the fault-free control scenario `--control-runs` times, counting false trips (suspect
events). Targets: TTD <= 1.0 s (silent) / 0.3 s (killed), TTR after heal <= 1.0 s,
survivors stepping again <= 3 s after a permanent fault starts, zero false trips.
"""
from __future__ import annotations

import argparse
import math
import sys
import tempfile
from pathlib import Path

import torchrun_kill
import yaml

import reports
from harness import signals
from harness.cluster.backends import backend_named
from harness.run.orchestrator import run_scenario
from harness.run.progress import Progress
from harness.run.scenario import load_scenario
from runfolder.layout import RUN_FILE

REPO = Path(__file__).resolve().parent.parent
DOCUMENT = {"ttd": 15.0, "ttr": 12.0, "breaker": 30.0}  # the document's claims, seconds
FAULTS = {
    "kill": {"kind": "kill"},
    "blackhole": {"kind": "blackhole"},
    "link_down": {"kind": "link_down", "duration": "10s"},
    "pause": {"kind": "pause", "duration": "10s"},
    "loss": {"kind": "loss", "percent": "20%", "duration": "20s"},
}
_DOC = {"timeout": "15s", "rendezvous_timeout": "30s", "backoff_base": "2s", "backoff_cap": "16s"}
POLICIES = {
    "pytorch_default": {"base": "baseline", "timeout": "30m"},
    "timeout": {"timeout": "15s"},
    "retry": {**_DOC, "max_retries": 3},
    "isolation": {**_DOC, "max_retries": 3},
    "retry_fd": {"base": "retry", "detector": {}, "timeout": "10s", "rendezvous_timeout": "30s",
                 "max_retries": 100, "backoff_base": "20ms", "backoff_cap": "200ms",
                 "jitter": ["0s", "30ms"]},
    "elastic": {},
    # a rank left out comes back once it is reachable (waits up to 15 s: the faults that
    # never heal would otherwise keep the trial 60 s longer)
    "elastic_rejoin": {"base": "elastic", "rejoin": True, "rejoin_within": "15s"},
}
EXTERNAL = {"torchrun": ("kill",)}  # not harness policies: the faults each is measured on


def scenario_text(fault: str, policies: list[str]) -> str:
    policies = [p for p in policies if p in POLICIES]
    spec = dict(FAULTS[fault])
    duration = spec.pop("duration", None)
    event = {**spec, "target": {"rank": 5}, "start": "1s"}
    if duration:
        event["duration"] = duration
    return yaml.safe_dump({
        "name": f"bench_{fault}", "seed": 1, "cluster": {"ranks": 16},
        "workload": {"step_period": "250ms", "checkpoint_every": 10}, "warmup_steps": 12,
        "faults": [event], "hang_cap": "20s", "settle_steps": 8,
        "policies": {p: POLICIES[p] for p in policies}}, sort_keys=False)


def breaker_or_exclusion(row) -> float:
    """When the breaker opened on any rank, or the survivors first left a rank out."""
    marks = [t for t in (row["breaker_open_s"], row["excluded_s"]) if not math.isnan(t)]
    return min(marks, default=math.nan)


def fmt(value: float, unit: str = "s") -> str:
    return "-" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:.2f}{unit}"


def ratio(document: float, ours: float) -> str:
    if not ours or math.isnan(ours):
        return "-"
    times = document / ours
    return f"{times:.0f}x" if times >= 10 else f"{times:.1f}x"


def measure_torchrun(out: Path) -> None:
    """The kill fault under torchrun (its agents restart every worker, from step 0), as the
    run folder out/torchrun; one that did not start says so in its trial_end."""
    try:
        torchrun_kill.measure(16, out / "torchrun", no_share_store=True)
    except (RuntimeError, TimeoutError) as exc:  # it did not start: say so, measure the rest
        print(f"torchrun: {exc}", file=sys.stderr)


def measure_fault(fault: str, policies: list[str], out: Path, progress: Progress) -> None:
    if any(fault in EXTERNAL.get(p, ()) for p in policies):
        measure_torchrun(out)
    policies = [p for p in policies if p in POLICIES]
    if policies:
        path = out / f"bench_{fault}.yaml"
        path.write_text(scenario_text(fault, policies))
        run_scenario(load_scenario(path), path, policies, out, backend_named("netns"), progress)


def latest_run(out: Path, name: str) -> Path | None:
    runs = sorted(out.glob(f"{name}-*/trials"))  # run folders are named <scenario>-<time>-<id>
    return runs[-1].parent if runs else None


def fault_rows(fault: str, policies: list[str], out: Path) -> list[dict]:
    """The rows of one fault, from the run folders under `out` (measured now or before)."""
    torchrun = out / "torchrun"  # a run folder of its own (bench/torchrun_kill.py)
    measured = [latest_run(out, f"bench_{fault}")]
    if any(fault in EXTERNAL.get(p, ()) for p in policies) and (torchrun / RUN_FILE).is_file():
        measured.insert(0, torchrun)
    rows = []
    for run_dir in filter(None, measured):
        for _, row in reports.analyze_run(run_dir).iterrows():
            if row["policy"] not in policies:
                continue
            rows.append({"fault": fault, "policy": row["policy"], "outcome": row["outcome"],
                         "ttd": row["ttd_s"], "ttd_last": row["ttd_max_s"], "ttr": row["ttr_s"],
                         "ttr_heal": row["ttr_after_end_s"], "breaker": breaker_or_exclusion(row),
                         "hung_cap": row["hung_cap"], "wasted": row["wasted_rank_s"]})
    return rows


def print_table(rows: list[dict]) -> None:
    head = ("fault", "policy", "outcome", "TTD first", "TTD last", "survivors step again",
            "after heal", "breaker", "wasted r*s", "TTD 15s/x", "TTR 12s/x", "breaker 30s/x")
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for r in rows:
        outcome = r["outcome"] + (f" >= {r['hung_cap']:g}s" if r["outcome"] == "hung" else "")
        # after a heal only a recovery counts from the heal; going on without the rank
        # (continued) happens while the fault lasts and counts from its start
        healed = r["ttr_heal"] if r["outcome"] == "recovered" else math.nan
        recover = r["ttr"] if math.isnan(healed) else healed
        print("| " + " | ".join([
            r["fault"], r["policy"], outcome, fmt(r["ttd"]), fmt(r["ttd_last"]), fmt(r["ttr"]),
            fmt(healed), fmt(r["breaker"]), fmt(r["wasted"], ""),
            ratio(DOCUMENT["ttd"], r["ttd"]), ratio(DOCUMENT["ttr"], recover),
            ratio(DOCUMENT["breaker"], r["breaker"])]) + " |")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--faults", default=",".join(FAULTS))
    parser.add_argument("--policies", default=",".join([*POLICIES, *EXTERNAL]))
    parser.add_argument("--control-runs", type=int, default=10)
    parser.add_argument("--out", type=Path, default=None, help="run folders (default: a temp dir)")
    parser.add_argument("--analyze", type=Path, default=None, metavar="DIR",
                        help="measure nothing: print the table of the run folders in DIR "
                             "(the --out of an earlier run)")
    parser.add_argument("--quiet", action="store_true")
    args = parser.parse_args(argv)
    faults, policies = args.faults.split(","), args.policies.split(",")
    unknown = ([f for f in faults if f not in FAULTS]
               + [p for p in policies if p not in POLICIES and p not in EXTERNAL])
    if unknown:
        parser.error(f"unknown fault or policy: {', '.join(unknown)}")
    if args.analyze is not None and not args.analyze.is_dir():
        parser.error(f"--analyze {args.analyze}: no such folder")
    out = args.analyze or args.out or Path(tempfile.mkdtemp(prefix="bench-detector-"))
    if args.analyze is None:
        out.mkdir(parents=True, exist_ok=True)
        progress = Progress(quiet=args.quiet)
        signals.install()
        for fault in faults:
            measure_fault(fault, policies, out, progress)
        control = REPO / "scenarios" / "detector_no_fault.yaml"
        for _ in range(args.control_runs):
            run_scenario(load_scenario(control), control, ["elastic"], out, backend_named("netns"),
                         progress)
    print_table([row for fault in faults for row in fault_rows(fault, policies, out)])
    # in a fault-free run every suspect event is a false trip
    trips = [int(reports.analyze_run(d.parent)["suspect_events"].sum())
             for d in sorted(out.glob("detector_no_fault-*/trials"))]
    if trips:
        print(f"\nfalse trips in {len(trips)} fault-free runs of ~60 s: {sum(trips)} "
              f"(per run: {trips})")
    print(f"\nrun folders: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
