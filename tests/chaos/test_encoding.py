"""The netlink messages built by hand, decoded back to golden attributes (no kernel needed:
the netem path cannot run here; it runs for real under requires_netem)."""
from __future__ import annotations

import random
import statistics
import struct

import pytest

from chaos import bpf, netem, netlink, nft, tc
from chaos.calibrate import loss_sample_size
from chaos.faults import parse_fault

QOPT = struct.Struct("=IIIIII")


def decode_netem(options: bytes) -> tuple[dict[str, int], dict[int, bytes]]:
    latency, limit, loss, gap, duplicate, jitter = QOPT.unpack_from(options)
    qopt = dict(latency=latency, limit=limit, loss=loss, gap=gap, duplicate=duplicate, jitter=jitter)
    return qopt, dict(netlink.parse_attrs(options[QOPT.size:]))


def test_netem_independent_loss_goes_in_the_struct():
    qopt, attrs = decode_netem(netem.options(parse_fault({"kind": "loss", "percent": "20%"})))
    assert qopt["loss"] == round(0.2 * 0xFFFFFFFF) and netem.TCA_NETEM_LOSS not in attrs
    assert qopt["limit"] >= netem.MIN_LIMIT


def test_netem_burst_loss_is_a_gilbert_elliott_model():
    qopt, attrs = decode_netem(netem.options(parse_fault({"kind": "loss", "percent": "10%", "burst": 4})))
    assert qopt["loss"] == 0
    (model, payload), = netlink.parse_attrs(attrs[netem.TCA_NETEM_LOSS])
    p, r, h, k1 = struct.unpack("=IIII", payload)
    assert model == netem.NETEM_LOSS_GE and (h, k1) == (0, 0)
    assert r == round(0.25 * 0xFFFFFFFF)  # mean burst 4 packets
    assert p / (p + r) == pytest.approx(0.10, abs=1e-6)  # mean loss


def test_netem_delay_uses_64_bit_times_a_table_and_a_queue_for_the_delay():
    fault = parse_fault({"kind": "delay", "latency": "5s", "jitter": "1s", "distribution": "pareto",
                         "correlation": "30%"})
    qopt, attrs = decode_netem(netem.options(fault))
    assert struct.unpack("=q", attrs[netem.TCA_NETEM_LATENCY64]) == (5_000_000_000,)
    assert struct.unpack("=q", attrs[netem.TCA_NETEM_JITTER64]) == (1_000_000_000,)
    assert struct.unpack("=Q", attrs[netem.TCA_NETEM_RATE64]) == (netem.ORDER_KEEPING_RATE,)  # in order
    assert netem.TCA_NETEM_RATE64 not in decode_netem(netem.options(parse_fault({"kind": "delay", "latency": "5s"})))[1]
    table = struct.unpack(f"={len(attrs[netem.TCA_NETEM_DELAY_DIST]) // 2}h", attrs[netem.TCA_NETEM_DELAY_DIST])
    assert table == netem.distribution_table("pareto") and len(table) == netem.DIST_SIZE
    assert struct.unpack("=III", attrs[netem.TCA_NETEM_CORR])[0] == round(0.3 * 0xFFFFFFFF)
    assert qopt["limit"] > 1000 * 100  # pyroute2's 1000 would drop at 10 Gbit/s x 5 s


@pytest.mark.parametrize("name", ["normal", "pareto", "paretonormal"])
def test_distribution_tables_are_standardized(name):
    table = [v / netem.DIST_SCALE for v in netem.distribution_table(name)]
    assert sum(table) / len(table) == pytest.approx(0, abs=0.05)
    assert (sum(v * v for v in table) / len(table)) ** 0.5 == pytest.approx(1, abs=0.1)


def test_netem_duplicate_corrupt_reorder():
    qopt, attrs = decode_netem(netem.options(parse_fault({"kind": "duplicate", "percent": "1%"})))
    assert qopt["duplicate"] == round(0.01 * 0xFFFFFFFF)
    _, attrs = decode_netem(netem.options(parse_fault({"kind": "corrupt", "percent": "2%", "correlation": "5%"})))
    assert struct.unpack("=II", attrs[netem.TCA_NETEM_CORRUPT]) == (round(0.02 * 0xFFFFFFFF), round(0.05 * 0xFFFFFFFF))
    qopt, attrs = decode_netem(netem.options(parse_fault({"kind": "reorder", "percent": "25%", "latency": "10ms"})))
    assert qopt["gap"] == 1 and struct.unpack("=II", attrs[netem.TCA_NETEM_REORDER])[0] == round(0.25 * 0xFFFFFFFF)
    assert struct.unpack("=q", attrs[netem.TCA_NETEM_LATENCY64]) == (10_000_000,)


