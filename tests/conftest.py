"""Markers for privileged tests: each skips, saying why, where the capability is missing.
CI runs as root with a Docker engine, so there they run."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def _has_cuda() -> bool:
    import torch
    return torch.cuda.is_available()


def _has_netem() -> bool:
    # The kernel offers a qdisc kind if tc can add it to a scratch namespace's loopback.
    ns = f"chaos-netemprobe{os.getpid()}"
    try:
        subprocess.run(["ip", "netns", "add", ns], check=True, capture_output=True)
        added = subprocess.run(["ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", "lo",
                                "root", "netem", "delay", "1ms"], capture_output=True)
        return added.returncode == 0
    except (OSError, subprocess.CalledProcessError):
        return False
    finally:
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)


_CHECKS = {
    "requires_root": (lambda: os.geteuid() == 0, "needs root (network namespaces, netlink)"),
    "requires_gpu": (_has_cuda, "needs a CUDA device; none is visible to torch"),
    "requires_netem": (lambda: os.geteuid() == 0 and _has_netem(),
                       "needs the sch_netem qdisc, which this kernel does not have"),
}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    verdicts: dict[str, bool] = {}
    for item in items:
        for marker, (check, reason) in _CHECKS.items():
            if item.get_closest_marker(marker):
                if marker not in verdicts:
                    verdicts[marker] = check()
                if not verdicts[marker]:
                    item.add_marker(pytest.mark.skip(reason=reason))


def chaos_namespaces() -> set[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return {line.split()[0] for line in out.splitlines() if line.startswith("chaos-")}


def harness_processes() -> set[int]:
    """Rank launchers and their children still alive (by command line)."""
    pids = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmd = (entry / "cmdline").read_bytes()
            except OSError:
                continue
            if b"harness.zygote" in cmd:
                pids.add(int(entry.name))
    return pids


@pytest.fixture
def leaves_nothing():
    """Asserts the test left no namespace and no rank launcher behind that were not there."""
    namespaces, processes = chaos_namespaces(), harness_processes()
    yield
    assert chaos_namespaces() - namespaces == set(), "namespaces left behind"
    assert harness_processes() - processes == set(), "rank launcher processes left behind"


def chaos_cli(*args: str, **kwargs) -> subprocess.CompletedProcess:
    """Run the `chaos` command as a user would."""
    return subprocess.run([sys.executable, "-m", "harness.cli", *args], cwd=REPO,
                          capture_output=True, text=True, **kwargs)
