"""The control plane: the rendezvous store, hosted by the harness on the switch.

It runs in the switch namespace (reachable from every host over its link), so rank 0 is
not special and a fault on a rank's link also cuts that rank off from the store. Keys:

    generation     the current process-group generation; a rank that saw its group fail
                   bumps it with compare_set(old, old + 1) and every rank joins the value
                   it reads, under PrefixStore("gen<N>/").
    gen<N>/members the members of generation N (original rank ids, a JSON list), agreed
                   by compare_set from "": the first proposal wins.
    rejoin/<rank>, rejoin/requests
                   a rank left out asks to be let back in (harness.job.group); the counter
                   counts the requests.

Beside the store, on the next port, the failure detector's heartbeat server
(harness.job.detector): UDP heartbeats in, one digest of every rank's liveness out to all,
with the rejoin request counter, so that the members hear of a rank asking back within a
digest (they step at once, and group rank 0 admits it in that step).
"""
from __future__ import annotations

import signal
import sys
import threading
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

if TYPE_CHECKING:
    from harness.job.detector import HeartbeatServer

GENERATION_KEY = "generation"
REJOIN_REQUESTS_KEY = "rejoin/requests"
LISTENING = "control plane listening"
STALL_LOGGED = "control plane: not running for"  # in the control plane's log, per stall
DEAF_LOGGED = "control plane: heard no rank for"  # per time every rank went silent at once
GAPS_LAST_WRITE_S = 2.0  # on SIGTERM, the heartbeat gaps' last write gets this long


def heartbeat_port(store_port: int) -> int:
    """The failure detector's port (UDP heartbeats, TCP leases): the one after the store's."""
    return store_port + 1


def heartbeat_server(port: int, store: Any, host: str = "0.0.0.0",
                     on_gap: Callable[[int, float], None] | None = None) -> HeartbeatServer:
    """The failure detector's server, telling in its digests the store's rejoin counter."""
    from harness.job.detector import HeartbeatServer

    return HeartbeatServer(port, host, rejoin_requests=lambda: store.add(REJOIN_REQUESTS_KEY, 0),
                           on_stall=_log_stall, on_gap=on_gap, on_deaf=_log_deaf)


def _log_stall(secs: float) -> None:
    sys.stderr.write(f"{STALL_LOGGED} {secs:.2f}s; heartbeat silence over it not counted\n")
    sys.stderr.flush()


def _log_deaf(secs: float) -> None:
    sys.stderr.write(f"{DEAF_LOGGED} {secs:.2f}s (this host cut off); heartbeat silence over it not counted\n")
    sys.stderr.flush()


def main(config: dict[str, Any]) -> int:
    import torch.distributed as dist

    from harness.job.detector import not_ahead, run_ahead
    from harness.signals import Terminated

    # before the store's and the detector's threads start: they inherit it
    if warning := not_ahead("control plane", run_ahead()):
        print(warning, file=sys.stderr, flush=True)
    host = config.get("host", "0.0.0.0")  # bench/control_plane.py: loopback only
    store = dist.TCPStore(host, config["port"], is_master=True, wait_for_workers=False,
                          timeout=timedelta(seconds=30))
    store.set(GENERATION_KEY, "0")
    gaps, stopped = None, threading.Event()
    if config.get("gaps"):  # where the trial keeps its heartbeat gaps (runfolder.heartbeats)
        from harness.job.gaps import GapRecorder, keep_writing

        gaps = GapRecorder()
        writer = keep_writing(gaps, Path(config["gaps"]), stopped)
    heartbeat_server(heartbeat_port(config["port"]), store, host, gaps.gap if gaps else None).start()
    print(f"{LISTENING} on port {config['port']}", flush=True)
    try:
        while True:
            signal.pause()
    except Terminated:
        if gaps is not None:
            stopped.set()
            writer.join(GAPS_LAST_WRITE_S)
        return 0
