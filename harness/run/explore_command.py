"""`chaos explore`: draw fault schedules (harness.run.explore), run each as a trial per
policy, judge every trial against its policy's contract (reports.oracle), until the budget.

    chaos explore SCENARIO.yaml [--policy P]... [--budget 10m] [--kinds kill,pause]
        [--max-faults 3] [--seed N] [--backend B] [--out DIR] [--dry-run] [--quiet]

Writes OUT/explore-<scenario>-<time>/: schedules/NNN.yaml (each drawn schedule as a
scenario), runs/ (their run folders), tried.jsonl (one line per trial: schedule, policy,
outcome, verdict, violations, signature, seconds), and per new failure signature
found-NN.yaml: the schedule that broke the contract, with an `expect:` block it fails
today, the signature in a comment and the command that runs it again. Not yet: shrinking
(the written schedule is the one drawn), repeats of a found schedule, resume.
Exit status 1 when a trial broke its contract, 0 when none did within the budget.
"""
from __future__ import annotations

import argparse
import datetime
import json
import sys
import time
from pathlib import Path
from typing import Any

import yaml

from chaos.errors import UsageError
from chaos.faults import kind_names
from chaos.units import parse_duration
from harness.cluster.backends import BACKEND_NAMES, backends_with
from harness.run.explore import ExploreOptions, Schedule, explorable_kinds, schedules
from harness.run.scenario import Scenario, load_scenario, reproduce_command

DEFAULT_BUDGET = "10m"
SHOWN_BY_DRY_RUN = 5


def add_explore_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("scenario", help="a scenario: its cluster, workload or job, policies and seed are used; "
                                         "its faults are replaced by the drawn ones")
    parser.add_argument("--policy", action="append", help="policy (or job variant) to explore (repeatable; "
                                                          "default: all in the file)")
    parser.add_argument("--budget", default=DEFAULT_BUDGET, help=f"stop before a trial that would pass it "
                                                                 f"(default {DEFAULT_BUDGET})")
    parser.add_argument("--kinds", help="fault kinds to draw, comma-separated (default: every kind the backend "
                                        "and job take)")
    parser.add_argument("--max-faults", type=int, default=3, help="faults per schedule at most (default 3)")
    parser.add_argument("--seed", type=int, default=0, help="the generator's seed (default 0)")
    parser.add_argument("--backend", choices=BACKEND_NAMES, help="host backend (default: the scenario's)")
    parser.add_argument("--out", default="explore", help="folder of explore folders (default: ./explore)")
    parser.add_argument("--dry-run", action="store_true", help="print the first schedules and the time per trial")
    parser.add_argument("--quiet", action="store_true", help="no progress output from the trials")


def _options(args: argparse.Namespace, scenario: Scenario) -> ExploreOptions:
    if args.max_faults < 1:
        raise UsageError(f"--max-faults {args.max_faults}: a schedule needs at least one fault; give 1 or more")
    kinds = tuple(k.strip() for k in args.kinds.split(",") if k.strip()) if args.kinds else ()
    unknown = [k for k in kinds if k not in kind_names()]
    if unknown:
        raise UsageError(f"--kinds {unknown[0]}: not a fault kind; give some of {', '.join(kind_names())}")
    policies = tuple(args.policy or scenario.trial_names())
    missing = [p for p in policies if p not in scenario.trial_names()]
    if missing:
        raise UsageError(f"--policy {missing[0]}: not in {args.scenario}'s policies (or a job's variants: "
                         f"{', '.join(scenario.trial_names())}); pick one of those")
    options = ExploreOptions(max_faults=args.max_faults, seed=args.seed, kinds=kinds, policies=policies)
    refused = [k for k in kinds if k not in explorable_kinds(scenario, options)]
    if refused:
        able = backends_with("network_faults") if refused[0] not in ("kill", "pause") else ()
        raise UsageError(f"--kinds {refused[0]}: the {scenario.cluster.backend} backend cannot inject it into this "
                         f"scenario's job" + (f" (try --backend {' or '.join(able)})" if able else "")
                         + "; leave it out")
    return options


def trial_floor_s(scenario: Scenario) -> float:
    """The least one trial can take: its warm-up and settle steps at the step period (a
    user's job's: its hang cap, watched when it makes no step). Bring-up not counted."""
    if scenario.job is not None:
        return scenario.hang_cap
    return (scenario.warmup_steps + scenario.settle_steps) * scenario.workload.step_period


def schedule_scenario(scenario: Scenario, schedule: Schedule) -> dict[str, Any]:
    """The scenario file of one drawn schedule (the job's folder absolute: it is written
    elsewhere)."""
    data = scenario.model_dump(mode="json", exclude_defaults=True, exclude={"faults", "name"})
    if scenario.job is not None:
        data["job"] = {**data.get("job", {}), "workdir": scenario.job.workdir}
    return {"name": f"{scenario.name}-{schedule.number:03d}", **data, "faults": list(schedule.faults)}


