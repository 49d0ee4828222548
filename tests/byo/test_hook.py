"""The step hook (harness.job.hook) inside real jobs: 2 ranks of examples/train_ddp.py on
loopback with the environment the harness gives a rank, and scripts that use no optimizer."""
from __future__ import annotations

import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from harness.cluster.userjob import JobSpec, rank_environment
from reports.state import check_state
from runfolder.events import read_events, schema_problems

pytestmark = pytest.mark.system  # real DDP ranks on loopback: not in ./dev.sh check

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "train_ddp.py"
DEADLINE_S = 180


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_ranks(argv: list[str], events: Path, ranks: int, cwd: Path,
              extra: list[dict[str, str]] | None = None) -> list[subprocess.CompletedProcess]:
    """Start `ranks` processes with the harness's environment (on loopback instead of a
    host's link), each with its `extra` variables, and wait for all of them."""
    port = str(free_port())
    procs = []
    for rank in range(ranks):
        env = rank_environment(JobSpec(command=tuple(argv)), rank, ranks, "hooktest", "default", str(events), "lo")
        env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=port, **(extra[rank] if extra else {}))
        procs.append(subprocess.Popen(argv, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                      text=True))
    try:
        return [subprocess.CompletedProcess(p.args, p.wait(DEADLINE_S), p.stdout.read(), None) for p in procs]
    finally:
        for p in procs:
            p.kill()
            p.wait()
            p.stdout.close()


def kinds_by_rank(events: Path) -> dict[int, list[dict]]:
    found: dict[int, list[dict]] = {}
    for event in read_events(events)[0]:
        assert schema_problems(event) == [], event
        found.setdefault(event["rank"], []).append(event)
    return found


def test_optimizer_steps_of_a_real_2_rank_ddp_job_are_recorded(tmp_path):
    events = tmp_path / "events.jsonl"
    done = run_ranks([sys.executable, str(EXAMPLE), "--steps", "5", "--step-period", "0",
                      "--checkpoint", str(tmp_path / "c.pt"), "--checkpoint-every", "2"], events, 2, tmp_path)
    assert [d.returncode for d in done] == [0, 0], [d.stdout[-2000:] for d in done]
    by_rank = kinds_by_rank(events)
    for rank in (0, 1):
        own = [e for e in by_rank[rank] if not e["kind"].startswith("checkpoint_")]
        assert [e["kind"] for e in own] == ["rank_start", "group_init", "state", "flight_ready"] + \
            ["step", "state"] * 5 + ["group_destroyed"]
        assert own[0]["world"] == 2 and own[0]["policy"] == "default"
        assert (own[1]["gen"], own[1]["world"]) == (0, 2)  # init_process_group returned
        states = [e for e in own if e["kind"] == "state"]
        assert [(e["at"], e["step"]) for e in states] == [("start", 0)] + [("step", s) for s in range(1, 6)]
        assert states[0]["optim"] is None and all(e["optim"] for e in states[1:])  # SGD momentum from step 1
        steps = [e for e in own if e["kind"] == "step"]
        assert [e["step"] for e in steps] == [1, 2, 3, 4, 5]
        assert len({e["pid"] for e in own}) == 1
        times = [e["t"] for e in steps]
        assert times == sorted(times) and steps[0]["dur"] is None and all(e["dur"] > 0 for e in steps[1:])
    # rank 0 saves to a temporary file that it renames into place; the hook sees the save
    saves = [e for e in by_rank[0] if e["kind"] == "checkpoint_save"]
    assert [(e["path"], e["step"], e["api"]) for e in saves] == [(str(tmp_path / "c.pt.tmp"), s, "torch.save")
                                                                 for s in (2, 4)]
    # and when each save began (a fault may be anchored on it: harness.scenario.anchors)
    began = [e for e in by_rank[0] if e["kind"] == "checkpoint_begin"]
    assert [(e["path"], e["step"]) for e in began] == [(e["path"], e["step"]) for e in saves]
    assert all(b["t"] <= e["t"] for b, e in zip(began, saves, strict=True))
    assert not [e for e in by_rank[1] if e["kind"].startswith("checkpoint_")]
    verdict = check_state(read_events(events)[0])  # DDP's replicas, fingerprinted on each side
    assert verdict.verdict == "consistent" and verdict.compared == 6, verdict.violations
    # the job resumes from its checkpoint: a second run starts at step 4 and makes one more
    again = run_ranks([sys.executable, str(EXAMPLE), "--steps", "5", "--step-period", "0",
                       "--checkpoint", str(tmp_path / "c.pt"), "--checkpoint-every", "2"], events, 2, tmp_path)
    assert [d.returncode for d in again] == [0, 0]
    assert "resumed from" in again[0].stdout and "at step 4" in again[0].stdout
    assert [e["kind"] for e in kinds_by_rank(events)[0]].count("step") == 5 + 1
    # every rank read what rank 0 last saved, renamed since: the same file by inode, time and size
    loads = [e for e in read_events(events)[0] if e["kind"] == "checkpoint_load"]
    assert sorted((e["rank"], e["path"], e["step"]) for e in loads) == [(r, str(tmp_path / "c.pt"), 0) for r in (0, 1)]
    assert all(e["file"] == saves[-1]["file"] and e["file"]["size"] > 0 for e in loads)


