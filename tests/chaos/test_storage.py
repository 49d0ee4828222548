"""Storage faults on a real directory: the kernel's own ENOSPC and EROFS, what a full disk
wrote kept after the revert, and a heal from the ledger alone (as after a SIGKILL) leaving
no mount behind."""
from __future__ import annotations

import errno
import os
import subprocess
import sys

import pytest

from chaos.errors import FaultConflict
from chaos.faults import DiskFull, ReadOnly, parse_fault
from chaos.heal import heal_run
from chaos.undotable import HealReport
from chaos.inject import NetlinkInjector
from chaos.storage import FILLER, ReadOnlyBind, SizedTmpfs, mounted, share_below
from chaos.undo import UNDOS

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="mounting needs root")
MECHANISMS = {"disk_full": SizedTmpfs(), "read_only": ReadOnlyBind()}


def write(path, size: int) -> None:
    with open(path, "wb") as f:
        f.write(b"x" * size)
        f.flush()
        os.fsync(f.fileno())


def test_storage_kinds_parse_with_their_sizes():
    assert parse_fault({"kind": "disk_full", "after_bytes": "64kib"}) == DiskFull(after_bytes=64 * 1024)
    assert parse_fault({"kind": "read_only"}) == ReadOnly()
    assert DiskFull.acts_on == ReadOnly.acts_on == "storage"


def test_disk_full_from_the_start_fails_writes_and_keeps_what_was_there(storage):
    host, ledger, directory = storage
    injection = NetlinkInjector(ledger, MECHANISMS).apply(DiskFull(), [host])
    assert (directory / "step-00000010.pt").read_bytes() == b"ten" * 1000  # copied in: still readable
    with pytest.raises(OSError) as full:
        write(directory / "step-00000020.pt", 10_000)
    assert full.value.errno == errno.ENOSPC
    injection.revert()
    assert not mounted(str(directory))
    assert sorted(p.name for p in directory.iterdir()) == ["step-00000010.pt", "step-00000020.pt"]
    assert (directory / "step-00000020.pt").stat().st_size == 0  # the torn file is what the disk had


def test_disk_full_after_bytes_lets_one_save_through_and_keeps_it_after_the_revert(storage):
    host, ledger, directory = storage
    injection = NetlinkInjector(ledger, MECHANISMS).apply(DiskFull(after_bytes=64 * 1024), [host])
    write(directory / "step-00000020.pt", 60 * 1024)
    (directory / "step-00000010.pt").unlink()  # a rotation: gone below too after the revert
    with pytest.raises(OSError) as full:
        write(directory / "step-00000030.pt", 64 * 1024)
    assert full.value.errno == errno.ENOSPC
    injection.revert()
    assert (directory / "step-00000020.pt").stat().st_size == 60 * 1024
    assert not (directory / "step-00000010.pt").exists()
    assert not (directory / FILLER).exists()


def test_read_only_refuses_writes_with_erofs_and_a_second_storage_fault(storage):
    host, ledger, directory = storage
    injector = NetlinkInjector(ledger, MECHANISMS)
    injection = injector.apply(ReadOnly(), [host])
    for act in (lambda: write(directory / "new.pt", 10), lambda: (directory / "step-00000010.pt").unlink()):
        with pytest.raises(OSError) as refused:
            act()
        assert refused.value.errno == errno.EROFS
    assert (directory / "step-00000010.pt").read_bytes() == b"ten" * 1000
    with pytest.raises(FaultConflict, match="already holds a storage fault"):
        injector.apply(DiskFull(), [host])
    injection.revert()
    write(directory / "new.pt", 10)


@pytest.mark.parametrize("fault", [DiskFull(after_bytes=4096), ReadOnly()])
def test_a_heal_from_the_ledger_alone_removes_the_mount(storage, fault):
    host, ledger, directory = storage
    NetlinkInjector(ledger, MECHANISMS).apply(fault, [host])  # never reverted: the harness "died"
    assert mounted(str(directory))
    report = HealReport()
    heal_run(ledger.run_id, report, UNDOS)
    assert not mounted(str(directory)) and report.failed == []
    assert (directory / "step-00000010.pt").read_bytes() == b"ten" * 1000
    heal_run(ledger.run_id, HealReport(), UNDOS)  # idempotent


# A process in a mount namespace of its own, as a container's rank is: ready, it waits for a
# line, then writes into the checkpoint folder and prints the errno it got (0: written).
WRITER = """
import os, sys
print("ready", flush=True)
sys.stdin.readline()
try:
    with open(os.path.join(sys.argv[1], "new.pt"), "wb") as f:
        f.write(b"x" * 1_000_000)
    print(0)
except OSError as e:
    print(e.errno)
"""


@pytest.mark.parametrize(("fault", "code"), [(DiskFull(), errno.ENOSPC), (ReadOnly(), errno.EROFS)])
def test_a_fault_reaches_a_mount_namespace_made_before_it_through_a_shared_folder(storage, fault, code):
    """The docker backend's path: its containers' mount namespaces exist before the fault's
    mount; the trial folder is shared and bound rslave there. A read-only bind remounted
    read-only after it was attached would reach them writable."""
    host, ledger, directory = storage
    share_below(str(directory.parent), ledger)
    writer = subprocess.Popen(["unshare", "--mount", "--propagation", "slave", sys.executable, "-c", WRITER,
                               str(directory)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert writer.stdout.readline() == "ready\n"  # its namespace exists: the fault comes after
        injection = NetlinkInjector(ledger, MECHANISMS).apply(fault, [host])
        out, _ = writer.communicate("go\n", timeout=30)
    finally:
        writer.kill()
    assert int(out) == code
    injection.revert()
