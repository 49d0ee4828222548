"""One fault through the built-in workload and through the example script, side by side.

    sudo flock /tmp/chaos-cpu.lock .venv/bin/python bench/byo_compare.py \
        [--faults link_down,kill,pause] [--ranks 16] [--out DIR] [--quiet]
    .venv/bin/python bench/byo_compare.py --analyze DIR    # the table of a stored run, again

For each fault on rank 5 (link down 10 s, SIGKILL, SIGSTOP 10 s: bench/detector.py's
faults) it builds two scenarios from one fault list, with the same seed, offsets,
durations, warm-up steps, settle steps, hang cap, rank count and 0.25 s step period:
the harness's own runner and workload under a policy, and the user's-job path running
examples/train_ddp.py under the matching variant. Each pair has the same process-group
timeout on both sides:

    pytorch_default (gloo's default 30 min, no retry)  <->  default (no --timeout: gloo's 30 min)
    timeout (5 s, then release and exit)               <->  timeout_5s (--timeout 5)

Both run through run_scenario (which heals what a run leaves, also on Ctrl-C) and are
measured by the same definitions (reports.metrics). It prints one table: outcome,
time-to-detect (first and last rank), time-to-recover, longest stall, restarts, wasted
rank-seconds, steps per second before the fault, and for each example row its ratios to
the built-in row of the same pair.

What is and is not comparable. Comparable: the fault (kind, rank, offset, duration), the
seed, the warm-up, the hang cap, the nominal step period, the process-group timeout, gloo
on CPU, and every definition of the figures. Not comparable: (1) step pacing and work:
both sleep out the rest of a 0.25 s period, but the built-in step all-reduces one flat
gradient of a 3-layer MLP (~340 KB) and records its own step events, while the example's
DDP all-reduces a 2-layer MLP's gradients (~77 KB) in buckets during backward and its step
is marked by the startup hook at optimizer.step(); (2) checkpointing: the example's rank 0
saves a shared checkpoint every 10 steps inside its step and reads it only at start; the
built-in runner also checkpoints every 10 steps but restores only under the retry
policies, which have no peer here;
(3) the example has no retry and no clean exit: an error ends it with an exception, so
the same behaviour is `failed-fast` for the built-in timeout policy and `crashed` for the
example; (4) the example is detected from outside: its error lines and exits are
timestamped when they reach the harness, the built-in ranks record their own errors;
(5) restarts: nothing restarts either side here (0 where observed); the example's are
counted only through its startup hook.
"""
from __future__ import annotations

import argparse
import math
import shlex
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import detector
import yaml

from chaos.errors import ChaosError
from harness import signals
from harness.cluster.backends import backend_named
from harness.scenario.scenario import load_scenario
from harness.signals import Terminated
from harness.trial.scenario_run import run_scenario
from harness.trial.progress import Progress
import reports

EXAMPLE = detector.REPO / "examples" / "train_ddp.py"
FAULTS = ("link_down", "kill", "pause")  # keys of detector.FAULTS
VICTIM = 5
SEED = 1
STEP_PERIOD_S = 0.25
CHECKPOINT_EVERY = 10
TIMEOUT_S = 5
WARMUP_STEPS = 12
SETTLE_STEPS = 8
HANG_CAP = "30s"
# the docstring's paragraph on what the two sides share, printed under the table
COMPARABILITY = " ".join(next(p for p in __doc__.split("\n\n") if p.startswith("What is and is not")).split())


@dataclass(frozen=True)
class Pair:
    """A built-in policy and the example's variant with the same process-group timeout."""

    policy: str
    settings: dict[str, Any]
    variant: str
    overrides: dict[str, Any]


PAIRS = (
    Pair("pytorch_default", detector.POLICIES["pytorch_default"], "default", {}),
    Pair("timeout", {"timeout": f"{TIMEOUT_S}s"}, f"timeout_{TIMEOUT_S}s",
         {"args": ["--timeout", str(TIMEOUT_S)]}),
)
SIDES = ("built-in", "example")


