"""Where a user's job's checkpoints came from: a trial that loads a file it did not write.

The startup hook records every checkpoint the job writes and reads (`checkpoint_save`,
`checkpoint_load`: runfolder.events), with the file's identity (inode, modification time
in ns, size). A rename keeps all three, so a checkpoint written to a temporary file and
moved into place (`torch.save(tmp)`, `os.replace(tmp, path)`) is still known by what was
saved. A load is then, by the first that applies:

    this trial's     the identity of a file this trial saved (its own restart resuming)
    another trial's  the identity of a file another trial of the run saved: the trials
                     were not independent (the later one started from the earlier one's
                     state), and their comparison is not what it claims
    before the trial a file last modified before the trial began (trial.json's wall-clock
                     anchor), in a folder the job writes its checkpoints to in this run: a
                     checkpoint an earlier run left there (a file from elsewhere, such as
                     pretrained weights, is the job's input, not judged)
    unexplained      written during the trial by nothing the hook saw: not judged

The second and third are findings: the report names them, and they fail the trial's
expectations unless the scenario says trials share a checkpoint on purpose
(`job.shared_checkpoint: true`).
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Sequence

import pandas as pd

from runfolder.events import CHECKPOINT_LOAD, CHECKPOINT_SAVE
from runfolder.info import TrialInfo

Identity = tuple[int, int, int]  # inode, mtime in ns, size
ALLOW = "job.shared_checkpoint"


def file_identity(file: Any) -> Identity | None:
    """A checkpoint event's file as (inode, mtime, size); None where it names no file."""
    if not isinstance(file, dict):
        return None
    try:
        return int(file["ino"]), int(file["mtime_ns"]), int(file["size"])
    except (KeyError, TypeError, ValueError):
        return None


def _of_kind(events: pd.DataFrame, kind: str) -> list[dict[str, Any]]:
    return events[events["kind"] == kind].to_dict("records")


@dataclass(frozen=True)
class Saved:
    """What one trial's job saved: the files' identities and the folders they were in."""

    identities: frozenset[Identity]
    folders: frozenset[str]


def saved(events: pd.DataFrame) -> Saved:
    saves = _of_kind(events, CHECKPOINT_SAVE)
    return Saved(frozenset(ident for e in saves if (ident := file_identity(e.get("file")))),
                 frozenset(os.path.dirname(str(e["path"])) for e in saves))


def loaded_steps(events: pd.DataFrame, after: float) -> set[int]:
    """The steps at which this trial saved the files its job loaded after `after` (a
    restart's restore, as the job's own counting of steps saw it when it saved)."""
    steps = {ident: int(e["step"]) for e in _of_kind(events, CHECKPOINT_SAVE)
             if (ident := file_identity(e.get("file"))) is not None and e.get("step") is not None}
    return {steps[ident] for load in _of_kind(events, CHECKPOINT_LOAD)
            if float(load["t"]) > after and (ident := file_identity(load.get("file"))) in steps}


def foreign_loads(events: pd.DataFrame, info: TrialInfo, others: Sequence[tuple[str, Saved]]) -> list[str]:
    """One line per checkpoint file this trial loaded that another trial of the run wrote
    (`others`: each other trial's name and what it saved) or that existed before the trial
    began, naming the file, the ranks that loaded it and where it came from."""
    own = saved(events)
    folders = own.folders.union(*(other.folders for _, other in others))
    found: dict[tuple[str, str], set[int]] = {}  # (path, where it came from) -> ranks
    for load in _of_kind(events, CHECKPOINT_LOAD):
        ident, path = file_identity(load.get("file")), str(load["path"])
        if ident is None or ident in own.identities:
            continue
        writer = next((name for name, other in others if ident in other.identities), None)
        modified = ident[1] / 1e9
        if writer is not None:
            origin = f"written by trial {writer}"
        elif modified < info.wall_anchor and os.path.dirname(path) in folders:
            origin = f"from before the trial (last written {info.wall_anchor - modified:.0f} s before it began)"
        else:
            continue
        found.setdefault((path, origin), set()).add(int(load["rank"]))
    return [f"{_ranks(ranks)} loaded {path}, {origin}" for (path, origin), ranks in found.items()]


def _ranks(ranks: set[int]) -> str:
    return ", ".join(f"r{r}" for r in sorted(ranks))


def shared_checkpoint_failure(finding: str) -> str:
    """The expectation failure for a finding of `foreign_loads`."""
    return (f"checkpoint: {finding}: the trial did not start from its own state (give each trial its own, "
            f"a path under {{trial_dir}}, or set {ALLOW}: true)")
