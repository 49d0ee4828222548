"""`chaos explore`: draw fault schedules (harness.studies.explore.generator), run each as a trial per
policy, judge every trial against its policy's contract (reports.oracle), until the budget.

    chaos explore SCENARIO.yaml [--policy P]... [--budget 10m] [--kinds kill,pause]
        [--max-faults 3] [--weights FILE] [--seed N] [--repeats 3] [--no-shrink] [--backend B]
        [--out DIR] [--dry-run] [--quiet]
    chaos explore --resume FOLDER [--budget B] [--quiet];  chaos explore --report FOLDER

Writes OUT/explore-<scenario>-<time>/: schedules/NNN.yaml (each drawn schedule as a
scenario; NNN-sK.yaml each candidate of its shrinking), runs/ (their run folders),
tried.jsonl (one line per trial: schedule, policy, outcome, verdict, violations, signature,
a crash's cause, seconds), and per new failure signature found-NN.yaml: the schedule that
broke the contract, shrunk (harness.studies.explore.shrink, each candidate run --repeats times) while
the budget lasts, with an `expect:` block it fails today, and in comments the signature, a
crash's cause (reports.last_error), how far it shrank, its reproduction count (the file
itself run --repeats times as `chaos run` runs it, while the budget lasts: the runs that
broke its expect: with the found outcome) and the command that runs it again; explore.json
(the command, settings and each session's budget) and explore.md, the page of everything
tried (reports.explore). --resume FOLDER goes on with an interrupted folder: first
the findings it was still shrinking (a drawn trial that broke the contract with no found
file yet: shrunk again from the drawn schedule), then its seeded draw after its last
schedule; --report FOLDER rebuilds its page.
Exit status 1 when a trial broke its contract, 0 when none did within the budget.
"""
from __future__ import annotations

import argparse
import datetime
import itertools
import json
import shlex
import sys
import time
from pathlib import Path
from typing import Any, Callable, NamedTuple

import yaml
from pydantic import ValidationError

from chaos.errors import UsageError
from chaos.faults import kind_names
from chaos.units import parse_duration
from harness.cluster.backends import BACKEND_NAMES, backends_with
from harness.scenario.anchors import ANCHOR_NAMES
from harness.scenario.scenario import Scenario, load_scenario, reproduce_command
from harness.scenario.yaml_errors import describe_errors, line_of
from harness.studies.explore.generator import ExploreOptions, Schedule, Weights, explorable_kinds, schedules

DEFAULT_BUDGET = "10m"
SHOWN_BY_DRY_RUN = 5


def add_explore_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("scenario", nargs="?", help="a scenario: its cluster, workload or job, policies and seed "
                                                    "are used; its faults are replaced by the drawn ones")
    parser.add_argument("--policy", action="append", help="policy (or job variant) to explore (repeatable; "
                                                          "default: all in the file)")
    parser.add_argument("--budget", help=f"stop before a trial that would pass it (default {DEFAULT_BUDGET}; "
                                         f"with --resume, what the folder's budget left unused)")
    parser.add_argument("--kinds", help="fault kinds to draw, comma-separated (default: every kind the backend "
                                        "and job take)")
    parser.add_argument("--max-faults", type=int, default=3, help="faults per schedule at most (default 3)")
    parser.add_argument("--weights", help="a YAML file of the generator's weights (harness.studies.explore.generator.Weights: "
                                          "kinds, events, on_event, durations; docs/explore.md)")
    parser.add_argument("--seed", type=int, default=0, help="the generator's seed (default 0)")
    parser.add_argument("--backend", choices=BACKEND_NAMES, help="host backend (default: the scenario's)")
    parser.add_argument("--out", default="explore", help="folder of explore folders (default: ./explore)")
    parser.add_argument("--repeats", type=int, default=3, help="runs of each shrinking candidate: kept when more "
                                                               "than half fail alike (default 3)")
    parser.add_argument("--expect", action="store_true", help="judge the drawn schedules by the scenario's own "
                                                              "expect: block (default: each policy's contract; "
                                                              "the block was written for the scenario's faults)")
    parser.add_argument("--no-shrink", action="store_true", help="write a failing schedule as it was drawn")
    parser.add_argument("--dry-run", action="store_true", help="print the first schedules and the time per trial")
    parser.add_argument("--quiet", action="store_true", help="no progress lines (the budget's and the trials'); "
                                                             "the line per trial stays")
    parser.add_argument("--resume", metavar="FOLDER", help="continue an interrupted explore folder: its settings, "
                                                           "the seeded draw after its last schedule in tried.jsonl")
    parser.add_argument("--report", metavar="FOLDER", help="rebuild FOLDER/explore.md from its tried.jsonl and "
                                                           "found files; runs nothing")


