"""Progress of long work on stderr: phase lines, and a status line while a trial runs.

On a terminal the status line is redrawn in place; elsewhere (CI logs) a plain line is
printed every few seconds. `quiet` keeps only errors.
"""
from __future__ import annotations

import sys
import time
from typing import TextIO


class Progress:
    def __init__(self, quiet: bool = False, stream: TextIO | None = None,
                 plain_every_s: float = 5.0) -> None:
        self.quiet = quiet
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty()
        self.plain_every_s = plain_every_s
        self._last_status = 0.0
        self._status_shown = False

    def _clear(self) -> None:
        if self._status_shown:
            self.stream.write("\r\033[K")
            self._status_shown = False

    def phase(self, label: str, text: str) -> None:
        if self.quiet:
            return
        self._clear()
        self.stream.write(f"[{label}] {text}\n")
        self.stream.flush()

    def status(self, label: str, text: str) -> None:
        if self.quiet:
            return
        now = time.monotonic()
        if self.tty:
            self.stream.write(f"\r\033[K[{label}] {text}")
            self._status_shown = True
        elif now - self._last_status >= self.plain_every_s:
            self.stream.write(f"[{label}] {text}\n")
            self._last_status = now
        else:
            return
        self.stream.flush()

    def done(self) -> None:
        self._clear()
