"""The local backend: ranks as plain processes of an ordinary user on loopback.

The real runs are made as uid 65534 (nobody) through the installed `chaos` command, as a
user without sudo would: the built-in workload killed and paused, `chaos doctor`, and a
harness SIGKILLed mid-fault whose leftovers that user's `chaos heal` takes back. What the
backend cannot do (link faults, host sysctls) is refused when the scenario loads.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from chaos.api import Host
from chaos.errors import UnsupportedFault
from chaos.faults import LinkDown
from chaos.inject import LinkStateDown, NetlinkInjector
from chaos.ledger import Ledger
from harness.cluster.backends import BACKEND_NAMES, backend_class
from harness.scenario.schema import json_schema
from tests.conftest import CHAOS, NOBODY, REPO, as_nobody, chaos_cli, processes_of

pytestmark = pytest.mark.system  # real ranks of the local backend: not in ./dev.sh check

KILL = REPO / "scenarios" / "kill_rank.yaml"
PAUSE = REPO / "scenarios" / "pause_rank.yaml"


def test_the_registry_is_the_one_list_of_backend_names():
    assert BACKEND_NAMES[0] == "netns" and "local" in BACKEND_NAMES
    assert json_schema()["$defs"]["ClusterConfig"]["properties"]["backend"]["enum"] == list(BACKEND_NAMES)
    for command in (("run", "--help"), ("nightly", "--help")):
        assert "{" + ",".join(BACKEND_NAMES) + "}" in chaos_cli(*command).stdout
    for name in BACKEND_NAMES:
        assert backend_class(name).name == name


def test_a_link_fault_on_the_local_backend_is_refused_at_load_naming_the_backends_that_can(tmp_path):
    done = chaos_cli("run", "scenarios/link_down.yaml", "--backend", "local", "--dry-run")
    assert done.returncode == 2
    line = done.stderr.strip()
    assert line.startswith("chaos: error: scenarios/link_down.yaml:12: faults.0.kind: link_down acts on a rank's link")
    assert "--backend netns or docker" in line and len(line.splitlines()) == 1
    sysctls = tmp_path / "s.yaml"
    sysctls.write_text(KILL.read_text().replace("cluster: {ranks: 16}",
                       "cluster: {ranks: 16, backend: local, sysctls: {net.ipv4.tcp_retries2: 5}}"))
    done = chaos_cli("run", str(sysctls), "--dry-run")
    assert done.returncode == 2 and "cluster.sysctls: the local backend's ranks share" in done.stderr


def test_the_injector_refuses_a_link_fault_on_hosts_without_a_link(tmp_path):
    host = Host(name="r000", address="127.0.0.1", switch_ns=None, port=None, ns_path=None, ifname="lo")
    injector = NetlinkInjector(Ledger("nolink", tmp_path), {"link_down": LinkStateDown()}, hosts=[host])
    with pytest.raises(UnsupportedFault, match="no network of their own"):
        injector.apply(LinkDown(), [host])
    assert not Ledger("nolink", tmp_path).entries()  # refused before anything was recorded


@pytest.mark.requires_root  # to become another user; the runs themselves have no privilege
def test_an_ordinary_user_runs_a_kill_on_the_local_backend_and_doctor_says_so(user_dir):
    assert not processes_of(NOBODY, user_dir)
    done = as_nobody(user_dir, "run", str(KILL), "--backend", "local", "--policy", "timeout",
                     "--out", str(user_dir / "runs"), timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "| timeout | kill on r5 |" in done.stdout and "| consistent |" in done.stdout, done.stdout
    assert "| met |" in done.stdout, done.stdout
    [run_dir] = (user_dir / "runs").iterdir()
    assert json.loads((run_dir / "trials" / "timeout" / "trial.json").read_text())["backend"] == "local"
    doctor = as_nobody(user_dir, "doctor", timeout=120)
    assert doctor.returncode == 0, doctor.stderr
    assert "  local   yes:" in doctor.stdout and "  docker  no   (needs root)" in doctor.stdout
    assert "  kill       signal to the rank's process" in doctor.stdout
    assert not list((user_dir / "state").glob("*.jsonl")), "a ledger was left"
    assert not processes_of(NOBODY, user_dir)


# frameworks_kill.yaml's ft_launcher trial alone (the file's torchft trials need the netns
# backend's UTS namespaces)
FT_LAUNCHER_KILL = f"""\
name: ft_launcher_local
cluster: {{ranks: 4}}
job:
  command: [python, train_ft_launcher.py, --step-period, "0.25", --checkpoint, "{{trial_dir}}/checkpoint.pt"]
  workdir: {REPO / "examples"}
  launcher: ft_launcher
  max_restarts: 3
  ft_launcher: {{initial_rank_heartbeat_timeout: 60s, rank_heartbeat_timeout: 5s, workload_check_interval: 1s,
                relaunch: 1s}}
  start_timeout: 120s
