"""Markers for privileged tests: each skips, saying why, where the capability is missing.
CI runs as root with a Docker engine, so there they run."""
from __future__ import annotations

import json
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


def leftovers(folder: Path) -> list[str]:
    """What the runs recorded under `folder` left on this host: namespaces named after
    their run ids, their ledgers, and rank processes still alive."""
    from chaos.ledger import state_dir
    found = []
    namespaces = chaos_namespaces()
    for trial in folder.rglob("trial.json"):
        run_id = json.loads(trial.read_text())["run_id"]
        found += sorted(n for n in namespaces if n.startswith(f"chaos-{run_id}-"))
        if (state_dir() / f"{run_id}.jsonl").exists():
            found.append(f"ledger {run_id}")
        events = trial.parent / "events.jsonl"
        for line in events.read_text().splitlines() if events.exists() else []:
            event = json.loads(line)
            if event["kind"] == "rank_spawned" and Path(f"/proc/{event['pid']}").exists():
                found.append(f"rank {event['rank']} pid {event['pid']}")
    return found


@pytest.fixture
def leaves_nothing(tmp_path):
    """Asserts that the runs a test made under tmp_path left nothing on the host."""
    yield
    assert leftovers(tmp_path) == []


def chaos_cli(*args: str, **kwargs) -> subprocess.CompletedProcess:
    """Run the `chaos` command as a user would."""
    return subprocess.run([sys.executable, "-m", "harness.cli", *args], cwd=REPO,
                          capture_output=True, text=True, **kwargs)
