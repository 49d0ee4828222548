"""Network faults without root: an ordinary user's `chaos run` on the netns backend becomes
root of a user namespace of its own (chaos.userns) and builds the switch and hosts there.

The real runs are made as uid 65534 through the installed `chaos` command: the shipped
link-down scenario with its report, a FUSE storage fault, `chaos doctor` saying what that user gets (namespaces
and tc yes, BPF no), and a harness SIGKILLed while the link is down whose leftovers that
user's `chaos heal` takes back. The refusal where user namespaces are off is checked on
the settings' files.
"""
from __future__ import annotations

import csv
import json
import os
import signal
import time
from pathlib import Path

import pytest

from chaos import userns
from chaos.calibrate import NETWORK
from chaos.storage import mounts_below
from tests.conftest import NOBODY, REPO, as_nobody, processes_of

SCENARIOS = REPO / "scenarios"
LINK_DOWN = SCENARIOS / "link_down.yaml"

pytestmark = pytest.mark.requires_root  # to become uid 65534; the runs themselves have no privilege


def _left(state: Path) -> list[str]:
    """What the user's state folder still holds but the probe's cache: ledgers, pins."""
    return sorted(str(p.relative_to(state)) for p in state.rglob("*") if p.name != "capabilities.json")


def test_an_ordinary_user_runs_the_link_down_scenario_in_a_user_namespace(user_dir):
    assert userns.why_not() is None, "this machine refuses user namespaces: the test cannot run here"
    done = as_nobody(user_dir, "run", str(LINK_DOWN), "--policy", "timeout", "--out", str(user_dir / "runs"),
                     timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "| timeout | link_down on r5 |" in done.stdout and "| met |" in done.stdout, done.stdout
    [run_dir] = (user_dir / "runs").iterdir()
    events = (run_dir / "trials" / "timeout" / "events.jsonl").read_text()
    applied = [json.loads(line) for line in events.splitlines() if '"fault_applied"' in line]
    assert applied and applied[0]["mechanism"] == "link state down (switch-side port)"
    assert not _left(user_dir / "state")
    assert not processes_of(NOBODY, user_dir)
    doctor = as_nobody(user_dir, "doctor", timeout=120)
    assert doctor.returncode == 0, doctor.stderr
    assert "backends (as uid 65534 as root of a user namespace of its own):" in doctor.stdout
    assert "  netns   yes:" in doctor.stdout and "  netns             yes" in doctor.stdout
    assert "  clsact_bpf        no " in doctor.stdout  # BPF needs the initial namespace's privilege
    assert not _left(user_dir / "state")


def test_a_harness_killed_while_the_link_is_down_leaves_nothing_after_that_users_heal(user_dir):
    run = as_nobody(user_dir, "run", str(LINK_DOWN), "--policy", "timeout", "--out", str(user_dir / "runs"),
                    background=True)
    try:
        deadline = time.monotonic() + 120
        while not any('"fault_applied"' in p.read_text() for p in (user_dir / "runs").rglob("events.jsonl")):
            assert run.poll() is None and time.monotonic() < deadline, run.stderr.read() if run.stderr else ""
            time.sleep(0.2)
    finally:
        os.killpg(run.pid, signal.SIGKILL)
        run.wait()
    state = user_dir / "state"
    assert any(p.name.startswith("netns-") for p in state.iterdir()), "no namespace pins to heal"
    healed = as_nobody(user_dir, "heal", timeout=60)
    assert healed.returncode == 0, healed.stderr
    assert "netns {'name': 'chaos-" in healed.stdout
    deadline = time.monotonic() + 10
    while processes_of(NOBODY, user_dir) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not processes_of(NOBODY, user_dir)
    assert not _left(state)


def test_refused_user_namespaces_are_named_with_the_setting_and_the_fix(tmp_path, monkeypatch):
    off = tmp_path / "max_user_namespaces"
    off.write_text("0\n")
    monkeypatch.setattr(userns, "_REFUSALS", ((str(off), "0", "sysctl -w user.max_user_namespaces=15000"),))
    assert userns.why_not() == (f"{off} is 0: user namespaces are refused to ordinary users; "
                                "sysctl -w user.max_user_namespaces=15000")
    off.write_text("15000\n")
    assert userns.why_not() is None


def test_calibrate_as_an_ordinary_user_measures_each_fallback_against_its_setting(user_dir):
    # the network kinds; `slow` needs no privilege and is left to the full calibration
    # (docs/storage-faults.md): its 8 s say nothing about the user
    kinds = [arg for kind in NETWORK.kinds for arg in ("--kind", kind)]
    done = as_nobody(user_dir, "calibrate", *kinds, timeout=240)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    figures = done.stdout.split("\nok   ")
    loss = next(f for f in figures if "percent=0.2," in f)
    assert "via nftables drop at the switch port" in loss  # no BPF in a user namespace
    assert "not measured: correlated or bursty loss needs the BPF drop program" in done.stdout
    assert "MISS" not in done.stdout
    assert "via NFQUEUE delay line" in done.stdout and "via tbf qdisc" in done.stdout
    assert not _left(user_dir / "state")


def test_calibrate_as_an_ordinary_user_says_why_a_storage_kind_is_not_measured(user_dir):
    # /dev/fuse as most machines without udev have it, mode 600, whatever this one's is: a
    # root-owned file of that mode bound over it in a mount namespace of the command's own
    closed = user_dir / "fuse-600"
    closed.touch(mode=0o600)
    done = as_nobody(user_dir, "calibrate", "--kind", "lose_unsynced", timeout=60,
                     prefix=["unshare", "--mount", "--propagation", "private", "sh", "-c",
                             'mount --bind "$0" /dev/fuse && exec "$@"', str(closed)])
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert done.stdout.startswith("n/a  lose_unsynced(") and (
        "not measured: the storage kinds need the FUSE passthrough (root, or /dev/fuse open to the user): "
        "/dev/fuse (mode 600) is not open to this user") in done.stdout, done.stdout
    assert not _left(user_dir / "state")  # its user namespace's pin folder, where it built no namespace


def test_pytest_as_an_ordinary_user_skips_netns_scenarios_with_the_ways_that_run_them(user_dir):
    done = as_nobody(user_dir, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-rs", "scenarios/kill_rank.yaml",
                     "--basetemp", str(user_dir / "pytest"), python=True, timeout=120)
    assert done.returncode == 0, done.stdout[-2000:]
    assert "3 skipped" in done.stdout
    assert "the netns backend needs root in a test session" in done.stdout and "--backend local" in done.stdout


@pytest.mark.requires_fuse_user
def test_an_ordinary_user_s_fuse_fault_fails_the_save_and_the_retry_recovers(user_dir):
    """The FUSE passthrough mounted by root of the run's user namespace, no privilege outside."""
    done = as_nobody(user_dir, "run", str(SCENARIOS / "io_error.yaml"), "--policy", "retry",
                     "--out", str(user_dir / "runs"), timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    [metrics] = (user_dir / "runs").glob("*/metrics.csv")
    [row] = csv.DictReader(metrics.open())
    assert row["expect_ok"] == "True", row["expect_failures"]
    assert "EIO on r0's save" in row["storage"], row["storage"]
    assert not _left(user_dir / "state")
    assert not processes_of(NOBODY, user_dir)  # the FUSE daemon included
    assert not mounts_below(str(user_dir))
