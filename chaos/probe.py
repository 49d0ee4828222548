"""Capability probe: what this kernel and machine can do, found once and quickly.

The probe builds a scratch namespace (``chaos-probe<pid>-x``, written first to a ledger of
its own, run ``probe<pid>`` with this process as owner, so a plain `chaos heal` removes it
if the probe is killed and leaves it alone while the probe lives) with a veth pair and tries each mechanism for real: a netem, tbf and
blackhole qdisc, a clsact + cls_bpf program, an nftables table per family, the NFQUEUE
target with a physdev match, and binding an NFQUEUE listener. It then checks bridge
netfilter, a Docker engine and a GPU. `chaos doctor` prints the result and, per fault
kind, the mechanism it will use or why the kind is refused.
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import glob
import json
import os
import socket
import time
from dataclasses import dataclass, field
from typing import Callable, Iterator

from chaos import bpf, netem, netlink, nfq, nft, tc, topology
from chaos.errors import ChaosError
from chaos.faults import Loss
from chaos.ledger import Ledger, make_state_dir, state_dir
from chaos.undo import UNDOS, record_owner, undo_outstanding

DOCKER_SOCKET = "/var/run/docker.sock"
CHECKS = ("netns", "netem", "tbf", "blackhole", "clsact_bpf", "nft_bridge", "nfqueue_delay",
          "bridge_netfilter", "docker", "gpu")


@dataclass(frozen=True)
class Capabilities:
    """Per check, whether it works; `reasons` says why a failed check failed."""

    netns: bool = False  # a network namespace with a veth pair could be made (root, a full kernel)
    netem: bool = False
    tbf: bool = False
    blackhole: bool = False
    clsact_bpf: bool = False
    nft_families: tuple[str, ...] = ()
    nft_bridge: bool = False
    nfqueue_delay: bool = False
    bridge_netfilter: bool = False
    docker: bool = False
    gpu: bool = False
    reasons: dict[str, str] = field(default_factory=dict)
    seconds: float = 0.0

    def why_not(self, check: str) -> str:
        return self.reasons.get(check, f"{check} is not available")


@contextlib.contextmanager
def _scratch_namespace() -> Iterator[tuple[str, str]]:
    """A namespace with an up veth pair; yields (namespace, device)."""
    run_id = f"probe{os.getpid()}"
    name = topology.namespace_name(run_id, "x")
    try:
        ledger = Ledger(run_id)
        record_owner(ledger)
    except OSError as exc:  # the state directory is root's
        raise ChaosError(f"cannot write the probe's ledger: {exc}") from exc
    try:
        topology.make_namespace(ledger, name)
        with netlink.translated("probe veth"), netlink.route(name) as ipr:
            ipr.link("add", ifname="pa", kind="veth", peer={"ifname": "pb"})
            for dev in ("pa", "pb"):
                ipr.link("set", index=netlink.link_index(ipr, dev), state="up")
        yield name, "pa"
    finally:
        undo_outstanding(ledger, UNDOS)
        ledger.close_if_clean()


def _try(reasons: dict[str, str], check: str, what: str, action: Callable[[], object]) -> bool:
    try:
        action()
    except (ChaosError, OSError) as exc:
        reasons[check] = f"{what} failed: {exc}"
        return False
    return True


def _root_qdisc(ns: str, dev: str, kind: str, options: bytes) -> None:
    netlink.send_acked(ns, netlink.NETLINK_ROUTE, [tc.qdisc_message(netlink.ifindex(ns, dev), kind, options)],
                       f"add a {kind} qdisc")
    netlink.remove_root_qdisc(ns, dev, kind)


def _clsact_bpf(ns: str, dev: str) -> None:
    fd = bpf.load_drop_program(bpf.DropChain.from_loss(0.0), "chaos_probe")
    try:
        netlink.add_clsact(ns, dev)
        netlink.add_bpf_filter(ns, dev, "ingress", 1, fd, "chaos_probe")
        netlink.remove_filter(ns, dev, "ingress", 1)
        netlink.remove_clsact_if_unused(ns, dev)
    finally:
        os.close(fd)


def _nft_table(ns: str, family: int, chains: list[nft.Chain]) -> None:
    nft.add_table(ns, "chaos_probe", chains, family)
    nft.remove_table(ns, "chaos_probe", family)


def _nfqueue_listener(ns: str) -> None:
    sock = netlink.namespace_socket(ns, netlink.NETLINK_NETFILTER)
    try:
        nfq.bind_queue(sock, 1)
    finally:
        sock.close()


def _docker_engine() -> None:
    with socket.socket(socket.AF_UNIX) as sock:
        sock.settimeout(1.0)
        sock.connect(DOCKER_SOCKET)
        sock.sendall(b"GET /_ping HTTP/1.0\r\n\r\n")
        if b"OK" not in sock.recv(4096):
            raise OSError(f"{DOCKER_SOCKET} did not answer a ping")


def _probe_kernel(ns: str, dev: str, found: dict[str, object], reasons: dict[str, str]) -> None:
    """The kernel checks, in the scratch namespace `ns` on veth `dev`."""
    found["netem"] = _try(reasons, "netem", "adding a netem qdisc",
                          lambda: _root_qdisc(ns, dev, "netem", netem.options(Loss(percent="1%"))))
    found["tbf"] = _try(reasons, "tbf", "adding a tbf qdisc",
                        lambda: _root_qdisc(ns, dev, "tbf", tc.tbf_options(10e6, None)))
    found["blackhole"] = _try(reasons, "blackhole", "adding a blackhole qdisc",
                              lambda: _root_qdisc(ns, dev, "blackhole", b""))
    found["clsact_bpf"] = _try(reasons, "clsact_bpf", "attaching a cls_bpf program to clsact",
                               lambda: _clsact_bpf(ns, dev))
    families = tuple(name for name, number in nft.FAMILIES.items()
                     if _try(reasons, f"nft_{name}", f"an nftables {name} table",
                             lambda number=number: _nft_table(ns, number, [])))
    found["nft_families"] = families
    found["nft_bridge"] = "bridge" in families
    if not found["nft_bridge"]:
        reasons["nft_bridge"] = reasons.get("nft_bridge", "no nftables bridge family")
    found["bridge_netfilter"] = os.path.exists(nfq.BRIDGE_NF_CALL_IPTABLES)
    if not found["bridge_netfilter"]:
        reasons["bridge_netfilter"] = f"{nfq.BRIDGE_NF_CALL_IPTABLES} is missing (no br_netfilter)"
    queue_rule = [nft.Chain("forward", nft.IP_FORWARD, 0,
                            (tuple(nft.physdev_is(dev, False) + nft.nfqueue(1)),))]
    found["nfqueue_delay"] = (
        found["bridge_netfilter"]
        and _try(reasons, "nfqueue_delay", "an ip rule with physdev match and NFQUEUE target",
                 lambda: _nft_table(ns, nft.NFPROTO_IPV4, queue_rule))
        and _try(reasons, "nfqueue_delay", "binding an NFQUEUE listener",
                 lambda: _nfqueue_listener(ns)))
    if not found["bridge_netfilter"]:
        reasons["nfqueue_delay"] = reasons["bridge_netfilter"]


def probe() -> Capabilities:
    """Run every check once (needs root)."""
    start = time.monotonic()
    reasons: dict[str, str] = {}
    found: dict[str, object] = {}
    try:
        with _scratch_namespace() as (ns, dev):
            found["netns"] = True
            _probe_kernel(ns, dev, found, reasons)
    except ChaosError as exc:  # not root, or no namespaces (gVisor): every kernel mechanism is out
        reasons["netns"] = f"making a network namespace with a veth pair failed: {exc}"
        for check in ("netem", "tbf", "blackhole", "clsact_bpf", "nft_bridge", "nfqueue_delay"):
            reasons[check] = f"cannot probe the kernel: {exc}"
    found["docker"] = _try(reasons, "docker", f"pinging the Docker engine at {DOCKER_SOCKET}", _docker_engine)
    found["gpu"] = bool(glob.glob("/dev/nvidia[0-9]*"))
    if not found["gpu"]:
        reasons["gpu"] = "no /dev/nvidia<N> device"
    return Capabilities(**found, reasons=reasons, seconds=time.monotonic() - start)  # type: ignore[arg-type]


LAST_PROBE_FILE = "capabilities.json"  # in the state directory (a tmpfs: gone at reboot)


def _this_kernel() -> dict[str, str]:
    with open("/proc/sys/kernel/random/boot_id") as f:
        return {"boot_id": f.read().strip(), "kernel": os.uname().release}


@functools.cache
def capabilities() -> Capabilities:
    """The probe's result, computed once per process and kept for `last_probe`."""
    caps = probe()
    with contextlib.suppress(OSError):  # a dry run then probes again: slower, never wrong
        path = make_state_dir() / LAST_PROBE_FILE
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps({**_this_kernel(), "capabilities": dataclasses.asdict(caps)}))
        tmp.replace(path)
    return caps


def last_probe() -> Capabilities | None:
    """What the last probe on this boot and kernel found, without probing (a dry run touches
    nothing and answers at once); None when there was none. Runs and `chaos doctor` always
    probe afresh, so a module loaded since is seen there."""
    try:
        stored = json.loads((state_dir() / LAST_PROBE_FILE).read_text())
        if {k: stored[k] for k in ("boot_id", "kernel")} != _this_kernel():
            return None
        found = stored["capabilities"]
        return Capabilities(**{**found, "nft_families": tuple(found["nft_families"])})
    except (OSError, ValueError, KeyError, TypeError):
        return None
