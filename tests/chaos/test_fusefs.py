"""The FUSE storage faults on a real directory: the errno a rank's file calls get, a delay
and a stall that the revert releases, files kept where they were, and a heal from the
ledger alone (the harness SIGKILLed) leaving no mount and no daemon behind."""
from __future__ import annotations

import errno
import os
import signal
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from chaos import proc
from chaos.faults import IoDelay, IoError, IoStall, LoseUnsynced
from chaos.fusefs import FusePassthrough, control, control_name
from chaos.heal import heal_run
from chaos.undotable import HealReport
from chaos.inject import NetlinkInjector
from chaos.storage import mounted
from chaos.undo import UNDOS

pytestmark = [pytest.mark.requires_root, pytest.mark.requires_fuse]
MECHANISMS = {kind: FusePassthrough() for kind in ("io_error", "io_delay", "io_stall", "lose_unsynced")}


def save(path, size: int = 10_000) -> None:
    with open(path, "wb") as f:
        f.write(b"x" * size)
        f.flush()
        os.fsync(f.fileno())


def test_io_error_fails_writes_and_fsyncs_keeps_reads_and_counts(storage):
    host, ledger, directory = storage
    injection = NetlinkInjector(ledger, MECHANISMS).apply(IoError(every_nth=2, ops=("fsync",)), [host])
    assert mounted(str(directory))
    assert (directory / "step-00000010.pt").read_bytes() == b"ten" * 1000  # the files below, served
    listed = {p.name: p.stat().st_ino for p in directory.iterdir()}  # and listed, with their inodes
    assert listed == {"step-00000010.pt": (directory / "step-00000010.pt").stat().st_ino}
    outcomes = []
    for n in range(4):
        try:
            save(directory / f"step-0000002{n}.pt")
            outcomes.append("ok")
        except OSError as exc:
            outcomes.append(errno.errorcode[exc.errno])
    assert outcomes == ["ok", "EIO", "ok", "EIO"]
    stats = control(control_name(ledger.run_id, str(directory)), "stats")
    assert stats["counts"] == {"fsync_matched": 4, "fsync_failed": 2}
    injection.revert()
    assert not mounted(str(directory))
    assert sorted(p.name for p in directory.iterdir())[:2] == ["step-00000010.pt", "step-00000020.pt"]
    assert (directory / "step-00000020.pt").stat().st_size == 10_000  # written below, kept


def test_io_delay_holds_each_fsync_its_latency(storage):
    host, ledger, directory = storage
    start = time.monotonic()
    save(directory / "direct.pt")
    direct = time.monotonic() - start
    injection = NetlinkInjector(ledger, MECHANISMS).apply(IoDelay(latency=0.3, ops=("fsync",)), [host])
    start = time.monotonic()
    save(directory / "delayed.pt")
    delayed = time.monotonic() - start
    injection.revert()
    assert delayed >= 0.3 > direct


def test_io_stall_blocks_a_save_until_the_revert_then_it_completes(storage):
    host, ledger, directory = storage
    injection = NetlinkInjector(ledger, MECHANISMS).apply(IoStall(), [host])
    done = threading.Event()
    writer = threading.Thread(target=lambda: (save(directory / "step-00000020.pt"), done.set()), daemon=True)
    writer.start()
    assert not done.wait(1.0), "the save went through a stalled filesystem"
    injection.revert()
    assert done.wait(5.0), "the save did not go on after the revert"
    assert (directory / "step-00000020.pt").stat().st_size == 10_000