@pytest.mark.parametrize("kind, sharded", [("zero", "optim"), ("fsdp", "params")])
def test_shards_are_recorded_as_such_and_not_called_diverged(tmp_path, kind, sharded):
    events = tmp_path / "events.jsonl"
    script = REPO / "tests" / "byo" / "planted" / "sharded.py"
    done = run_ranks([sys.executable, str(script), kind], events, 2, tmp_path)
    assert [d.returncode for d in done] == [0, 0], [d.stdout[-2000:] for d in done]
    states = [e for e in read_events(events)[0] if e["kind"] == "state" and e["at"] == "step"]
    assert len(states) == 8 and {e["sharded"] for e in states} == {sharded}
    by_rank = {r: [e["optim"] for e in states if e["rank"] == r] for r in (0, 1)}
    assert by_rank[0] != by_rank[1]  # each rank's optimizer state is its own
    verdict = check_state(read_events(events)[0])
    assert verdict.verdict == "consistent", verdict.summary()


def test_the_one_line_opt_in_records_steps_without_torch_optim(tmp_path):
    script = tmp_path / "loop.py"
    script.write_text(textwrap.dedent("""\
        import chaos_hook
        for _ in range(3):
            chaos_hook.step()
    """))
    events = tmp_path / "events.jsonl"
    done = run_ranks([sys.executable, str(script)], events, 1, tmp_path)
    assert done[0].returncode == 0, done[0].stdout
    assert [e["kind"] for e in kinds_by_rank(events)[0]] == ["rank_start", "step", "step", "step"]


def test_a_process_group_made_again_in_process_begins_a_generation_of_its_own(tmp_path):
    """An in-process restart (nvidia-resiliency-ext's Wrapper calls the training function
    again): the process's steps count from 0 again, and the state it resumes from is recorded,
    as a process a launcher started again would have it."""
    script = tmp_path / "restart.py"
    script.write_text(textwrap.dedent("""\
        import os
        import torch
        import torch.distributed as dist
        for iteration, steps in enumerate((3, 2)):
            store = dist.TCPStore("127.0.0.1", int(os.environ["MASTER_PORT"]) + iteration, 1, True)
            dist.init_process_group("gloo", store=store, rank=0, world_size=1)
            model = torch.nn.Linear(4, 2)
            optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
            for _ in range(steps):
                model(torch.ones(1, 4)).sum().backward()
                optimizer.step()
            dist.destroy_process_group()
    """))
    events = tmp_path / "events.jsonl"
    done = run_ranks([sys.executable, str(script)], events, 1, tmp_path)
    assert done[0].returncode == 0, done[0].stdout
    seen = [(e["kind"], e.get("gen"), e.get("step"), e.get("at")) for e in kinds_by_rank(events)[0]
            if e["kind"] in ("group_init", "step") or e.get("at") == "start"]
    assert seen == [("group_init", 0, None, None), ("state", 0, 0, "start"), ("step", 0, 1, None),
                    ("step", 0, 2, None), ("step", 0, 3, None),
                    ("group_init", 1, None, None), ("state", 1, 0, "start"), ("step", 1, 1, None),
                    ("step", 1, 2, None)]


def test_the_workers_of_agents_that_restarted_a_different_number_of_times_share_one_generation(tmp_path):
    """ft_launcher or torchrun after a host's agent was killed and started again: the
    survivors' agents count a restart, the new one none, and their workers are one world;
    each records the world's generation, the largest count."""
    events = tmp_path / "events.jsonl"
    agents = [{"TORCHELASTIC_USE_AGENT_STORE": "False", "TORCHELASTIC_RESTART_COUNT": count} for count in ("1", "0")]
    done = run_ranks([sys.executable, str(EXAMPLE), "--steps", "2", "--step-period", "0"], events, 2, tmp_path,
                     agents)
    assert [d.returncode for d in done] == [0, 0], [d.stdout[-2000:] for d in done]
    gens = {(rank, e["kind"], e["gen"]) for rank, own in kinds_by_rank(events).items() for e in own
            if e["kind"] in ("group_init", "step")}
    assert gens == {(rank, kind, 1) for rank in (0, 1) for kind in ("group_init", "step")}


