"""The netem path for real, on kernels that have sch_netem: the qdisc the kernel holds,
decoded back, what loss, delay and jitter do to traffic, and `chaos calibrate` measuring
the kinds only netem injects (duplicate, corrupt, reorder) against their targets. Loss and
delay are measured by the first test here; `chaos calibrate --kind loss --kind delay` adds
a burst loss over 23,500 datagrams, a delay both ways and a jitter's spread, which CI's
one-CPU kernel would spend most of this file's time on
(bench/results/calibrate-netem-uml-2026-12-06.txt has them).

The build VM's kernel has no sch_netem: CI runs this file inside a User-Mode Linux kernel
that has it (tests/chaos/test_netem_uml.py). There the kernel is one process of the host's
with one CPU and syscalls several times slower than the host's; each datagram is stamped by
the receiving kernel on arrival, so the delays measured are the qdisc's, and the targets
are the product's own.

CHAOS_TEST_NETEM_BREAK=latency_us makes this file's injector send the delay in
microseconds where netem reads nanoseconds, a slip the kernel accepts: the delay test must
then fail (test_netem_uml.py shows it does)."""
from __future__ import annotations

import os
import statistics
import struct

import pytest

from chaos import netem, netlink, probe
from chaos.calibrate import udp_stream
from chaos.faults import parse_fault
from chaos.inject import NetlinkInjector, choose_mechanisms
from tests.conftest import chaos_cli

pytestmark = [pytest.mark.requires_root, pytest.mark.requires_netem]
NETEM_ONLY = ("duplicate", "corrupt", "reorder")


def _latency_in_microseconds(encode):
    def broken(fault) -> bytes:
        encoded = encode(fault)
        qopt, attrs = encoded[:netem._QOPT.size], netlink.parse_attrs(encoded[netem._QOPT.size:])
        return qopt + b"".join(
            netlink.nla(kind, struct.pack("=q", struct.unpack("=q", value)[0] // 1000)
                        if kind == netem.TCA_NETEM_LATENCY64 else value) for kind, value in attrs)
    return broken


@pytest.fixture
def injector(cluster, monkeypatch):
    mechanisms = choose_mechanisms(probe.capabilities())
    assert mechanisms["loss"].name.startswith("netem")
    if os.environ.get("CHAOS_TEST_NETEM_BREAK") == "latency_us":
        monkeypatch.setattr(netem, "options", _latency_in_microseconds(netem.options))
    return NetlinkInjector(cluster.ledger, mechanisms, hosts=cluster.hosts)


def root_qdisc(ns, ifname):
    with netlink.route(ns) as ipr:
        index = netlink.link_index(ipr, ifname)
        return next(q for q in ipr.get_qdiscs(index=index) if q["parent"] == netlink.TC_H_ROOT)


def test_netem_loss_and_delay_for_real(cluster, injector):
    a, b = cluster.hosts[:2]
    loss = injector.apply(parse_fault({"kind": "loss", "percent": "20%", "direction": "from_host"}), [a])
    qdisc = root_qdisc(a.ns_path, a.ifname)
    assert qdisc.get_attr("TCA_KIND") == "netem"
    assert qdisc.get_attr("TCA_OPTIONS")["loss"] == round(0.2 * 0xFFFFFFFF)
    with udp_stream(a, b) as send:
        lost = 1 - len(send(5000, 0.0002).received_at) / 5000
    assert lost == pytest.approx(0.2, abs=0.02)
    loss.revert()
    delay = injector.apply(parse_fault({"kind": "delay", "latency": "20ms", "direction": "from_host"}), [a])
    with udp_stream(a, b) as send:
        assert statistics.median(send(200, 0.002).delays()) == pytest.approx(0.020, abs=0.001)
    delay.revert()
    assert root_qdisc(a.ns_path, a.ifname).get_attr("TCA_KIND") != "netem"


def test_delay_with_jitter_keeps_the_packets_in_order(cluster, injector):
    """A delay's packets never overtake each other (chaos.faults.Delay), though each draws
    its own jitter: here a datagram every 0.5 ms, each held 10 ms +/- 5 ms."""
    a, b = cluster.hosts[:2]
    fault = {"kind": "delay", "latency": "10ms", "jitter": "5ms", "distribution": "normal",
             "direction": "from_host"}
    delay = injector.apply(parse_fault(fault), [a])
    with udp_stream(a, b) as send:
        got = send(1000, 0.0005)
    delay.revert()
    assert len(got.received_at) == 1000
    assert got.overtaking() == 0


@pytest.mark.parametrize("spec", [
    {"kind": "loss", "percent": "5%", "burst": 3},
    {"kind": "delay", "latency": "10ms", "jitter": "2ms", "distribution": "paretonormal"},
    {"kind": "duplicate", "percent": "1%"}, {"kind": "corrupt", "percent": "1%"},
    {"kind": "reorder", "percent": "10%", "latency": "5ms"},
])
def test_every_netem_encoding_is_accepted_by_the_kernel(cluster, injector, spec):
    injection = injector.apply(parse_fault(spec), cluster.hosts[:1])
    assert root_qdisc(cluster.hosts[0].switch_ns, cluster.hosts[0].port).get_attr("TCA_KIND") == "netem"
    injection.revert()


def test_calibrate_measures_the_netem_only_kinds_on_target(state_dir):
    kinds = [arg for kind in NETEM_ONLY for arg in ("--kind", kind)]
    done = chaos_cli("calibrate", *kinds, env={**os.environ, "CHAOS_STATE_DIR": str(state_dir)}, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    figures = [lines[i:i + 3] for i in range(0, len(lines), 3)]  # verdict and fault, figures, mechanism
    assert [f[0].split("(")[0] for f in figures] == [f"ok   {kind}" for kind in NETEM_ONLY], done.stdout
    assert all(f[2].strip().startswith("via netem qdisc") for f in figures), done.stdout
