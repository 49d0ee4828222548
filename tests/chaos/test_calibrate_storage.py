"""`chaos calibrate` for the storage kinds and `slow` (chaos.calibrate_storage,
chaos.calibrate_slow): CI's slice. The two cheapest storage kinds run for real through the
installed command (lose_unsynced's crash and io_error's errno, share and every_nth: about a
second); the bars of io_delay, io_stall and slow are checked on figures (their real runs
take 17 s on a loaded machine: `chaos calibrate --kind io_delay --kind io_error --kind
io_stall --kind lose_unsynced --kind slow`, bench/results/calibrate-storage-slow-*.txt).
"""
from __future__ import annotations

import os

import pytest

from chaos.calibrate_slow import Share
from chaos.calibrate_storage import delay_verdict, stall_verdict
from tests.conftest import as_nobody, chaos_cli


@pytest.mark.requires_root
@pytest.mark.requires_fuse
def test_calibrate_measures_the_crash_and_the_errno_through_the_mount(state_dir):
    done = chaos_cli("calibrate", "--kind", "lose_unsynced", "--kind", "io_error",
                     env={**os.environ, "CHAOS_STATE_DIR": str(state_dir)}, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    figures = [lines[i:i + 3] for i in range(0, len(lines), 3)]
    assert [f[0].split("(")[0] for f in figures] == ["ok   io_error", "ok   io_error", "ok   lose_unsynced"]
    assert "errno EIO x" in figures[0][1]
    assert "write 3,6,9,12,15,18,21,24,27,30 failed; fsync 3,6,9,12,15,18,21,24,27,30 failed; errno ENOSPC x20" \
        in figures[1][1]
    assert "unsynced.bin 0 bytes (empty); overwritten.bin holds its 4096 bytes from before the fault" in figures[2][1]
    assert all("via passthrough FUSE filesystem" in f[2] for f in figures)
    assert not list(state_dir.glob("*.jsonl")), "the calibration left a ledger outstanding"


DISK_FIGURES = [
    "ok   disk_full(after_bytes=307200)",
    "measured 307200 bytes written, then ENOSPC; the file from before kept; after the end the written bytes are "
    "there and 4194304 more went in",
    "ok   disk_full(after_bytes=None)",
    "measured 0 bytes written, then ENOSPC",
    "ok   read_only",
    "measured create EROFS, write EROFS, rename EROFS, remove EROFS; read ok; after the end a write went in",
]


def _disk_figures_hold(stdout: str) -> None:
    lines = stdout.splitlines()
    assert [line for line in lines if line.startswith(("ok", "MISS", "n/a"))] == DISK_FIGURES[::2], stdout
    for measured in DISK_FIGURES[1::2]:
        assert any(measured in line for line in lines), (measured, stdout)


@pytest.mark.requires_root
def test_calibrate_measures_the_kernel_s_enospc_byte_count_and_erofs(state_dir):
    """The tmpfs's cap against `after_bytes` (300 KiB: 75 pages, exactly), ENOSPC at once
    without one, every change refused by the read-only bind; all of it back after."""
    done = chaos_cli("calibrate", "--kind", "disk_full", "--kind", "read_only",
                     env={**os.environ, "CHAOS_STATE_DIR": str(state_dir)}, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    _disk_figures_hold(done.stdout)
    assert not list(state_dir.glob("*.jsonl")), "the calibration left a ledger outstanding"


@pytest.mark.requires_root
def test_an_ordinary_user_gets_the_same_figures_in_a_user_namespace(user_dir):
    done = as_nobody(user_dir, "calibrate", "--kind", "disk_full", "--kind", "read_only", timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    _disk_figures_hold(done.stdout)


def test_io_delay_is_judged_on_the_latency_added_to_the_passthroughs_own():
    off = [0.0004] * 20
    assert delay_verdict(0.020, [0.0204 + i * 0.0001 for i in range(20)], off)[2]  # +20.4 ms median
    assert not delay_verdict(0.020, [0.0220] * 20, off)[2]  # median 1.6 ms late
    assert not delay_verdict(0.020, [0.0204] * 17 + [0.040] * 3, off)[2]  # p95 20 ms late
    median, p95, _ = delay_verdict(0.020, [0.0214] * 20, [0.0010] * 20)
    assert round(median, 4) == round(p95, 4) == 0.0204


def test_io_stall_needs_every_call_held_to_the_end_and_back_within_50_ms():
    assert stall_verdict({"write": 0.002, "fsync": 0.010}, {"write": True, "fsync": True})
    assert not stall_verdict({"write": -0.3, "fsync": 0.010}, {"write": True, "fsync": True})  # went through
    assert not stall_verdict({"write": 0.002, "fsync": None}, {"write": True, "fsync": False})  # never back
    assert not stall_verdict({"write": 0.080}, {"write": True})  # too late
    assert not stall_verdict({"write": 0.002}, {"write": False})  # back, but failed


def test_slow_is_judged_against_the_share_unslowed_and_only_on_a_free_cpu():
    assert Share(asked=0.2, free=0.98, slowed=0.22).ok  # 22.4% of what it would have
    assert Share(asked=0.2, free=0.98, slowed=0.26).ok is False
    assert Share(asked=0.5, free=0.186, slowed=0.116).ok is None  # a busy machine: not judged
