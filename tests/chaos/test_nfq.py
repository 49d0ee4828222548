"""The NFQUEUE delay line's logic: queue messages parsed, deadlines counted from the
kernel's stamp, timeouts aimed early by how late they wake (the delay itself is measured
for real in test_mechanisms.py)."""
from __future__ import annotations

import struct

import pytest

from chaos import netlink
from chaos.nfq import (NFNL_SUBSYS_QUEUE, NFQA_PACKET_HDR, NFQA_TIMESTAMP, NFQNL_MSG_PACKET,
                       WakeLateness, _packets, queued_at)


def packet_message(packet_id: int, stamp: tuple[int, int] | None) -> bytes:
    attrs = [netlink.nla(NFQA_PACKET_HDR, struct.pack("!IHB", packet_id, 0x0800, 3))]
    if stamp is not None:
        attrs.append(netlink.nla(NFQA_TIMESTAMP, struct.pack("!QQ", *stamp)))
    body = struct.pack("=BBH", 2, 0, 0) + b"".join(attrs)
    return netlink.nlmsg((NFNL_SUBSYS_QUEUE << 8) | NFQNL_MSG_PACKET, 0, body)


def test_packets_carry_their_id_and_the_kernels_stamp_where_it_gave_one():
    buf = packet_message(7, (1_700_000_000, 250_000)) + packet_message(8, None)
    assert _packets(buf) == [(7, 1_700_000_000.25), (8, None)]


def test_a_deadline_counts_from_a_plausible_stamp_and_otherwise_from_now():
    wall_minus_monotonic = 1_000.0
    assert queued_at(1_004.9995, 5.0, wall_minus_monotonic) == pytest.approx(4.9995)
    assert queued_at(None, 5.0, wall_minus_monotonic) == 5.0
    assert queued_at(4.9995, 5.0, wall_minus_monotonic) == 5.0  # a monotonic stamp: not wall time
    assert queued_at(1_006.0, 5.0, wall_minus_monotonic) == 5.0  # from the future


def test_wake_lateness_is_the_median_of_the_recent_window_between_zero_and_its_ceiling():
    lateness = WakeLateness(window=3, ceiling=0.005)
    for late in (0.001, 0.010, 0.002):
        lateness.add(late)
    assert lateness.median == 0.002
    for late in (-0.001, -0.002, -0.003):
        lateness.add(late)
    assert lateness.median == 0.0
    for late in (0.030, 0.040, 0.050):  # a throttled machine: aim no further ahead than the ceiling
        lateness.add(late)
    assert lateness.median == 0.005
