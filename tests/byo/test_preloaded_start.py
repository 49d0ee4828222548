"""A preloaded start (harness.cluster.preload) against an exec'd one, through the real rank
launcher: the same probe script (probe/start_probe.py) run both ways must see the same
process, item by item, where a fresh `python` would differ from a fork of the launcher."""
from __future__ import annotations

import json
import os
import secrets
import signal
import sys
import time
import types
from pathlib import Path

import pytest

from chaos.ledger import Ledger
from chaos.undo import record_owner
from harness.cluster import preload
from harness.cluster.launcher import PRELOAD_TIMEOUT_S, Launcher, LauncherPool
from harness.cluster.userjob import JobSpec, launch_command, rank_environment
from harness.cluster.workers import SERVER_ENV
from runfolder.events import read_events

pytestmark = pytest.mark.system  # real interpreters forked and exec-ed: not in ./dev.sh check

PROBE_DIR = Path(__file__).parent / "probe"
STARTS = ("exec", "preloaded")


@pytest.fixture(scope="module")
def launcher(tmp_path_factory):
    state = tmp_path_factory.mktemp("state")
    with LauncherPool(state) as pool:
        launcher = pool.take()
        ledger = Ledger(secrets.token_hex(3), state)
        record_owner(ledger)
        launcher.preload([], PRELOAD_TIMEOUT_S)
        try:
            yield launcher, ledger
        finally:
            launcher.close()


def run_job(launcher, tmp_path: Path, start: str, command: tuple[str, ...], env: dict | None = None,
            within_s: float = 60, launch: dict | None = None) -> tuple[dict | None, int | None, str, Path]:
    """Run `command` as rank 0's job (`launch`: added to its launch); (its probe facts, exit
    code or -signal, log, out file)."""
    launcher, ledger = launcher
    folder = tmp_path / start
    folder.mkdir(parents=True)
    out = folder / "facts.json"
    job = JobSpec(command=(*command[:2], *(a.replace("{out}", str(out)) for a in command[2:])),
                  workdir=str(PROBE_DIR), env=env or {}, start=start)
    job_env = rank_environment(job, 0, 1, "run1", "default", str(folder / "events.jsonl"), "lo",
                               master=("127.0.0.1", 29999))
    name = f"r{secrets.randbelow(900) + 100}"
    log = folder / "job.log"
    launcher.spawn(ledger, name, "exec", None, str(log),
                   {**launch_command(job, list(job.command), job_env, folder), "rank": 0, **(launch or {})})
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        ended = [m for m in launcher.exits(0.1) if m["name"] == name]
        if ended:
            code = ended[0]["exitcode"] if ended[0]["exitcode"] is not None else -ended[0]["signal"]
            time.sleep(0.3)  # the tap's last lines
            text = out.read_text() if out.exists() else ""
            facts = json.loads(text) if text.startswith("{") else None  # a probe's facts, or another job's output
            return facts, code, log.read_text() if log.exists() else "", out
    pytest.fail(f"the {start} job did not end within {within_s} s; its log: {log.read_text()[-2000:]}")


def both(launcher, tmp_path, command, env=None, within_s=60):
    return {start: run_job(launcher, tmp_path, start, command, env, within_s) for start in STARTS}


def test_a_preloaded_job_sees_what_an_execd_one_sees(launcher, tmp_path):
    runs = both(launcher, tmp_path, ("python", "start_probe.py", "{out}"),
                {"PROBE": "x", "CUDA_VISIBLE_DEVICES": "3", "TORCH_LOGS": "-dynamo"})
    (fresh, fresh_code, _, fresh_out), (forked, forked_code, log, forked_out) = runs["exec"], runs["preloaded"]
    assert "exec instead" not in log
    assert fresh_code == forked_code == 0
    assert forked["warm"] and not fresh["warm"]
    changing = {"argv", "random", "torch_random", "cmdline", "warm"}  # the out file's folder, the seeds
    assert {k: v for k, v in forked.items() if k not in changing} == \
           {k: v for k, v in fresh.items() if k not in changing}
    assert forked["argv"][0] == fresh["argv"][0] == "start_probe.py"
    assert forked["file"] == str(PROBE_DIR / "start_probe.py") and forked["name"] == "__main__"
    assert forked["reports"] == "the job's own reports module" and forked["hook"]
    assert forked["env"] == {"PROBE": "x", "CUDA_VISIBLE_DEVICES": "3", "OMP_NUM_THREADS": "1"}
    assert not forked["cuda_initialized"] and forked["threads"] == 1
    assert forked["cmdline"] == fresh["cmdline"] == "python"  # ps shows the job's command, not the launcher's
    for suffix in (".thread", ".atexit"):  # the non-daemon thread joined, then atexit
        assert Path(str(forked_out) + suffix).exists() and Path(str(fresh_out) + suffix).exists()


