"""The harness's lease on its ranks: a rank that loses it for a few seconds exits.

A rank of the netns backend needs none: it is forked by the rank launcher, which dies with
the harness, and it dies with the launcher (PR_SET_PDEATHSIG, `harness.cluster.zygote`). A
container has no parent on the host's side to die with, and its processes cannot see the
harness's pid. So the harness holds a lease file in the run folder, which every container
has bind-mounted: the harness renews it (`hold`, its modification time, every
`RENEW_S`), the rank watches it (`watch`) without any network, and a rank whose lease is
older than its timeout (the harness is dead, or stopped) asks itself to stop (SIGTERM:
`harness.signals` raises `Terminated`, the runner releases what it holds) and, if that
does not end it within `EXIT_GRACE_S`, exits at once. Both sides read one clock: the
kernel's wall clock, shared by the containers and the host.
"""
from __future__ import annotations

import os
import signal
import sys
import threading
import time
from pathlib import Path

LEASE_FILE = "lease"
RENEW_S = 0.5
TIMEOUT_S = 5.0          # how long a rank waits for a renewal before it leaves
EXIT_GRACE_S = 3.0       # from its own SIGTERM to an exit without clean-up
EXIT_CODE = 75           # EX_TEMPFAIL: the harness went away


def lease_path(run_dir: Path) -> Path:
    return run_dir / LEASE_FILE


class Holder:
    """The harness's side: renews the lease from a daemon thread until `release`."""

    def __init__(self, path: Path, renew_s: float = RENEW_S) -> None:
        self.path = path
        self._renew_s = renew_s
        self._stop = threading.Event()
        self.path.touch()
        self._thread = threading.Thread(target=self._renew, name="lease", daemon=True)
        self._thread.start()

    def _renew(self) -> None:
        while not self._stop.wait(self._renew_s):
            os.utime(self.path)

    def release(self) -> None:
        self._stop.set()
        self._thread.join()


def expired(path: Path, timeout_s: float, now: float) -> bool:
    """Whether the lease at `path` was last renewed more than `timeout_s` before `now` (or is gone)."""
    try:
        return now - path.stat().st_mtime > timeout_s
    except FileNotFoundError:
        return True


def watch(path: Path, timeout_s: float = TIMEOUT_S) -> threading.Thread:
    """The rank's side: a daemon thread that ends this process once the lease expires."""
    def run() -> None:
        while not expired(path, timeout_s, time.time()):
            time.sleep(min(RENEW_S, timeout_s / 4))
        print(f"lease {path} not renewed for {timeout_s:g} s: the harness is gone; leaving",
              file=sys.stderr, flush=True)
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(EXIT_GRACE_S)
        os._exit(EXIT_CODE)

    thread = threading.Thread(target=run, name="lease-watch", daemon=True)
    thread.start()
    return thread
