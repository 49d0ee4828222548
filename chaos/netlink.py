"""The pyroute2 edge: every netlink call of the project goes through here.

pyroute2's `NetlinkError` and the OSErrors of namespace files are translated once, into
`InjectionError`, with the errno kept; `gone_ok` lets a revert tolerate exactly the
"already gone" errors (ENOENT, ENODEV, ESRCH) and nothing else. Each call returns the
monotonic time at which the kernel acknowledged it.

Besides pyroute2's own calls, this edge sends raw netlink messages that pyroute2 cannot
encode (netem's full option set, nftables rules with hand-built expressions): the
messages are built by `chaos.tc` / `chaos.nft` as bytes, and sent and acknowledged here.
Sockets inside a namespace are made by `socket_in`, on a thread that enters it, never by
pyroute2 (which forks a process for each, and with O_CREAT *creates* a missing namespace,
so that a heal would resurrect what it is removing); a namespace is made the same way, by a
thread that moves into a new one and names it (`create_namespace`).
"""
from __future__ import annotations

import contextlib
import errno
import os
import socket
import struct
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Iterator, Sequence, TypeVar

from pyroute2 import IPRoute, netns
from pyroute2.netlink.exceptions import NetlinkError

from chaos import proc, userns
from chaos.errors import ALREADY_GONE, InjectionError

T = TypeVar("T")


def _errno(exc: NetlinkError | OSError) -> int | None:
    return exc.code if isinstance(exc, NetlinkError) else exc.errno


@contextlib.contextmanager
def translated(what: str, gone_ok: bool = False) -> Iterator[None]:
    """Turn netlink/OS errors into InjectionError; swallow only 'already gone' if asked."""
    try:
        yield
    except InjectionError as exc:  # from an inner edge call: already translated
        if not (gone_ok and exc.errno in ALREADY_GONE):
            raise
    except (NetlinkError, OSError) as exc:
        code = _errno(exc)
        if gone_ok and code in ALREADY_GONE:
            return
        raise InjectionError(f"{what}: {exc}", code) from exc


def socket_in(ns: str, family: int, kind: int, proto: int = 0) -> socket.socket:
    """A socket created inside namespace `ns` (a name under /var/run/netns, or a path; never
    created if missing). setns(2) moves only the calling thread: a thread of its own enters
    the namespace, creates the socket and ends. pyroute2 forks a process for it instead:
    0.05 s each with 16 busy ranks on 2 cores, 0.45 s with 64, so that applying a blackhole
    (six netlink sockets) took 0.23-0.35 s and 3.7-9.3 s (docs/scale-journal.md)."""
    return _on_a_thread_of_its_own(_socket_here, namespace_path(ns), family, kind, proto)


def _on_a_thread_of_its_own(work: Callable[..., T], *args: Any) -> T:
    """`work` on a new thread that ends with it: setns(2) and unshare(2) move only the
    calling thread into a namespace, and this thread stays where it is."""
    with ThreadPoolExecutor(1, thread_name_prefix="netns") as pool:
        return pool.submit(work, *args).result()


def _socket_here(path: str, family: int, kind: int, proto: int) -> socket.socket:
    proc.enter_netns(path)
    return socket.socket(family, kind, proto)


@contextlib.contextmanager
def route(ns: str | None) -> Iterator[IPRoute]:
    """An IPRoute socket inside namespace `ns` (None: the caller's own namespace)."""
    with translated(f"open netlink in namespace {ns}"):
        ipr = (IPRoute(fileno=socket_in(ns, socket.AF_NETLINK, socket.SOCK_DGRAM, NETLINK_ROUTE).detach())
               if ns else IPRoute())
    try:
        yield ipr
    finally:
        ipr.close()


def namespace_path(ns: str) -> str:
    """The pin of namespace `ns` (a name under chaos.userns.netns_dir(), or a path)."""
    return ns if ns.startswith("/") else os.path.join(userns.netns_dir(), ns)


def list_namespaces() -> list[str]:
    return sorted(netns.listnetns(nspath=userns.netns_dir()))


def create_namespace(name: str) -> float:
    """Namespace `name` (/run/netns/`name`, as `ip netns add`), made by a thread of its own
    that moves into a new namespace, names it and ends. pyroute2's `netns.create` forks the
    harness for it instead, and a fork of a process as large as the harness costs about ten
    times this way's time (docs/scale-journal.md)."""
    with translated(f"create namespace {name}"):
        _on_a_thread_of_its_own(_create_here, name)
    return time.monotonic()


def _create_here(name: str) -> None:
    proc.leave_netns()
    netns.attach(namespace_path(name), "thread-self")  # the bind mount of this thread's namespace, as ip netns add


def attach_namespace(name: str, pid: int) -> None:
    """Name the network namespace of process `pid` (/run/netns/`name`, as `ip netns attach`)."""
    with translated(f"pin the namespace of pid {pid} as {name}"):
        netns.attach(namespace_path(name), pid)


def remove_namespace(name: str) -> None:
    with translated(f"remove namespace {name}", gone_ok=True):
        netns.remove(namespace_path(name))


