"""Storage faults the kernel has no filesystem for (io_error, io_delay, io_stall,
lose_unsynced), made by a passthrough FUSE filesystem mounted over the rank's checkpoint directory.

One daemon per faulted directory, `python -m chaos.fusefs`: a helper process of the harness
in a session of its own, outside the ranks' process trees and namespaces (a FUSE daemon that
dies with a pid namespace can leave the tasks in its mount hung). It opens the directory
before it mounts over it and serves every call from the directory below
(`/proc/self/fd/N/...`), so the files stay where they are and nothing is copied; the ranks
share the harness's mount namespace and see the mount. The fault is on from the mount; the
harness turns it `off` (a stalled call then goes on) and reads its `stats` over a unix
socket in the abstract namespace, named after the run and the directory.

lose_unsynced keeps an undo record per file written while it is on: the bytes each write
or truncation replaced, and the size the file had, dropped when the file is fsynced.
Turning it off is the crash: every file still holding a record is put back to what its last
fsync made durable, through a descriptor of its own (so a file renamed since is found);
renames, creations and removals stay done, as with LazyFS.

The binding is mfusepy: the maintained ctypes binding of libfuse 3 (pyfuse3's README points
to it; fusepy is unmaintained), so nothing is compiled and the daemon is plain threads.

Ledger: `unmount_fuse` (a lazy unmount) is recorded before the daemon starts; `stop_fuse`
once it mounted. Undone last-in first, `stop_fuse` turns the fault off, unmounts lazily (a
file a rank still holds open is still served) and gives the daemon a grace to end on its own
before SIGTERM/SIGKILL; `unmount_fuse` then finds nothing left, unless the daemon never got
that far. A heal after a SIGKILL of the harness runs the same undos; a daemon started before
its entry was written is found by its `--run-id` (chaos.proc.helpers_of_run).
"""
from __future__ import annotations

import argparse
import contextlib
import ctypes
import ctypes.util
import errno
import fnmatch
import hashlib
import importlib.util
import json
import os
import random
import socket
import stat
import subprocess
import sys
import threading
import time
from collections import Counter
from typing import Any

from chaos import proc
from chaos.api import Host
from chaos.errors import InjectionError, InvalidFault, UnsupportedFault
from chaos.faults import (FaultBase, FuseStorageFault, IoCallFault, IoDelay, IoError, IoStall, LoseUnsynced,
                          fault_from_wire)
from chaos.ledger import Entry, Ledger
from chaos.undotable import UndoTable
from chaos.storage import MNT_DETACH, StorageMechanism, mounted

READY = "fusefs ready"
READY_TIMEOUT_S = 10.0
CONTROL_TIMEOUT_S = 2.0
STOP_GRACE_S = 2.0
_libc = ctypes.CDLL(None, use_errno=True)


def control_name(run_id: str, path: str) -> str:
    """The daemon's socket, in the abstract namespace (no file to leave behind)."""
    return f"\0chaos-fusefs-{run_id}-{hashlib.sha1(path.encode()).hexdigest()[:12]}"


