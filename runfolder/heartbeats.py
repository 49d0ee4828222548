"""A trial's heartbeat gaps: how long the failure detector's server went between two
heartbeats of a rank, over the whole trial (heartbeat_gaps.json in the trial's folder).

The control plane's heartbeat server (harness.job.detector) records every gap between a
rank's consecutive heartbeats as it judges them (a stall of the server's own is not
counted, as in its judgements; a rank that restarted starts anew) and rewrites this file
every few seconds, so that a trial whose control plane was SIGKILLed at its end keeps what
it saw up to then. Only trials whose policy has a detector have heartbeats; only the
backends that fork the control plane (netns, local) write the file.

`chaos tune` derives the detector's `suspect_after` from the fault-free gaps: a margin over
the longest one (reports.tune).

    {"format": 1, "gaps": n, "max_s": s, "max_rank": r, "watched_s": s,
     "buckets": {"<i>": count, ...}, "ranks": {"<rank>": {"gaps": n, "max_s": s}, ...}}

Bucket i holds the gaps in (upper(i - 1), upper(i)], upper(i) = 2^(i / BUCKETS_PER_DOUBLING)
ms: a quantile read from them is at most 9% above the gap it stands for, never below.
"""
from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HEARTBEAT_GAPS_FILE = "heartbeat_gaps.json"  # in each trial's folder (runfolder.layout)
HEARTBEAT_GAPS_FORMAT = 1
BUCKETS_PER_DOUBLING = 8


def bucket_of(gap_s: float) -> int:
    """The bucket holding `gap_s` (gaps of a millisecond or less share bucket 0)."""
    if gap_s <= 0.001:
        return 0
    return math.ceil(math.log2(gap_s * 1000.0) * BUCKETS_PER_DOUBLING - 1e-9)


def bucket_upper_s(index: int) -> float:
    return 2.0 ** (index / BUCKETS_PER_DOUBLING) / 1000.0


@dataclass(frozen=True)
class RankGaps:
    gaps: int
    max_s: float


@dataclass(frozen=True)
class HeartbeatGaps:
    """Every rank's heartbeat gaps over one trial, as the server judged them."""

    gaps: int
    max_s: float
    max_rank: int | None
    watched_s: float                     # from the server's start to the file's last write
    buckets: dict[int, int] = field(default_factory=dict)
    ranks: dict[int, RankGaps] = field(default_factory=dict)

    def quantile_s(self, q: float) -> float:
        """The gap that `q` of all gaps do not exceed, to the bucket's upper edge (nan: no gaps)."""
        if not self.gaps:
            return math.nan
        wanted, seen = math.ceil(q * self.gaps), 0
        for index in sorted(self.buckets):
            seen += self.buckets[index]
            if seen >= wanted:
                return min(bucket_upper_s(index), self.max_s)
        return self.max_s

    def to_json(self) -> str:
        return json.dumps({"format": HEARTBEAT_GAPS_FORMAT, "gaps": self.gaps, "max_s": self.max_s,
                           "max_rank": self.max_rank, "watched_s": self.watched_s,
                           "buckets": {str(i): n for i, n in sorted(self.buckets.items())},
                           "ranks": {str(r): {"gaps": g.gaps, "max_s": g.max_s} for r, g in sorted(self.ranks.items())}})


def write_heartbeat_gaps(path: Path, gaps: HeartbeatGaps) -> None:
    """Atomically: a reader sees the previous file or this one, never half of one."""
    partial = path.with_name(path.name + ".partial")
    partial.write_text(gaps.to_json())
    os.replace(partial, path)


class HeartbeatGapsError(ValueError):
    pass


def read_heartbeat_gaps(trial_dir: Path) -> HeartbeatGaps | None:
    """The trial's gaps; None where none were recorded (no detector, a backend that does
    not write them, or a run folder from before format 11)."""
    path = Path(trial_dir) / HEARTBEAT_GAPS_FILE
    if not path.is_file():
        return None
    try:
        data: dict[str, Any] = json.loads(path.read_text())
        if data.get("format") != HEARTBEAT_GAPS_FORMAT:
            raise HeartbeatGapsError(f"format {data.get('format')!r}, this chaos-harness reads "
                                     f"{HEARTBEAT_GAPS_FORMAT}")
        return HeartbeatGaps(gaps=int(data["gaps"]), max_s=float(data["max_s"]),
                             max_rank=None if data["max_rank"] is None else int(data["max_rank"]),
                             watched_s=float(data["watched_s"]),
                             buckets={int(i): int(n) for i, n in data["buckets"].items()},
                             ranks={int(r): RankGaps(int(g["gaps"]), float(g["max_s"]))
                                    for r, g in data["ranks"].items()})
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise HeartbeatGapsError(f"{path}: not a heartbeat gaps file ({exc}); run the trial again") from None
