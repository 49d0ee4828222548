"""What a night records of the machine it ran on (reports.nightly.NightInfo's fields)."""
from __future__ import annotations

import platform
import socket
import subprocess
from typing import Any, Callable

from harness.studies.nightly.plan import REPO
from harness.trial import machine

PROBE_TIMEOUT_S = 10.0  # for each metadata command (git, nvidia-smi)


def _output(command: list[str]) -> str:
    """The command's first line of output; "" where it is missing or fails."""
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=PROBE_TIMEOUT_S, cwd=REPO)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return done.stdout.strip().splitlines()[0] if done.returncode == 0 and done.stdout.strip() else ""


def gather_metadata(backend: str) -> Callable[[str, str], dict[str, Any]]:
    """reports.nightly.NightInfo's fields for a night on this machine ("" where unknown),
    with its speed measured before the night's first trial (harness.trial.machine)."""
    def gather(night: str, started: str) -> dict[str, Any]:
        import torch

        from reports.nightly.history import MACHINE_FIELDS

        commit = _output(["git", "rev-parse", "HEAD"])
        if commit and _output(["git", "status", "--porcelain", "--untracked-files=no"]):
            commit += "-dirty"
        gpu, _, driver = _output(["nvidia-smi", "--query-gpu=name,driver_version",
                                  "--format=csv,noheader"]).partition(", ")
        nccl = ".".join(map(str, torch.cuda.nccl.version())) if torch.cuda.is_available() else ""
        speed = machine.measure_or_why()  # a night goes on without it
        return {"night": night, "started": started, "commit": commit, "host": socket.gethostname(),
                "kernel": platform.release(), "torch": torch.__version__, "cuda": torch.version.cuda or "",
                "gpu": gpu, "driver": driver, "nccl": nccl, "backend": backend,
                **({} if isinstance(speed, str) else {name: getattr(speed, name) for name in MACHINE_FIELDS})}
    return gather