def scenario_name(fault: str, side: str) -> str:
    return f"byo_compare_{fault}_{'builtin' if side == 'built-in' else 'example'}"


def scenario_pair(fault: str, ranks: int) -> dict[str, dict[str, Any]]:
    """The two scenarios of one fault, by side: everything but the job is shared."""
    shared = {"seed": SEED, "cluster": {"ranks": ranks}, "warmup_steps": WARMUP_STEPS,
              "faults": [{**detector.FAULTS[fault], "target": {"rank": VICTIM}, "start": "1s"}],
              "hang_cap": HANG_CAP, "settle_steps": SETTLE_STEPS}
    builtin = {"name": scenario_name(fault, "built-in"), **shared,
               "workload": {"step_period": STEP_PERIOD_S, "checkpoint_every": CHECKPOINT_EVERY},
               "policies": {p.policy: p.settings for p in PAIRS}}
    example = {"name": scenario_name(fault, "example"), **shared,
               "job": {"command": ["python", EXAMPLE.name, "--step-period", str(STEP_PERIOD_S),
                                   "--checkpoint-every", str(CHECKPOINT_EVERY),
                                   "--checkpoint", "{trial_dir}/checkpoint.pt"],
                       "workdir": str(EXAMPLE.parent)},
               "variants": {p.variant: p.overrides for p in PAIRS}}
    return {"built-in": builtin, "example": example}


def write_scenarios(fault: str, ranks: int, out: Path) -> dict[str, Path]:
    """The two scenario files of one fault under `out`, by side."""
    paths = {}
    for side, scenario in scenario_pair(fault, ranks).items():
        paths[side] = out / f"{scenario['name']}.yaml"
        paths[side].write_text(yaml.safe_dump(scenario, sort_keys=False))
    return paths


def measure(faults: list[str], ranks: int, out: Path, progress: Progress) -> dict[str, str]:
    """Run both sides of every fault; returns why a scenario gave no run folder, by name."""
    failed = {}
    for fault in faults:
        for path in write_scenarios(fault, ranks, out).values():
            scenario = load_scenario(path)
            try:
                run_scenario(scenario, path, scenario.trial_names(), out, backend_named("netns"),
                             progress, command=shlex.join(["chaos", "run", str(path)]))
            except ChaosError as exc:  # say why in the table, measure the rest
                failed[scenario.name] = f"{type(exc).__name__}: {exc}"
                print(f"{scenario.name}: {failed[scenario.name]}", file=sys.stderr)
    return failed


def trial_figures(out: Path, fault: str, side: str, failed: dict[str, str]) -> dict[str, Any]:
    """Each trial's metrics row of one side, by trial name; `why` names a side with none."""
    name = scenario_name(fault, side)
    run_dir = detector.latest_run(out, name)
    if run_dir is None:
        return {"why": failed.get(name, f"no run folder {name}-* under {out}")}
    return {row["trial"]: row for _, row in reports.analyze_run(run_dir).iterrows()}


def seconds(value: float, absent: str) -> str:
    return absent if math.isnan(value) else detector.fmt(value)


# outcomes that say the fault's effect was not seen; the cell also gives the reason
UNJUDGED = ("incomplete", "no-fault", "bypassed", "inconclusive")


def figures(row: Any) -> list[str]:
    """The table's figures of one trial. "-": the figure does not apply to its outcome
    (no rank detected, or nothing to recover from); "not observed": the run could not see it."""
    outcome = row["outcome"] + (f" >= {row['hung_cap']:g}s" if row["outcome"] == "hung" else "")
    if row["outcome"] in UNJUDGED:
        outcome += f" ({row['outcome_reason']})"
    detect = "-" if math.isnan(row["ttd_s"]) else f"{detector.fmt(row['ttd_s'])} / {detector.fmt(row['ttd_max_s'])}"
    restarts = "not observed (no step hook)" if math.isnan(row["restarts"]) else f"{row['restarts']:.0f}"
    rate = row["steps_per_s_before"]
    return [outcome, detect, seconds(row["ttr_s"], "-"), seconds(row["max_stall_s"], "not observed"),
            restarts, "not observed" if math.isnan(row["wasted_rank_s"]) else f"{row['wasted_rank_s']:.1f}",
            "not observed" if math.isnan(rate) else f"{rate:.2f}"]


