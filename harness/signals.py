"""Signals become exceptions here, once: SIGTERM raises `Terminated`, SIGINT raises
KeyboardInterrupt (Python's own). Both derive from BaseException so that `except
Exception` in policy code never swallows a request to stop."""
from __future__ import annotations

import signal
from types import FrameType


class Terminated(BaseException):
    """The process was asked to stop (SIGTERM)."""


def _raise_terminated(signum: int, frame: FrameType | None) -> None:
    raise Terminated(f"received {signal.Signals(signum).name}")


def install() -> None:
    """Turn SIGTERM into `Terminated` and restore the default SIGINT behaviour."""
    signal.signal(signal.SIGTERM, _raise_terminated)
    signal.signal(signal.SIGINT, signal.default_int_handler)
