"""The control plane's start, for every backend: the rendezvous store and the failure
detector (`harness.job.control`), forked by the rank launcher where every host reaches it
(a switch namespace, or the machine's own loopback for the local backend)."""
from __future__ import annotations

from pathlib import Path

from chaos.ledger import Ledger
from harness.cluster.launcher import Launcher, wait_for_text
from harness.job.control import LISTENING
from runfolder.heartbeats import HEARTBEAT_GAPS_FILE

CONTROL_READY_TIMEOUT_S = 20.0
CONTROL = "control"  # the launcher's name for it, unless it is a host's process


def start_control(launcher: Launcher, ledger: Ledger, ns_path: str | None, run_dir: Path, port: int,
                  host: str = "0.0.0.0", name: str = CONTROL) -> None:
    """The control plane in the network namespace at `ns_path` (None: the launcher's own),
    listening on `host`:`port`; returns once it listens. Named after a host (ClusterSpec.
    store_host) it is that host's process: the cluster's pid and reap of the host are its."""
    log = run_dir / "logs" / "control.log"
    launcher.spawn(ledger, name, "control", ns_path, str(log),
                   {"port": port, "host": host, "gaps": str(run_dir / HEARTBEAT_GAPS_FILE)})
    wait_for_text(log, LISTENING, CONTROL_READY_TIMEOUT_S)