RATIOS = {"detect": "ttd_s", "stall": "max_stall_s", "wasted": "wasted_rank_s", "steps/s": "steps_per_s_before"}


def ratios(example: Any, builtin: Any) -> str:
    """example / built-in for each figure both sides measured (a zero built-in has no ratio)."""
    parts = [f"{label} {detector.ratio(example[column], builtin[column])}"
             for label, column in RATIOS.items()
             if math.isfinite(example[column]) and math.isfinite(builtin[column]) and builtin[column]]
    return ", ".join(parts) or "-"


HEAD = ("fault", "job", "trial", "outcome", "detect first / last", "recover", "longest stall",
        "restarts", "wasted r*s", "steps/s before", "example / built-in")


def fault_lines(out: Path, fault: str, failed: dict[str, str]) -> list[list[str]]:
    sides = {side: trial_figures(out, fault, side, failed) for side in SIDES}
    lines = []
    for pair in PAIRS:
        rows = {"built-in": sides["built-in"].get(pair.policy), "example": sides["example"].get(pair.variant)}
        for side, trial in zip(SIDES, (pair.policy, pair.variant), strict=True):
            row = rows[side]
            if row is None:
                why = sides[side].get("why", f"trial {trial} never began: the run ended before it")
                lines.append([fault, side, trial, f"not observed: {why}", *[""] * (len(HEAD) - 4)])
                continue
            peer = rows["built-in"] if side == "example" else None
            lines.append([fault, side, trial, *figures(row), "-" if peer is None else ratios(row, peer)])
    return lines


def print_table(lines: list[list[str]]) -> None:
    print("| " + " | ".join(HEAD) + " |")
    print("|" + "---|" * len(HEAD))
    for line in lines:
        print("| " + " | ".join(line) + " |")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--faults", default=",".join(FAULTS))
    parser.add_argument("--ranks", type=int, default=16)
    parser.add_argument("--out", type=Path, default=None, help="run folders (default: a temp dir)")
    parser.add_argument("--analyze", type=Path, default=None, metavar="DIR",
                        help="measure nothing: print the table of the run folders in DIR "
                             "(the --out of an earlier run)")
    parser.add_argument("--quiet", action="store_true")
    args = parser.parse_args(argv)
    faults = args.faults.split(",")
    unknown = [f for f in faults if f not in FAULTS]
    if unknown:
        parser.error(f"--faults: unknown {', '.join(unknown)}; choose from {','.join(FAULTS)}")
    if args.ranks <= VICTIM:
        parser.error(f"--ranks {args.ranks}: the fault hits rank {VICTIM}; use at least {VICTIM + 1}")
    if args.analyze is not None and not args.analyze.is_dir():
        parser.error(f"--analyze {args.analyze}: no such folder")
    out = args.analyze or args.out or Path(tempfile.mkdtemp(prefix="bench-byo-compare-"))
    failed: dict[str, str] = {}
    if args.analyze is None:
        out.mkdir(parents=True, exist_ok=True)
        signals.install()
        try:
            failed = measure(faults, args.ranks, out, Progress(quiet=args.quiet, scope="byo_compare"))
        except (KeyboardInterrupt, Terminated):
            print(f"interrupted; run_scenario removed what the run made; run folders so far: {out}",
                  file=sys.stderr)
            return 130
    print_table([line for fault in faults for line in fault_lines(out, fault, failed)])
    print("\n" + COMPARABILITY)
    print(f"\nrun folders: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
