"""A host's own network settings: the net.* sysctls of its network namespace.

The kernel keeps most net.* settings per network namespace, and per interface under
net.ipv4.conf.eth0.* and net.ipv4.neigh.eth0.*, so a scenario's hosts can have the settings
of the user's nodes (`cluster.sysctls`: TCP retries, keepalive, ARP timers) without
touching the machine's own. They are written while a host is plugged in, before its link
is up, and go with its namespace: nothing to record or undo.

Why a scenario may want one: after a link comes back, a host's first packet to a peer it
could not reach waits for that peer's neighbour entry to be probed again, at the entry's
next retransmission (net.ipv4.neigh.eth0.retrans_time_ms, 1 s by default; docs/scale-journal.md).
"""
from __future__ import annotations

import re
import threading
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import TypeVar

from chaos import proc
from chaos.errors import UsageError

PROC_SYS = Path("/proc/sys")
KEY_FORM = re.compile(r"net(\.[A-Za-z0-9_-]+)+")
FIELD = "cluster.sysctls"
T = TypeVar("T")


def check_key(key: str) -> str:
    """`key` if it names a setting a host may have of its own; ValueError saying why not."""
    if not KEY_FORM.fullmatch(key):
        raise ValueError(f"{key!r} is not a host's network setting: a host is a network namespace, and "
                         "only net.* settings are its own (e.g. net.ipv4.neigh.eth0.retrans_time_ms)")
    return key


def path_of(key: str) -> Path:
    return PROC_SYS.joinpath(*key.split("."))


def apply(ns_path: str, settings: Mapping[str, str]) -> None:
    """Write `settings` in the network namespace at `ns_path`."""
    if settings:
        _in_namespace(ns_path, lambda: [_write(key, value) for key, value in settings.items()])


def read(ns_path: str, keys: Iterable[str]) -> dict[str, str]:
    """The values of `keys` in the network namespace at `ns_path`."""
    return _in_namespace(ns_path, lambda: {key: path_of(check_key(key)).read_text().strip() for key in keys})


def _in_namespace(ns_path: str, work: Callable[[], T]) -> T:
    """work() on a thread of its own inside the namespace: /proc/sys/net shows the namespace
    of the thread that opens it, and the caller's thread must stay where it is."""
    result: list[T] = []
    failed: list[BaseException] = []

    def run() -> None:
        try:
            proc.enter_netns(ns_path)
            result.append(work())
        except BaseException as exc:  # noqa: BLE001 - raised again in the caller's thread
            failed.append(exc)

    worker = threading.Thread(target=run, name="sysctl")
    worker.start()
    worker.join()
    if failed:
        raise failed[0]
    return result[0]


def _write(key: str, value: str) -> None:
    path = path_of(check_key(key))
    try:
        path.write_text(value)
    except FileNotFoundError:
        raise UsageError(f"{FIELD}: {key}: a host's network namespace has no such setting ({path} "
                         "is missing); use one that `ip netns exec <host> sysctl -a` lists, naming "
                         "the host's interface eth0") from None
    except OSError as exc:
        raise UsageError(f"{FIELD}: {key}: the kernel refused {value!r} ({exc.strerror}); "
                         f"give a value that `sysctl -w {key}=...` accepts") from None
