"""What a node lets the agent do, as the agent would run there: `chaos doctor --backend
slurm` runs this on every node with srun (one task per node) and prints one JSON line per
node. Kept light (no torch): it answers in well under a second.

    link_down, blackhole, loss
                         CAP_NET_ADMIN (root has it) and CAP_BPF or CAP_SYS_ADMIN, for the BPF
                         drop program on the node's interface
    slurmd_kill          root: slurmd runs as root
    kill, pause          nothing: the agent's own children
"""
from __future__ import annotations

import json
import os
import socket
import sys

CAP_NET_ADMIN, CAP_SYS_ADMIN, CAP_BPF = 12, 21, 39
BPF_KINDS = ("link_down", "blackhole", "loss")


def effective_caps() -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("CapEff:"):
                return int(line.split()[1], 16)
    return 0


def allowed(caps: int, euid: int) -> dict[str, str]:
    """Per fault kind: "yes", or why not."""
    net_admin = bool(caps >> CAP_NET_ADMIN & 1)
    bpf = bool(caps >> CAP_BPF & 1 or caps >> CAP_SYS_ADMIN & 1)
    no_net = "the agent lacks CAP_NET_ADMIN on this node (run the job as root, or grant the capability)"
    verdict = {"kill": "yes", "pause": "yes"}
    verdict.update(dict.fromkeys(BPF_KINDS, "yes" if net_admin and bpf else
                                 no_net if not net_admin else "the agent lacks CAP_BPF (or CAP_SYS_ADMIN)"))
    verdict["slurmd_kill"] = "yes" if euid == 0 else f"the agent runs as uid {euid}; slurmd runs as root"
    return verdict


def main() -> None:
    node = os.environ.get("SLURMD_NODENAME") or socket.gethostname()
    print(json.dumps({"node": node, "uid": os.geteuid(), "kinds": allowed(effective_caps(), os.geteuid())}),
          flush=True)


if __name__ == "__main__":
    main()
    sys.exit(0)
