"""Storage faults on a rank's checkpoint directory (`Host.storage`), by the kernel's own filesystems.

    disk_full   a size-capped tmpfs mounted over the directory, holding a copy of what the
                directory held; its capacity is what that copy uses plus `after_bytes`, so
                writes fail with a real ENOSPC (none given: at once)
    read_only   the directory bind-mounted over itself and made read-only: a real EROFS

Ranks enter only a network namespace of their own and share the harness's mount namespace,
so what is mounted here is what their file calls see. A container has a mount namespace of
its own: what is mounted here reaches it only by propagation, from a folder the backend made
shared (`share_below`) and the container binds `rslave`. So every mount below is made whole
before it is attached (a read-only bind is read-only in every copy propagation makes).

Both kinds (and the shared folder) are undone by one op, `unmount_storage`: a lazy unmount
(a file a process still holds open there stays its own; every new call sees the directory
below). Before a disk_full's tmpfs goes, what it holds is copied back to the directory
below, so a full disk loses no write that succeeded (a file removed on the tmpfs, as a
rotation removes an old checkpoint, is removed below too). The entry is written before the
first mount, so a revert, `chaos heal` after a SIGKILL and a later run's heal run the same
undo. The kinds the kernel has no filesystem for (io_error,
io_delay, io_stall) are a FUSE passthrough on the same directory: chaos.fusefs.
"""
from __future__ import annotations

import abc
import ctypes
import errno
import os
import shutil
import struct
from pathlib import Path
from typing import Any, Callable

from chaos.api import Host
from chaos.errors import InjectionError, UnsupportedFault
from chaos.faults import DiskFull, FaultBase
from chaos.ledger import Entry, Ledger
from chaos.mechanism import Mechanism
from chaos.undotable import UndoTable

MS_REMOUNT, MS_BIND, MS_SHARED = 0x20, 0x1000, 1 << 20
MNT_DETACH = 2
# the mount API of Linux 5.12+ (the same numbers on every architecture that has them): a
# bind made read-only while detached, then attached
SYS_OPEN_TREE, SYS_MOVE_MOUNT, SYS_MOUNT_SETATTR = 428, 429, 442
OPEN_TREE_CLONE, OPEN_TREE_CLOEXEC, AT_EMPTY_PATH, AT_FDCWD = 1, 0o2000000, 0x1000, -100
MOVE_MOUNT_F_EMPTY_PATH, MOUNT_ATTR_RDONLY = 0x4, 0x1
# tmpfs reads size=0 as no limit: a directory that holds nothing yet keeps this file, one
# page, so that its tmpfs can be full from the start
FILLER = ".chaos-disk-full"
PAGE = os.sysconf("SC_PAGE_SIZE")
_libc = ctypes.CDLL(None, use_errno=True)


def _mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None) -> None:
    def raw(text: str | None) -> bytes | None:
        return None if text is None else text.encode()
    if _libc.mount(raw(source), raw(target), raw(fstype), flags, raw(data)) != 0:
        code = ctypes.get_errno()
        raise InjectionError(f"mount {fstype or 'bind'} on {target}: {os.strerror(code)}")


def _syscall(number: int, what: str, *args: Any) -> int:
    result = _libc.syscall(number, *args)
    if result < 0:
        code = ctypes.get_errno()
        raise InjectionError(f"{what}: {os.strerror(code)}"
                             + (" (Linux 5.12 or later has it)" if code == errno.ENOSYS else ""))
    return result


def _read_only_bind(path: str) -> None:
    """`path` bind-mounted over itself, read-only from the moment it is attached."""
    tree = _syscall(SYS_OPEN_TREE, f"clone {path}", AT_FDCWD, path.encode(), OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC)
    try:
        attr = struct.pack("QQQQ", MOUNT_ATTR_RDONLY, 0, 0, 0)  # struct mount_attr: set, clr, propagation, userns_fd
        _syscall(SYS_MOUNT_SETATTR, f"make the bind of {path} read-only", tree, b"", AT_EMPTY_PATH,
                 attr, ctypes.c_size_t(len(attr)))
        _syscall(SYS_MOVE_MOUNT, f"attach the read-only bind on {path}", tree, b"", AT_FDCWD, path.encode(),
                 MOVE_MOUNT_F_EMPTY_PATH)
    finally:
        os.close(tree)  # a clone never attached is freed with it


def _unescape(field: str) -> str:
    """A mountinfo path: space, tab, newline and backslash are written as octal escapes."""
    for code in ("040", "011", "012", "134"):
        field = field.replace("\\" + code, chr(int(code, 8)))
    return field


def _mount_points() -> list[str]:
    with open("/proc/self/mountinfo") as lines:
        return [_unescape(line.split()[4]) for line in lines]


def mounted(path: str) -> bool:
    """Whether something is mounted on `path` (a bind mount of a directory over itself
    included, which os.path.ismount cannot see)."""
    return os.path.realpath(path) in _mount_points()


def mounts_below(path: str) -> list[str]:
    """The mount points at or below `path`."""
    top = os.path.realpath(path)
    return [p for p in _mount_points() if p == top or p.startswith(top.rstrip("/") + "/")]


