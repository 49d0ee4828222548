"""sch_netem options, encoded by hand: what pyroute2's netem plugin leaves out.

pyroute2 encodes a subset of netem: no Gilbert-Elliott loss model, no delay distribution
table, no 64-bit latency/jitter, and a default queue limit of 1000 packets that silently
drops at high bandwidth x delay. `options(fault)` builds the whole TCA_OPTIONS payload
(struct tc_netem_qopt followed by attributes, netem's own layout) for `chaos.tc` to send.
Not encoded: a PRNG seed (TCA_NETEM_PRNG_SEED) -- the fallbacks cannot seed their random
source, so a seed would make the two paths differ. netem's rate is not a bandwidth here
(that is tbf on every kernel): a delay with jitter sets one so high that it adds no
transmission time, because with a rate netem sends no packet before the one ahead of it,
and without one each packet leaves at its own draw and overtakes (834 of 1,000 datagrams
0.5 ms apart under 10 ms +/- 5 ms, Linux 6.1). The NFQUEUE delay line keeps order too.

Distribution tables are computed here (inverse CDFs, 4096 entries scaled by 8192 as
netem expects) and shared with the NFQUEUE delayer, so jitter has one shape everywhere.
"""
from __future__ import annotations

import functools
import math
import random
import statistics
import struct

from chaos import netlink
from chaos.bpf import DropChain
from chaos.faults import Corrupt, Delay, Duplicate, FaultBase, Loss, Reorder

DIST_SCALE = 8192  # NETEM_DIST_SCALE: table values are standard deviations x 8192
DIST_SIZE = 4096
DISTRIBUTIONS = ("uniform", "normal", "pareto", "paretonormal")

TCA_NETEM_CORR, TCA_NETEM_DELAY_DIST, TCA_NETEM_REORDER = 1, 2, 3
TCA_NETEM_CORRUPT, TCA_NETEM_LOSS, TCA_NETEM_RATE64 = 4, 5, 8
TCA_NETEM_LATENCY64, TCA_NETEM_JITTER64 = 10, 11
NETEM_LOSS_GE = 2
_QOPT = struct.Struct("=IIIIII")  # latency, limit, loss, gap, duplicate, jitter
# Enough packets for 10 Gbit/s of 1500-byte packets across the configured delay, twice over.
_LIMIT_PPS = 10e9 / 8 / 1500 * 2
MIN_LIMIT = 1000
ORDER_KEEPING_RATE = 0xFFFFFFFFFFFFFFFF  # bytes/s: a 64 KiB packet's transmission time rounds to 0 ns


def probability(fraction: float) -> int:
    """netem's u32 probability: 0 -> never, 0xffffffff -> always."""
    return min(int(round(fraction * 0xFFFFFFFF)), 0xFFFFFFFF)


def _ticks(seconds: float) -> int:
    """The legacy 32-bit psched ticks (ns >> 6); the 64-bit attributes carry the exact value."""
    return min(int(seconds * 1e9) >> 6, 0xFFFFFFFF)


def _standardized(values: list[float]) -> list[int]:
    """Zero mean, unit deviation, in s16 steps of 1/DIST_SCALE. A heavy tail is clipped at
    4 deviations by the s16 range; the rest is widened until the deviation is 1 again."""
    table = [float(v) for v in values]
    for _ in range(8):
        mean, sd = statistics.fmean(table), statistics.pstdev(table)
        table = [max(-32767.0, min(32767.0, (v - mean) / sd * DIST_SCALE)) for v in table]
    return [round(v) for v in table]


@functools.cache
def distribution_table(name: str) -> tuple[int, ...]:
    """The table of `name`: DIST_SIZE quantiles of a zero-mean, unit-deviation shape."""
    quantiles = [(i + 0.5) / DIST_SIZE for i in range(DIST_SIZE)]
    normal = [statistics.NormalDist().inv_cdf(q) for q in quantiles]
    pareto = [(1 - q) ** (-1 / 3) for q in quantiles]  # shape 3: a heavy right tail
    if name == "normal":
        return tuple(_standardized(normal))
    if name == "pareto":
        return tuple(_standardized(pareto))
    if name == "paretonormal":  # iproute2's mix: a quarter normal, three quarters pareto
        shuffled = pareto[:]
        random.Random(0).shuffle(shuffled)
        mixed = sorted(0.25 * n + 0.75 * p for n, p in zip(normal, shuffled, strict=True))
        return tuple(_standardized([mixed[int(q * len(mixed))] for q in quantiles]))
    raise ValueError(f"no table for distribution {name!r}; expected one of {DISTRIBUTIONS}")


def options(fault: FaultBase) -> bytes:
    """TCA_OPTIONS of a netem qdisc that injects `fault` (loss, delay, duplicate, corrupt, reorder)."""
    latency = jitter = 0.0
    loss = gap = duplicate = 0
    delay_corr = dup_corr = 0
    attrs: list[bytes] = []
    if isinstance(fault, Loss):
        chain = DropChain.from_loss(fault.percent, fault.correlation, fault.burst)
        if chain.independent:
            loss = probability(fault.percent)
        else:  # Gilbert: drop in bad, never in good (h = 0, 1-k = 0)
            ge = struct.pack("=IIII", probability(chain.enter), probability(chain.leave), 0, 0)
            attrs.append(netlink.nested(TCA_NETEM_LOSS, netlink.nla(NETEM_LOSS_GE, ge)))
    elif isinstance(fault, Delay):
        latency, jitter = fault.latency, fault.jitter
        delay_corr = probability(fault.correlation)
        if fault.distribution != "uniform":
            table = distribution_table(fault.distribution)
            attrs.append(netlink.nla(TCA_NETEM_DELAY_DIST, struct.pack(f"={len(table)}h", *table)))
    elif isinstance(fault, Duplicate):
        duplicate, dup_corr = probability(fault.percent), probability(fault.correlation)
    elif isinstance(fault, Corrupt):
        attrs.append(netlink.nla(TCA_NETEM_CORRUPT, struct.pack("=II", probability(fault.percent),
                                                           probability(fault.correlation))))
    elif isinstance(fault, Reorder):
        latency, gap = fault.latency, 1  # gap 1: any packet may go ahead (iproute2's default)
        attrs.append(netlink.nla(TCA_NETEM_REORDER, struct.pack("=II", probability(fault.percent),
                                                           probability(fault.correlation))))
    else:
        raise TypeError(f"netem does not inject {fault.kind}")  # type: ignore[attr-defined]
    limit = max(MIN_LIMIT, math.ceil(_LIMIT_PPS * (latency + jitter)))
    qopt = _QOPT.pack(_ticks(latency), limit, loss, gap, duplicate, _ticks(jitter))
    attrs.insert(0, netlink.nla(TCA_NETEM_CORR, struct.pack("=III", delay_corr, 0, dup_corr)))
    if latency:
        attrs.append(netlink.nla(TCA_NETEM_LATENCY64, struct.pack("=q", int(round(latency * 1e9)))))
    if jitter:
        attrs.append(netlink.nla(TCA_NETEM_JITTER64, struct.pack("=q", int(round(jitter * 1e9)))))
        attrs.append(netlink.nla(TCA_NETEM_RATE64, struct.pack("=Q", ORDER_KEEPING_RATE)))
    return qopt + b"".join(attrs)
