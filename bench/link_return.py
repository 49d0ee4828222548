"""After a link comes back, how long until a host's traffic gets through again, per ARP
retransmission time of the host, side by side (needs root).

    sudo .venv/bin/python bench/link_return.py [--retrans 1 0.1] [--repeat 10] [--down 3] [--seed 1]

Two hosts on a switch (`chaos.topology`); r000 sends r001 a datagram every 5 ms; r000's
link goes down (the link_down fault, switch-side port) for `--down` seconds plus a share of
3 s drawn with `--seed` (the same draws for every row), and comes back.
While it is down the kernel drops r000's neighbour entries (carrier lost) and its next
packets make a new one, which cycles INCOMPLETE (3 probes, one per retransmission time) / FAILED because its probes cannot leave;
when the link is back the packets queued on the entry leave only at its next probe, up to
one retransmission time later (net.ipv4.neigh.eth0.retrans_time_ms, 1 s by default), and
where in that cycle the return falls depends on how long the link was down: hence the
drawn share. This is what held a rank's rejoin request 0.29-0.42 s after a heal (docs/scale-journal.md).

Prints, per retransmission time: the first datagram through after the link's return
(median, max over the repetitions) and the bound the setting gives.
"""
from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import threading
import time

from chaos import sysctl
from chaos.api import Host
from chaos.calibrate import scratch_cluster, udp_stream
from chaos.errors import ChaosError
from chaos.faults import LinkDown
from chaos.inject import NetlinkInjector
from chaos.ledger import Ledger

SETTING = "net.ipv4.neigh.eth0.retrans_time_ms"
INTERVAL_S = 0.005
AFTER_S = 1.5  # sending goes on this long after the return: more than the kernel's 1 s
CYCLE_S = 3.0  # an unresolved entry's cycle with the kernel's defaults: 3 probes 1 s apart


def cut(injector: NetlinkInjector, host: Host, down_s: float, back: list[float]) -> None:
    """`host`'s link down for `down_s` after 0.2 s; appends when it is back."""
    time.sleep(0.2)
    injection = injector.apply(LinkDown(), [host])
    time.sleep(down_s)
    injection.revert()
    back.append(time.monotonic())


def first_through_after_return(retrans_s: float, downs: list[float]) -> list[float]:
    run_id = f"lr{os.getpid()}"
    ledger = Ledger(run_id)
    returns: list[float] = []
    with scratch_cluster(run_id, ledger, 2, {SETTING: str(round(retrans_s * 1000))}) as (a, b):
        assert sysctl.read(a.ns_path, [SETTING]) == {SETTING: str(round(retrans_s * 1000))}
        injector = NetlinkInjector(ledger)
        with udp_stream(a, b) as send:
            for down_s in downs:
                back: list[float] = []
                thread = threading.Thread(target=cut, args=(injector, a, down_s, back))
                thread.start()
                got = send(round((0.2 + down_s + AFTER_S) / INTERVAL_S), INTERVAL_S)
                thread.join()
                through = [t for t in got.received_at.values() if t >= back[0]]
                returns.append(min(through) - back[0] if through else float("inf"))
    return returns


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--retrans", type=float, nargs="+", default=[1.0, 0.1], metavar="S",
                        help=f"the host's {SETTING}, in seconds, one row each (default 1 0.1)")
    parser.add_argument("--repeat", type=int, default=10)
    parser.add_argument("--down", type=float, default=3.0,
                        help="seconds the link is down, before the drawn share of 3 s (default 3)")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    if os.geteuid() != 0:
        print("link_return: needs root (it builds namespaces); run it with sudo")
        return 2
    if args.repeat < 1 or args.down <= 0 or any(r <= 0 for r in args.retrans):
        parser.error("--repeat, --down and --retrans take positive numbers")
    print("| ARP retransmit | first packet through after the link's return: median | max | bound |")
    print("|---|---|---|---|")
    rng = random.Random(args.seed)
    downs = [args.down + rng.uniform(0, CYCLE_S) for _ in range(args.repeat)]
    for retrans in args.retrans:
        try:
            times = first_through_after_return(retrans, downs)
        except ChaosError as exc:
            print(f"| {retrans:g} s | failed: {exc} | | |")
            continue
        lost = sum(t == float("inf") for t in times)
        shown = [t for t in times if t != float("inf")]
        if not shown:
            print(f"| {retrans:g} s | nothing through within {AFTER_S:g} s, {lost} of {len(times)} times | | |")
            continue
        print(f"| {retrans:g} s | {statistics.median(shown):.3f} s | {max(shown):.3f} s"
              + (f" ({lost} of {len(times)}: nothing within {AFTER_S:g} s)" if lost else "")
              + f" | {retrans:g} s |")
    print(f"\n{args.repeat} returns per row, after {min(downs):.2f}-{max(downs):.2f} s down; r000 sends every "
          f"{INTERVAL_S * 1000:g} ms, so a time is late by up to that much")
    return 0


if __name__ == "__main__":
    sys.exit(main())
