"""Busy CPU processes beside a job: a busy node, on purpose (`chaos tune --hogs`,
bench/detector.py). Each dies with the process that started it (PR_SET_PDEATHSIG), so not
even a SIGKILL of the harness leaves one behind."""
from __future__ import annotations

import contextlib
import subprocess
import sys
from collections.abc import Iterator

from chaos.proc import die_with_parent

HOG = "while True: pass"


@contextlib.contextmanager
def cpu_hogs(count: int) -> Iterator[list[subprocess.Popen]]:
    """`count` busy processes for as long as the block runs."""
    hogs = [subprocess.Popen([sys.executable, "-c", HOG], preexec_fn=die_with_parent) for _ in range(count)]
    try:
        yield hogs
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
