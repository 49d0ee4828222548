"""The netem path for real, on kernels that have sch_netem (GPU nodes; not this VM): the
qdisc the kernel holds, decoded back, and the loss and delay it makes."""
from __future__ import annotations

import statistics

import pytest

from chaos import netlink, probe
from chaos.calibrate import udp_stream
from chaos.faults import parse_fault
from chaos.inject import NetlinkInjector, choose_mechanisms

pytestmark = [pytest.mark.requires_root, pytest.mark.requires_netem]


@pytest.fixture
def injector(cluster):
    mechanisms = choose_mechanisms(probe.capabilities())
    assert mechanisms["loss"].name.startswith("netem")
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
