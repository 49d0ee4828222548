"""The heartbeat server's record of every rank's heartbeat gaps (runfolder.heartbeats), and
the thread of the control plane that keeps it on disk."""
from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Callable

from runfolder.heartbeats import HeartbeatGaps, RankGaps, bucket_of, write_heartbeat_gaps

WRITE_EVERY_S = 2.0  # the file lags the server by at most this until the control plane is stopped (SIGTERM)


class GapRecorder:
    """Counts gaps as the server's thread reports them; `snapshot` from any thread."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.started = clock()
        self._lock = threading.Lock()
        self._buckets: dict[int, int] = {}
        self._ranks: dict[int, list] = {}  # rank -> [gaps, longest]

    def gap(self, rank: int, gap_s: float) -> None:
        index = bucket_of(gap_s)
        with self._lock:
            self._buckets[index] = self._buckets.get(index, 0) + 1
            seen = self._ranks.setdefault(rank, [0, 0.0])
            seen[0] += 1
            seen[1] = max(seen[1], gap_s)

    def snapshot(self) -> HeartbeatGaps:
        with self._lock:
            buckets = dict(self._buckets)
            ranks = {rank: RankGaps(n, longest) for rank, (n, longest) in self._ranks.items()}
        longest = max(ranks.items(), key=lambda item: item[1].max_s, default=None)
        return HeartbeatGaps(gaps=sum(buckets.values()), max_s=longest[1].max_s if longest else 0.0,
                             max_rank=longest[0] if longest else None, watched_s=self.clock() - self.started,
                             buckets=buckets, ranks=ranks)


def keep_writing(recorder: GapRecorder, path: Path, stopped: threading.Event, every_s: float = WRITE_EVERY_S
                 ) -> threading.Thread:
    """A daemon thread that rewrites `path` every `every_s` until `stopped`, and once more
    then; from the first gap on (a trial without heartbeats has no file)."""
    def write() -> None:
        while True:
            last = stopped.wait(every_s)
            if (gaps := recorder.snapshot()).gaps:
                write_heartbeat_gaps(path, gaps)
            if last:
                return

    thread = threading.Thread(target=write, name="heartbeat-gaps", daemon=True)
    thread.start()
    return thread
