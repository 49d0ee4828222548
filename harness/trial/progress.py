"""Progress of long work on stderr: phase lines, and a progress bar while a trial runs.

    [link_down/timeout] cluster up: 16 netns hosts in 0.41 s          (a phase line)
    [link_down/timeout] [########------------]  40% faults  t+8.1s ...  (the bar)

On a terminal the bar is redrawn in place; elsewhere (CI logs) it is printed as a plain
line every few seconds. `quiet` prints nothing.
"""
from __future__ import annotations

import math
import sys
import time
from typing import TextIO

BAR_WIDTH = 20


def duration_text(seconds: float) -> str:
    """"3m07s" for 187 s, "42s" below a minute: the progress lines' elapsed, budget and ETA."""
    minutes, secs = divmod(round(seconds), 60)
    return f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"


def bar(fraction: float) -> str:
    """"[#####---------------]  25%" for 0.25; the fraction is clipped to 0..1."""
    fraction = min(1.0, max(0.0, fraction))
    filled = round(fraction * BAR_WIDTH)
    return f"[{'#' * filled}{'-' * (BAR_WIDTH - filled)}] {fraction:4.0%}"


class Progress:
    def __init__(self, quiet: bool = False, stream: TextIO | None = None,
                 plain_every_s: float = 5.0, scope: str = "") -> None:
        self.quiet = quiet
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty()
        self.plain_every_s = plain_every_s
        self.scope = scope  # what the labels belong to: the scenario's name
        self._last_status = -math.inf  # when the last plain status line was printed
        self._status_shown = False

    def _tag(self, label: str) -> str:
        return f"[{self.scope}/{label}]" if self.scope else f"[{label}]"

    def _clear(self) -> None:
        if self._status_shown:
            self.stream.write("\r\033[K")
            self._status_shown = False

    def phase(self, label: str, text: str) -> None:
        if self.quiet:
            return
        self._clear()
        self.stream.write(f"{self._tag(label)} {text}\n")
        self.stream.flush()

    def status(self, label: str, fraction: float, text: str) -> None:
        """The bar of `label`'s current phase, `fraction` done, with a line of detail."""
        if self.quiet:
            return
        line = f"{self._tag(label)} {bar(fraction)} {text}"
        now = time.monotonic()
        if self.tty:
            self.stream.write(f"\r\033[K{line}")
            self._status_shown = True
        elif now - self._last_status >= self.plain_every_s:
            self.stream.write(line + "\n")
            self._last_status = now
        else:
            return
        self.stream.flush()

    def done(self) -> None:
        self._clear()
        self._last_status = -math.inf  # the next trial's first bar is shown at once
