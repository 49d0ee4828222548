"""Signals become exceptions here, once: SIGTERM and SIGHUP (an ssh session dropping) raise
`Terminated`, SIGINT raises KeyboardInterrupt (Python's own), whatever dispositions the
parent left (a background shell or CI runner may start us with SIGINT ignored). Both derive from BaseException so that `except
Exception` in policy code never swallows a request to stop.

One signal asks, and stops nothing: `DUMP_FLIGHT_RECORDER` (SIGUSR2), which a rank that
records its collectives answers with a dump (harness.job.flight); the harness sends it only
to ranks that said they do.

Only the process that installed the handler raises: a child forked by a library
(pyroute2 forks helpers to enter namespaces) gets the default action, and dies quietly.
"""
from __future__ import annotations

import os
import signal
import time
from types import FrameType

DUMP_FLIGHT_RECORDER = signal.SIGUSR2
_installed_by: int | None = None
_requested: BaseException | None = None  # the stop asked for, kept for `check`


class Terminated(BaseException):
    """The process was asked to stop (SIGTERM or SIGHUP)."""


def _stop(signum: int, frame: FrameType | None) -> None:
    global _requested
    if os.getpid() != _installed_by:
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
        return
    name = signal.Signals(signum).name
    _requested = KeyboardInterrupt() if signum == signal.SIGINT else Terminated(f"received {name}")
    raise _requested


def install() -> None:
    """Turn SIGTERM and SIGHUP into `Terminated` and SIGINT into KeyboardInterrupt."""
    global _installed_by, _requested
    _installed_by = os.getpid()
    _requested = None
    for signum in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        signal.signal(signum, _stop)


def check() -> None:
    """Raise a stop that was asked for again, for the loops that wait (the orchestrator's
    poll, a rank's runner). Python discards an exception raised while it runs a finalizer
    (a `__del__`, a logging or weakref callback), and a signal handler may run just there:
    the request would be lost and the run would go on."""
    if _requested is not None:
        raise type(_requested)(*_requested.args)


def sleep(seconds: float) -> None:
    """time.sleep, and then `check`: a wait that a lost stop cannot outlast."""
    check()
    time.sleep(seconds)
    check()
