"""The progress bar: drawn in place on a terminal, plain lines every few seconds in CI logs,
nothing when quiet."""
from __future__ import annotations

import io

from harness.trial.progress import Progress, bar


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_the_bar_shows_the_fraction_done_clipped() -> None:
    assert bar(0.25) == "[#####---------------]  25%"
    assert bar(-1) == "[--------------------]   0%"
    assert bar(7) == "[####################] 100%"


def test_a_terminal_redraws_one_line_and_phase_lines_scroll_above_it() -> None:
    out = Terminal()
    progress = Progress(stream=out, scope="link_down")
    progress.status("timeout", 0.5, "faults  t+3.0s")
    progress.status("timeout", 0.6, "faults  t+3.6s")
    progress.phase("timeout", "fault reverted")
    text = out.getvalue()
    assert text.count("\r\033[K[link_down/timeout] [") == 2
    assert text.endswith("\r\033[K[link_down/timeout] fault reverted\n")


def test_ci_logs_get_a_plain_line_every_few_seconds() -> None:
    out = io.StringIO()
    progress = Progress(stream=out, plain_every_s=3600)
    progress.status("retry", 0.1, "warm-up")
    progress.status("retry", 0.2, "warm-up")  # within the interval: not printed
    progress.done()
    progress.status("retry", 0.0, "next trial")  # a new trial shows its bar at once
    assert out.getvalue().splitlines() == ["[retry] [##------------------]  10% warm-up",
                                           "[retry] [--------------------]   0% next trial"]
    assert "\r" not in out.getvalue()


def test_quiet_prints_nothing() -> None:
    out = Terminal()
    progress = Progress(quiet=True, stream=out)
    progress.phase("a", "b")
    progress.status("a", 0.5, "c")
    progress.done()
    assert out.getvalue() == ""