def link_index(ipr: IPRoute, ifname: str) -> int:
    found = ipr.link_lookup(ifname=ifname)
    if not found:
        raise InjectionError(f"no interface {ifname!r}", errno.ENODEV)
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


# --- raw netlink: messages pyroute2 cannot encode, built as bytes by chaos.tc / chaos.nft ---

NETLINK_ROUTE = 0
NETLINK_NETFILTER = 12
NLMSG_ERROR = 2
NLMSG_DONE = 3
NLM_F_REQUEST = 0x1
NLM_F_ACK = 0x4
NLM_F_EXCL = 0x200
NLM_F_CREATE = 0x400
NLA_F_NESTED = 0x8000
_NLMSG_HEADER = struct.Struct("=IHHII")
SO_SNDBUFFORCE, SO_RCVBUFFORCE, SO_TIMESTAMPNS = 32, 33, 35  # <asm-generic/socket.h>; the socket module lacks them


def set_buffer(sock: socket.socket, size: int, receive: bool = True) -> None:
    """A socket buffer of `size` bytes: past net.core.[rw]mem_max where the process may
    (CAP_NET_ADMIN of the initial namespace), else as large as that cap allows (an ordinary
    user's user namespace)."""
    force, plain = (SO_RCVBUFFORCE, socket.SO_RCVBUF) if receive else (SO_SNDBUFFORCE, socket.SO_SNDBUF)
    try:
        sock.setsockopt(socket.SOL_SOCKET, force, size)
    except PermissionError:
        sock.setsockopt(socket.SOL_SOCKET, plain, size)
SOCKET_BUFFER = 1 << 16     # what a netlink socket's default buffers surely hold
ACK_BYTES = 1024            # what one acknowledgement costs the receive buffer (its skb, not its 36 bytes)


def nla(attr_type: int, payload: bytes) -> bytes:
    """One netlink attribute, padded to 4 bytes."""
    length = 4 + len(payload)
    return struct.pack("=HH", length, attr_type) + payload + b"\0" * (-length % 4)


def nested(attr_type: int, *attrs: bytes) -> bytes:
    return nla(attr_type | NLA_F_NESTED, b"".join(attrs))


def nlmsg(msg_type: int, flags: int, body: bytes, seq: int = 0) -> bytes:
    return _NLMSG_HEADER.pack(_NLMSG_HEADER.size + len(body), msg_type, flags, seq, 0) + body


def parse_attrs(data: bytes) -> list[tuple[int, bytes]]:
    """(type without flag bits, payload) of each attribute in `data`."""
    attrs, offset = [], 0
    while offset + 4 <= len(data):
        length, attr_type = struct.unpack_from("=HH", data, offset)
        if length < 4:
            break
        attrs.append((attr_type & ~NLA_F_NESTED & 0x7FFF, data[offset + 4:offset + length]))
        offset += (length + 3) & ~3
    return attrs


def parse_messages(data: bytes) -> list[tuple[int, int, int, bytes]]:
    """(type, flags, seq, body) of each netlink message in `data`."""
    messages, offset = [], 0
    while offset + _NLMSG_HEADER.size <= len(data):
        length, msg_type, flags, seq, _ = _NLMSG_HEADER.unpack_from(data, offset)
        if length < _NLMSG_HEADER.size:
            break
        messages.append((msg_type, flags, seq, data[offset + _NLMSG_HEADER.size:offset + length]))
        offset += (length + 3) & ~3
    return messages


def namespace_socket(ns: str | None, protocol: int) -> socket.socket:
    """A raw netlink socket living in namespace `ns` (never created if missing)."""
    with translated(f"open netlink in namespace {ns}"):
        if ns is None:
            sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, protocol)
        else:
            sock = socket_in(ns, socket.AF_NETLINK, socket.SOCK_RAW, protocol)
        sock.bind((0, 0))
    return sock


def send_acked(ns: str | None, protocol: int, messages: Sequence[bytes], what: str,
               gone_ok: bool = False) -> float:
    """Send raw messages (each built with NLM_F_ACK unless a batch delimiter) and wait for
    every acknowledgement; the first error the kernel reports is raised, translated."""
    with translated(what, gone_ok=gone_ok):
        sock = namespace_socket(ns, protocol)
        try:
            seqs = set()
            stamped = []
            for seq, msg in enumerate(messages, start=1):
                length, msg_type, flags, _, pid = _NLMSG_HEADER.unpack_from(msg)
                stamped.append(_NLMSG_HEADER.pack(length, msg_type, flags, seq, pid) + msg[_NLMSG_HEADER.size:])
                if flags & NLM_F_ACK:
                    seqs.add(seq)
            payload = b"".join(stamped)
            # One datagram (an nftables batch is one transaction): a 64-rank partition's
            # thousands of rules pass the default socket buffers, which root may raise.
            if len(payload) > SOCKET_BUFFER:
                set_buffer(sock, len(payload) + SOCKET_BUFFER, receive=False)
                set_buffer(sock, len(seqs) * ACK_BYTES + SOCKET_BUFFER)
            sock.sendall(payload)
            error = 0
            while seqs:
                for msg_type, _, seq, body in parse_messages(sock.recv(1 << 16)):
                    if msg_type == NLMSG_ERROR:
                        code = -struct.unpack_from("=i", body)[0]
                        seqs.discard(seq)
                        error = error or code
            if error:
                raise OSError(error, os.strerror(error))
        finally:
            sock.close()
    return time.monotonic()


