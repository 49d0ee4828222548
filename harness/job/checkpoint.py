"""Atomic checkpoints: write a temp file, fsync it, os.replace it, fsync the directory.

A reader only ever sees complete files (``step-00000120.pt``); a crash mid-write leaves at
most a ``.tmp-*`` file that the next save removes, and a save the disk refuses (ENOSPC,
EROFS, EIO: chaos.storage) raises with the older checkpoints untouched, its own file
removed where the disk allows it: the temp file, or the renamed one when the directory's
fsync fails after the rename, so that a save reported failed is never the newest checkpoint
a restore finds (one writer per directory: the group's
rank 0, so any other temp file there is a dead writer's). The newest `keep` checkpoints are kept
so that ranks one checkpoint apart can still agree on a common one.
"""
from __future__ import annotations

import contextlib
import io
import os
import re
from pathlib import Path
from typing import Any

import torch

_NAME = re.compile(r"step-(\d{8})\.pt")
TEMP_PREFIX = ".tmp-"


class Checkpointer:
    # whether a restore passes over a file whose bytes are no checkpoint for the next older
    # one (harness.job.restore): this save never leaves one under a final name, so one is
    # storage that lost a durable save; a planted defect's restore trusts the newest file
    skips_torn = True

    def __init__(self, directory: Path | str, keep: int = 3) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.keep = keep

    def path(self, step: int) -> Path:
        return self.directory / f"step-{step:08d}.pt"

    def steps(self) -> list[int]:
        found = (_NAME.fullmatch(p.name) for p in self.directory.iterdir())
        return sorted(int(m.group(1)) for m in found if m)

    def latest(self) -> int | None:
        steps = self.steps()
        return steps[-1] if steps else None

    def save(self, step: int, state: dict[str, Any]) -> Path:
        final = self.path(step)
        tmp = self.directory / f"{TEMP_PREFIX}{os.getpid()}-{final.name}"
        for stale in self.directory.glob(f"{TEMP_PREFIX}*"):
            stale.unlink(missing_ok=True)
        # serialized first: torch's zip writer reports a failed write as its own RuntimeError,
        # the file calls below as the OSError the disk gave (ENOSPC, EROFS, EIO)
        buffer = io.BytesIO()
        torch.save(state, buffer)
        try:
            with open(tmp, "wb") as f:
                f.write(buffer.getbuffer())
                f.flush()
                os.fsync(f.fileno())
        except BaseException:
            with contextlib.suppress(OSError):
                tmp.unlink(missing_ok=True)
            raise
        os.replace(tmp, final)
        try:
            dir_fd = os.open(self.directory, os.O_RDONLY)
            try:
                os.fsync(dir_fd)
            finally:
                os.close(dir_fd)
        except BaseException:  # the rename may not last: the save failed, and leaves no file
            with contextlib.suppress(OSError):
                final.unlink(missing_ok=True)
            raise
        for old in self.steps()[:-self.keep]:
            self.path(old).unlink(missing_ok=True)
        return final

    def load(self, step: int) -> dict[str, Any]:
        return self.parse(self.read(step))

    def read(self, step: int) -> bytes:
        """The file's bytes: an OSError here is the disk's (EIO), not the file's content."""
        return self.path(step).read_bytes()

    @staticmethod
    def parse(data: bytes) -> dict[str, Any]:
        """A checkpoint from its bytes; any error here means they are no checkpoint (torn:
        torch raises RuntimeError, EOFError, or an OSError of its own for a short file)."""
        return torch.load(io.BytesIO(data), weights_only=True)
