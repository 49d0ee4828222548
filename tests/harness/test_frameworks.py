"""Fault-tolerance frameworks as a user's job (harness.cluster.frameworks): what runs on each
host, what is refused at load, how their log lines and steps read, and how the state checker
judges a framework's own step count. The real thing (a real Lighthouse, real replica groups
in namespaces, a real kill) is scenarios/frameworks_kill.yaml, a test of its own."""
from __future__ import annotations

import math
import time
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import pytest

from chaos.errors import UsageError
from harness.cluster.backends import BACKEND_NAMES
from harness.cluster.frameworks import FRAMEWORKS, Framework
from harness.cluster.userjob import JobSpec, JobVariant, launch_command, rank_command, rank_environment
from harness.job.hook.chaos_hook import HOST_RANK_ENV
from harness.scenario.scenario import load_scenario
from reports.metrics import _heal_columns
from reports.state import CONSISTENT, DIVERGED, RESTORE_IS_REAL, REPLICAS_AGREE, check_state
from reports.trial_events import FaultWindow
from reports.trial_facts import _final_world, _quorum_change, _resumed
from runfolder.classify import classify_line, heal_fetch_of, heal_of
from runfolder.frameworks import COORDINATED, coordinator_host, training_hosts

ADDRESSES = ["10.77.0.10", "10.77.0.11", "10.77.0.12", "10.77.0.13"]


def torchft_job(**changes) -> JobSpec:
    return JobSpec.model_validate({"command": ["python", "train_torchft.py"], "launcher": "torchft",
                                   "torchft": {"min_replicas": 1, "heartbeat_timeout_ms": 2000, "timeout": 7},
                                   **changes})


def test_the_frameworks_with_a_coordinator_are_the_ones_runfolder_names():
    assert sorted(name for name, f in FRAMEWORKS.items() if f.coordinator) == sorted(COORDINATED)
    job = {"launcher": "torchft"}
    assert (coordinator_host(4, job), training_hosts(4, job)) == (3, (0, 1, 2))
    assert (coordinator_host(4, {"launcher": "torchrun"}), training_hosts(4, None)) == (None, (0, 1, 2, 3))


def test_the_last_host_runs_the_lighthouse_by_exec_with_the_scenarios_options():
    job = torchft_job(torchft={"min_replicas": 2, "quorum_tick_ms": 50, "join_timeout_ms": 3000,
                               "heartbeat_timeout_ms": 2000})
    argv = rank_command(job, 3, 4, "ab12cd", "10.77.0.1:29400", addresses=ADDRESSES)
    assert argv == ["torchft_lighthouse", "--min_replicas", "2", "--quorum_tick_ms", "50", "--join_timeout_ms",
                    "3000", "--heartbeat_timeout_ms", "2000", "--bind", "[::]:29510"]
    env = rank_environment(job, 3, 4, "ab12cd", "torchft", "/tmp/e.jsonl", base={}, addresses=ADDRESSES)
    assert HOST_RANK_ENV not in env and "TORCHFT_LIGHTHOUSE" not in env  # no rank: the hook records nothing
    launch = launch_command(job, argv, env, Path("/tmp"), ADDRESSES[3])
    assert (launch["start"], launch["hostname"]) == ("exec", ADDRESSES[3])


def test_a_replica_group_is_a_torchrun_hosting_its_store_at_its_own_address():
    job = torchft_job(nproc_per_host=2, max_restarts=1, start="exec")
    argv = rank_command(job, 1, 4, "ab12cd", "10.77.0.1:29400", addresses=ADDRESSES)
    assert argv[:8] == ["torchrun", "--nnodes=1", "--nproc-per-node=2", "--master-addr=10.77.0.11",
                        "--master-port=29500", "--rdzv-id=ab12cd-g1", "--max-restarts=1",
                        "--log-dir={trial_dir}/logs/torchrun/r001"]
    assert argv[-3:] == ["--no-python", "python", "train_torchft.py"]
    env = rank_environment(job, 1, 4, "ab12cd", "torchft", "/tmp/e.jsonl", base={}, addresses=ADDRESSES)
    assert {k: env[k] for k in ("TORCHFT_LIGHTHOUSE", "REPLICA_GROUP_ID", "NUM_REPLICA_GROUPS",
                                "TORCHFT_TIMEOUT_SEC", HOST_RANK_ENV)} == {
        "TORCHFT_LIGHTHOUSE": "http://10.77.0.13:29510", "REPLICA_GROUP_ID": "1", "NUM_REPLICA_GROUPS": "3",
        "TORCHFT_TIMEOUT_SEC": "7", HOST_RANK_ENV: "1"}
    assert "RANK" not in env  # the agent sets the worker's


