"""What an explore folder records and the page built from it (`chaos explore`, docs/explore.md).

    OUT/explore-<scenario>-<time>/
      explore.json    the command, the settings the draw needs again (scenario, seed, kinds,
                      weights, ...), and per session (a first run, each --resume) its budget,
                      the seconds it used and how it ended; rewritten after every run
      tried.jsonl     one line per trial, as each run ends (schedule NNN drawn, NNN-sK a
                      shrinking candidate, found-NN a rerun of a found file)
      found-NN.yaml   per failure signature: its header comments name the signature and schedule
      explore.md      this module's page: everything tried, rebuilt from the three above

The page is built from the files alone, so `chaos explore --report FOLDER` rebuilds it for an
explore that was interrupted (said so: partial). Shrinking steps are replayed from the
candidates' runs with the same greedy walk shrinking took (harness.studies.explore.shrink): each
candidate kept, dropped, skipped unrun, or undecided where the runs stop.

ExploreProgress is the one progress line against the budget, with an injected clock.
"""
from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from chaos.errors import UsageError
from harness.studies.explore.shrink import candidates, uncaused
from harness.trial.progress import Progress, duration_text

RECORD = "explore.json"
TRIED = "tried.jsonl"
PAGE = "explore.md"
RECORD_FORMAT = 1
DRAWN = re.compile(r"^(\d{3})$")
CANDIDATE = re.compile(r"^(\d{3})-s(\d+)$")
RERUN = re.compile(r"^found-(\d{2})$")


class ExploreProgress:
    """Where explore stands against its budget: elapsed of budget, schedules drawn, failure
    signatures found, ETA and what it is doing. The ETA is the runs that still fit in the
    budget (explore starts a run only when this session's mean run fits) times that mean;
    unknown before the first run. `schedules` and `found` count earlier sessions' too."""

    def __init__(self, progress: Progress, budget_s: float, clock: Callable[[], float], first_run_s: float,
                 schedules: int = 0, found: int = 0) -> None:
        self.progress = progress
        self.budget_s = budget_s
        self.clock = clock
        self.start = clock()
        self.first_run_s = first_run_s    # the estimate before any run: one schedule's least time
        self.runs_s: list[float] = []      # this session's runs: drawn schedules, candidates, reruns
        self.schedules = schedules
        self.found = found

    def elapsed_s(self) -> float:
        return self.clock() - self.start

    def mean_run_s(self) -> float:
        return sum(self.runs_s) / len(self.runs_s) if self.runs_s else self.first_run_s

    def fits(self) -> bool:
        """Whether one more run (of the mean time so far) ends within the budget."""
        return self.elapsed_s() + self.mean_run_s() <= self.budget_s

    def eta_s(self) -> float | None:
        if not self.runs_s:
            return None
        mean = self.mean_run_s()
        return max(0, math.floor((self.budget_s - self.elapsed_s()) / mean)) * mean

    def line(self, doing: str) -> str:
        eta = self.eta_s()
        return (f"elapsed {duration_text(self.elapsed_s())} of {duration_text(self.budget_s)}  "
                f"{self.schedules} schedules  {self.found} found  ETA {'?' if eta is None else duration_text(eta)}  "
                f"{doing}")

    def show(self, doing: str) -> None:
        self.progress.phase("explore", self.line(doing))


def doing_text(stem: str, repeats: int) -> str:
    """What a run of the schedule file `stem` is, for the progress line."""
    if m := CANDIDATE.match(stem):
        return f"shrinking schedule {m[1]}: candidate s{m[2]}"
    if m := RERUN.match(stem):
        return f"rerunning found-{m[1]}.yaml (up to {repeats} runs)"
    return f"drawing: schedule {stem}"


def write_record(folder: Path, record: dict[str, Any]) -> None:
    path = folder / RECORD
    path.with_suffix(".tmp").write_text(json.dumps(record, indent=1) + "\n")
    path.with_suffix(".tmp").replace(path)


def read_record(folder: Path) -> dict[str, Any]:
    """explore.json; an error naming the fix where the folder is not an explore folder of this format."""
    path = folder / RECORD
    try:
        record = json.loads(path.read_text())
    except FileNotFoundError:
        raise UsageError(f"{folder}: no {RECORD}: not an explore folder, or one written before explore recorded "
                         f"its settings; give a folder that `chaos explore` wrote (OUT/explore-<scenario>-<time>)") \
            from None
    except (OSError, ValueError) as exc:
        raise UsageError(f"{path}: cannot read it ({exc}); give a folder that `chaos explore` wrote") from None
    if record.get("format") != RECORD_FORMAT:
        raise UsageError(f"{path}: format {record.get('format')!r}, this chaos reads format {RECORD_FORMAT}; "
                         f"use the chaos version that wrote it")
    return record


def read_tried(folder: Path) -> list[dict[str, Any]]:
    """tried.jsonl's lines (a line cut off by an interruption is left out)."""
    path = folder / TRIED
    lines = []
    for text in path.read_text().splitlines() if path.exists() else ():
        try:
            lines.append(json.loads(text))
        except ValueError:
            continue
    return lines


