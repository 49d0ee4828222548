"""A rank's heart: the process that sends the rank's heartbeats (`harness.job.detector`).

Why a process and not a thread of the rank: a Python thread beats only while it holds the
rank's GIL. On a real node that is fine; with 96-128 ranks on two cores the thread holding
the GIL is often descheduled, and at 96 ranks the rank's heartbeat thread fell silent for
0.41-0.43 s again and again (2,023 false suspicions, docs/scale-journal.md), as it would beside a
user's job that holds the GIL in Python for longer than `suspect_after`.

The heart is the rank's child, started by `HeartbeatClient.start` as

    python -S -I heart.py UDP_FD GEN_FD RANK INTERVAL_S PARENT_PID GENERATION

It shares the rank's UDP socket (UDP_FD: digests come back to the same address, where the
rank reads them) and network namespace, so a fault on the rank's link silences it too; a
pause stops it with the rank (the mechanisms stop the rank's descendants, or its whole
container); it dies with the rank (PR_SET_PDEATHSIG, and EOF on GEN_FD, whose write end
only the rank holds). The rank writes its generation as a line on GEN_FD when it changes.
Standard library only, so that it starts in milliseconds and shares no state with torch.
"""
from __future__ import annotations

import ctypes
import os
import select
import signal
import socket
import sys
import time

PR_SET_PDEATHSIG = 1


def beat(udp: socket.socket, gen_fd: int, rank: int, interval_s: float, generation: int) -> None:
    """Send "hb <rank> <seq> <gen>" every interval_s until GEN_FD ends (the rank is gone)."""
    seq = 0
    due = time.monotonic()
    while True:
        seq += 1
        try:
            udp.send(f"hb {rank} {seq} {generation}".encode())
        except OSError:
            pass  # unreachable now (link down): the silence is the signal
        # after a pause, beat on from now rather than catch up in a burst
        due = max(due + interval_s, time.monotonic())
        while (left := due - time.monotonic()) > 0:
            if not select.select([gen_fd], [], [], left)[0]:
                continue
            lines = os.read(gen_fd, 4096).split()
            if not lines:
                return
            generation = int(lines[-1])


def main(argv: list[str]) -> int:
    udp_fd, gen_fd, rank, parent, generation = (int(argv[i]) for i in (0, 1, 2, 4, 5))
    ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:  # the rank died before the line above
        return 0
    beat(socket.socket(fileno=udp_fd), gen_fd, rank, float(argv[3]), generation)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