def test_each_preloaded_rank_draws_its_own_random_numbers(launcher, tmp_path):
    first = run_job(launcher, tmp_path / "a", "preloaded", ("python", "start_probe.py", "{out}"))[0]
    second = run_job(launcher, tmp_path / "b", "preloaded", ("python", "start_probe.py", "{out}"))[0]
    assert first["random"] != second["random"] and first["torch_random"] != second["torch_random"]


@pytest.mark.parametrize("env, same", [
    ({"OMP_NUM_THREADS": "2"}, "threads"),
    ({"OMP_NUM_THREADS": "64"}, "threads"),
    ({"PYTHONFAULTHANDLER": "1"}, "faulthandler"),
    ({"PYTHONDONTWRITEBYTECODE": "1"}, "dont_write_bytecode"),
    ({"TORCH_LOGS": "+dynamo"}, "dynamo_log_level"),
    ({"PYTHONUNBUFFERED": ""}, "stdout"),
    ({"TMPDIR": "/dev/shm"}, "tempdir"),  # a host's own (harness.cluster.forked), not the launcher's
])
def test_environment_read_at_start_is_applied(launcher, tmp_path, env, same):
    runs = both(launcher, tmp_path, ("python", "start_probe.py", "{out}"), env)
    assert runs["preloaded"][0][same] == runs["exec"][0][same]
    assert "exec instead" not in runs["preloaded"][2]


@pytest.mark.parametrize("end, code, says", [
    ("3", 3, None), ("raise", 1, "ValueError: the probe's own error"),
    ("interrupt", -signal.SIGINT, "KeyboardInterrupt"), ("not a number", 1, "invalid literal"),
])
def test_exit_codes_and_tracebacks_are_pythons(launcher, tmp_path, end, code, says):
    runs = both(launcher, tmp_path, ("python", "start_probe.py", "{out}"), {"PROBE_END": end})
    for start in STARTS:
        facts, got, log, _ = runs[start]
        assert got == code, (start, log[-1500:])
        if says:
            assert says in log
    if end == "raise":  # the traceback starts at the script, not in the launcher
        for start in STARTS:
            lines = runs[start][2].splitlines()
            first = lines[lines.index("Traceback (most recent call last):") + 1]
            assert "start_probe.py" in first, (start, first)


def test_data_loader_workers_fork_and_spawn(launcher, tmp_path):
    runs = both(launcher, tmp_path, ("python", "start_probe.py", "{out}", "loader"), within_s=120)
    for start in STARTS:
        facts = runs[start][0]
        assert facts is not None, runs[start][2][-2000:]
        assert facts["loader_fork"] == facts["loader_spawn"] == [[0, 1], [2, 3]], start


def test_python_dash_m_runs_the_module_as_main(launcher, tmp_path):
    runs = both(launcher, tmp_path, ("python", "-m", "probe_module", "{out}"))
    fresh, forked = runs["exec"][0], runs["preloaded"][0]
    assert forked["name"] == fresh["name"] == "__main__"
    assert forked["argv"][0] == fresh["argv"][0] == str(PROBE_DIR / "probe_module.py")
    assert forked["path0"] == fresh["path0"] == str(PROBE_DIR)


@pytest.mark.parametrize("command, env, reason", [
    (("sh", "-c", "echo from sh > {out}"), {}, "is not this Python"),
    (("python", "-O", "start_probe.py", "{out}"), {}, "python option -O"),
    (("python", "start_probe.py", "{out}"), {"PYTHONHASHSEED": "7"}, "PYTHONHASHSEED"),
])
def test_what_a_preloaded_start_cannot_give_is_execd_and_says_why(launcher, tmp_path, command, env, reason):
    facts, code, log, out = run_job(launcher, tmp_path, "preloaded", command, env)
    assert code == 0 and out.exists(), log
    assert "exec instead, as" in log and reason in log


def test_the_step_hook_records_the_start_of_a_preloaded_job(launcher, tmp_path):
    _, code, log, out = run_job(launcher, tmp_path, "preloaded", ("python", "start_probe.py", "{out}"))
    events, _ = read_events(out.parent / "events.jsonl", 0)
    assert code == 0 and [e["kind"] for e in events if e.get("rank") == 0][:1] == ["rank_start"], log


def test_a_preload_that_cannot_be_imported_names_the_field(launcher):
    with pytest.raises(Exception, match="job.preload: importing 'no_such_module_here'"):
        launcher[0].preload(["no_such_module_here"], 60)


# -- which commands a preloaded start gives (harness.cluster.preload.how_to_start) -------------

