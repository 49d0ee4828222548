"""Signals become exceptions here, once: SIGTERM and SIGHUP (an ssh session dropping) raise
`Terminated`, SIGINT raises KeyboardInterrupt (Python's own), whatever dispositions the
parent left (a background shell or CI runner may start us with SIGINT ignored). Both derive from BaseException so that `except
Exception` in policy code never swallows a request to stop.

Only the process that installed the handler raises: a child forked by a library
(pyroute2 forks helpers to enter namespaces) gets the default action, and dies quietly.
"""
from __future__ import annotations

import os
import signal
from types import FrameType

_installed_by: int | None = None


class Terminated(BaseException):
    """The process was asked to stop (SIGTERM)."""


def _raise_terminated(signum: int, frame: FrameType | None) -> None:
    if os.getpid() != _installed_by:
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
        return
    raise Terminated(f"received {signal.Signals(signum).name}")


def install() -> None:
    """Turn SIGTERM and SIGHUP into `Terminated` and SIGINT into KeyboardInterrupt."""
    global _installed_by
    _installed_by = os.getpid()
    signal.signal(signal.SIGTERM, _raise_terminated)
    signal.signal(signal.SIGHUP, _raise_terminated)
    signal.signal(signal.SIGINT, signal.default_int_handler)
