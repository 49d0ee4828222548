"""A step's length against its stretched period, per number of ranks: does the scale rule hold here?

    sudo .venv/bin/python bench/steps.py [--ranks 16 32 64 128] [--seconds 30] [--out DIR]
                                         [--policies timeout elastic]
    .venv/bin/python bench/steps.py --ranks 16 32 --analyze DIR    # the table of a stored run, again

For each size, `scenarios/control.yaml` (no fault, its timeout policy) scaled the way
`chaos run --ranks` scales it (k = max(1, ranks / cores / 8) x max(1, ranks / 64);
docs/scale.md), with `--seconds` of steps after the warm-up. Prints, per size and policy:
the cores, k, the stretched step period, the median and 95th percentile of every rank's
step after the warm-up (the `dur` of the step events: compute and all-reduce, not the
pacing sleep), the median's share of the period, the median against the first policy's,
and the trial's outcome; under the table, per size, the packets the kernel dropped because
a CPU's backlog of received packets was full while the trials' ranks ran (their
`host_drops` events: the whole host's count), a loss no fault injected, and the share of
the CPU time the virtual machine's host took meanwhile (`machine_steal`). A step longer than
its period means the rule stretches too little on this machine. `--policies timeout elastic` runs the same steps with the failure detector
too (`elastic: {}`, added to the scenario), one trial after the other in one run: what the
detector costs a step. A size that fails prints why.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

import yaml
from detector import latest_run, scale_scenario

from chaos.errors import ChaosError
from harness import signals
from harness.cluster.backends import backend_named
from harness.scenario.scaling import scale_factor, usable_cores
from harness.trial import machine
from harness.trial.scenario_run import run_scenario
from harness.trial.progress import Progress
from runfolder.events import EVENTS_FILE, HOST_DROPS, MACHINE_STEAL, STEP, TRIAL_END, WARMUP_DONE, read_events
from runfolder.layout import trial_dirs

CONTROL = Path(__file__).resolve().parent.parent / "scenarios" / "control.yaml"
# control.yaml's own policy, and the failure detector's, which the bench adds
POLICIES = {"timeout": None, "elastic": {}}
SIZE_FILE = "size.json"      # in a size's folder: the cores, k and step period it ran with
FAILED_FILE = "failed.json"  # in a size's folder: why its run stopped


def control_with(policies: list[str], out: Path) -> Path:
    """control.yaml with every policy of `policies` it lacks, written into `out`."""
    doc = yaml.safe_load(CONTROL.read_text())
    for policy in policies:
        if policy not in doc["policies"]:
            doc["policies"][policy] = POLICIES[policy]
            doc["expect"][policy] = {"outcome": "no-fault"}
    path = out / CONTROL.name
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def measure(ranks: int, seconds: float, policies: list[str], out: Path, progress: Progress) -> None:
    out.mkdir(parents=True, exist_ok=True)
    path = control_with(policies, out)
    scenario = scale_scenario(path, ranks, seconds)
    cores = usable_cores()
    (out / SIZE_FILE).write_text(json.dumps({"cores": cores, "k": scale_factor(ranks, cores),
                                             "step_period": scenario.workload.step_period,
                                             "policies": policies}))
    try:
        run_scenario(scenario, path, policies, out, backend_named("netns"), progress)
    except (ChaosError, OSError) as exc:  # a size that fails says why; the others run
        (out / FAILED_FILE).write_text(json.dumps(f"{type(exc).__name__}: {exc}"))


def host_line(ranks: int, out: Path) -> str | None:
    """What the host did to the size's trials: packets the kernel's backlog dropped (their
    host_drops events) and the CPU time the VM's host took (machine_steal), or None where no
    trial counted either."""
    run_dir = latest_run(out, "control") if out.is_dir() else None
    events = [e for trial in (trial_dirs(run_dir) if run_dir is not None else ())
              for e in read_events(trial / EVENTS_FILE)[0] if e["kind"] in (HOST_DROPS, MACHINE_STEAL)]
    drops = [e for e in events if e["kind"] == HOST_DROPS]
    steal = [e for e in events if e["kind"] == MACHINE_STEAL]
    said = []
    if drops:
        said.append(f"{sum(e['packets'] for e in drops)} packets dropped by a full backlog in "
                    f"{sum(e['secs'] for e in drops):.1f} s of trials (the whole host's count)")
    if steal and (cpu_s := sum(e["secs"] * e["cpus"] for e in steal)) > 0:
        said.append(f"the VM's host took {sum(e['steal_s'] for e in steal) / cpu_s:.1%} of the CPU time")
    return f"{ranks} ranks: {'; '.join(said)}" if said else None


def step_durations(events: list[dict]) -> list[float]:
    """Every rank's step durations after the warm-up."""
    warm = next((e["t"] for e in events if e["kind"] == WARMUP_DONE), None)
    if warm is None:
        return []
    return [e["dur"] for e in events if e["kind"] == STEP and e["t"] > warm]


