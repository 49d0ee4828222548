"""An explore folder's record: the files `chaos explore` writes (harness.studies.explore) and
its page reads back (reports.explore), their names, format and reading, in one place.

    OUT/explore-<scenario>-<time>/
      explore.json    the command, the settings the draw needs again (scenario, seed, kinds,
                      weights, ...), and per session (a first run, each --resume) its budget,
                      the seconds it used and how it ended; rewritten after every run
      tried.jsonl     one line per trial, as each run ends (schedule NNN drawn, NNN-sK a
                      shrinking candidate, found-NN a rerun of a found file)
      found-NN.yaml   per failure signature: its header comments name the signature and schedule
      explore.md      the page of everything tried (reports.explore), rebuilt from the three above

A folder that is not an explore folder of this format is refused with `RunFolderError`, one
line naming the file, what is wrong and the fix; the harness says it as a usage error.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from runfolder.info import RunFolderError

RECORD = "explore.json"
TRIED = "tried.jsonl"
PAGE = "explore.md"
RECORD_FORMAT = 1
# a schedule's name in tried.jsonl and schedules/: drawn, a shrinking candidate, a found file's rerun
DRAWN = re.compile(r"^(\d{3})$")
CANDIDATE = re.compile(r"^(\d{3})-s(\d+)$")
RERUN = re.compile(r"^found-(\d{2})$")


def write_record(folder: Path, record: dict[str, Any]) -> None:
    path = folder / RECORD
    path.with_suffix(".tmp").write_text(json.dumps(record, indent=1) + "\n")
    path.with_suffix(".tmp").replace(path)


def read_record(folder: Path) -> dict[str, Any]:
    """explore.json; RunFolderError naming the fix where the folder is not an explore folder of this format."""
    path = folder / RECORD
    try:
        record = json.loads(path.read_text())
    except FileNotFoundError:
        raise RunFolderError(f"{folder}: no {RECORD}: not an explore folder, or one written before explore "
                             f"recorded its settings; give a folder that `chaos explore` wrote "
                             f"(OUT/explore-<scenario>-<time>)") from None
    except (OSError, ValueError) as exc:
        raise RunFolderError(f"{path}: cannot read it ({exc}); give a folder that `chaos explore` wrote") from None
    if record.get("format") != RECORD_FORMAT:
        raise RunFolderError(f"{path}: format {record.get('format')!r}, this chaos reads format {RECORD_FORMAT}; "
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
