"""The heartbeat server's record of the gaps between a rank's heartbeats, and its file."""
from __future__ import annotations

import json
import math
import socket
import threading

import pytest

from harness.job.detector import HeartbeatServer
from harness.job.gaps import GapRecorder, keep_writing
from runfolder.heartbeats import (HEARTBEAT_GAPS_FILE, HeartbeatGapsError, bucket_of, bucket_upper_s,
                                  read_heartbeat_gaps)
from tests.harness.test_detector import _free_port


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_a_gap_is_between_two_beats_of_one_process_as_the_server_judges_it():
    """Stalls of the server's own are not counted (as in its judgements); a heart that
    counts from 1 again is a new process of the rank: no gap across the restart."""
    clock, recorder = Clock(), GapRecorder(Clock())
    port = _free_port()
    server = HeartbeatServer(port, host="127.0.0.1", clock=clock, on_gap=recorder.gap)  # not started
    sender = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)

    def beat(rank: int, seq: int, at: float) -> None:
        clock.t = at
        sender.sendto(f"hb {rank} {seq} 0".encode(), ("127.0.0.1", port))
        server._drain_udp()
    try:
        beat(3, 1, 100.0)
        beat(3, 2, 100.06)
        beat(3, 4, 100.21)  # the third was lost: its silence is the gap
        server.members[3].accrual.discount(1.0)  # the server stalled a second
        beat(3, 5, 101.30)
        beat(3, 1, 107.0)  # restarted
        beat(3, 2, 107.05)
        beat(1, 1, 107.05)
        gaps = recorder.snapshot()
    finally:
        sender.close()
        server.stop()
    assert gaps.ranks[3].gaps == 4 and gaps.ranks[3].max_s == pytest.approx(0.15)
    assert 1 not in gaps.ranks and gaps.gaps == 4 and gaps.max_rank == 3
    assert gaps.quantile_s(0.5) == pytest.approx(bucket_upper_s(bucket_of(0.06)))
    assert gaps.quantile_s(1.0) == pytest.approx(0.15)  # the max, not the bucket's edge above it


def test_a_quantile_is_at_most_a_ninth_above_the_gap_and_never_below():
    for gap in (0.0004, 0.05, 0.0501, 0.4, 3.0, 59.0):
        upper = bucket_upper_s(bucket_of(gap))
        assert gap <= upper * (1 + 1e-9) and (gap <= 0.001 or upper < gap * 1.091)
    assert math.isnan(GapRecorder().snapshot().quantile_s(0.99))


def test_the_file_is_rewritten_while_the_server_runs_and_reads_back(tmp_path):
    recorder, stopped = GapRecorder(), threading.Event()
    path = tmp_path / HEARTBEAT_GAPS_FILE
    quiet = keep_writing(GapRecorder(), tmp_path / "none.json", threading.Event(), every_s=0.01)
    recorder.gap(0, 0.05)
    writer = keep_writing(recorder, path, stopped, every_s=0.01)
    try:
        recorder.gap(2, 0.31)
    finally:
        stopped.set()
        writer.join(5.0)
    assert not writer.is_alive() and not path.with_name(path.name + ".partial").exists()
    assert quiet.is_alive() and not (tmp_path / "none.json").exists()  # no heartbeats (no detector): no file
    gaps = read_heartbeat_gaps(tmp_path)
    assert (gaps.gaps, gaps.max_s, gaps.max_rank, sorted(gaps.ranks)) == (2, 0.31, 2, [0, 2])
    assert read_heartbeat_gaps(tmp_path / "elsewhere") is None  # none recorded: no detector, an older run
    path.write_text(json.dumps({"format": 1, "gaps": "many"}))
    with pytest.raises(HeartbeatGapsError, match=f"{path}: not a heartbeat gaps file .*run the trial again"):
        read_heartbeat_gaps(tmp_path)
