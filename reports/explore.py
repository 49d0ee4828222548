"""The page of `chaos explore` (explore.md, docs/explore.md): the command, settings, budget
used, every drawn schedule's trials and each finding with its shrinking steps and reruns.

It is built from the explore folder's files alone (runfolder.explore: explore.json,
tried.jsonl, found-NN.yaml), so `chaos explore --report FOLDER` rebuilds it for an explore
that was interrupted (said so: partial). Shrinking steps are replayed from the candidates'
runs with the same greedy walk shrinking took (runfolder.shrinking): each candidate kept,
dropped, skipped unrun, or undecided where the runs stop. A folder that is not an explore
folder is refused with runfolder.info.RunFolderError, one line naming the fix.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from runfolder.explore import (CANDIDATE, DRAWN, PAGE, FoundFile, found_files, last_drawn, read_record,
                               read_tried)
from runfolder.shrinking import candidates, uncaused


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
    takes them (runfolder.shrinking), each matched with its runs in `runs` (a candidate's runs
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
