"""The pyroute2 edge: every netlink call of the project goes through here.

pyroute2's `NetlinkError` and the OSErrors of namespace files are translated once, into
`InjectionError`, with the errno kept; `gone_ok` lets a revert tolerate exactly the
"already gone" errors (ENOENT, ENODEV, ESRCH) and nothing else. Each call returns the
monotonic time at which the kernel acknowledged it.
"""
from __future__ import annotations

import contextlib
import time
from typing import Iterator

from pyroute2 import IPRoute, netns
from pyroute2.netlink.exceptions import NetlinkError

from chaos.errors import ALREADY_GONE, InjectionError


def _errno(exc: BaseException) -> int | None:
    if isinstance(exc, NetlinkError):
        return exc.code
    if isinstance(exc, OSError):
        return exc.errno
    return None


@contextlib.contextmanager
def translated(what: str, gone_ok: bool = False) -> Iterator[None]:
    """Turn netlink/OS errors into InjectionError; swallow only 'already gone' if asked."""
    try:
        yield
    except (NetlinkError, OSError) as exc:
        code = _errno(exc)
        if gone_ok and code in ALREADY_GONE:
            return
        err = InjectionError(f"{what}: {exc}")
        err.errno = code  # type: ignore[attr-defined]
        raise err from exc


@contextlib.contextmanager
def route(ns: str | None) -> Iterator[IPRoute]:
    """An IPRoute socket inside namespace `ns` (None: the caller's own namespace)."""
    with translated(f"open netlink in namespace {ns}"):
        ipr = IPRoute(netns=ns) if ns else IPRoute()
    try:
        yield ipr
    finally:
        ipr.close()


def list_namespaces() -> list[str]:
    return sorted(netns.listnetns())


def create_namespace(name: str) -> float:
    with translated(f"create namespace {name}"):
        netns.create(name)
    return time.monotonic()


def remove_namespace(name: str) -> None:
    with translated(f"remove namespace {name}", gone_ok=True):
        netns.remove(name)


def link_index(ipr: IPRoute, ifname: str) -> int:
    found = ipr.link_lookup(ifname=ifname)
    if not found:
        raise InjectionError(f"no interface {ifname!r}")
    return found[0]


def set_link_state(ns: str | None, ifname: str, up: bool, gone_ok: bool = False) -> float:
    """Bring a link up or down; returns the kernel's acknowledgement time."""
    state = "up" if up else "down"
    with translated(f"set {ifname} {state} in {ns}", gone_ok=gone_ok):
        with route(ns) as ipr:
            found = ipr.link_lookup(ifname=ifname)
            if not found:
                if gone_ok:
                    return time.monotonic()
                raise NetlinkError(19, f"no interface {ifname}")
            ipr.link("set", index=found[0], state=state)
    return time.monotonic()


def link_is_up(ns: str | None, ifname: str) -> bool:
    with translated(f"read state of {ifname} in {ns}"), route(ns) as ipr:
        link = ipr.get_links(link_index(ipr, ifname))[0]
        return bool(link["flags"] & 1)  # IFF_UP