def _options(args: argparse.Namespace, scenario: Scenario) -> ExploreOptions:
    if args.repeats < 1:
        raise UsageError(f"--repeats {args.repeats}: each shrinking candidate runs at least once; give 1 or more")
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
    weights = _weights(Path(args.weights)) if args.weights else Weights()
    options = ExploreOptions(max_faults=args.max_faults, seed=args.seed, kinds=kinds, policies=policies,
                             weights=weights)
    refused = [k for k in kinds if k not in explorable_kinds(scenario, options)]
    if refused:
        able = backends_with("network_faults") if refused[0] not in ("kill", "pause") else ()
        raise UsageError(f"--kinds {refused[0]}: the {scenario.cluster.backend} backend cannot inject it into this "
                         f"scenario's job" + (f" (try --backend {' or '.join(able)})" if able else "")
                         + "; leave it out")
    return options


def _weights(path: Path) -> Weights:
    """The generator's weights from a YAML file; its problems as file:line: field: problem."""
    try:
        text = path.read_text(encoding="utf-8")
        data = yaml.safe_load(text)
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise UsageError(f"--weights {path}: cannot read it as YAML ({exc})") from None
    try:
        weights = Weights.model_validate(data or {})
    except ValidationError as exc:
        raise UsageError("\n".join(f"{path}{f':{line}' if (line := line_of(root, loc)) else ''}: {message}"
                                    for loc, message in describe_errors(exc))) from None
    unknown = [k for k in weights.kinds if k not in kind_names()] + [e for e in weights.events if e not in ANCHOR_NAMES]
    if unknown:
        raise UsageError(f"{path}: {unknown[0]}: neither a fault kind nor an event (kinds: {', '.join(kind_names())}; "
                         f"events: {', '.join(ANCHOR_NAMES)})")
    return weights


def judged_by(scenario: Scenario, path: str, own_expect: bool) -> Scenario:
    """The scenario whose drawn schedules are judged: by each policy's contract, its own
    expect: block left out (written for its own faults, a recovery within 40 s of its link
    down, it would read as broken most schedules the policy handled well), unless
    `own_expect` (--expect: a planted expectation as the oracle)."""
    if not scenario.expect or own_expect:
        return scenario
    print(f"explore: {path}'s expect: block is for its own faults; the drawn schedules are judged by each "
          "policy's contract (--expect judges them by the block)", file=sys.stderr)
    return scenario.model_copy(update={"expect": {}})


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


# settings an explore folder keeps (explore.json): --resume takes them from there
RESUMED_SETTINGS = {"policy": None, "kinds": None, "max_faults": 3, "weights": None, "seed": 0, "backend": None,
                    "repeats": 3, "no_shrink": False, "dry_run": False, "expect": False}


def _resumed(args: argparse.Namespace, record: dict[str, Any]) -> argparse.Namespace:
    """`args` with the explore folder's settings (explore.json), refusing any given anew."""
    given = [name for name, default in RESUMED_SETTINGS.items() if getattr(args, name) != default]
    if args.scenario or given:
        what = "SCENARIO" if args.scenario else "--" + given[0].replace("_", "-")
        raise UsageError(f"--resume {args.resume}: {what} is the folder's own (explore.json); leave it out "
                         f"(only --budget and --quiet go with --resume)")
    return argparse.Namespace(**{**vars(args), "scenario": record["scenario"], "policy": record["policies"],
                                 "kinds": ",".join(record["kinds"]) or None, "max_faults": record["max_faults"],
                                 "weights": record["weights"], "seed": record["seed"], "backend": record["backend"],
                                 "repeats": record["repeats"], "no_shrink": not record["shrink"],
                                 "expect": record.get("expect", False)})


def _budget_s(args: argparse.Namespace, record: dict[str, Any] | None) -> float:
    """This session's budget: --budget, or with --resume what the folder's budget left unused."""
    if args.budget is None and record is not None:
        return max(0.0, record["budget_s"] - sum(s["elapsed_s"] for s in record["sessions"]))
    try:
        return parse_duration(args.budget or DEFAULT_BUDGET)
    except ValueError as exc:
        raise UsageError(f"--budget {args.budget}: {exc}") from None