def explore_command(args: argparse.Namespace) -> int:
    overrides = {"cluster.backend": args.backend} if args.backend else None
    scenario = load_scenario(args.scenario, overrides)
    options = _options(args, scenario)
    try:
        budget = parse_duration(args.budget)
    except ValueError as exc:
        raise UsageError(f"--budget {args.budget}: {exc}") from None
    floor = trial_floor_s(scenario)
    per_schedule = floor * len(options.policies)
    if budget < per_schedule:
        raise UsageError(f"--budget {args.budget}: shorter than one schedule's trials ({len(options.policies)} "
                         f"x at least {floor:g} s of warm-up and settling); give at least {per_schedule:.0f}s")
    try:
        drawn = schedules(scenario, options)
        first = next(drawn)
    except ValueError as exc:
        raise UsageError(f"{args.scenario}: {exc}") from None
    if args.dry_run:
        print(f"explore {scenario.name} ({args.scenario}) under {', '.join(options.policies)}, seed {options.seed}, "
              f"kinds {', '.join(explorable_kinds(scenario, options))}: each schedule is a trial per policy, "
              f"each at least {floor:g} s (warm-up and settling; bring-up and the faults' own time come on top)")
        for schedule in [first, *(next(drawn) for _ in range(SHOWN_BY_DRY_RUN - 1))]:
            print(f"  {schedule.number:3d}: " + "; ".join(json.dumps(f) for f in schedule.faults))
        return 0
    from harness.cluster.backends import backend_named, require_privileges
    from harness.run.orchestrator import run_scenario
    from harness.run.progress import Progress
    import reports
    from reports.oracle import BROKEN, TOLERANT_ENDS, judge
    from runfolder.info import read_trial_info
    from runfolder.layout import trial_dir

    require_privileges("chaos explore", scenario.cluster.backend)
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    folder = Path(args.out).resolve() / f"explore-{scenario.name}-{stamp}"
    (folder / "schedules").mkdir(parents=True)
    backend = backend_named(scenario.cluster.backend)
    started, took, found = time.monotonic(), [], {}
    schedule: Schedule | None = first
    while schedule is not None:
        eta = sum(took) / len(took) if took else per_schedule
        if time.monotonic() - started + eta > budget:
            break
        path = folder / "schedules" / f"{schedule.number:03d}.yaml"
        path.write_text(yaml.safe_dump(schedule_scenario(scenario, schedule), sort_keys=False))
        began = time.monotonic()
        run_dir, _ = run_scenario(load_scenario(path), path, list(options.policies), folder / "runs", backend,
                                  Progress(quiet=args.quiet, scope=path.stem))
        took.append(time.monotonic() - began)
        for _, row in reports.analyze_run(run_dir).iterrows():
            plan = read_trial_info(trial_dir(run_dir, row["trial"])).plan
            verdict = judge(row, plan)
            with (folder / "tried.jsonl").open("a") as tried:
                tried.write(json.dumps({"schedule": schedule.number, "faults": schedule.faults, "policy": row["trial"],
                                        "outcome": row["outcome"], "verdict": verdict.verdict,
                                        "violations": verdict.violations, "signature": verdict.signature,
                                        "seconds": round(took[-1], 1), "run": str(run_dir)}) + "\n")
            print(f"schedule {schedule.number:3d} {row['trial']:10} {row['outcome']:18} {verdict.verdict}"
                  + (f": {verdict.signature}" if verdict.signature else ""), flush=True)
            if verdict.verdict == BROKEN and verdict.signature not in found:
                found[verdict.signature] = _write_found(folder, len(found) + 1, path, row["trial"], verdict,
                                                        scenario.seed, TOLERANT_ENDS)
        schedule = next(drawn)
    print(f"{len(took)} schedules in {time.monotonic() - started:.0f} s of {budget:g} s; "
          f"{len(found)} failure signature(s); {folder}")
    for signature, written in found.items():
        print(f"found: {signature}\n  {written}", file=sys.stderr)
    return 1 if found else 0


def _write_found(folder: Path, number: int, schedule_file: Path, policy: str, verdict: Any, seed: int,
                 tolerant: tuple[str, ...]) -> Path:
    """The schedule that broke `policy`'s contract as a scenario, with an expect: block that
    it fails today (the contract, or the scenario's own expectation)."""
    data = yaml.safe_load(schedule_file.read_text())
    data.setdefault("expect", {})[policy] = data.get("expect", {}).get(policy) or {
        "outcome": list(tolerant), "state": "consistent"}
    path = folder / f"found-{number:02d}.yaml"
    command = reproduce_command(path, policy, seed)
    header = (f"# chaos explore found: {verdict.signature}\n# drawn as {schedule_file.name} (not shrunk); "
              f"run it again: {command}\n")
    path.write_text(header + yaml.safe_dump(data, sort_keys=False))
    return path