def ifindex(ns: str | None, ifname: str) -> int:
    with translated(f"look up {ifname} in {ns}"), route(ns) as ipr:
        return link_index(ipr, ifname)


# --- traffic control through pyroute2: clsact, cls_bpf filters, read-back of qdiscs ---

TC_H_ROOT = 0xFFFFFFFF
TC_H_CLSACT = 0xFFFFFFF1
CLSACT_PARENT = {"ingress": 0xFFFFFFF2, "egress": 0xFFFFFFF3}
ETH_P_ALL = 0x0003


def qdiscs(ns: str | None, ifname: str) -> list[dict[str, Any]]:
    """The qdiscs of one device as {kind, handle, parent} (kernel state, for checks and heal)."""
    with translated(f"list qdiscs of {ifname} in {ns}"), route(ns) as ipr:
        index = link_index(ipr, ifname)
        return [{"kind": q.get_attr("TCA_KIND"), "handle": q["handle"], "parent": q["parent"]}
                for q in ipr.get_qdiscs(index=index)]


def add_clsact(ns: str, ifname: str) -> float:
    """Ensure a clsact qdisc on the device; one that is already there is shared."""
    with translated(f"add clsact to {ifname} in {ns}"), route(ns) as ipr:
        index = link_index(ipr, ifname)
        if not any(q.get_attr("TCA_KIND") == "clsact" for q in ipr.get_qdiscs(index=index)):
            ipr.tc("add", kind="clsact", index=index)
    return time.monotonic()


def remove_clsact_if_unused(ns: str, ifname: str) -> None:
    """Remove the clsact qdisc once no filter is left on either hook (other faults share it)."""
    with translated(f"remove clsact from {ifname} in {ns}", gone_ok=True), route(ns) as ipr:
        index = link_index(ipr, ifname)
        if any(ipr.get_filters(index=index, parent=parent) for parent in CLSACT_PARENT.values()):
            return
        ipr.tc("del", kind="clsact", index=index, handle=0xFFFF0000, parent=TC_H_CLSACT)


def _filter_prios(ipr: IPRoute, index: int, hook: str) -> set[int]:
    return {f["info"] >> 16 for f in ipr.get_filters(index=index, parent=CLSACT_PARENT[hook])}


def filter_prios(ns: str, ifname: str, hook: str) -> set[int]:
    with translated(f"list filters of {ifname} {hook} in {ns}"), route(ns) as ipr:
        return _filter_prios(ipr, link_index(ipr, ifname), hook)


def add_bpf_filter(ns: str, ifname: str, hook: str, prio: int, prog_fd: int, name: str) -> float:
    """Attach a loaded cls_bpf direct-action program at the clsact hook with priority `prio`."""
    with translated(f"attach bpf {name} to {ifname} {hook} in {ns}"), route(ns) as ipr:
        ipr.tc("add-filter", kind="bpf", index=link_index(ipr, ifname), parent=CLSACT_PARENT[hook],
               info=(prio << 16) | socket.htons(ETH_P_ALL), fd=prog_fd, name=name, direct_action=True)
    return time.monotonic()


def remove_filter(ns: str, ifname: str, hook: str, prio: int) -> float:
    """Remove the filter of priority `prio` (only that one: prio 0 would remove them all)."""
    with translated(f"remove filter {prio} from {ifname} {hook} in {ns}", gone_ok=True), route(ns) as ipr:
        index = link_index(ipr, ifname)
        if prio in _filter_prios(ipr, index, hook):  # the kernel says EINVAL, not ENOENT, once clsact is gone
            ipr.tc("del-filter", kind="bpf", index=index, parent=CLSACT_PARENT[hook],
                   info=(prio << 16) | socket.htons(ETH_P_ALL))
    return time.monotonic()


def remove_root_qdisc(ns: str | None, ifname: str, kind: str) -> float:
    """Remove the device's root qdisc if it is still of `kind` (never someone else's)."""
    with translated(f"remove {kind} from {ifname} in {ns}", gone_ok=True), route(ns) as ipr:
        index = link_index(ipr, ifname)
        if any(q.get_attr("TCA_KIND") == kind and q["parent"] == TC_H_ROOT
               for q in ipr.get_qdiscs(index=index)):
            ipr.tc("del", index=index, parent=TC_H_ROOT)
    return time.monotonic()


def namespace_inodes(names: Sequence[str]) -> set[int]:
    """The nsfs inodes of named namespaces (a process's /proc/PID/ns/net has the same)."""
    inodes = set()
    for name in names:
        with contextlib.suppress(FileNotFoundError):
            inodes.add(os.stat(namespace_path(name)).st_ino)
    return inodes