def rows(ranks: int, out: Path) -> list[str]:
    """One row per policy measured at `ranks` ranks, from the run folder in `out`."""
    if not (out / SIZE_FILE).is_file():
        return [f"| {ranks} | - | - | - | - | - | - | - | - | not measured (no {out / SIZE_FILE}) |"]
    size = json.loads((out / SIZE_FILE).read_text())
    policies = size.get("policies", ["timeout"])
    period = size["step_period"]
    failed = json.loads((out / FAILED_FILE).read_text()) if (out / FAILED_FILE).is_file() else None
    run_dir = latest_run(out, "control")
    trials = {t.name: t for t in trial_dirs(run_dir)} if run_dir is not None else {}
    found, first = [], None
    for policy in policies:
        head = f"| {ranks} | {policy} | {size['cores']} | {size['k']:g} | {period:g} s |"
        if policy not in trials:
            found.append(f"{head} - | - | - | - | {failed or 'no trial folder'} |")
            continue
        events, _ = read_events(trials[policy] / EVENTS_FILE)
        durations = step_durations(events)
        ended = next((e["reason"] for e in events if e["kind"] == TRIAL_END), "did not end")
        outcome = failed or f"ended: {ended}"
        if len(durations) < 2:
            found.append(f"{head} - | - | - | - | no step after the warm-up; {outcome} |")
            continue
        median, p95 = statistics.median(durations), statistics.quantiles(durations, n=20)[-1]
        first = first or median
        found.append(f"{head} {median:.3f} / {p95:.3f} s | {median / period:.0%} | {median / first:.2f}x "
                     f"| {len(durations)} | {outcome} |")
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[16, 32, 64, 128], metavar="N")
    parser.add_argument("--seconds", type=float, default=30.0, help="seconds of steps after the warm-up")
    parser.add_argument("--out", type=Path, default=None, help="run folders (default: a temp dir)")
    parser.add_argument("--analyze", type=Path, default=None, metavar="DIR",
                        help="print the table of a stored run, measuring nothing")
    parser.add_argument("--policies", nargs="+", default=["timeout"], choices=list(POLICIES),
                        help="each runs the same steps, one trial after the other (elastic: with the "
                             "failure detector); --analyze prints those the folder has")
    parser.add_argument("--quiet", action="store_true")
    args = parser.parse_args(argv)
    if min(args.ranks) < 2:
        parser.error(f"--ranks {min(args.ranks)}: give 2 or more")
    if args.seconds <= 0:
        parser.error("--seconds: give a positive number of seconds")
    if args.analyze is not None and not args.analyze.is_dir():
        parser.error(f"--analyze {args.analyze}: no such folder")
    out = args.analyze or args.out or Path(tempfile.mkdtemp(prefix="bench-steps-"))
    if args.analyze is None:
        signals.install()
        progress = Progress(quiet=args.quiet)
        out.mkdir(parents=True, exist_ok=True)
        machine.record(out)
        for ranks in args.ranks:
            measure(ranks, args.seconds, args.policies, out / f"ranks-{ranks}", progress)
    print("| ranks | policy | cores | k | step period | step after warm-up: median / p95 | median / period "
          "| median / the first policy's | steps | trial |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for ranks in args.ranks:
        print(*rows(ranks, out / f"ranks-{ranks}"), sep="\n")
    print("", *filter(None, (host_line(ranks, out / f"ranks-{ranks}") for ranks in args.ranks)), sep="\n")
    print("\nk and the period as `chaos run --ranks` scales control.yaml on the measuring machine "
          "(docs/scale.md); a median past 100% of the period: the rule stretches too little here; "
          "elastic: control.yaml's steps with the failure detector (`elastic: {}`)")
    print(f"{machine.recorded_line(out)}\nrun folders: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
