"""Plays torchrun's part for tests/byo/test_preloaded_start.py: starts workers through the
stub (harness.cluster.workers) as torchrun's agent does, in sessions of their own, signals
their sessions, and writes what it saw as JSON to argv[1]."""
import json
import os
import signal
import subprocess
import sys
import time

from harness.cluster.workers import SERVER_ENV, stub_command

out = sys.argv[1]


def started(path, env=None):
    stub = subprocess.Popen(stub_command(["python", "worker_probe.py", "wait", path]), start_new_session=True, env=env)
    deadline = time.monotonic() + 30
    while not os.path.exists(path) and time.monotonic() < deadline:
        time.sleep(0.02)
    time.sleep(0.1)
    with open(path) as f:
        return stub, json.load(f)


def gone(pid, within_s=5.0):
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.02)
    return False


facts = {"exit": subprocess.Popen(stub_command(["python", "worker_probe.py", "exit"]),
                                  start_new_session=True).wait()}
stub, worker = started(out + ".a")
os.killpg(stub.pid, signal.SIGTERM)  # torchrun's close(): the stub forwards it
facts.update(warm=worker["warm"], term=stub.wait(), term_worker_gone=gone(worker["pid"]))
stub, worker = started(out + ".b")
os.killpg(stub.pid, signal.SIGKILL)  # torchrun's last resort: the server ends the worker
stub.wait()
facts["kill_worker_gone"] = gone(worker["pid"])
stub, worker = started(out + ".d")
os.kill(worker["pid"], signal.SIGKILL)  # the worker itself killed (an OOM kill, a worker fault)
facts["worker_killed"] = stub.wait()
stub, worker = started(out + ".c", env={k: v for k, v in os.environ.items() if k != SERVER_ENV})
facts["no_server_warm"] = worker["warm"]
os.killpg(stub.pid, signal.SIGKILL)
stub.wait()
facts["no_server_gone"] = gone(worker["pid"])
with open(out, "w") as f:
    json.dump(facts, f)