def explore_command(args: argparse.Namespace) -> int:
    from harness.studies.explore.progress import ExploreProgress, doing_text
    from runfolder.explore import (RECORD_FORMAT, TRIED, found_files, last_drawn, read_record, read_tried, unfinished,
                                   write_record)
    from runfolder.info import RunFolderError, read_trial_info
    try:
        if args.report:
            if args.scenario or args.resume:
                raise UsageError(f"--report {args.report}: it rebuilds a folder's page and runs nothing; leave out "
                                 f"{'the scenario' if args.scenario else '--resume'}")
            from reports.explore import write_page
            print(write_page(Path(args.report)))
            return 0
        record = read_record(Path(args.resume)) if args.resume else None
    except RunFolderError as exc:  # not an explore folder of this format: the message names the fix
        raise UsageError(str(exc)) from None
    if record is not None:
        args = _resumed(args, record)
    elif not args.scenario:
        raise UsageError("chaos explore: give a scenario file (or --resume FOLDER, or --report FOLDER)")
    overrides = {"cluster.backend": args.backend} if args.backend else None
    scenario = judged_by(load_scenario(args.scenario, overrides), args.scenario, args.expect)
    options = _options(args, scenario)
    budget = _budget_s(args, record)
    floor = trial_floor_s(scenario)
    per_schedule = floor * len(options.policies)
    if budget < per_schedule:
        spent = (f"what its budget left ({budget:.0f} s of {record['budget_s']:g} s)" if record is not None
                 and args.budget is None else f"--budget {args.budget}")
        raise UsageError(f"{spent}: shorter than one schedule's trials ({len(options.policies)} "
                         f"x at least {floor:g} s of warm-up and settling); give --budget of at least "
                         f"{per_schedule:.0f}s")
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
    from harness.signals import Terminated
    from harness.studies.explore.shrink import shrink
    from harness.trial.scenario_run import run_scenario
    from harness.trial.progress import Progress
    import reports
    from reports.explore import write_page
    from reports.oracle import BROKEN, TOLERANT_ENDS, judge
    from runfolder.layout import trial_dir

    def run(path: Path, policies: list[str]) -> list[Judged]:
        """Run one schedule's scenario file: per policy, its outcome, verdict and, where it
        crashed, the cause (reports.last_error)."""
        progress.show(doing_text(path.stem, args.repeats))
        began = time.monotonic()
        run_dir, _ = run_scenario(load_scenario(path), path, policies, folder / "runs", backend,
                                  Progress(quiet=args.quiet, scope=path.stem))
        progress.runs_s.append(time.monotonic() - began)
        session["elapsed_s"] = round(progress.elapsed_s(), 1)
        write_record(folder, record)
        judged = []
        for _, row in reports.analyze_run(run_dir).iterrows():
            trial = trial_dir(run_dir, row["trial"])
            verdict = judge(row, read_trial_info(trial).plan)
            cause = row["crash_cause"] if row["outcome"] == "crashed" else ""
            judged.append(Judged(row["trial"], row["outcome"], verdict, cause))
            with (folder / TRIED).open("a") as tried:
                tried.write(json.dumps({"schedule": path.stem, "faults": yaml.safe_load(path.read_text())["faults"],
                                        "policy": row["trial"], "outcome": row["outcome"],
                                        "verdict": verdict.verdict, "violations": verdict.violations,
                                        "signature": verdict.signature, "cause": cause,
                                        "seconds": round(progress.runs_s[-1], 1), "run": str(run_dir),
                                        "session": len(record["sessions"])}) + "\n")
        return judged

    require_privileges("chaos explore", scenario.cluster.backend)
    if record is None:
        stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
        folder = Path(args.out).resolve() / f"explore-{scenario.name}-{stamp}"
        (folder / "schedules").mkdir(parents=True)
        record = {"format": RECORD_FORMAT, "command": shlex.join(["chaos", *sys.argv[1:]]),
                  "scenario": str(Path(args.scenario).resolve()), "name": scenario.name, "seed": options.seed,
                  "budget_s": budget, "max_faults": options.max_faults, "kinds": list(options.kinds),
                  "policies": list(options.policies), "weights": str(Path(args.weights).resolve()) if args.weights
                  else None, "repeats": args.repeats, "shrink": not args.no_shrink, "expect": args.expect,
                  "backend": scenario.cluster.backend, "sessions": []}
    else:
        folder = Path(args.resume).resolve()
    session = {"command": shlex.join(["chaos", *sys.argv[1:]]),
               "began": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
               "budget_s": budget, "elapsed_s": 0.0, "end": None}
    record["sessions"].append(session)
    write_record(folder, record)
    backend = backend_named(scenario.cluster.backend)
    tried = read_tried(folder)
    # signature -> its found-NN.yaml (a resumed folder's own first)
    found: dict[str, Path] = {f.signature: f.path for f in found_files(folder)}
    schedule: Schedule = first
    while schedule.number <= last_drawn(tried):  # resumed: the seeded draw goes on after its last schedule
        schedule = next(drawn)
    progress = ExploreProgress(Progress(quiet=args.quiet), budget, time.monotonic, per_schedule,
                               schedules=schedule.number - 1, found=len(found))

    def investigate(schedule: Schedule, drawn_run: Judged) -> None:
        """Shrink a drawn trial that broke the contract, write its found file, rerun it."""
        policy, _, verdict, _ = drawn_run
        fails = _fails_alike(run, folder, scenario, schedule.number, policy, verdict.signature)
        shrunk = None if args.no_shrink else shrink(schedule.faults, (1, 1), fails, args.repeats, progress.fits)
        written = _write_found(folder, len(found) + 1, scenario, schedule, shrunk, drawn_run, TOLERANT_ENDS)
        # the written file run as a user runs it (judged by its expect: block), while the budget lasts
        reruns = _reproduce(run, written, policy, args.repeats, progress.fits)
        _write_found(folder, len(found) + 1, scenario, schedule, shrunk, drawn_run, TOLERANT_ENDS, reruns)
        found[verdict.signature] = written
        progress.found = len(found)
        print(f"  found: {written}\n  {_shrink_text(schedule, shrunk)}\n  "
              f"{_reproduced_text(drawn_run, reruns)}", flush=True)

    try:
        # a session that ended while it shrank: its finding first, from its drawn trial (with
        # no budget left, written as drawn: the found file without shrinking)
        for line in unfinished(tried, set(found)):
            print(f"schedule {line['schedule']} {line['policy']:10} {line['outcome']:18} broken: "
                  f"{line['signature']} (an earlier session's; shrinking it again)", flush=True)
            investigate(Schedule(int(line["schedule"]), tuple(line["faults"])), _judged(line))
        while progress.fits():
            path = folder / "schedules" / f"{schedule.number:03d}.yaml"
            path.write_text(yaml.safe_dump(schedule_scenario(scenario, schedule), sort_keys=False))
            progress.schedules = schedule.number
            for drawn_run in run(path, list(options.policies)):
                policy, outcome, verdict, cause = drawn_run
                print(f"schedule {schedule.number:3d} {policy:10} {outcome:18} {verdict.verdict}"
                      + (f": {verdict.signature}" if verdict.signature else "") + (f"; why: {cause}" if cause else ""),
                      flush=True)
                if verdict.verdict == BROKEN and verdict.signature not in found:
                    investigate(schedule, drawn_run)
            schedule = next(drawn)
    except (KeyboardInterrupt, Terminated):
        session.update(end="interrupted", elapsed_s=round(progress.elapsed_s(), 1))
        write_record(folder, record)
        progress.show(f"interrupted: `chaos explore --resume {folder}` goes on; the page so far (partial): "
                      f"{write_page(folder)}")
        raise
    session.update(end="budget", elapsed_s=round(progress.elapsed_s(), 1))
    write_record(folder, record)
    print(f"{progress.schedules} schedules drawn, {len(found)} failure signature(s) found; this session: "
          f"{len(progress.runs_s)} runs (shrinking and reruns included) in {progress.elapsed_s():.0f} s of {budget:g} s; "
          f"{folder}; page {write_page(folder)}")
    for signature, written in found.items():
        print(f"found: {signature}\n  {written}", file=sys.stderr)
    return 1 if found else 0


