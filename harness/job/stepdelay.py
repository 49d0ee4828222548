"""The rank's side of the step_delay fault: before each step, wait what the harness's command
says, for as long as its file is there (a slow data loader).

chaos.cmdfile.StepDelayFile writes `commands/rNNN.step_delay` into the trial folder when the
fault is applied and its undo removes it. The built-in runner asks before each step, and a
user's job's step hook (harness.job.hook) before its optimizer's step: one stat a step, and
a read when the file changed. Kept light (no torch): the hook imports it into a user's job.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

from chaos.cmdfile import command_path
from harness.job.gpufault import commands_dir

KIND = "step_delay"


def step_delay_file(trial_dir: Path, rank: int) -> Path:
    """The step_delay command file of `rank` (its host is named rNNN)."""
    return command_path(commands_dir(trial_dir), f"r{rank:03d}", KIND)


class StepDelays:
    """The delay due before the next step: the command's, while its file exists."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._seen: tuple[int, int] | None = None  # (inode, mtime) of the command read
        self._delay = 0.0

    def due(self) -> float:
        try:
            stat = os.stat(self.path)
        except FileNotFoundError:
            self._seen, self._delay = None, 0.0
            return 0.0
        if (stat.st_ino, stat.st_mtime_ns) != self._seen:
            try:  # written whole, renamed into place; gone meanwhile: no delay
                self._delay = float(json.loads(self.path.read_text())["delay_s"])
            except FileNotFoundError:
                return 0.0
            self._seen = (stat.st_ino, stat.st_mtime_ns)
        return self._delay