def test_a_missing_framework_package_is_refused_saying_how_to_install_it(monkeypatch):
    monkeypatch.setattr(Framework, "installed", lambda self: False)
    with pytest.raises(ValueError, match=r"launcher: torchft: its package \(torchft\) is not installed .*"
                                         r"pip install -e '\.\[frameworks\]' in the harness's repository"):
        torchft_job()


@pytest.mark.parametrize("changes, message", [
    ({"launcher": "torchrun"}, "torchft: these are torchft's settings, and the job's launcher is torchrun"),
    ({"min_hosts": 2}, "min_hosts: it is torchrun's elastic rendezvous"),
])
def test_settings_that_do_not_fit_torchft_are_refused(changes, message):
    with pytest.raises(ValueError, match=message):
        torchft_job(**changes)


SCENARIO = """\
name: ft
cluster: {{ranks: {ranks}, backend: {backend}}}
job:
  command: [python, train_torchft.py]
  workdir: {workdir}
  launcher: {launcher}
faults:
  - {{kind: kill, target: {{rank: 1}}, start: 1s}}
"""


@pytest.mark.parametrize("launcher, ranks, backend, message", [
    ("torchft", 4, "local", r"s\.yaml:\d+: job\.launcher: torchft runs on the netns or docker or slurm backend "
                            r"only \(the local backend's hosts share loopback.*; set cluster\.backend: netns"),
    ("torchft", 2, "netns", r"s\.yaml:\d+: job\.launcher: torchft's coordinator \(torchft_lighthouse\) takes "
                            "the last"),
])
def test_a_framework_trial_where_it_cannot_run_is_refused_at_load_with_file_and_line(tmp_path, launcher, ranks,
                                                                                      backend, message):
    path = tmp_path / "s.yaml"
    path.write_text(SCENARIO.format(ranks=ranks, backend=backend, workdir=tmp_path, launcher=launcher))
    with pytest.raises(UsageError, match=message):
        load_scenario(path)


@pytest.mark.parametrize("launcher", ["ft_launcher", "nvrx_inprocess"])
def test_nvidias_frameworks_load_on_every_backend(tmp_path, launcher):
    for backend in BACKEND_NAMES:
        path = tmp_path / f"{backend}.yaml"
        path.write_text(SCENARIO.format(ranks=4, backend=backend, workdir=tmp_path, launcher=launcher))
        assert load_scenario(path).cluster.backend == backend


def test_a_slurm_node_of_the_local_cluster_gives_torchft_a_hostname_and_a_real_ones_keeps_its_own():
    from harness.cluster.slurm.agent import shares_a_hostname
    assert shares_a_hostname("node03", "buildbox")          # the local cluster: the machine's name
    assert not shares_a_hostname("node03", "node03")        # a cluster's machine: its own
    assert not shares_a_hostname("gpu017", "gpu017.cluster.example.org")


def test_torchfts_lines_say_a_quorum_change_and_a_heal():
    lighthouse = "2026-12-07T06:32:26.522 [INFO] [torchft::lighthouse] - Detected quorum change, bumping quorum_id to 3"
    assert classify_line(lighthouse) == "quorum"
    heal = ("[INFO] [torchft::manager] - [Replica train_torchft_0] healing is required step=0, max_step=93, "
            "recover_src_replica_rank=1")
    assert (classify_line(heal), heal_of(heal)) == (None, {"step": 0, "max_step": 93, "source": 1})
    assert heal_of("step 12 participants 2 lr 0.05 loss 2.3") is None
    fetched = ("INFO:torchft.checkpointing.http_transport:fetching checkpoint from "
               "http://10.77.0.10:33373/checkpoint/1/full took 0.011888380000527832s")
    assert (classify_line(fetched), heal_fetch_of(fetched)) == (None, 0.011888380000527832)
    assert heal_fetch_of("INFO:torchft.checkpointing.http_transport:fetching checkpoint from http://x/1/full") is None
    # a Manager whose Lighthouse is gone says so at its next quorum and heartbeat
    gone = ('[INFO] [torchft::manager] - [Replica train_torchft_0] lighthouse quorum failed. error: status: '
            'Unavailable, message: "tcp connect error", details: []')
    heartbeat = ("[INFO] [torchft::manager] - [Replica train_torchft_0] Failed to send heartbeat to lighthouse: "
                 'status: Unavailable, message: "tcp connect error"')
    assert classify_line(gone) == classify_line(heartbeat) == "quorum"


