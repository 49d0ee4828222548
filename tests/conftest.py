"""Markers for privileged tests: each skips, saying why, where the capability is missing.
CI runs as root with a Docker engine, so there they run.

`host_left_clean` (session-wide, automatic): the run fails when the session left anything
of a run on the host (namespaces, ledgers, containers, project processes, any process the
tests started that still lives, torchrun's own log folders in /tmp), and what was left is
removed. Things of runs whose
live owner is not this session (CI beside us), or whose owner is dead and whose run
folder or ledger is not under this session's temp folder, are not ours and are left
alone (`harness.cluster.host`). `stop_child` ends a helper harness a test started, whatever
happens."""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
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
    "requires_uml": (lambda: shutil.which("linux.uml") is not None,
                     "needs User-Mode Linux (apt-get install user-mode-linux kmod)"),
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


def _descendants(me: int) -> list[str]:
    from chaos import proc
    from harness.cluster.host import descends_from
    return [f"process {pid} (started by the tests, state {proc.state(pid)}): {_command_line(pid)}"
            for pid in (int(e) for e in os.listdir("/proc") if e.isdigit())
            if pid != me and descends_from(pid, me)]


def _command_line(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return " ".join(a.decode(errors="replace") for a in f.read().split(b"\0") if a)[:300]
    except OSError:
        return "(gone)"


@pytest.fixture(scope="session", autouse=True)
def host_left_clean(tmp_path_factory: pytest.TempPathFactory):
    """Fail the session if it left anything of a run on the host; remove it either way."""
    from harness.cluster import host
    before = host.snapshot()
    torch_logs = set(_torchrun_log_dirs())
    yield
    me = os.getpid()
    strays = _descendants(me)
    for item in strays:
        proc_kill(int(item.split()[1]))
    runs = host.runs_under(tmp_path_factory.getbasetemp())  # the tests' run folders and ledgers
    left = host.left_since(before, me, runs)
    report = host.remove(left, runs)
    # torchrun run without --log-dir makes a folder of its own in /tmp and never removes it
    stray_logs = sorted(set(_torchrun_log_dirs()) - torch_logs)
    for folder in stray_logs:
        shutil.rmtree(folder, ignore_errors=True)
    problems = (strays + [str(i) for i in left] + [f"could not remove: {f}" for f in report.failed]
                + [f"torchrun's log folder {f} (give it --log-dir)" for f in stray_logs])
    if problems:
        pytest.fail("the test session left this behind (now removed):\n  " + "\n  ".join(problems))


def _torchrun_log_dirs() -> list[str]:
    return [str(p) for p in Path(tempfile.gettempdir()).glob("torchelastic_*")]


def proc_kill(pid: int) -> None:
    from chaos import proc
    proc.send_signal(pid, signal.SIGKILL, proc.start_time(pid), gone_ok=True)
    proc.reap(pid, proc.KILLED_WITHIN_S)


def stop_child(child: subprocess.Popen, grace_s: float = 30.0, run_id: str | None = None) -> None:
    """End a helper harness a test started: SIGINT (it cleans up on its way out), SIGKILL at
    the deadline, then a heal of `run_id`; never raises for a child already gone."""
    from harness.cluster.host import end_process
    end_process(child, signal.SIGINT, grace_s)
    if run_id is not None:
        from chaos.heal import heal
        from harness.cluster.backends import undo_table
        heal(undo_table(), run_id)


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


# the console script pip installed beside this interpreter, as a user runs it
CHAOS = str(Path(sys.executable).parent / "chaos")


def chaos_cli(*args: str, **kwargs) -> subprocess.CompletedProcess:
    """Run the installed `chaos` command as a user would."""
    kwargs.setdefault("cwd", REPO)
    return subprocess.run([CHAOS, *args], capture_output=True, text=True, **kwargs)


# -- an ordinary user (uid 65534), for the no-root paths ----------------------------------

NOBODY = 65534


@pytest.fixture
def user_dir():
    """A folder of uid 65534's own (pytest's temporary folders are root's, mode 700)."""
    folder = Path(tempfile.mkdtemp(prefix="chaos-local-test-"))
    os.chown(folder, NOBODY, NOBODY)
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def as_nobody(folder: Path, *args: str, **kwargs) -> subprocess.Popen | subprocess.CompletedProcess:
    """`chaos ARGS` (with python=True: `python ARGS`) as uid 65534, with its state folder
    (ledgers) in `folder`."""
    program = str(Path(sys.executable).parent / "python") if kwargs.pop("python", False) else CHAOS
    argv = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", program, *args]
    env = {**os.environ, "HOME": str(folder), "USER": "nobody", "CHAOS_STATE_DIR": str(folder / "state")}
    if kwargs.pop("background", False):
        return subprocess.Popen(argv, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                text=True, start_new_session=True)
    return subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, **kwargs)


def processes_of(uid: int, folder: Path) -> list[str]:
    """The live processes of `uid` started for `folder` (their environment names it: an
    `as_nobody` command's state folder), not zombies (a killed harness's child awaits its
    reaper); other processes of that user (another test session, a daemon) are not ours."""
    found = []
    for entry in os.listdir("/proc"):
        try:
            if entry.isdigit() and os.stat(f"/proc/{entry}").st_uid == uid \
                    and Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z" \
                    and str(folder).encode() in Path(f"/proc/{entry}/environ").read_bytes():
                found.append(f"{entry} {Path(f'/proc/{entry}/cmdline').read_bytes()[:120]!r}")
        except (OSError, IndexError):
            continue
    return found