def test_qdisc_message_is_an_exclusive_root_qdisc():
    (msg_type, flags, _, body), = netlink.parse_messages(tc.qdisc_message(7, "netem", b"xyz"))
    assert msg_type == tc.RTM_NEWQDISC and flags & netlink.NLM_F_EXCL and flags & netlink.NLM_F_CREATE
    family, ifindex, handle, parent, _ = struct.unpack_from("=BxxxiIII", body)
    assert (ifindex, parent) == (7, netlink.TC_H_ROOT)
    attrs = dict(netlink.parse_attrs(body[20:]))
    assert attrs[tc.TCA_KIND] == b"netem\0" and attrs[tc.TCA_OPTIONS] == b"xyz"


def test_tbf_carries_64_bit_rates_and_the_burst_in_bytes():
    attrs = dict(netlink.parse_attrs(tc.tbf_options(100e9, 1 << 20)))
    assert struct.unpack("=Q", attrs[tc.TCA_TBF_RATE64]) == (12_500_000_000,)
    assert struct.unpack("=I", attrs[tc.TCA_TBF_BURST]) == (1 << 20,)
    assert struct.unpack_from("=I", attrs[tc.TCA_TBF_PARMS], 8) == (0xFFFFFFFF,)  # 32-bit field saturated
    assert tc.TCA_TBF_RATE64 not in dict(netlink.parse_attrs(tc.tbf_options(10e6, None)))


def test_drop_chains_match_the_loss_they_are_built_for():
    assert bpf.DropChain.from_loss(0.2).independent
    correlated = bpf.DropChain.from_loss(0.2, correlation=0.5)
    assert correlated.loss == pytest.approx(0.2) and not correlated.independent
    bursty = bpf.DropChain.from_loss(0.05, mean_burst=3)
    assert bursty.loss == pytest.approx(0.05) and 1 / bursty.leave == pytest.approx(3)
    assert len(bpf.independent_program(1.0)) == 16  # drop everything: two instructions
    assert len(bpf.chain_program(bursty, map_fd=3)) == 20 * 8


def test_partition_rule_matches_both_ports_and_drops():
    batch = nft.table_batch("t", [nft.Chain("forward", nft.BRIDGE_FORWARD, 0,
                                            (tuple(nft.port_is("p1", False) + nft.port_is("p2", True) + nft.drop()),))])
    messages = [netlink.parse_messages(m)[0] for m in batch]
    assert [m[0] & 0xFF for m in messages] == [nft.NFNL_MSG_BATCH_BEGIN, nft.NFT_MSG_NEWTABLE,
                                              3, nft.NFT_MSG_NEWRULE, nft.NFNL_MSG_BATCH_END]
    rule = dict(netlink.parse_attrs(messages[3][3][4:]))
    exprs = [dict(netlink.parse_attrs(e))[1].rstrip(b"\0") for _, e in netlink.parse_attrs(rule[4])]
    assert exprs == [b"meta", b"cmp", b"meta", b"cmp", b"immediate"]


@pytest.mark.parametrize("spec", [{"percent": "20%"}, {"percent": "5%", "burst": 3},
                                  {"percent": "10%", "correlation": "50%"}])
def test_calibration_measures_each_loss_as_precisely_as_5000_independent_datagrams(spec):
    """`chaos calibrate` sizes its sample by the drop chain's correlation; simulated here,
    the sample's loss spreads like that of 5,000 independent datagrams."""
    fault = parse_fault({"kind": "loss", **spec})
    chain = bpf.DropChain.from_loss(fault.percent, fault.correlation, fault.burst)
    count, rng = loss_sample_size(fault), random.Random(7)
    losses = []
    for _ in range(100):
        bad, lost = rng.random() < chain.loss, 0
        for _ in range(count):
            bad = rng.random() >= chain.leave if bad else rng.random() < chain.enter
            lost += bad
        losses.append(lost / count)
    independent = (fault.percent * (1 - fault.percent) / 5000) ** 0.5
    assert 0.75 * independent <= statistics.pstdev(losses) <= 1.25 * independent


def test_a_drop_on_a_hosts_own_egress_is_a_packet_lost_on_the_wire():
    """At the egress of a host's own interface (a Slurm node's agent), SHOT would tell the
    sender's TCP the drop was its own (no backoff: it gives up in ~7.7 s); STOLEN reads as
    sent and lost. The verdict is the program's last but one instruction."""
    import struct
    for program in (bpf.independent_program(1.0, bpf.TC_ACT_STOLEN), bpf.independent_program(0.3, bpf.TC_ACT_STOLEN),
                    bpf.chain_program(bpf.DropChain.from_loss(0.2, mean_burst=4), map_fd=3, drop=bpf.TC_ACT_STOLEN)):
        assert struct.unpack("<i", program[-12:-8])[0] == bpf.TC_ACT_STOLEN
    assert struct.unpack("<i", bpf.independent_program(1.0)[-12:-8])[0] == bpf.TC_ACT_SHOT