def ft_launcher_job(**changes) -> JobSpec:
    return JobSpec.model_validate({"command": ["python", "train_ft_launcher.py"], "launcher": "ft_launcher",
                                   "max_restarts": 3, "start": "exec",
                                   "ft_launcher": {"initial_rank_heartbeat_timeout": "60s",
                                                   "rank_heartbeat_timeout": 5, "workload_check_interval": 0.5},
                                   **changes})


def test_every_host_runs_an_ft_launcher_agent_in_the_harness_rendezvous_with_its_ft_options():
    job = ft_launcher_job(nproc_per_host=2, min_hosts=3, rdzv_conf={"last_call_timeout": 2})
    assert coordinator_host(4, {"launcher": "ft_launcher"}) is None  # every host trains
    argv = rank_command(job, 1, 4, "ab12cd", "10.77.0.1:29400", addresses=ADDRESSES)
    assert argv == ["ft_launcher", "--nnodes=3:4", "--nproc-per-node=2", "--rdzv-backend=c10d",
                    "--rdzv-endpoint=10.77.0.1:29400", "--rdzv-id=ab12cd", "--max-restarts=3",
                    "--rdzv-conf=last_call_timeout=2", "--local-addr=10.77.0.11",
                    "--log-dir={trial_dir}/logs/torchrun/r001", "--ft-initial-rank-heartbeat-timeout=60",
                    "--ft-rank-heartbeat-timeout=5", "--ft-workload-check-interval=0.5", "--no-python",
                    "python", "train_ft_launcher.py"]
    # torchrun's own command is the same agent without the ft options
    torchrun = rank_command(job.model_copy(update={"launcher": "torchrun"}), 1, 4, "ab12cd", "10.77.0.1:29400",
                            addresses=ADDRESSES)
    assert torchrun == ["torchrun", *(a for a in argv[1:] if not a.startswith("--ft-"))]
    env = rank_environment(job, 1, 4, "ab12cd", "ft_launcher", "/tmp/e.jsonl", base={}, addresses=ADDRESSES)
    assert env[HOST_RANK_ENV] == "1" and "RANK" not in env  # the agent sets the worker's


def test_ft_launchers_section_timeouts_are_its_flags():
    job = ft_launcher_job(ft_launcher={"rank_section_timeouts": {"step": "3s", "checkpoint": 10},
                                       "rank_out_of_section_timeout": "1m"})
    argv = rank_command(job, 0, 4, "ab12cd", "10.77.0.1:29400", addresses=ADDRESSES)
    assert [a for a in argv if a.startswith("--ft-")] == ["--ft-rank-section-timeouts=step:3,checkpoint:10",
                                                          "--ft-rank-out-of-section-timeout=60"]


def test_a_variant_runs_another_framework_with_its_own_script_and_settings():
    job = torchft_job()
    variant = JobVariant.model_validate({"launcher": "ft_launcher", "command": ["python", "train_ft_launcher.py"],
                                         "args": ["--step-period", "0"], "max_restarts": 2,
                                         "ft_launcher": {"rank_heartbeat_timeout": "5s", "relaunch": "1s"}})
    varied = variant.applied_to(job)
    assert varied.command == ("python", "train_ft_launcher.py", "--step-period", "0")
    assert (varied.torchft, varied.ft_launcher.relaunch, varied.framework.name) == (None, 1.0, "ft_launcher")
    with pytest.raises(ValueError, match="torchft: these are torchft's settings, and the job's launcher is "
                                         "ft_launcher"):
        JobVariant.model_validate({"launcher": "ft_launcher", "torchft": {"timeout": 3}}).applied_to(job)


