"""A user's DDP job's flight recorders, through the startup hook: 3 real ranks on loopback
with the harness's environment; rank 2 stops before its 4th step (in Python), ranks 0 and 1
wait for it inside DDP's all-reduce (in C++, where a Python signal handler would not run).
Asked with SIGUSR2, every rank answers, and the report names rank 2 as the one that did not
enter the newest collective. The same when each rank's process is an agent that started
the job as its worker (as torchrun does): the worker that said flight_ready is asked."""
from __future__ import annotations

import signal
import subprocess
import sys
import time

import pytest

from chaos import proc
from harness.cluster.userjob import JobSpec, rank_environment
from harness.trial.stacks import ask_flight_recorders, recording_ranks
from reports.stuck import flight_text, read_flight
from runfolder.events import read_events, schema_problems
from tests.byo.test_hook import free_port

pytestmark = pytest.mark.system  # real ranks and their flight recorder: not in ./dev.sh check

JOB = """
import os, sys, time
import torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
dist.init_process_group("gloo")
rank = dist.get_rank()
model = DistributedDataParallel(torch.nn.Linear(8, 8))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(1, 100):
    if rank == 2 and step == 4:
        print("stopping", flush=True)
        while True:
            time.sleep(0.05)
    model(torch.ones(4, 8)).sum().backward()
    optimizer.step()
    optimizer.zero_grad()
    if step == 3:
        print("stepped", flush=True)
"""


# an agent, as torchrun's: itself without RANK (so the hook leaves the measuring to its
# worker), it starts the job as its worker with RANK set and waits for it
AGENT = ("import os, subprocess, sys\n"
         "env = dict(os.environ, RANK=os.environ['WORKER_RANK'])\n"
         "sys.exit(subprocess.run([sys.executable, sys.argv[1]], env=env).returncode)")


@pytest.mark.parametrize("agent", [False, True], ids=["direct", "worker-of-an-agent"])
def test_every_rank_of_a_hung_ddp_job_answers_and_the_missing_one_is_named(tmp_path, agent):
    script = tmp_path / "job.py"
    script.write_text(JOB)
    events = tmp_path / "events.jsonl"
    port = str(free_port())
    procs = []
    for rank in range(3):
        env = rank_environment(JobSpec(command=(sys.executable, str(script))), rank, 3, "flighttest", "default",
                               str(events), "lo")
        env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
        if agent:
            env["WORKER_RANK"] = env.pop("RANK")
        argv = [sys.executable, "-c", AGENT, str(script)] if agent else [sys.executable, str(script)]
        procs.append(subprocess.Popen(argv, cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True))
    try:
        lines = [p.stdout.readline().strip() for p in procs]
        assert lines == ["stepped"] * 3, lines
        assert procs[2].stdout.readline().strip() == "stopping"
        time.sleep(1.0)  # ranks 0 and 1 are inside their 4th step's all-reduce by now
        recorded = read_events(events)[0]
        assert all(schema_problems(e) == [] for e in recorded)
        pids = {rank: p.pid for rank, p in enumerate(procs)}
        said = {e["rank"]: e["pid"] for e in recorded if e["kind"] == "flight_ready"}
        assert said.keys() == {0, 1, 2} and (said == pids) is (not agent)  # a worker's own pid under an agent
        asked = recording_ranks(recorded, pids)
        assert asked == said  # each rank's process that said flight_ready
        assert ask_flight_recorders(asked, tmp_path, deadline_s=10.0) == [0, 1, 2]
        assert all(p.poll() is None for p in procs)  # asked, not stopped
        text = flight_text(read_flight(tmp_path), pids)
        assert "entered by ranks 0,1" in text and "rank 2 did not enter it" in text, text
    finally:
        for p in procs:
            proc.signal_tree(p.pid, signal.SIGKILL, None, gone_ok=True)
            p.wait()
            p.stdout.close()