def control(name: str, command: str, timeout_s: float = CONTROL_TIMEOUT_S) -> dict[str, Any]:
    """Send one command (`on`, `off`, `stats`) to a daemon; its answer."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout_s)
        sock.connect(name)
        sock.sendall(command.encode() + b"\n")
        answer = b""
        while not answer.endswith(b"\n"):
            chunk = sock.recv(4096)
            if not chunk:
                break
            answer += chunk
    return json.loads(answer or b"{}")


def why_no_fuse() -> str | None:
    """Why a FUSE filesystem cannot be mounted here, or None."""
    if not os.path.exists("/dev/fuse"):
        return "there is no /dev/fuse"
    if not os.access("/dev/fuse", os.R_OK | os.W_OK):
        mode = stat.S_IMODE(os.stat("/dev/fuse").st_mode)
        return (f"/dev/fuse (mode {mode:o}) is not open to this user; most distributions make it 666 "
                "(chmod 666 /dev/fuse), or run as root")
    if importlib.util.find_spec("mfusepy") is None:
        return "the Python package mfusepy is not installed (pip install mfusepy)"
    if ctypes.util.find_library("fuse3") is None:
        return "libfuse 3 is not installed (apt-get install fuse3 libfuse3-3)"
    if os.geteuid() != 0 and not _fusermount():
        return "fusermount3 is not installed (apt-get install fuse3): an ordinary user mounts through it"
    return None


def _fusermount() -> str | None:
    return next((f"{d}/fusermount3" for d in ("/usr/bin", "/bin") if os.access(f"{d}/fusermount3", os.X_OK)), None)


def lazy_unmount(path: str) -> None:
    """Detach the mount on `path`: new calls see the directory below; a file still open in
    it stays served while its daemon lives. Already gone is fine."""
    if not mounted(path):
        return
    if os.geteuid() == 0:
        if _libc.umount2(path.encode(), MNT_DETACH) != 0:
            raise InjectionError(f"unmount {path}: {os.strerror(ctypes.get_errno())}")
        return
    done = subprocess.run([_fusermount() or "fusermount3", "-u", "-z", path], capture_output=True, text=True,
                          timeout=CONTROL_TIMEOUT_S * 5)
    if done.returncode != 0 and mounted(path):
        raise InjectionError(f"fusermount3 -u -z {path}: {done.stderr.strip()}")


def _undo_unmount_fuse(args: dict[str, Any]) -> None:
    lazy_unmount(args["path"])


def _undo_stop_fuse(args: dict[str, Any]) -> None:
    """Off first (stalled calls go on), then the mount detached, then the daemon ends: on
    its own once the last open file in the detached mount is closed, else stopped."""
    with contextlib.suppress(OSError, ValueError):
        control(args["control"], "off")
    lazy_unmount(args["path"])
    deadline = time.monotonic() + STOP_GRACE_S
    while time.monotonic() < deadline and proc.start_time(args["pid"]) == args["started"]:
        proc.reap(args["pid"])
        time.sleep(0.02)
    proc.stop(args["pid"], args["started"], STOP_GRACE_S)


UNDOS = UndoTable({"unmount_fuse": _undo_unmount_fuse, "stop_fuse": _undo_stop_fuse})


class FusePassthrough(StorageMechanism):
    name = "passthrough FUSE filesystem over the checkpoint directory (mfusepy)"

    def apply(self, fault: FaultBase, host: Host, ledger: Ledger) -> list[Entry]:
        assert isinstance(fault, FuseStorageFault)
        reason = why_no_fuse()
        if reason:
            raise UnsupportedFault(f"{fault.kind} on {host.name}: {reason}")  # type: ignore[attr-defined]
        path = self.directory(fault, host)
        name = control_name(ledger.run_id, path)
        # a fault value carries no scenario seed (the delayer's and the kernel's draws are not
        # seeded either): a percent's draws come from a stream seeded by the run and the directory
        seed = int.from_bytes(hashlib.sha1(f"{ledger.run_id}:{path}".encode()).digest()[:8], "big")
        mount = ledger.record("unmount_fuse", path=path)
        try:
            helper = proc.spawn_helper("chaos.fusefs", "--path", path, "--fault", fault.model_dump_json(),
                                       "--seed", str(seed), "--control", name[1:], "--run-id", ledger.run_id)
            proc.wait_ready(helper, READY, READY_TIMEOUT_S)
        except BaseException:
            lazy_unmount(path)
            ledger.mark(mount, "undone")
            raise
        daemon = ledger.record("stop_fuse", path=path, control=name, pid=helper.pid,
                               started=proc.start_time(helper.pid))
        ledger.mark(daemon, "done")
        ledger.mark(mount, "done")
        return [mount, daemon]


class Passthrough:
    """The filesystem: every call done on the directory below; the fault's `ops` on files
    matching its `path` glob fail, wait or stall while it is on."""

    use_ns = True

    def __init__(self, below: int, fault: FuseStorageFault | None, seed: int) -> None:
        self.root = f"/proc/self/fd/{below}"
        self.fault = fault
        self.on = threading.Event()
        self.off = threading.Event()  # set while off: what a stall or a delay waits on
        self._lock = threading.Lock()
        self._random = random.Random(seed)
        self.counts: Counter[str] = Counter()
        # lose_unsynced: per file (device, inode), its own descriptor, its size and the bytes replaced
        self._unsynced: dict[tuple[int, int], dict[str, Any]] = {}
        self.switch(fault is not None)

    def switch(self, on: bool) -> None:
        if not on and self.on.is_set() and isinstance(self.fault, LoseUnsynced):
            self._crash()
        (self.on.set if on else self.on.clear)()
        (self.off.clear if on else self.off.set)()

    def _losing(self, path: str) -> bool:
        return (isinstance(self.fault, LoseUnsynced) and self.on.is_set()
                and fnmatch.fnmatch(path.lstrip("/"), self.fault.path))

    def _remember(self, path: str, target: str | int, start: int, end: int | None) -> None:
        """Before a write or a truncation of bytes [start, end) (None: to the end) of a file
        (a path, or a descriptor of the daemon's), keep what they were while it is unsynced."""
        if not self._losing(path):
            return
        try:
            st = os.fstat(target) if isinstance(target, int) else os.stat(target)
        except FileNotFoundError:
            return  # created by this call: empty until an fsync says otherwise (create remembers it)
        with self._lock:
            record = self._unsynced.get((st.st_dev, st.st_ino))
            if record is None:
                keeper = os.open(f"/proc/self/fd/{target}" if isinstance(target, int) else target, os.O_RDWR)
                record = self._unsynced[(st.st_dev, st.st_ino)] = {"fd": keeper, "size": st.st_size, "old": []}
            length = max(0, (st.st_size if end is None else min(end, st.st_size)) - start)
            record["old"].append((start, os.pread(record["fd"], length, start) if length else b""))

    def _synced(self, fh: int) -> None:
        st = os.fstat(fh)
        with self._lock:
            record = self._unsynced.pop((st.st_dev, st.st_ino), None)
        if record is not None:
            os.close(record["fd"])

    def _crash(self) -> None:
        """What was not fsynced is lost: each file back to its last durable content."""
        with self._lock:
            for record in self._unsynced.values():
                for start, old in reversed(record["old"]):
                    os.pwrite(record["fd"], old, start)
                os.ftruncate(record["fd"], record["size"])
                os.close(record["fd"])
                self.counts["files_lost_writes"] += 1
            self._unsynced.clear()

    def _real(self, path: str) -> str:
        return self.root + path

    def _call(self, op: str, path: str) -> None:
        """The fault on one call: raise its errno, wait its latency, or block until off."""
        fault = self.fault
        if not isinstance(fault, IoCallFault) or not self.on.is_set() or op not in fault.ops or not fnmatch.fnmatch(path.lstrip("/"), fault.path):
            return
        with self._lock:
            self.counts[f"{op}_matched"] += 1
            if isinstance(fault, IoError):
                if fault.every_nth is not None:  # counted per operation: every nth write, every nth fsync
                    fail = self.counts[f"{op}_matched"] % fault.every_nth == 0
                else:
                    fail = fault.percent is None or self._random.random() < fault.percent
                if fail:
                    self.counts[f"{op}_failed"] += 1
        if isinstance(fault, IoError) and fail:
            print(f"fusefs: {op} {path}: {errno.errorcode[fault.errno]}", file=sys.stderr, flush=True)
            raise OSError(fault.errno, os.strerror(fault.errno))
        if isinstance(fault, IoDelay):
            self.off.wait(fault.latency)
        elif isinstance(fault, IoStall):
            started = time.monotonic()
            self.off.wait()  # until the fault ends: the harness's revert, or a heal, turns it off
            with self._lock:
                self.counts[f"{op}_stalled_s"] += round(time.monotonic() - started, 3)  # type: ignore[assignment]

    # -- the filesystem's calls (mfusepy's Operations interface, paths from the mount's root)
    def init(self, path: str) -> None:
        print(READY, flush=True)

    def getattr(self, path: str, fh: int | None = None) -> dict[str, Any]:
        st = os.fstat(fh) if fh is not None else os.lstat(self._real(path))
        return {"st_ino": st.st_ino, "st_mode": st.st_mode, "st_nlink": st.st_nlink, "st_uid": st.st_uid,
                "st_gid": st.st_gid, "st_size": st.st_size, "st_atime": st.st_atime_ns, "st_mtime": st.st_mtime_ns,
                "st_ctime": st.st_ctime_ns, "st_blocks": st.st_blocks, "st_blksize": st.st_blksize}

    def readdir(self, path: str, fh: int) -> list[tuple[str, dict[str, int], int]]:
        # each entry with its inode number: under use_ino the kernel lists the number given,
        # and a bare name's is 0, an entry readdir(3) skips (the folder looked empty to every
        # os.listdir, so a restore found no checkpoint and started from scratch)
        real = self._real(path)
        listed = [(name, os.lstat(os.path.join(real, name))) for name in (".", "..")]
        with os.scandir(real) as entries:
            listed += [(e.name, e.stat(follow_symlinks=False)) for e in entries]
        return [(name, {"st_ino": st.st_ino, "st_mode": st.st_mode}, 0) for name, st in listed]

    def access(self, path: str, amode: int) -> int:
        if not os.access(self._real(path), amode):
            raise OSError(errno.EACCES, os.strerror(errno.EACCES))
        return 0

    def open(self, path: str, flags: int) -> int:
        self._call("open", path)
        if flags & os.O_TRUNC:
            self._remember(path, self._real(path), 0, None)
        return os.open(self._real(path), flags)

    def create(self, path: str, mode: int, flags: int | None = None) -> int:
        self._call("open", path)
        if (flags or 0) & os.O_TRUNC:
            self._remember(path, self._real(path), 0, None)
        fh = os.open(self._real(path), os.O_RDWR | os.O_CREAT | ((flags or 0) & (os.O_EXCL | os.O_TRUNC)), mode)
        self._remember(path, fh, 0, 0)  # a new file: empty unless fsynced
        return fh

    def read(self, path: str, size: int, offset: int, fh: int) -> bytes:
        self._call("read", path)
        return os.pread(fh, size, offset)

    def write(self, path: str, data: bytes, offset: int, fh: int) -> int:
        self._call("write", path)
        self._remember(path, fh, offset, offset + len(data))
        return os.pwrite(fh, data, offset)

    def truncate(self, path: str, length: int, fh: int | None = None) -> int:
        self._remember(path, fh if fh is not None else self._real(path), length, None)
        os.ftruncate(fh, length) if fh is not None else os.truncate(self._real(path), length)
        return 0

    def flush(self, path: str, fh: int) -> int:
        return 0

    def fsync(self, path: str, datasync: int, fh: int) -> int:
        self._call("fsync", path)
        os.fdatasync(fh) if datasync else os.fsync(fh)
        self._synced(fh)
        return 0

    def fsyncdir(self, path: str, datasync: int, fh: int) -> int:
        self._call("fsync", path)
        fd = os.open(self._real(path), os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        return 0

    def release(self, path: str, fh: int) -> int:
        os.close(fh)
        return 0

    def rename(self, old: str, new: str) -> int:
        self._call("rename", new)
        os.rename(self._real(old), self._real(new))
        return 0

    def unlink(self, path: str) -> int:
        os.unlink(self._real(path))
        return 0

    def mkdir(self, path: str, mode: int) -> int:
        os.mkdir(self._real(path), mode)
        return 0

    def rmdir(self, path: str) -> int:
        os.rmdir(self._real(path))
        return 0

    def chmod(self, path: str, mode: int) -> int:
        os.chmod(self._real(path), mode)
        return 0

    def chown(self, path: str, uid: int, gid: int) -> int:
        os.lchown(self._real(path), uid, gid)
        return 0

    def utimens(self, path: str, times: tuple[int, int] | None = None) -> int:
        os.utime(self._real(path), ns=times) if times else os.utime(self._real(path))
        return 0

    def statfs(self, path: str) -> dict[str, int]:
        fs = os.statvfs(self._real(path))
        return {key: getattr(fs, key) for key in ("f_bsize", "f_frsize", "f_blocks", "f_bfree", "f_bavail",
                                                  "f_files", "f_ffree", "f_favail", "f_flag", "f_namemax")}


def _serve_control(filesystem: Passthrough, name: str) -> None:
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind("\0" + name)
    server.listen(4)

    def loop() -> None:
        while True:
            conn, _ = server.accept()
            with conn:
                conn.settimeout(CONTROL_TIMEOUT_S)
                with contextlib.suppress(OSError):
                    command = conn.recv(64).decode(errors="replace").strip()
                    if command in ("on", "off"):
                        filesystem.switch(command == "on")
                    with filesystem._lock:
                        answer = {"on": filesystem.on.is_set(), "counts": dict(filesystem.counts)}
                    conn.sendall(json.dumps(answer).encode() + b"\n")

    threading.Thread(target=loop, name="control", daemon=True).start()


def fault_from_json(text: str) -> FuseStorageFault:
    """The fault the harness validated and sent as JSON (`model_dump_json`), rebuilt
    (chaos.faults.fault_from_wire), not parsed again from the scenario's units."""
    fault = fault_from_wire(json.loads(text))
    if not isinstance(fault, FuseStorageFault):
        raise InvalidFault(f"kind: {fault.kind} is not a storage fault the FUSE daemon makes")  # type: ignore[attr-defined]
    return fault


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m chaos.fusefs", description=__doc__.split("\n\n")[0])
    parser.add_argument("--path", required=True, help="the directory to mount over")
    parser.add_argument("--fault", default="", help="the fault as JSON (none: a plain passthrough)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--control", required=True, help="the control socket's abstract name")
    parser.add_argument("--run-id", required=True, help="the run this daemon belongs to (for heal)")
    args = parser.parse_args(argv)
    import mfusepy  # only the daemon loads libfuse

    fault = fault_from_json(args.fault) if args.fault else None
    below = os.open(args.path, os.O_RDONLY | os.O_DIRECTORY)  # the directory below, once covered
    filesystem = Passthrough(below, fault, args.seed)
    _serve_control(filesystem, args.control)
    # use_ino: a file keeps the inode number it has below, so what a rank records of it
    # inside the mount (a checkpoint's identity: reports.checkpoints) is what it has after
    options: dict[str, Any] = {"use_ino": True, **({"allow_other": True} if os.geteuid() == 0 else {})}
    mfusepy.FUSE(filesystem, args.path, foreground=True, fsname=f"chaos-{args.run_id}", **options)
    return 0


if __name__ == "__main__":
    sys.exit(main())