def test_the_in_process_restart_runs_the_script_once_per_host_with_the_torchrun_contract():
    job = JobSpec.model_validate({"command": ["python", "train_inprocess.py"], "launcher": "nvrx_inprocess"})
    assert rank_command(job, 2, 4, "ab12cd", "10.77.0.1:29400", addresses=ADDRESSES) == ["python",
                                                                                        "train_inprocess.py"]
    env = rank_environment(job, 2, 4, "ab12cd", "nvrx_inprocess", "/tmp/e.jsonl", base={}, addresses=ADDRESSES,
                           master=(ADDRESSES[0], 29500))
    assert {k: env[k] for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")} == {
        "RANK": "2", "WORLD_SIZE": "4", "MASTER_ADDR": "10.77.0.10", "MASTER_PORT": "29500"}
    with pytest.raises(ValueError, match="max_restarts: the nvrx_inprocess launcher starts each rank once"):
        JobSpec.model_validate({"command": ["python", "x.py"], "launcher": "nvrx_inprocess", "max_restarts": 1})
    with pytest.raises(ValueError, match="min_hosts: 2 is torchrun's --nnodes MIN:MAX; the nvrx_inprocess launcher "
                                         "starts a fixed set of ranks"):
        JobSpec.model_validate({"command": ["python", "x.py"], "launcher": "nvrx_inprocess", "min_hosts": 2})


def test_a_group_made_again_in_process_with_fewer_ranks_is_the_final_world():
    events = pd.DataFrame([
        {"t": 1.0, "kind": "rank_start", "rank": r, "world": 4} for r in range(4)] + [
        {"t": 9.0, "kind": "group_init", "rank": r, "world": 3, "gen": 1} for r in (0, 1, 3)])
    assert _final_world(events, start=5.0) == 3
    assert _final_world(events[events["kind"] == "rank_start"], start=0.0) == 4


def test_a_store_polls_warning_is_not_an_error_line():
    poll = ("[rank3]:[W1207 10:26:23.314850148 socket.cpp:494] [c10d] waitForInput: socket SocketImpl(fd=8, "
            "addr=[::]:28453, remote=[fdff:ffff:fd7f::1]:29502) timed out after 1000ms")
    assert classify_line(poll) is None
    assert classify_line("torch.distributed.DistStoreError: wait timeout after 30000ms, keys: /x") == "timeout"


def test_ft_launchers_lines_say_a_section_open_too_long():
    assert classify_line("[2026-12-07 23:14:01,351] [WARNING] [RankMonServer32720@vm:1] Section 'step' has been "
                         "open for 3.15 seconds. Timeout is 3.00 seconds.") == "section"
    assert classify_line("[WARNING] [RankMonServer1@vm:0] Was out of section for 61.02 seconds. "
                         "Timeout is 60.00 seconds.") == "section"
    # the warning a monitor prints as its worker ends with a section open is no detection
    assert classify_line("[WARNING] [RankMonServer32724@vm:0] Section(s) ['step'] were still open. you can "
                         "use`.end_all_sections` to avoid this warning") is None


def test_ft_launchers_lines_say_a_missed_heartbeat_and_a_restart():
    assert classify_line("[2026-12-07 09:43:38,113] [WARNING] [RankMonServer17811@vm:1] Did not get subsequent "
                         "heartbeat. Waited 5.00 seconds.") == "heartbeat"
    assert classify_line("[INFO] [ft_launcher17524@vm] [default] Worker group UNHEALTHY. 3/3 attempts left; "
                         "will restart worker group") == "agent"
    assert classify_line("[WARNING] [ft_launcher17524@vm] GPU Health checks disabled: Unable to determine "
                         "driver version due to: NVML Shared Library Not Found") is None


def states(events):
    """(rank, at, torchft's step, weights[, pid]) -> state events; optimizer state by step."""
    return [{"t": 100 + i, "src": "rank", "kind": "state", "gen": 0, "optim": f"m{e[2]}", "step_source": "torchft",
             "rank": e[0], "pid": e[4] if len(e) > 4 else 1000 + e[0], "at": e[1], "step": e[2], "fingerprint": e[3]}
            for i, e in enumerate(events)]