def plan(argv: list[str], env: dict | None = None, cwd: Path = PROBE_DIR):
    path = f"{Path(sys.executable).parent}{os.pathsep}/usr/bin{os.pathsep}/bin"
    return preload.how_to_start({"argv": argv, "cwd": str(cwd), "env": {**os.environ, "PATH": path, **(env or {})}})


def test_this_python_with_a_script_or_a_module_is_preloaded():
    start = plan(["python", "-u", "-X", "faulthandler", "start_probe.py", "a"])
    assert isinstance(start, preload.Start)
    assert start.script == str(PROBE_DIR / "start_probe.py") and start.args == ("a",)
    assert start.unbuffered and start.faulthandler and start.argv0 == "start_probe.py"
    module = plan(["python", "-m", "probe_module", "x"])
    assert module.module == "probe_module" and module.args == ("x",) and module.script is None


def test_a_script_run_by_this_python_through_its_shebang_is_preloaded(tmp_path):
    script = tmp_path / "tool"
    script.write_text(f"#!{sys.executable}\nprint('hi')\n")
    script.chmod(0o755)
    start = plan([str(script), "--flag"], cwd=tmp_path)
    assert isinstance(start, preload.Start) and start.script == str(script) and start.args == ("--flag",)
    script.write_text(f"#!{sys.executable} -O\nprint('hi')\n")
    assert isinstance(plan([str(script)], cwd=tmp_path), str)


@pytest.mark.parametrize("argv, env, reason", [
    (["python", "-c", "pass"], {}, "python option -c"),
    (["python"], {}, "stdin"),
    (["python", "missing.py"], {}, "not a file"),
    (["no-such-program-here"], {}, "not found"),
    (["python", "start_probe.py"], {"TORCHDYNAMO_VERBOSE": "1"}, "TORCHDYNAMO_VERBOSE"),
    (["python", "start_probe.py"], {"PYTHONOPTIMIZE": "1"}, "PYTHONOPTIMIZE"),
])
def test_what_is_execd_is_named(argv, env, reason):
    why = plan(argv, env)
    assert isinstance(why, str) and reason in why


def test_settings_read_later_or_applied_here_keep_the_preloaded_start():
    env = {"TORCH_NCCL_ASYNC_ERROR_HANDLING": "1", "TORCH_DISTRIBUTED_DEBUG": "DETAIL", "NCCL_DEBUG": "WARN",
           "OMP_NUM_THREADS": "4", "TORCH_LOGS": "+dynamo", "PYTHONUNBUFFERED": "1", "CUDA_VISIBLE_DEVICES": "1"}
    assert isinstance(plan(["python", "start_probe.py"], env), preload.Start)


def test_answers_read_together_are_each_kept_for_their_caller():
    # bring-up asks for the preload before it waits for the launcher's ready: both answers
    # can come in one read, and the second must still be there for start_job (it once was
    # dropped, and the run waited for the preload's answer until PRELOAD_TIMEOUT_S)
    read_end, write_end = os.pipe()
    launcher = Launcher.__new__(Launcher)
    launcher._proc = types.SimpleNamespace(stdout=open(read_end, "rb", buffering=0), poll=lambda: None)
    launcher._buf, launcher._exits, launcher._answers, launcher._ready = b"", [], [], False
    launcher._preloads, launcher.pids = {frozenset(): None}, {}
    os.write(write_end, b'{"ev": "ready", "pid": 1}\n{"ev": "exited", "name": "r000", "pid": 5, "t": 1.0, '
                        b'"exitcode": 0, "signal": null}\n{"ev": "preloaded", "problem": null, "secs": 1.0}\n')
    launcher.wait_ready()
    launcher.preload([], 1)
    assert [m["name"] for m in launcher.exits()] == ["r000"]
    os.close(write_end)
    launcher._proc.stdout.close()


def test_torchruns_workers_fork_from_the_agents_server_and_the_stub_stands_in_for_them(launcher, tmp_path):
    # stub_probe.py plays the agent (preloaded, with its worker server) and starts its
    # workers through the stub as torchrun does (harness.cluster.workers)
    facts, code, log, _ = run_job(launcher, tmp_path, "preloaded", ("python", "stub_probe.py", "{out}"),
                                  {SERVER_ENV: f"chaos-workers-test{os.getpid()}-r000"},
                                  within_s=120, launch={"serve_workers": True})
    assert code == 0 and facts is not None, log[-2000:]
    assert facts["exit"] == 3                                     # the worker's code, from the stub
    assert facts["warm"]                                          # forked from the server
    assert facts["term"] == -signal.SIGTERM and facts["term_worker_gone"]  # forwarded, and died of it
    assert facts["kill_worker_gone"]                              # a SIGKILLed stub takes its worker
    assert facts["worker_killed"] == -signal.SIGKILL              # a SIGKILLed worker: the stub reads as it
    assert not facts["no_server_warm"] and facts["no_server_gone"]  # no server: the stub execs it
