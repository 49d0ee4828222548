"""The slurm backend against a real local cluster (tests/slurm/conftest.py): the installed
`chaos` run as a user runs it, `--backend slurm`; ranks on the nodes of an sbatch
allocation, started by node agents that srun started; faults through the agents.
The 16-node runs of the shipped scenarios are the nights' (nightly/slurm.yaml)."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from tests.conftest import CHAOS, NOBODY, REPO, as_nobody, chaos_cli, leftovers
from tests.run.test_local_backend import FT_LAUNCHER_KILL  # the same trial, on the local backend there

pytestmark = pytest.mark.system  # a Slurm cluster: its daemons: not in ./dev.sh check


def _scenario(folder: Path, name: str, body: str) -> Path:
    path = folder / f"{name}.yaml"
    path.write_text(f"name: {name}\nseed: 1\nworkload: {{step_period: 250ms, checkpoint_every: 10}}\n"
                    f"warmup_steps: 8\nsettle_steps: 6\n{body}")
    return path


def _events(run_dir: Path, policy: str) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "trials" / policy / "events.jsonl").read_text().splitlines()]


def _run_dir(stdout: str) -> Path:
    return Path(next(line.split(":", 1)[1].strip() for line in stdout.splitlines() if line.startswith("run folder:")))


def _run_slurm(path: Path, env: dict[str, str], out: Path) -> Path:
    """`chaos run PATH --backend slurm` as a user runs it; its run folder (it met its expectations)."""
    done = chaos_cli("run", str(path), "--backend", "slurm", "--out", str(out), env=env, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    return _run_dir(done.stdout)


def _nothing_left(env: dict[str, str], run_dir: Path | None = None) -> None:
    jobs = subprocess.run(["squeue", "-h", "-o", "%i %j"], env=env, capture_output=True, text=True).stdout
    assert jobs.strip() == "", f"jobs left in squeue: {jobs}"
    agents = subprocess.run(["pgrep", "-f", "harness.cluster.slurm.agent"], capture_output=True, text=True).stdout
    assert agents.strip() == "", f"node agents left: {agents}"
    if run_dir is not None:
        from chaos.ledger import state_dir
        ids = [json.loads(t.read_text())["run_id"] for t in run_dir.rglob("trial.json")]
        assert [p.name for p in state_dir().glob("*.jsonl") if p.name.split(".")[0] in ids] == []


def test_kill_and_link_down_meet_their_expectations(slurm_env, tmp_path):
    """A kill (one node's rank) and a 10 s link down of one node, 4 nodes x 1 rank: the
    timeout policy fails fast at its timeout, retry comes back after the link does."""
    kill = _scenario(tmp_path, "kill_rank", """cluster: {ranks: 4}
faults:
  - {kind: kill, target: {rank: 2}, start: 1s}
hang_cap: 15s
policies:
  timeout: {timeout: 5s}
expect:
  timeout: {outcome: failed-fast, detect_within: 2s}
""")
    run_dir = _run_slurm(kill, slurm_env, tmp_path / "runs")
    events = _events(run_dir, "timeout")
    applied = next(e for e in events if e["kind"] == "fault_applied")
    assert "node03" in applied["mechanism"]  # rank 2 of 4 x 1 lives on the third node
    facts = [json.loads(p.read_text()) for p in sorted((run_dir / "trials" / "timeout" / "nodes").glob("*.json"))]
    assert [f["node"] for f in facts] == ["node01", "node02", "node03", "node04"]
    assert {f["clock_offset_s"] for f in facts} == {0.0}  # one kernel, one clock: no round trip's noise
    _nothing_left(slurm_env, run_dir)

    link = _scenario(tmp_path, "link_down", """cluster: {ranks: 4}
faults:
  - {kind: link_down, target: {rank: 1}, start: 1s, duration: 10s}
hang_cap: 30s
policies:
  retry: {timeout: 5s, rendezvous_timeout: 20s, max_retries: 6, backoff_base: 1s, backoff_cap: 8s}
expect:
  retry: {outcome: recovered, detect_within: 7s, recover_within: 30s}
""")
    run_dir = _run_slurm(link, slurm_env, tmp_path / "runs")
    events = _events(run_dir, "retry")
    applied = next(e for e in events if e["kind"] == "fault_applied")
    reverted = next(e for e in events if e["kind"] == "fault_reverted")
    # the node's agent brought its own link back at the end of the on-phase, not when the
    # harness's revert could reach it
    assert 9.5 <= reverted["t"] - applied["t"] <= 11.0, reverted["t"] - applied["t"]
    _nothing_left(slurm_env)


def test_ranks_share_a_node(slurm_env, tmp_path):
    """ranks_per_node: 4 ranks on 2 nodes; a pause of rank 3 stops only rank 3's processes."""
    path = _scenario(tmp_path, "pause_rank", """cluster: {ranks: 4, ranks_per_node: 2}
faults:
  - {kind: pause, target: {rank: 3}, start: 1s, duration: 8s}
hang_cap: 15s
policies:
  timeout: {timeout: 5s}
expect:
  timeout: {outcome: failed-fast, detect_within: 7s}
""")
    run_dir = _run_slurm(path, slurm_env, tmp_path / "runs")
    trial = run_dir / "trials" / "timeout"
    assert sorted(p.stem for p in (trial / "nodes").glob("*.json")) == ["node01", "node02"]
    applied = next(e for e in _events(trial.parent.parent, "timeout") if e["kind"] == "fault_applied")
    assert "node02" in applied["mechanism"]
    _nothing_left(slurm_env)


def test_bad_input_is_refused_before_anything_runs(slurm_env, tmp_path):
    uneven = _scenario(tmp_path, "uneven", "cluster: {ranks: 6, ranks_per_node: 4}\n"
                       "faults: [{kind: kill, target: {rank: 1}, start: 1s}]\npolicies: {timeout: {timeout: 5s}}\n")
    done = chaos_cli("run", str(uneven), "--backend", "slurm", "--dry-run", env=slurm_env)
    assert done.returncode == 2 and "6 ranks do not split into hosts of 4" in done.stderr, done.stderr
    delay = _scenario(tmp_path, "delay", "cluster: {ranks: 4}\n"
                      "faults: [{kind: delay, latency: 50ms, target: {rank: 1}, start: 1s}]\n"
                      "policies: {timeout: {timeout: 5s}}\n")
    done = chaos_cli("run", str(delay), "--backend", "slurm", "--dry-run", env=slurm_env)
    assert done.returncode == 2 and "its link faults are link_down, blackhole, loss" in done.stderr, done.stderr
    done = chaos_cli("run", str(uneven), "--dry-run", env=slurm_env)  # netns: a host per rank
    assert done.returncode == 2 and "ranks_per_node" in done.stderr, done.stderr
    nowhere = {**slurm_env, "SLURM_CONF": str(tmp_path / "no-such-slurm.conf")}
    kill = _scenario(tmp_path, "kill", "cluster: {ranks: 4}\n"
                     "faults: [{kind: kill, target: {rank: 1}, start: 1s}]\npolicies: {timeout: {timeout: 5s}}\n")
    done = chaos_cli("run", str(kill), "--backend", "slurm", "--out", str(tmp_path / "runs"), env=nowhere,
                     timeout=120)
    assert done.returncode == 2 and "no-such-slurm.conf: no such file" in done.stderr, done.stderr


def test_a_link_fault_an_ordinary_users_node_does_not_allow_is_refused_before_a_rank_starts(slurm_env, user_dir):
    """The job of an ordinary user: its node agents run as that user, without CAP_NET_ADMIN;
    each node's facts say so at bring-up, and the link fault is refused before any rank
    starts, naming the node and the reason (exit 2), with nothing left in squeue."""
    folder = user_dir
    path = _scenario(folder, "link", "cluster: {ranks: 4}\nhang_cap: 20s\n"
                     "faults: [{kind: link_down, target: {rank: 2}, start: 2s, duration: 2s}]\n"
                     "policies: {timeout: {timeout: 5s}}\n")
    done = as_nobody(folder, "run", str(path), "--backend", "slurm", "--out", str(folder / "runs"), env=slurm_env,
                     timeout=180)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "faults[0] (link_down(direction=both) on r2): node " in done.stderr and \
        "does not allow it: the agent lacks CAP_NET_ADMIN" in done.stderr, done.stderr
    assert "(no trial finished)" in done.stderr and "| timeout |" not in done.stdout
    [run_dir] = (folder / "runs").iterdir()
    assert not [e for e in _events(run_dir, "timeout") if e["kind"] == "rank_spawned"]
    _nothing_left(slurm_env)
    assert list((folder / "state").glob("*.jsonl")) == []


def test_an_ordinary_user_reaches_the_cluster_and_not_what_is_roots(slurm_env, user_dir):
    """The package's cluster was brought up in a state folder closed to others, under umask
    077 (conftest.py): uid 65534 still reads its slurm.conf and reaches munged (a task on
    every node, a batch job's script in the spool), and still cannot list the state folder,
    nor read the cluster's ledger, its munge key or slurmctld's state."""
    conf = Path(slurm_env["SLURM_CONF"])

    def as_user(*argv: str) -> subprocess.CompletedProcess:
        return subprocess.run(["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", *argv],
                              cwd=user_dir, env={**slurm_env, "HOME": str(user_dir)}, capture_output=True,
                              text=True, timeout=60)
    done = as_user("srun", "-N4", "id", "-u")
    assert done.stdout.split() == [str(NOBODY)] * 4, done.stdout + done.stderr
    done = as_user("sbatch", "--wait", "-N1", "-o", str(user_dir / "job.out"), "--wrap", "id -u")
    assert done.returncode == 0 and (user_dir / "job.out").read_text().split() == [str(NOBODY)], done.stderr
    for argv in (["ls", str(conf.parent.parent)], ["cat", str(conf.parent.with_suffix(".jsonl"))],
                 ["cat", str(conf.parent / "munge.key")], ["ls", str(conf.parent / "state")]):
        refused = as_user(*argv)
        assert refused.returncode != 0 and "Permission denied" in refused.stderr, (argv, refused.stdout)
    _nothing_left(slurm_env)


def test_a_slurm_conf_an_ordinary_user_cannot_read_is_said_as_such(user_dir):
    """A slurm.conf behind a folder closed to the user: the run stops before anything is
    submitted, naming the folder that stops it and the fix, not "no such file"."""
    closed = user_dir / "closed"
    closed.mkdir(mode=0o700)
    (closed / "slurm.conf").write_text("ClusterName=x\n")
    path = _scenario(user_dir, "kill", "cluster: {ranks: 4}\n"
                     "faults: [{kind: kill, target: {rank: 1}, start: 1s}]\npolicies: {timeout: {timeout: 5s}}\n")
    done = as_nobody(user_dir, "run", str(path), "--backend", "slurm", "--out", str(user_dir / "runs"),
                     env={**os.environ, "SLURM_CONF": str(closed / "slurm.conf")}, timeout=120)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert f"SLURM_CONF={closed}/slurm.conf: cannot be read by uid {NOBODY} (permission denied on {closed}: " \
           f"mode 0700, owner root; `chmod a+x {closed}` by its owner lets others through)" in done.stderr, done.stderr


def _agent_of(node: str) -> int:
    """The pid of `node`'s agent (on the local cluster every node's processes are this machine's)."""
    found = subprocess.run(["pgrep", "-f", "-x", ".*python.* -m harness.cluster.slurm.agent .*"],
                           capture_output=True, text=True).stdout.split()
    for pid in map(int, found):
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if f"SLURMD_NODENAME={node}".encode() in environ:
            return pid
    raise AssertionError(f"no agent of {node} among {found}")


def test_a_killed_harness_and_agent_are_healed_on_the_node(slurm_env, tmp_path, monkeypatch):
    """SIGKILL of `chaos run --backend slurm` mid-fault, and of the node agent that applied the
    fault before it could take it back, then `chaos heal`: the run's job is cancelled and a
    heal on the nodes (srun) takes back what the agent's ledger there names: no job in
    squeue, no agent, no filter on the node's interface, no ledger."""
    from chaos import netlink, topology
    from chaos.ledger import state_dir
    from harness.cluster.slurm.local import running
    [cluster] = running()  # found by its ledger in the default folder
    # a ledger folder of its own: a harness started meanwhile (another test) heals dead runs
    # as it starts, and would take this one's before the heal below
    monkeypatch.setenv("CHAOS_STATE_DIR", str(tmp_path / "state"))
    slurm_env = {**slurm_env, "CHAOS_STATE_DIR": str(tmp_path / "state")}
    path = _scenario(tmp_path, "held", """cluster: {ranks: 4}
faults:
  - {kind: loss, percent: 10%, target: {rank: 3}, start: 2s, duration: 60s}
hang_cap: 90s
policies:
  baseline: {}
""")
    runs = tmp_path / "runs"
    child = subprocess.Popen([CHAOS, "run", str(path), "--backend", "slurm", "--out", str(runs), "--quiet"],
                             cwd=REPO, env=slurm_env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while not any('"fault_applied"' in p.read_text() for p in runs.rglob("events.jsonl")):
        assert child.poll() is None and time.monotonic() < deadline, "the run never applied its fault"
        time.sleep(0.2)
    node = topology.host_at(cluster.id, 3)
    while not netlink.filter_prios(node.ns_path, node.ifname, "ingress"):  # on a moment after its answer
        assert time.monotonic() < deadline, "the agent never put its filter on"
        time.sleep(0.05)
    os.kill(child.pid, signal.SIGSTOP)  # it cannot see its agent go, nor close the others' input
    agent = _agent_of("node04")
    os.kill(agent, signal.SIGKILL)
    while Path(f"/proc/{agent}").exists() and "Z" not in Path(f"/proc/{agent}/stat").read_text().split(")")[-1][:3]:
        time.sleep(0.05)
    os.kill(child.pid, signal.SIGKILL)
    child.wait()
    [run_id] = {json.loads(t.read_text())["run_id"] for t in runs.rglob("trial.json")}
    ledger = state_dir() / f"{run_id}.node04.jsonl"
    assert ledger.exists() and netlink.filter_prios(node.ns_path, node.ifname, "ingress"), "nothing was left"
    healed = chaos_cli("heal", env=slurm_env, timeout=240)
    assert healed.returncode == 0, healed.stdout + healed.stderr
    assert "slurm_nodes" in healed.stdout and "slurm_job" in healed.stdout, healed.stdout
    _nothing_left(slurm_env, runs)
    assert not ledger.exists() and not netlink.filter_prios(node.ns_path, node.ifname, "ingress")


def test_a_submission_cut_off_is_waited_for_and_its_job_cancelled(slurm_env, tmp_path, monkeypatch):
    """A harness stopped while sbatch ran leaves a submission whose job may register a moment
    after a first look finds none: `chaos heal` waits for it and cancels it (a job holding
    its nodes for good otherwise). The late job is an sbatch started 1 s after the heal."""
    from chaos.ledger import Ledger
    from harness.cluster.slurm.cluster import job_name
    monkeypatch.setenv("CHAOS_STATE_DIR", str(tmp_path / "state"))
    name = job_name("cut0ff")
    ledger = Ledger("cut0ff")  # an owner that is gone: the heal takes the run's entries back
    ledger.mark(ledger.record("owner", pid=2 ** 22 + 1, started=1), "done")
    ledger.mark(ledger.record("slurm_submission", name=name, conf=slurm_env["SLURM_CONF"]), "done")
    late = subprocess.Popen(["sh", "-c", f"sleep 1; sbatch --job-name {name} --output /dev/null --wrap 'sleep 600'"],
                            env=slurm_env, stdout=subprocess.DEVNULL)
    healed = chaos_cli("heal", env={**slurm_env, "CHAOS_STATE_DIR": str(tmp_path / "state")}, timeout=60)
    late.wait()
    assert healed.returncode == 0 and "slurm_submission" in healed.stdout, healed.stdout + healed.stderr
    _nothing_left(slurm_env)


def test_preempt_with_requeue_starts_the_job_again(slurm_env, tmp_path):
    """Slurm's own fault: a preemption with requeue. Every task gets SIGTERM, Slurm requeues
    the job after KillWait, the harness starts the ranks again on the new allocation, and
    the built-in runner resumes from its checkpoint: the state verdict holds."""
    path = _scenario(tmp_path, "preempt", """cluster: {ranks: 4}
faults:
  - {kind: preempt, requeue: true, target: {rank: 0}, start: 2s}
hang_cap: 60s
policies:
  retry: {timeout: 5s, rendezvous_timeout: 20s, max_retries: 6, backoff_base: 1s, backoff_cap: 8s}
expect:
  retry: {state: consistent}
""")
    run_dir = _run_slurm(path, slurm_env, tmp_path / "runs")
    events = _events(run_dir, "retry")
    requeued = [e for e in events if e["kind"] == "job_requeued"]
    assert len(requeued) == 1 and requeued[0]["restarts"] == 1, requeued
    after = [e for e in events if e["kind"] == "step" and e["t"] > requeued[0]["t"]]
    assert {e["rank"] for e in after} == {0, 1, 2, 3}, "every rank stepped again after the requeue"
    saved = max(e["step"] for e in events if e["kind"] == "checkpoint" and e["t"] < requeued[0]["t"])
    restored = {e["step"] for e in events if e["kind"] == "restored" and e["t"] > requeued[0]["t"]}
    assert restored == {saved}, f"restored {restored}, the newest checkpoint before the requeue was step {saved}"
    assert any(e["kind"] == "trial_end" and e["reason"] == "settled" for e in events)
    _nothing_left(slurm_env)


def test_scheduler_faults_are_refused_without_a_scheduler(tmp_path):
    path = _scenario(tmp_path, "preempt", "cluster: {ranks: 4}\n"
                     "faults: [{kind: preempt, target: {rank: 0}, start: 1s}]\npolicies: {timeout: {timeout: 5s}}\n")
    done = chaos_cli("run", str(path), "--dry-run")
    assert done.returncode == 2 and "is a scheduler's fault" in done.stderr and "--backend slurm" in done.stderr, \
        done.stderr


def test_preempted_user_job_says_what_a_resume_would_redo(slurm_env, tmp_path):
    """examples/slurm/preempt.yaml as shipped: examples/train_ddp.py preempted for good. As
    written, SIGTERM ends every rank and the steps since its periodic checkpoint are lost,
    named; with --save-on-sigterm every rank stops at one step, rank 0 saves it: 0 lost."""
    run_dir = _run_slurm(REPO / "examples" / "slurm" / "preempt.yaml", slurm_env, tmp_path / "runs")
    report = (run_dir / "report.md").read_text()
    plain = next(line for line in report.splitlines() if line.startswith("| default | preempt"))
    assert "ranks ended by signal SIGTERM" in plain and "saved on the signal" not in plain, plain
    saved = next(line for line in report.splitlines() if line.startswith("| save_on_sigterm | preempt"))
    assert "saved on the signal: a resume redoes 0 steps" in saved, saved
    import csv
    rows = {r["policy"]: r for r in csv.DictReader((run_dir / "metrics.csv").open())}
    assert float(rows["default"]["steps_lost"]) > 0 and float(rows["save_on_sigterm"]["steps_lost"]) == 0, rows
    _nothing_left(slurm_env, run_dir)


def _slurmd_pids() -> dict[str, int]:
    from harness.cluster.slurm import slurmd
    return {node: pids[0] for node in ("node01", "node02") if (pids := slurmd.daemons(node))}


def test_slurmd_kill_spares_the_job_and_the_daemon_comes_back(slurm_env, tmp_path):
    """The node's daemon killed for 4 s (the test cluster's SlurmdTimeout is Slurm's 300 s):
    the job's step runs on without it, and the revert starts slurmd again, outside the
    job's step (the step's end would kill its descendants), answering the controller."""
    before = _slurmd_pids()
    path = _scenario(tmp_path, "slurmd_kill", """cluster: {ranks: 2}
faults:
  - {kind: slurmd_kill, target: {rank: 1}, start: 1s, duration: 4s}
hang_cap: 20s
policies:
  timeout: {timeout: 5s}
expect:
  timeout: {outcome: absorbed}
""")
    run_dir = _run_slurm(path, slurm_env, tmp_path / "runs")
    applied = next(e for e in _events(run_dir, "timeout") if e["kind"] == "fault_applied")
    assert f"SIGKILL to slurmd (pid {before['node02']})" in applied["mechanism"], applied
    after = _slurmd_pids()
    assert after["node01"] == before["node01"] and after["node02"] != before["node02"], (before, after)
    deadline = time.monotonic() + 20  # the new daemon registers with the controller
    while "node02 idle" not in subprocess.run(["sinfo", "-h", "-N", "-o", "%N %T"], env=slurm_env,
                                             capture_output=True, text=True).stdout:
        assert time.monotonic() < deadline, "node02 did not come back idle after its slurmd was started again"
        time.sleep(0.5)
    _nothing_left(slurm_env, run_dir)


def test_doctor_asks_each_node_what_its_agent_may_inject(slurm_env):
    done = chaos_cli("doctor", "--backend", "slurm", env=slurm_env, timeout=150)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = [line.split() for line in done.stdout.splitlines() if line.strip().startswith("node0")]
    assert [line[0] for line in lines] == ["node01", "node02", "node03", "node04"], done.stdout
    # the local cluster runs jobs as root: every kind on every node
    assert all(line[1:3] == ["uid", "0:"] and "slurmd_kill" in " ".join(line) for line in lines), done.stdout
    _nothing_left(slurm_env)


# NVIDIA's ft_launcher as its documentation runs it under Slurm (one agent per node), a
# node's agent killed and started again. Each node's agent gives the job a temporary folder
# of its own and removes it: the killed ft_launcher's IPC sockets do not stay in the node's
# /tmp. The shipped comparison's trials on Slurm are the slurm night's (nightly/slurm.yaml).
# Here, in this module, not one of its own: the package's cluster is made once, and a test
# module of its own made a second cluster beside the first in CI.
def test_ft_launcher_recovers_from_a_nodes_kill_and_leaves_no_socket(slurm_env, tmp_path):
    scenario = tmp_path / "ft_launcher.yaml"
    scenario.write_text(FT_LAUNCHER_KILL)
    out = tmp_path / "runs"
    sockets = set(Path(tempfile.gettempdir()).glob("_ft_launcher*"))  # another run's, if any
    done = chaos_cli("run", str(scenario), "--backend", "slurm", "--out", str(out), env=slurm_env, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "| job | kill on r2 |" in done.stdout and "all ranks step again" in done.stdout, done.stdout
    assert "| consistent |" in done.stdout and "| met |" in done.stdout, done.stdout
    (trial,) = out.glob("*/trials/job/trial.json")
    assert "node03" in next(json.loads(line)["mechanism"] for line in (trial.parent / "events.jsonl").open()
                            if '"fault_applied"' in line)
    assert set(Path(tempfile.gettempdir()).glob("_ft_launcher*")) <= sockets
    assert leftovers(out) == []
    _nothing_left(slurm_env, out)