def last_drawn(tried: list[dict[str, Any]]) -> int:
    """The number of the last drawn schedule whose trials all ended (0: none)."""
    return max((int(m[1]) for line in tried if (m := DRAWN.match(line["schedule"]))), default=0)


def unfinished(tried: list[dict[str, Any]], found: set[str]) -> list[dict[str, Any]]:
    """The drawn trials that broke the contract with a signature no found file has: a
    session ended while it shrank or reran them. The first trial of each signature."""
    first: dict[str, dict[str, Any]] = {}
    for line in tried:
        if DRAWN.match(line["schedule"]) and line["verdict"] == "broken" and line["signature"] not in found:
            first.setdefault(line["signature"], line)
    return list(first.values())


@dataclass(frozen=True)
class FoundFile:
    path: Path
    signature: str
    schedule: str             # "003"
    rerun_command: str


def found_files(folder: Path) -> list[FoundFile]:
    """The found-NN.yaml files, from their header comments."""
    found = []
    for path in sorted(folder.glob("found-[0-9][0-9].yaml")):
        header = {key: value for line in path.read_text().splitlines() if line.startswith("# ")
                  for key, value in [_header_field(line[2:])] if key}
        found.append(FoundFile(path, header.get("found", ""), header.get("schedule", ""), header.get("run", "")))
    return found


def _header_field(text: str) -> tuple[str, str]:
    if text.startswith("chaos explore found: "):
        return "found", text.removeprefix("chaos explore found: ")
    if m := re.match(r"schedule (\d{3}),", text):
        return "schedule", m[1]
    if text.startswith("run it again: "):
        return "run", text.removeprefix("run it again: ")
    return "", ""


def fault_text(fault: dict[str, Any]) -> str:
    """One fault in a few words: "kill r0 on checkpoint_save#1+0.1s", "pause r1,r2 at 3.2s for 3s"."""
    target = fault.get("target", {})
    ranks = target.get("ranks") or [target.get("rank")]
    start = fault.get("start")
    if isinstance(start, dict):
        delay = str(start.get("delay", "0s"))
        when = f"on {start.get('on')}#{start.get('nth', 1)}" + ("" if delay in ("0s", "0") else f"+{delay}")
    else:
        when = f"at {start}"
    lasting = f" for {fault['duration']}" if "duration" in fault else (" for good" if fault.get("kind") != "kill" else "")
    return f"{fault.get('kind')} {','.join(f'r{r}' for r in ranks)} {when}{lasting}"


def faults_text(faults: list[dict[str, Any]]) -> str:
    return "; ".join(fault_text(f) for f in faults)


@dataclass(frozen=True)
class Step:
    """One shrinking candidate as the walk met it."""

    faults: tuple[dict[str, Any], ...]
    result: str               # kept, dropped, skipped, undecided, not run
    failed: int = 0
    runs: int = 0
    why: str = ""


def shrink_steps(drawn: list[dict[str, Any]], runs: list[dict[str, Any]], signature: str,
                 repeats: int) -> list[Step]:
    """Shrinking's walk replayed: from the drawn faults, the candidates in the order shrinking
    takes them (harness.studies.explore.shrink), each matched with its runs in `runs` (a candidate's runs
    in tried.jsonl, in order), kept when more than half of `repeats` failed with `signature`."""
    pending = [(tuple(line["faults"]), line.get("signature") == signature) for line in runs]
    steps: list[Step] = []
    skipped: list[tuple[Any, ...]] = []
    current = tuple(drawn)
    progress = True
    while progress:
        progress = False
        for candidate in candidates(current):
            if (why := uncaused(candidate)) is not None:
                if candidate not in skipped:
                    skipped.append(candidate)
                    steps.append(Step(candidate, "skipped", why=why))
                continue
            failed = ran = 0
            while pending and pending[0][0] == candidate and ran < repeats:
                failed += pending.pop(0)[1]
                ran += 1
                if failed * 2 > repeats or (failed + repeats - ran) * 2 <= repeats:
                    break
            if not ran:
                return steps + [Step(candidate, "not run")]
            if failed * 2 > repeats:
                steps.append(Step(candidate, "kept", failed, ran))
                current, progress = candidate, True
                break
            if (failed + repeats - ran) * 2 > repeats:
                return steps + [Step(candidate, "undecided", failed, ran)]
            steps.append(Step(candidate, "dropped", failed, ran))
    return steps


def _session_text(number: int, session: dict[str, Any], last: bool) -> str:
    stopped = "partial" if last else f"resumed by session {number + 1}"
    end = {"budget": "ended: the next run would pass the budget",
           "interrupted": f"INTERRUPTED (Ctrl-C or a signal): {stopped}",
           None: f"no end recorded (killed, or still running): {stopped}"}.get(session.get("end"), session.get("end"))
    over = session.get("elapsed_s", 0) > session["budget_s"]
    return (f"session {number} ({session.get('began', '?')}): {session.get('elapsed_s', 0):.0f} s used of "
            f"{session['budget_s']:g} s budget" + (" (its last run took longer than the mean it was started on)"
                                                   if over else "") + f"; {end}")


