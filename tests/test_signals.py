"""Signals become exceptions once (harness/signals.py), whatever the parent's dispositions,
and a stop that Python swallowed (raised inside a finalizer) is raised again by `check`."""
from __future__ import annotations

import subprocess
import sys

PROBE = r"""
import os, signal, sys
signal.signal(signal.SIGINT, signal.SIG_IGN)   # as a background shell or a CI runner leaves it
from harness import signals
signals.install()

class Finalized:
    def __del__(self):
        os.kill(os.getpid(), signal.{name})    # the handler runs here: Python discards what it raises

Finalized()
print("went on", flush=True)
try:
    signals.{wait}
except KeyboardInterrupt:
    print("KeyboardInterrupt")
except signals.Terminated as exc:
    print(f"Terminated: {{exc}}")
"""


def _run(name: str, wait: str = "check()") -> list[str]:
    done = subprocess.run([sys.executable, "-c", PROBE.format(name=name, wait=wait)], capture_output=True, text=True,
                          timeout=60)
    return done.stdout.splitlines()


def test_a_swallowed_sigint_is_raised_again_even_when_the_parent_ignored_sigint():
    assert _run("SIGINT") == ["went on", "KeyboardInterrupt"]


def test_sigterm_and_sighup_are_terminated():
    assert _run("SIGTERM") == ["went on", "Terminated: received SIGTERM"]
    assert _run("SIGHUP") == ["went on", "Terminated: received SIGHUP"]


def test_a_rank_s_waits_raise_a_swallowed_stop():
    """A rank's runner waits with signals.sleep (harness/job/rank.py): a SIGTERM the handler
    raised inside a weakref callback during teardown was lost, and a rank went on retrying
    and opened its breaker 0.3 s into the harness's stop, read as the trial's outcome."""
    assert _run("SIGTERM", wait="sleep(0.01)") == ["went on", "Terminated: received SIGTERM"]
