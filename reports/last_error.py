"""A crash's cause in words, from the last error lines of the log of the rank that died
first: the report's `crash_cause` (its "why" in the story), and `chaos explore`'s progress
lines, tried.jsonl and found files (docs/explore.md).

The report reads a crash as "r1-r3 crashed (first r3, exit code 1)": the exit, not why.
The log of r3 says why: under torchrun, its worker's last exception
(`[rank2]: RuntimeError: PytorchStreamReader failed reading zip archive: ...`) and then
its agent's (`ChildFailedError`, `RendezvousClosedError`). So the cause is the log's last
error line of a worker (a line torchrun prefixes `[rankN]:`) and its last of its own (the
agent's, or the harness's runner's), in that order, each cut to its first sentence.

An error line is the last line of a Python traceback (`OSError: [Errno 22] Invalid
argument`; the module path of the exception's name left out) or a line the line classifier
(runfolder.classify) names a cause for (an NCCL watchdog's, an agent's).
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Iterable

from runfolder.classify import classify_line
from runfolder.layout import rank_log

WORKER_PREFIX = re.compile(r"^\[(?:rank|default)\d+\]:\s*")
EXCEPTION = re.compile(r"^(?:[A-Za-z_]\w*\.)*(?P<name>[A-Za-z_]\w*(?:Error|Exception|Interrupt|Exit))(?::\s*(?P<message>.*))?$")
SHORT = 160  # characters of one error line at most
TAIL_BYTES = 256 * 1024  # a log's last error lines are in its end; a rank's log may be long


def error_line(line: str) -> str | None:
    """`line` as a short error line, or None for an ordinary one."""
    text = WORKER_PREFIX.sub("", line.strip())
    if (exception := EXCEPTION.match(text)) is not None:
        message = (exception["message"] or "").strip()
        text = exception["name"] + (f": {message}" if message else "")
    elif classify_line(text) is None:
        return None
    first = re.split(r"(?<=[^.\s]{2})\. ", text, maxsplit=1)[0]  # its first sentence
    return first if len(first) <= SHORT else first[:SHORT - 3] + "..."


def last_errors(lines: Iterable[str]) -> list[str]:
    """A log's last error line of a worker (torchrun's `[rankN]:` prefix) and its last of its
    own, in that order (one where the two are the same or one is missing; none: none)."""
    worker = own = None
    worker_prefix = ""
    for line in lines:
        found = error_line(line)
        if found is None:
            continue
        prefix = WORKER_PREFIX.match(line.strip())
        if prefix is not None:
            worker, worker_prefix = found, prefix.group(0).strip().rstrip(":") + " "
        else:
            own = found
    shown = [f"{worker_prefix}{worker}" if worker else None, own if own != worker else None]
    return [line for line in shown if line]


def crash_cause(trial_dir: Path, ranks: Iterable[int]) -> str:
    """The cause of a crash: the last error lines of the first of `ranks` (in the order they
    died) whose log has any, as `r3: [rank2] RuntimeError: ...; then ChildFailedError`; ""
    where no log has one."""
    for rank in ranks:
        log = rank_log(trial_dir, rank)
        try:
            with log.open("rb") as handle:
                handle.seek(max(0, log.stat().st_size - TAIL_BYTES))
                text = handle.read().decode("utf-8", errors="replace")
        except OSError:
            continue
        errors = last_errors(text.splitlines())
        if errors:
            return f"r{rank}: " + "; then ".join(errors)
    return ""