def test_lose_unsynced_keeps_what_was_fsynced_and_renamed_and_loses_the_rest(storage):
    host, ledger, directory = storage
    injection = NetlinkInjector(ledger, MECHANISMS).apply(LoseUnsynced(), [host])
    save(directory / ".tmp-step-00000020.pt", 20_000)  # the atomic way: written, fsynced, renamed
    os.replace(directory / ".tmp-step-00000020.pt", directory / "step-00000020.pt")
    # what a rank records of a file in the mount is its identity below (reports.checkpoints)
    seen = (directory / "step-00000020.pt").stat()
    (directory / "step-00000030.pt").write_bytes(b"y" * 30_000)  # torch.save's way: no fsync
    (directory / ".partial").write_bytes(b"z" * 40_000)  # renamed without an fsync (examples/train_ddp.py)
    os.replace(directory / ".partial", directory / "checkpoint.pt")
    (directory / "step-00000010.pt").write_bytes(b"over")  # an old checkpoint overwritten, no fsync
    with open(directory / "grown.pt", "wb") as f:  # fsynced, then grown without one
        f.write(b"a" * 1000)
        f.flush()
        os.fsync(f.fileno())
        f.write(b"b" * 5000)
    assert (directory / "step-00000030.pt").stat().st_size == 30_000  # read back before the crash
    injection.revert()  # the fault's end: the crash
    assert not mounted(str(directory))
    assert (directory / "step-00000020.pt").read_bytes() == b"x" * 20_000
    below = (directory / "step-00000020.pt").stat()
    assert (seen.st_ino, seen.st_mtime_ns, seen.st_size) == (below.st_ino, below.st_mtime_ns, below.st_size)
    assert (directory / "step-00000030.pt").exists() and (directory / "step-00000030.pt").stat().st_size == 0
    assert (directory / "step-00000010.pt").read_bytes() == b"ten" * 1000
    assert (directory / "grown.pt").read_bytes() == b"a" * 1000
    assert (directory / "checkpoint.pt").stat().st_size == 0 and not (directory / ".partial").exists()
    assert not (directory / ".tmp-step-00000020.pt").exists()  # the rename stays done


@pytest.mark.parametrize("fault", [IoError(), IoStall()])
def test_a_heal_from_the_ledger_alone_removes_mount_and_daemon(storage, fault):
    host, ledger, directory = storage
    NetlinkInjector(ledger, MECHANISMS).apply(fault, [host])  # never reverted: the harness "died"
    assert mounted(str(directory)) and proc.helpers_of_run(ledger.run_id)
    report = HealReport()
    heal_run(ledger.run_id, report, UNDOS)
    assert report.failed == [] and not mounted(str(directory)) and proc.helpers_of_run(ledger.run_id) == []
    save(directory / "after.pt")
    heal_run(ledger.run_id, HealReport(), UNDOS)  # idempotent


def test_a_user_the_fuse_device_is_closed_to_is_told_why(tmp_path):
    """As uid 65534: where /dev/fuse is closed to others (mode 600, as here), the reason and
    the fix; where it is open, no reason from the device."""
    done = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", sys.executable, "-c",
                           "from chaos.fusefs import why_no_fuse; print(why_no_fuse())"],
                          capture_output=True, text=True, cwd=tmp_path, timeout=60,
                          env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])})
    assert done.returncode == 0, done.stderr
    closed = stat.S_IMODE(os.stat("/dev/fuse").st_mode) & 0o006 != 0o006
    assert ("/dev/fuse (mode" in done.stdout and "chmod 666 /dev/fuse" in done.stdout) == closed, done.stdout


def test_a_daemon_that_dies_mid_fault_fails_the_calls_and_its_revert_leaves_no_mount(storage):
    host, ledger, directory = storage
    injection = NetlinkInjector(ledger, MECHANISMS).apply(IoDelay(latency=0.01), [host])
    [daemon] = proc.helpers_of_run(ledger.run_id)
    os.kill(daemon, signal.SIGKILL)
    with pytest.raises(OSError) as cut:
        save(directory / "step-00000020.pt")
    # the kernel's answer for a dead daemon (ECONNABORTED here): what the rank's checkpoint_failed names
    assert cut.value.errno in (errno.ECONNABORTED, errno.ENOTCONN)
    injection.revert()
    assert not mounted(str(directory)) and (directory / "step-00000010.pt").read_bytes() == b"ten" * 1000


def test_io_error_percent_fails_about_that_share_of_calls(storage):
    host, ledger, directory = storage
    NetlinkInjector(ledger, MECHANISMS).apply(IoError(percent="30%", ops=("write",)), [host])
    fd = os.open(directory / "many.pt", os.O_WRONLY | os.O_CREAT, 0o644)
    failed = 0
    try:
        for n in range(400):
            try:
                os.pwrite(fd, b"w", n)
            except OSError as exc:
                assert exc.errno == errno.EIO
                failed += 1
    finally:
        os.close(fd)
    counts = control(control_name(ledger.run_id, str(directory)), "stats")["counts"]
    assert counts == {"write_matched": 400, "write_failed": failed}
    assert 0.22 < failed / 400 < 0.38  # 30% of 400: 120 +- 9.2; these bounds are 3.5 standard deviations out