warmup_steps: 8
faults:
  - {{kind: kill, target: {{rank: 2}}, start: {{'on': step, nth: 4, rank: 2, delay: 0.1s}}}}
hang_cap: 30s
settle_steps: 8
expect:
  job: {{outcome: recovered, detect_within: 1s, recover_within: 20s, state: consistent}}
"""


@pytest.mark.requires_root  # to become another user; the run itself has no privilege
def test_an_ordinary_user_runs_ft_launcher_under_a_kill_on_the_local_backend(user_dir):
    scenario = user_dir / "ft_launcher_local.yaml"
    scenario.write_text(FT_LAUNCHER_KILL)
    temporary = user_dir / "tmp"  # the user's TMPDIR: each host's own folder is made in it
    temporary.mkdir()
    os.chown(temporary, NOBODY, NOBODY)
    done = as_nobody(user_dir, "run", str(scenario), "--backend", "local", "--out", str(user_dir / "runs"),
                     env={**os.environ, "TMPDIR": str(temporary)}, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "| job | kill on r2 |" in done.stdout and "all ranks step again" in done.stdout, done.stdout
    assert "| consistent |" in done.stdout and "| met |" in done.stdout, done.stdout
    assert not list((user_dir / "state").glob("*.jsonl")), "a ledger was left"
    assert not processes_of(NOBODY, user_dir)
    # the killed agent's IPC sockets (_ft_launcher<pid>*.socket) went with its host's folder
    # (torch's compile cache, torchinductor_<user>, is the harness's own: kept, as torch keeps it)
    assert not [*temporary.glob("_ft_launcher*"), *temporary.glob("chaos-*")]


@pytest.mark.requires_root
def test_a_harness_killed_while_a_rank_is_paused_leaves_nothing_after_that_users_heal(user_dir):
    run = as_nobody(user_dir, "run", str(PAUSE), "--backend", "local", "--policy", "timeout",
                    "--out", str(user_dir / "runs"), background=True)
    try:
        deadline = time.monotonic() + 120
        while not any('"fault_applied"' in p.read_text() for p in (user_dir / "runs").rglob("events.jsonl")):
            assert run.poll() is None and time.monotonic() < deadline, run.stderr.read() if run.stderr else ""
            time.sleep(0.2)
        stopped = [p for p in processes_of(NOBODY, user_dir) if Path(f"/proc/{p.split()[0]}/stat").read_text()
                   .rsplit(")", 1)[1].split()[0] == "T"]
        assert stopped, "the pause fault stopped no process"
    finally:
        os.killpg(run.pid, signal.SIGKILL)  # the harness and whatever is in its session
        run.wait()
    assert list((user_dir / "state").glob("*.jsonl")), "the killed harness left no ledger to heal from"
    healed = as_nobody(user_dir, "heal", timeout=60)
    assert healed.returncode == 0, healed.stderr
    deadline = time.monotonic() + 10
    while processes_of(NOBODY, user_dir) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not processes_of(NOBODY, user_dir)
    assert not list((user_dir / "state").glob("*.jsonl"))


def test_pytest_with_backend_local_skips_a_link_fault_scenario_saying_why():
    done = subprocess.run([str(Path(CHAOS).parent / "python"), "-m", "pytest", "-p", "no:cacheprovider", "-q", "-rs",
                           "scenarios/link_down.yaml", "--backend", "local"],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout[-2000:]
    assert "4 skipped" in done.stdout
    assert "--backend local: " in done.stdout and "link_down.yaml:12: faults.0.kind: link_down acts on" in done.stdout