class Judged(NamedTuple):
    """One trial of a run that explore made: its policy, outcome, the oracle's verdict and,
    where it crashed, the cause from the rank logs' last error lines ("" otherwise)."""

    policy: str
    outcome: str
    verdict: Any                     # reports.oracle.Verdict
    cause: str


def reproduces(judged: list[Judged], found: Judged) -> bool:
    """Whether one run showed the found failure again: `found.policy`'s trial broke its
    contract with the same outcome. By outcome, not signature: a found file is judged by the
    expect: block written into it, whose failures read otherwise than the contract's
    violations ("outcome: expected absorbed or ..., measured crashed" for "outcome crashed: ...")."""
    from reports.oracle import BROKEN
    return any(j.policy == found.policy and j.outcome == found.outcome and j.verdict.verdict == BROKEN
               for j in judged)


def _judged(line: dict[str, Any]) -> Judged:
    """A drawn trial as tried.jsonl keeps it."""
    from reports.oracle import Verdict
    return Judged(line["policy"], line["outcome"], Verdict(line["verdict"], tuple(line["violations"]), line["signature"]),
                  line.get("cause", ""))


def _fails_alike(run: Callable[[Path, list[str]], list[Judged]], folder: Path, scenario: Scenario,
                 number: int, policy: str, signature: str) -> Callable[[tuple[dict[str, Any], ...]], bool]:
    """What runs one shrinking candidate of schedule `number`: written as NNN-sK.yaml, run
    under `policy`, true when it broke the contract with the same signature (the candidate is
    judged as the drawn schedule was: shrinking keeps the failure's words, not only its outcome).
    K goes on after the candidates an earlier session wrote."""
    written = [int(p.stem.rsplit("-s", 1)[1]) for p in (folder / "schedules").glob(f"{number:03d}-s*.yaml")]
    numbers = itertools.count(max(written, default=0) + 1)

    def fails(faults: tuple[dict[str, Any], ...]) -> bool:
        candidate = folder / "schedules" / f"{number:03d}-s{next(numbers)}.yaml"
        candidate.write_text(yaml.safe_dump(schedule_scenario(scenario, Schedule(number, faults)), sort_keys=False))
        return any(j.policy == policy and j.verdict.signature == signature for j in run(candidate, [policy]))
    return fails