def test_a_heal_says_its_source_its_steps_and_how_long_its_fetch_took():
    events = pd.DataFrame([
        {"t": 9.0, "kind": "step", "rank": 0, "step": 4, "step_source": "torchft"},
        {"t": 5.0, "kind": "heal", "rank": 2, "step": 0, "max_step": 1, "source": 0},  # the start-up's
        {"t": 15.1, "kind": "heal", "rank": 2, "step": 0, "max_step": 17, "source": 0},
        {"t": 15.2, "kind": "heal_fetched", "rank": 2, "seconds": 0.0119},
        {"t": 16.0, "kind": "heal", "rank": 1, "step": 18, "max_step": 20, "source": 0}])
    facts = SimpleNamespace(fault=SimpleNamespace(start=10.0))
    assert _heal_columns(events, facts) == {"heals": 2.0, "heal_detail": (
        "r2 from replica rank 0 at +5.1 s (its step 0 to the quorum's 17, fetched in 12 ms); "
        "r1 from replica rank 0 at +6.0 s (its step 18 to the quorum's 20)")}


def test_a_group_healed_at_its_peers_step_agrees_with_them():
    """Group 0 trains steps 1-5 alone; group 1 joins at step 5, healed from group 0 (its
    start is group 0's state of step 5); both go on together: torchft's own step count."""
    history = [(0, "start", 0, "w0"), *((0, "step", s, f"w{s}") for s in range(1, 6)), (1, "start", 5, "w5"),
               *((r, "step", s, f"w{s}") for s in range(6, 9) for r in (0, 1))]
    verdict = check_state(states(history))
    assert (verdict.verdict, verdict.compared, verdict.restores_checked) == (CONSISTENT, 4, 1)  # steps 5 (the heal) to 8


def test_a_heal_that_took_up_other_weights_is_diverged():
    history = [(0, "start", 0, "w0"), *((0, "step", s, f"w{s}") for s in range(1, 6)), (1, "start", 5, "stale"),
               *((r, "step", s, f"w{s}" if r == 0 else f"x{s}") for s in range(6, 8) for r in (0, 1))]
    verdict = check_state(states(history))
    assert verdict.verdict == DIVERGED
    assert verdict.violations[0].invariant == RESTORE_IS_REAL
    assert "step 5 (the framework's count)" in verdict.violations[0].detail
    assert {v.invariant for v in verdict.violations} == {RESTORE_IS_REAL, REPLICAS_AGREE}


def relaunched(after: str) -> list[dict]:
    """Groups 0 and 1 train steps 1-6; group 1's host is killed and its group started again
    (a new process), which heals from group 0 at step 6; both go on to step 9, the relaunched
    group's weights after its heal being `after`."""
    history = [(r, "start", 0, "w0") for r in (0, 1)] + [(r, "step", s, f"w{s}") for s in range(1, 7) for r in (0, 1)]
    history += [(1, "start", 6, "w6", 2000)]
    history += [e for s in range(7, 10) for e in ((0, "step", s, f"w{s}"), (1, "step", s, after.format(s), 2000))]
    return states(history)


def test_a_relaunched_group_is_compared_with_the_others_at_torchfts_step():
    verdict = check_state(relaunched("w{}"))
    # every step 0-9 compared; both of group 1's starts (step 0, and its heal at 6) checked
    assert (verdict.verdict, verdict.compared, verdict.restores_checked) == (CONSISTENT, 10, 2)


def test_a_relaunched_group_that_drifts_after_its_heal_is_diverged():
    verdict = check_state(relaunched("x{}"))
    assert verdict.verdict == DIVERGED
    assert verdict.violations[0].invariant == REPLICAS_AGREE
    assert verdict.violations[0].step == 7


def test_a_variant_sets_torchft_settings_over_the_jobs():
    job = torchft_job(torchft={"min_replicas": 2, "heartbeat_timeout_ms": 2000})
    varied = JobVariant(torchft={"relaunch": "1s"}).applied_to(job)
    assert (varied.torchft.min_replicas, varied.torchft.heartbeat_timeout_ms, varied.torchft.relaunch) == (2, 2000, 1.0)
    assert JobVariant().applied_to(job).torchft.relaunch is None


def test_a_survivor_resumes_with_the_new_quorum_not_with_a_step_in_flight():
    """A step that completed just after the kill was in flight: the survivor resumes at its
    first step after the Lighthouse's quorum change (the first detection, any process's)."""
    steps = [{"t": t, "kind": "step", "rank": 0, "participants": p} for t, p in ((9.9, 3), (10.01, 3), (15.1, 2))]
    events = pd.DataFrame([*steps, {"t": 15.0, "kind": "job_output", "rank": 3, "cause": "quorum"}])
    fault = FaultWindow(index=0, kind="kill", targets=(2,), start=10.0, end=math.nan)
    change = _quorum_change(events, {3: 15.0})
    assert change == 15.0
    assert _resumed(events, (0,), fault, {3: 15.0}, {0: ((9.9, 10.01, 15.1),)}, 20.0, change) == {0: 15.1}
    assert _resumed(events, (0,), fault, {3: 15.0}, {0: ((9.9, 10.01, 15.1),)}, 20.0) == {0: 10.01}