def _unmount_storage(args: dict[str, Any]) -> None:
    path = args["path"]
    if not mounted(path):
        return  # already gone
    top = os.open(path, os.O_RDONLY | os.O_DIRECTORY) if args.get("copy_back") else None
    try:
        if _libc.umount2(path.encode(), MNT_DETACH) != 0:
            raise InjectionError(f"unmount {path}: {os.strerror(ctypes.get_errno())}")
        if top is not None:  # the detached tmpfs, still reachable through the open directory
            _copy_back(f"/proc/self/fd/{top}", path, args.get("before", ()))
    finally:
        if top is not None:
            os.close(top)


def _copy_back(source: str, target: str, before: list[str] | tuple[str, ...]) -> None:
    """Make `target` hold what `source` holds, each file synced: what was written there
    stays written; what the directory held before and the tmpfs no longer does is removed."""
    kept = set(os.listdir(source)) - {FILLER}
    for name in kept:
        src, dst = os.path.join(source, name), os.path.join(target, name)
        if os.path.isdir(src):
            shutil.copytree(src, dst, dirs_exist_ok=True)
            continue
        shutil.copy2(src, dst)
        with open(dst, "rb+") as copied:
            os.fsync(copied.fileno())
    for name in set(before) - kept:
        gone = Path(target, name)
        shutil.rmtree(gone, ignore_errors=True) if gone.is_dir() else gone.unlink(missing_ok=True)
    directory = os.open(target, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)


UNDOS = UndoTable({"unmount_storage": _unmount_storage})


def ledgered_mount(ledger: Ledger, path: str, make: Callable[[], None], copy_back: bool = False,
                   before: list[str] | None = None) -> Entry:
    """`make()` mounts on `path`, its undo (`unmount_storage`) recorded first; a mount half
    made (one of two) is taken back here."""
    entry = ledger.record("unmount_storage", path=path, copy_back=copy_back, before=before or [])
    try:
        make()
    except BaseException:
        _unmount_storage(entry.args)
        ledger.mark(entry, "undone")
        raise
    ledger.mark(entry, "done")
    return entry


def share_below(path: str, ledger: Ledger) -> Entry:
    """`path` bind-mounted over itself and made shared, so that the mounts storage faults
    make below it reach a container that binds it `rslave` after the container started
    (this host's / may be private, as it is on the machines CI runs on)."""
    def bind_shared() -> None:
        _mount(path, path, None, MS_BIND, None)
        _mount(None, path, None, MS_SHARED, None)
    return ledgered_mount(ledger, os.path.realpath(path), bind_shared)


class StorageMechanism(Mechanism):
    """A mount over the target's checkpoint directory: one storage fault at a time there."""

    def conflict(self, fault: FaultBase, host: Host) -> str | None:
        if host.storage is not None and mounted(host.storage):
            return f"its checkpoint directory {host.storage} already holds a storage fault (a mount)"
        return None

    @staticmethod
    def directory(fault: FaultBase, host: Host) -> str:
        """The real path of the host's checkpoint directory, refused where it has none."""
        if host.storage is None:
            raise UnsupportedFault(f"{fault.kind} on {host.name}: the rank has no checkpoint directory")  # type: ignore[attr-defined]
        path = os.path.realpath(host.storage)
        if not os.path.isdir(path):
            raise UnsupportedFault(f"{fault.kind} on {host.name}: its checkpoint directory {path} does not exist")  # type: ignore[attr-defined]
        return path


class KernelMount(StorageMechanism):
    """A mount of the kernel's own filesystems, undone by `unmount_storage` (`copies_back`:
    what the mount holds is copied to the directory below first)."""

    copies_back = False

    def apply(self, fault: FaultBase, host: Host, ledger: Ledger) -> list[Entry]:
        path = self.directory(fault, host)
        return [ledgered_mount(ledger, path, lambda: self.mount(fault, path, ledger.run_id), self.copies_back,
                               sorted(os.listdir(path)))]

    @abc.abstractmethod
    def mount(self, fault: FaultBase, path: str, run_id: str) -> None:
        """Mount over `path` (the directory's real path), named after the run."""


class SizedTmpfs(KernelMount):
    name = "size-capped tmpfs over the checkpoint directory (ENOSPC)"
    copies_back = True

    def mount(self, fault: FaultBase, path: str, run_id: str) -> None:
        assert isinstance(fault, DiskFull)
        below = os.open(path, os.O_RDONLY | os.O_DIRECTORY)  # the directory as it was, once covered
        try:
            st = os.fstat(below)
            _mount(f"chaos-{run_id}", path, "tmpfs", 0, f"mode={st.st_mode & 0o7777:o},uid={st.st_uid},gid={st.st_gid}")
            shutil.copytree(f"/proc/self/fd/{below}", path, dirs_exist_ok=True)
        finally:
            os.close(below)
        fs = os.statvfs(path)
        used = (fs.f_blocks - fs.f_bfree) * fs.f_frsize
        if not used and not fault.after_bytes:
            Path(path, FILLER).write_bytes(b"\0" * PAGE)
            used = PAGE
        size = used + -(-(fault.after_bytes or 0) // PAGE) * PAGE
        _mount(None, path, None, MS_REMOUNT, f"size={size}")


class ReadOnlyBind(KernelMount):
    name = "read-only bind mount over the checkpoint directory (EROFS)"

    def mount(self, fault: FaultBase, path: str, run_id: str) -> None:
        _read_only_bind(path)