def _reproduce(run: Callable[[Path, list[str]], list[Judged]], written: Path, policy: str, repeats: int,
               time_left: Callable[[], bool]) -> list[Judged]:
    """The found file run `repeats` times under `policy` as `chaos run` runs it (judged by its
    expect: block), fewer where the budget ends first: `policy`'s trial of each run."""
    reruns: list[Judged] = []
    while len(reruns) < repeats and time_left():
        reruns += [j for j in run(written, [policy]) if j.policy == policy]
    return reruns


def _shrink_text(schedule: Schedule, shrunk: Any) -> str:
    """How far shrinking went, in words (harness.studies.explore.shrink.Shrunk; None: not shrunk)."""
    if shrunk is None:
        return "as drawn (not shrunk)"
    failed, runs = shrunk.reproduced
    return (f"shrunk from {len(schedule.faults)} to {len(shrunk.faults)} fault(s) over {len(shrunk.tried)} candidates"
            + (" (the budget ended it)" if shrunk.out_of_time else "")
            + (f", {len(shrunk.skipped)} more skipped unrun ({shrunk.skipped[0][1]})" if shrunk.skipped else "")
            + f"; its last runs while shrinking failed with the same signature in {failed} of {runs}")


def _reproduced_text(found: Judged, reruns: list[Judged] | None) -> str:
    """The reproduction count of a found file, in words, with what defines it."""
    if reruns is None:
        return "reproduced: not yet rerun"
    if not reruns:
        return "reproduced: not rerun, the budget ended first"
    again = sum(reproduces([j], found) for j in reruns)
    return (f"reproduced: this file broke {found.policy}'s expect: with outcome {found.outcome} in {again} of "
            f"{len(reruns)} runs of it (outcomes {', '.join(j.outcome for j in reruns)})")


def _write_found(folder: Path, number: int, scenario: Scenario, schedule: Schedule, shrunk: Any, found: Judged,
                 tolerant: tuple[str, ...], reruns: list[Judged] | None = None) -> Path:
    """The schedule that broke `found.policy`'s contract (shrunk, where it was) as a scenario,
    with an expect: block that it fails today (the contract, or the scenario's own
    expectation), and in comments the failure, its cause, shrinking and reproduction."""
    faults = schedule.faults if shrunk is None else shrunk.faults
    data = schedule_scenario(scenario, Schedule(schedule.number, faults))
    data["name"] = f"{scenario.name}-found-{number:02d}"
    data.setdefault("expect", {})[found.policy] = data.get("expect", {}).get(found.policy) or {
        "outcome": list(tolerant), "state": "consistent"}
    path = folder / f"found-{number:02d}.yaml"
    why = [f"# why (schedule {schedule.number:03d} as drawn; the last error lines of the rank that died first): "
           f"{found.cause}\n"] if found.cause else []
    header = (f"# chaos explore found: {found.verdict.signature}\n", *why,
              f"# schedule {schedule.number:03d}, {_shrink_text(schedule, shrunk)}\n",
              f"# {_reproduced_text(found, reruns)}\n",
              f"# run it again: {reproduce_command(path, found.policy, scenario.seed)}\n")
    path.write_text("".join(header) + yaml.safe_dump(data, sort_keys=False))
    return path