def page(folder: Path) -> str:
    """explore.md: the command, settings, budget used, every drawn schedule's trials and each
    finding with its shrinking steps and reruns, from explore.json, tried.jsonl and found-NN.yaml."""
    record = read_record(folder)
    tried = read_tried(folder)
    found = found_files(folder)
    sessions = record["sessions"]
    partial = sessions[-1].get("end") != "budget"  # an earlier session's interruption was resumed
    drawn = [line for line in tried if DRAWN.match(line["schedule"])]
    signatures: dict[str, int] = {}
    for line in drawn:
        if line.get("signature"):
            signatures.setdefault(line["signature"], len(signatures) + 1)
    found_by_signature = {f.signature: f for f in found}
    lines = [f"# chaos explore: {record['name']}" + (" (PARTIAL)" if partial else ""), "",
             f"- command: `{record['command']}`",
             f"- scenario: {record['scenario']}, policies {', '.join(record['policies'])}, seed {record['seed']}, "
             f"kinds {', '.join(record['kinds']) or 'those the backend takes and the weights draw'}, at most {record['max_faults']} faults, "
             f"weights {record['weights'] or 'default'}, {record['repeats']} runs per shrinking candidate"
             + ("" if record["shrink"] else ", no shrinking"),
             *(f"- {_session_text(i, s, i == len(sessions))}" for i, s in enumerate(sessions, 1)),
             f"- {last_drawn(tried)} schedules drawn, {len(tried)} trials in all (shrinking and reruns included), "
             f"{len(signatures)} failure signature(s), {len(found)} found file(s)", ""]
    lines += ["## Failure signatures", ""] + [
        f"- S{n}: {sig}" + (f" -> {found_by_signature[sig].path.name}" if sig in found_by_signature
                            else " (no found file: the explore stopped before writing it)")
        for sig, n in signatures.items()] + ([] if signatures else ["none: every trial kept its contract "
                                                                    "or was not judged"]) + [""]
    lines += ["## Findings", ""]
    for f in found:
        lines += _finding(f, tried, record["repeats"]) + [""]
    if not found:
        lines += ["none", ""]
    lines += ["## Schedules tried", "", "| schedule | faults | policy | outcome | verdict | signature | s |",
              "|---|---|---|---|---|---|---|"]
    for line in drawn:
        sig = line.get("signature")
        lines.append(f"| {line['schedule']} | {faults_text(line['faults'])} | {line['policy']} | {line['outcome']} | "
                     f"{line['verdict']} | {f'S{signatures[sig]}' if sig else ''} | {line.get('seconds', '')} |")
    return "\n".join(lines) + "\n"


def _finding(found: FoundFile, tried: list[dict[str, Any]], repeats: int) -> list[str]:
    drawn = [line for line in tried if line["schedule"] == found.schedule and line.get("signature") == found.signature]
    if not drawn:
        return [f"### {found.path.name}: {found.signature}", "", "its schedule's trials are not in tried.jsonl"]
    first = drawn[0]
    policy = first["policy"]
    runs = [line for line in tried if (m := CANDIDATE.match(line["schedule"])) and m[1] == found.schedule
            and line["policy"] == policy]
    steps = shrink_steps(first["faults"], runs, found.signature, repeats)
    reruns = [line for line in tried if line["schedule"] == found.path.stem and line["policy"] == policy]
    again = sum(line["outcome"] == first["outcome"] and line["verdict"] == first["verdict"] for line in reruns)
    kept = [s for s in steps if s.result == "kept"]
    out = [f"### {found.path.name}: {found.signature}", "",
           f"- schedule {found.schedule} under {policy}, as drawn: {faults_text(first['faults'])}"]
    if first.get("cause"):
        out.append(f"- why: {first['cause']}")
    out.append(f"- shrinking: {len(first['faults'])} -> {len((kept[-1].faults if kept else first['faults']))} "
               f"fault(s); {len(kept)} kept, {sum(s.result == 'dropped' for s in steps)} dropped, "
               f"{sum(s.result == 'skipped' for s in steps)} skipped unrun")
    for s in steps:
        runs_text = f" ({s.failed} of {s.runs} runs failed alike)" if s.runs else ""
        out.append(f"  - {s.result}: {faults_text(list(s.faults))}{runs_text}" + (f": {s.why}" if s.why else ""))
    out.append(f"- reproduced: {again} of {len(reruns)} runs of the file broke {policy}'s expect: with outcome "
               f"{first['outcome']} (outcomes {', '.join(line['outcome'] for line in reruns)})" if reruns else
               "- reproduced: not rerun (the budget, or an interruption, ended the explore first)")
    if found.rerun_command:
        out.append(f"- run it again: `{found.rerun_command}`")
    return out


def write_page(folder: Path) -> Path:
    path = folder / PAGE
    path.write_text(page(folder))
    return path
