"""Root of a user namespace of one's own: network faults without root, where the kernel
allows unprivileged user namespaces.

An ordinary user's process that calls `enter` becomes uid 0 of a new user namespace with
a mount namespace of its own (user_namespaces(7)): it may then make network namespaces,
veths, bridges, qdiscs and nftables rules, all owned by that user namespace, which is all
the fault library needs but BPF programs (loading one needs privileges of the initial
namespace: `kernel.unprivileged_bpf_disabled`). The namespaces are pinned by bind mounts
that only that mount namespace sees, onto files under the user's state folder
(`CHAOS_NETNS_DIR`), so they end when the last process of the run ends, even after a
SIGKILL: a heal from outside finds the pin files empty and counts them gone
(`is_pinned`). The user's state folder (the ledgers) is kept as the caller's before the
uid changes, so that a heal as that user finds them.
"""
from __future__ import annotations

import contextlib
import ctypes
import os
import threading
from pathlib import Path

from chaos.errors import ChaosError
from chaos.ledger import STATE_DIR_ENV

NETNS_DIR_ENV = "CHAOS_NETNS_DIR"
DEFAULT_NETNS_DIR = "/run/netns"  # ip-netns(8)'s
USERNS_ENV = "CHAOS_USER_NAMESPACE"  # set to the outer uid once entered (inherited by children)
CLONE_NEWNS = 0x00020000
CLONE_NEWUSER = 0x10000000
MS_REC = 0x4000
MS_PRIVATE = 0x40000
MNT_DETACH = 2
NSFS_MAGIC = 0x6E736673

# (file, value that refuses, what to do) for the settings known to refuse them
_REFUSALS = (
    ("/proc/sys/user/max_user_namespaces", "0", "sysctl -w user.max_user_namespaces=15000 (as root)"),
    ("/proc/sys/kernel/unprivileged_userns_clone", "0", "sysctl -w kernel.unprivileged_userns_clone=1 (as root)"),
    ("/proc/sys/kernel/apparmor_restrict_unprivileged_userns", "1",
     "sysctl -w kernel.apparmor_restrict_unprivileged_userns=0 (as root; Ubuntu's AppArmor restriction)"),
)
_libc = ctypes.CDLL(None, use_errno=True)


def netns_dir() -> str:
    """Where network namespaces are pinned by name."""
    return os.environ.get(NETNS_DIR_ENV, DEFAULT_NETNS_DIR)


def entered() -> bool:
    return USERNS_ENV in os.environ


def who() -> str:
    """The user, as a line says it: "uid 1000 as root of a user namespace of its own"."""
    if entered():
        return f"uid {os.environ[USERNS_ENV]} as root of a user namespace of its own"
    return f"uid {os.geteuid()}{' (root)' if os.geteuid() == 0 else ''}"


def why_not() -> str | None:
    """Why this user cannot have a user namespace here (the setting and the fix), or None."""
    for path, refusing, fix in _REFUSALS:
        try:
            if Path(path).read_text().strip() == refusing:
                return f"{path} is {refusing}: user namespaces are refused to ordinary users; {fix}"
        except OSError:
            continue
    return None


def enter(state_dir: Path) -> None:
    """Become root of a new user namespace with its own mount namespace; namespaces pin
    under `state_dir`/netns-<pid>. Call it before any thread starts (unshare(2) refuses a
    threaded process)."""
    uid, gid = os.geteuid(), os.getegid()
    if threading.active_count() != 1:
        raise ChaosError("a user namespace can only be entered before any thread starts")
    if _libc.unshare(CLONE_NEWUSER | CLONE_NEWNS) != 0:
        code = ctypes.get_errno()
        raise ChaosError(f"unshare of a user namespace failed: {os.strerror(code)}"
                         + (f" ({why_not()})" if why_not() else ""))
    Path("/proc/self/setgroups").write_text("deny")
    Path("/proc/self/uid_map").write_text(f"0 {uid} 1")
    Path("/proc/self/gid_map").write_text(f"0 {gid} 1")
    # nothing mounted here propagates back to the machine's mount namespace
    if _libc.mount(None, b"/", None, MS_REC | MS_PRIVATE, None) != 0:
        raise ChaosError(f"making the mounts private failed: {os.strerror(ctypes.get_errno())}")
    pins = state_dir / f"netns-{os.getpid()}"
    pins.mkdir(parents=True, exist_ok=True)
    os.environ.update({USERNS_ENV: str(uid), NETNS_DIR_ENV: str(pins), STATE_DIR_ENV: str(state_dir)})


def remove_pin_folder(pin: str) -> None:
    """Remove the folder of `pin` once it holds no pin: a user namespace's (pyroute2 binds
    the folder onto itself there: unmounted first); never ip-netns(8)'s own."""
    remove_empty_pin_folder(os.path.dirname(pin))


def remove_empty_pin_folder(folder: str) -> None:
    """Remove a user namespace's pin folder that holds no pin (a command that built no
    namespace, such as `chaos calibrate --kind slow`, leaves it as `enter` made it)."""
    if folder == DEFAULT_NETNS_DIR or not os.path.isdir(folder) or os.listdir(folder):
        return
    _libc.umount2(folder.encode(), MNT_DETACH)  # not mounted (a heal from outside): nothing to do
    with contextlib.suppress(OSError):
        os.rmdir(folder)


def is_pinned(path: str) -> bool:
    """Whether `path` is a live namespace (nsfs), not a pin file its mount namespace left."""
    try:
        return _fs_magic(path) == NSFS_MAGIC
    except OSError:
        return False


class _StatFs(ctypes.Structure):
    _fields_ = [("f_type", ctypes.c_long), ("rest", ctypes.c_long * 15)]


def _fs_magic(path: str) -> int:
    buf = _StatFs()
    if _libc.statfs(path.encode(), ctypes.byref(buf)) != 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code), path)
    return buf.f_type