def with_parts(events: list[dict], parts: dict[tuple[int, int], dict[str, str]]) -> list[dict]:
    """The state events with the named parts a framework records: (rank, step) -> parts that
    differ from the defaults (every part named by its step)."""
    for e in events:
        e["parts"] = {"model": f"m{e['step']}", "lr_scheduler": f"l{e['step']}", "data": f"d{e['step']}",
                      **parts.get((e["rank"], e["step"]), {})}
    return events


def test_a_heal_that_left_the_lr_scheduler_behind_is_named():
    events = with_parts(relaunched("w{}"), {(1, 6): {"lr_scheduler": "l0"}})
    verdict = check_state(events)
    assert verdict.verdict == DIVERGED
    first = verdict.violations[0]
    assert (first.invariant, first.step) == (RESTORE_IS_REAL, 6)
    assert "recorded there but not the others' lr_scheduler" in first.detail


def test_replicas_whose_data_position_differs_are_named():
    events = with_parts(relaunched("w{}"), {(1, 8): {"data": "d9"}})
    verdict = check_state(events)
    assert verdict.verdict == DIVERGED
    assert verdict.violations[0].invariant == REPLICAS_AGREE
    assert "(the data differs)" in verdict.violations[0].detail
    assert check_state(with_parts(relaunched("w{}"), {})).verdict == CONSISTENT


# A preloaded agent's host (harness.cluster.workers): torchrun's child is the stub (marked),
# the worker is a child of the host's worker server, its environment the server's.
PRELOADED_AGENT = """
import os, subprocess, sys, time
sleep = "import time; time.sleep(120)"
stub = subprocess.Popen([sys.executable, "-c", sleep, {stub!r}], env={{**os.environ, "TORCHELASTIC_RESTART_COUNT": "0"}})
server = subprocess.Popen([{title!r}, "-c", f"import subprocess, time; w = subprocess.Popen([{{sys.executable!r}}, '-c', {{sleep!r}}]); print(w.pid, flush=True); time.sleep(120)"],
                          executable=sys.executable, stdout=subprocess.PIPE, text=True)
worker = server.stdout.readline().strip()
while {stub!r} not in open(f"/proc/{{stub.pid}}/cmdline").read():  # until the stub has exec'd
    time.sleep(0.01)
print(stub.pid, server.pid, worker, flush=True)
time.sleep(120)
"""


def test_a_preloaded_worker_is_the_one_its_hosts_server_forked_not_its_stub():
    import subprocess
    import sys

    from chaos import proc
    from harness.cluster.workers import SERVER_TITLE, STUB, worker_processes
    agent = subprocess.Popen([sys.executable, "-c", PRELOADED_AGENT.format(stub=STUB, title=SERVER_TITLE)],
                             stdout=subprocess.PIPE, text=True)
    try:
        stub, server, worker = (int(word) for word in agent.stdout.readline().split())
        assert proc.workers(agent.pid) == [(stub, proc.start_time(stub))]  # what the agent's mark shows
        assert worker_processes(agent.pid) == [(worker, proc.start_time(worker))]
    finally:
        for pid, _ in [*proc.descendants(agent.pid), (agent.pid, 0)]:
            proc.send_signal(pid, 9, None, gone_ok=True)
        agent.wait(30)
        agent.stdout.close()


WORKERS_FAULT = "faults:\n  - {kind: pause, processes: workers, target: {rank: 1}, start: 1s, duration: 2s}\n"