def test_a_step_delay_command_holds_each_optimizer_step_while_its_file_is_there(tmp_path):
    """The step_delay fault in a user's job: the hook waits the command's delay before each
    optimizer step (chaos.cmdfile.StepDelayFile writes it; harness.job.stepdelay reads it)."""
    import json
    from harness.job.stepdelay import step_delay_file
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent("""\
        import torch
        model = torch.nn.Linear(4, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(4):
            model(torch.ones(1, 4)).sum().backward()
            opt.step()
    """))
    events = tmp_path / "events.jsonl"
    command = step_delay_file(tmp_path, 0)
    command.parent.mkdir()
    command.write_text(json.dumps({"id": "test.1", "delay_s": 0.3}))
    done = run_ranks([sys.executable, str(script)], events, 1, tmp_path)
    assert done[0].returncode == 0, done[0].stdout
    gaps = [e["dur"] for e in kinds_by_rank(events)[0] if e["kind"] == "step" and e["dur"] is not None]
    assert len(gaps) == 3 and min(gaps) >= 0.3, gaps
    command.unlink()  # the fault's revert: no wait
    done = run_ranks([sys.executable, str(script)], tmp_path / "after.jsonl", 1, tmp_path)
    gaps = [e["dur"] for e in kinds_by_rank(tmp_path / "after.jsonl")[0] if e["kind"] == "step" and e["dur"] is not None]
    assert sorted(gaps)[1] < 0.1, gaps  # the median of three: a loaded machine may hold one step


def test_a_user_job_s_compute_times_name_the_rank_its_peers_wait_for(tmp_path):
    """DDP equalises the two ranks' steps; their compute times (the step less the wait from
    the last gradient to the optimizer step) tell the one delayed 150 ms a step from the one
    that waits for it in the all-reduce, and the compute score flags it alone."""
    import json
    import statistics
    from harness.job.stepdelay import step_delay_file
    from reports.straggler import compute_flags, wait_flags
    command = step_delay_file(tmp_path, 1)
    command.parent.mkdir()
    command.write_text(json.dumps({"id": "test.1", "delay_s": 0.15}))
    events = tmp_path / "events.jsonl"
    done = run_ranks([sys.executable, str(EXAMPLE), "--steps", "17", "--step-period", "0.02",
                      "--checkpoint", str(tmp_path / "c.pt"), "--checkpoint-every", "100"], events, 2, tmp_path)
    assert [d.returncode for d in done] == [0, 0], [d.stdout[-2000:] for d in done]
    steps = {rank: [e for e in got if e["kind"] == "step"] for rank, got in kinds_by_rank(events).items()}
    for rank in (0, 1):
        assert "compute" not in steps[rank][0] and all(e["compute"] <= e["dur"] for e in steps[rank][1:])
    compute = {rank: statistics.median(e["compute"] for e in steps[rank][1:]) for rank in (0, 1)}
    wait = {rank: statistics.median(e["dur"] - e["compute"] for e in steps[rank][1:]) for rank in (0, 1)}
    assert compute[1] >= 0.15 > compute[0] and wait[0] >= 0.1 > wait[1], (compute, wait)
    assert {rank for _, rank in compute_flags(steps[0] + steps[1])} == {1}
    assert {rank for _, rank in wait_flags(steps[0] + steps[1])} == {1}


def test_python_processes_the_job_starts_do_not_measure(tmp_path):
    script = tmp_path / "parent.py"
    script.write_text("import subprocess, sys\nsubprocess.run([sys.executable, '-c', 'import chaos_hook; "
                      "chaos_hook.step()'], check=True)\n")
    events = tmp_path / "events.jsonl"
    done = run_ranks([sys.executable, str(script)], events, 1, tmp_path)
    assert done[0].returncode == 0, done[0].stdout
    assert [e["kind"] for e in kinds_by_rank(events)[0]] == ["rank_start"]


def test_outside_the_harness_the_opt_in_does_nothing(tmp_path):
    hook_dir = REPO / "harness" / "job" / "hook"
    done = subprocess.run([sys.executable, "-c", "import chaos_hook; chaos_hook.step(); print('ok')"],
                          env={"PYTHONPATH": str(hook_dir)}, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout == "ok\n", done.stderr