@pytest.mark.parametrize("head, message", [
    ("policies: {timeout: {timeout: 5s}}\n",
     r"s\.yaml:\d+: faults\.0\.processes: workers are those a host's agent started .* the harness's runner is one "
     "process per host"),
    ("job: {command: [python, x.py], launcher: direct}\n",
     r"s\.yaml:\d+: faults\.0\.processes: workers are those a host's agent started, and the job runs without one "
     r"\(launcher: direct\); run it under torchrun"),
    ("job: {command: [python, x.py], launcher: nvrx_inprocess}\n", r"the job runs without one \(launcher: nvrx_inpro"),
    ("cluster: {backend: docker}\njob: {command: [python, x.py], launcher: torchrun}\n",
     r"s\.yaml:\d+: faults\.0\.processes: workers: the docker backend acts on a host whole .* --backend netns or "
     "local"),
])
def test_a_fault_on_the_workers_where_no_agent_starts_them_is_refused_at_load(tmp_path, head, message):
    path = tmp_path / "s.yaml"
    path.write_text(f"name: s\n{head}{WORKERS_FAULT}".replace("x.py]", f"x.py], workdir: {tmp_path}"))
    with pytest.raises(UsageError, match=message):
        load_scenario(path)


MONITORS_FAULT = "faults:\n  - {kind: kill, processes: monitors, target: {rank: 1}, start: 1s}\n"


@pytest.mark.parametrize("launcher", ["torchrun", "torchft"])
def test_a_fault_on_the_monitors_of_an_agent_that_has_none_is_refused_at_load(tmp_path, launcher):
    path = tmp_path / "s.yaml"
    path.write_text(f"name: s\njob: {{command: [python, x.py], launcher: {launcher}, workdir: {tmp_path}}}\n"
                    f"{MONITORS_FAULT}")
    with pytest.raises(UsageError, match=rf"s\.yaml:\d+: faults\.0\.processes: monitors are the processes an agent "
                                         rf"watches its workers with .* launcher, {launcher}, has none; run it under "
                                         "ft_launcher"):
        load_scenario(path)
    path.write_text(path.read_text().replace(f"launcher: {launcher}", "launcher: ft_launcher"))
    fault = load_scenario(path).faults[0].fault
    assert fault.describe() == "kill(signal=9, processes=monitors)" and not fault.ends_host


# ft_launcher's rank monitor (torch.multiprocessing's fork of the agent) makes
# `_ft_launcher<its pid>_to_rmon.socket` in its temporary folder: a stand-in agent forks one
# that does, and a worker that does not. Its TMPDIR is set inside the process, as a preloaded
# start sets it (harness.cluster.preload): /proc/<pid>/environ does not show it.
AGENT_WITH_MONITOR = """
import os, socket, sys, time
os.environ["TMPDIR"] = sys.argv[1]
def child(monitor):
    if monitor:
        s = socket.socket(socket.AF_UNIX)
        s.bind(f"{os.environ['TMPDIR']}/_ft_launcher{os.getpid()}_to_rmon.socket")
    os.write(1, f"{'monitor' if monitor else 'worker'} {os.getpid()}\\n".encode())  # one write: lines whole
    time.sleep(120)
for monitor in (True, False):
    if os.fork() == 0:
        child(monitor)
        os._exit(0)
time.sleep(120)
"""


def test_ft_launchers_rank_monitors_are_the_agents_children_that_made_their_socket(tmp_path):
    import subprocess
    import sys

    from chaos import proc
    from harness.cluster.frameworks.ft_launcher import monitors
    agent = subprocess.Popen([sys.executable, "-c", AGENT_WITH_MONITOR, str(tmp_path)], stdout=subprocess.PIPE,
                             text=True)
    try:
        children = dict(agent.stdout.readline().split() for _ in range(2))
        monitor, worker = int(children["monitor"]), int(children["worker"])
        deadline = time.monotonic() + 10
        while not (tmp_path / f"_ft_launcher{monitor}_to_rmon.socket").exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert monitors(agent.pid) == [(monitor, proc.start_time(monitor))]
        assert worker != monitor and worker in {pid for pid, _ in proc.descendants(agent.pid)}
    finally:
        for pid, _ in [*proc.descendants(agent.pid), (agent.pid, 0)]:
            proc.send_signal(pid, 9, None, gone_ok=True)
        agent.wait(30)
        agent.stdout.close()


def test_a_fault_on_the_workers_under_an_agent_loads_and_says_so(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text(f"name: s\njob: {{command: [python, x.py], launcher: torchrun, workdir: {tmp_path}}}\n"
                    f"{WORKERS_FAULT}")
    fault = load_scenario(path).faults[0].fault
    assert fault.describe() == "pause(processes=workers)" and not fault.ends_host
