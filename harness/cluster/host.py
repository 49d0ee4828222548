"""What the project has on this host now, and what a session added that nobody else owns.

Everything a run makes carries its run id: namespaces ``chaos-<run>-*`` (the probe's
``chaos-probe<pid>-x``), ledgers ``<state dir>/<run>.jsonl``, containers labelled
``io.chaos-harness.run=<run>``, helper processes ``python -m chaos.nfq|chaos.deadman
--run-id <run>``; the rank launcher and the harness's own processes are found by their
module. The test session's fixture (tests/conftest.py) and bench/harness_kill.py take a
`snapshot` first and later ask `left_since` what was added that is theirs: a run whose
ledger names one of their own processes as owner, or a dead owner and the run is one they
know (`runs`: the run ids of their run folders, their own ledgers' directories), a
container whose owner label names one of their processes, a process that descends from
them. What cannot be told to be theirs is left alone: it may be a run of someone else on
the same host (another `chaos run`, or CI, which heals its own).
"""
from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

from chaos import netlink, proc
from chaos.heal import heal
from chaos.undotable import HealReport
from chaos.ledger import Ledger, ledger_run_ids
from chaos.topology import NAMESPACE_PREFIX
from harness.cluster.undos import undo_table

PROCESS_MODULES = ("harness.cluster.zygote", "harness.cli", "harness.cluster.container", "harness.cluster.slurm.agent",
                   *proc.HELPER_MODULES)


@dataclass(frozen=True)
class Item:
    """One thing of the project on the host: `kind` netns | ledger | container | process."""

    kind: str
    name: str
    run_id: str | None = None
    pid: int | None = None
    started: int | None = None

    def __str__(self) -> str:
        return f"{self.kind} {self.name}"


def _argv(pid: int) -> list[str]:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
    except OSError:
        return []


def _ppid(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


def descends_from(pid: int, ancestor: int) -> bool:
    while pid > 1:
        if pid == ancestor:
            return True
        pid = _ppid(pid) or 0
    return False


def _processes() -> list[Item]:
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        argv = _argv(int(entry))
        if argv[1:2] and os.path.basename(argv[1]) == "chaos":  # the console script
            module: str | None = "harness.cli"
        else:
            module = argv[argv.index("-m") + 1] if "-m" in argv[:-1] else None
        if module in PROCESS_MODULES:
            run_id = argv[argv.index("--run-id") + 1] if "--run-id" in argv[:-1] else None
            found.append(Item("process", f"{entry} {module}", run_id, int(entry), proc.start_time(int(entry))))
    return found


def _containers() -> list[Item]:
    try:
        import docker  # noqa: F401  (without the SDK no run of this install made a container)
    except ImportError:
        return []
    from chaos.errors import HarnessError
    from harness.cluster.docker.engine import LABEL_OWNER, LABEL_RUN, engine
    try:
        client = engine()
    except HarnessError:
        return []  # no engine: no container can be running
    try:
        found = []
        for c in client.containers.list(all=True, filters={"label": LABEL_RUN}):
            pid, _, started = c.labels.get(LABEL_OWNER, "").partition(":")
            found.append(Item("container", c.name, c.labels.get(LABEL_RUN),
                              int(pid) if pid.isdigit() else None, int(started) if started.isdigit() else None))
        return found
    finally:
        client.close()


def snapshot() -> frozenset[Item]:
    """Every namespace, ledger, container and process of the project on this host now."""
    items = [Item("netns", n, n[len(NAMESPACE_PREFIX):].rsplit("-", 1)[0])
             for n in netlink.list_namespaces() if n.startswith(NAMESPACE_PREFIX)]
    items += [Item("ledger", rid, rid) for rid in ledger_run_ids()]
    return frozenset(items + _containers() + _processes())


def _owner(ledger: Ledger) -> int | None:
    """The live owner named by `ledger`, if any."""
    for entry in ledger.entries():
        if entry.op == "owner" and proc.start_time(entry.args["pid"]) == entry.args["started"]:
            return int(entry.args["pid"])
    return None


def _ours(item: Item, me: int, runs: Mapping[str, Path | None]) -> bool:
    if item.kind == "process" and item.run_id is None:
        return item.pid is not None and descends_from(item.pid, me)
    if item.kind == "container" and item.pid is not None and proc.start_time(item.pid) == item.started:
        return descends_from(item.pid, me)  # its harness lives: ours only if we started it
    assert item.run_id is not None
    owner = _owner(Ledger(item.run_id, runs.get(item.run_id)))
    return descends_from(owner, me) if owner is not None else item.run_id in runs


def left_since(before: frozenset[Item], me: int | None = None,
               runs: Mapping[str, Path | None] | None = None) -> list[Item]:
    """What was added since `before` that belongs to `me` (default this process): its live
    runs, and the dead ones among `runs` (run id -> its ledger's directory, None for the
    state directory)."""
    me = os.getpid() if me is None else me
    return [item for item in sorted(snapshot() - before, key=str) if _ours(item, me, runs or {})]


def runs_under(folder: Path) -> dict[str, Path | None]:
    """Run id -> ledger directory of every run whose folder (trial.json) or ledger lies under
    `folder` (a test session's temp root, a bench's output)."""
    runs: dict[str, Path | None] = {}
    for trial in folder.rglob("trial.json"):
        with contextlib.suppress(OSError, ValueError, KeyError):
            runs[json.loads(trial.read_text())["run_id"]] = None
    runs.update({p.stem: p.parent for p in folder.rglob("*.jsonl") if p.name != "events.jsonl"})
    return runs


def end_process(child: subprocess.Popen, signum: int, grace_s: float) -> None:
    """Ask `child` to stop with `signum`, SIGKILL it if it has not within `grace_s`, reap it."""
    if child.poll() is None:
        child.send_signal(signum)
        try:
            child.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()


def remove(items: list[Item], runs: Mapping[str, Path | None] | None = None) -> HealReport:
    """SIGKILL the processes among `items` (still the same processes), then heal each of
    their runs by id (its ledger's directory from `runs`, else the state directory); returns the
    heal's report (its `failed` says what could not go)."""
    for item in items:
        if item.kind == "process" and item.pid is not None and item.run_id is None:
            proc.send_signal(item.pid, signal.SIGKILL, item.started, gone_ok=True)
            proc.reap(item.pid, proc.KILLED_WITHIN_S)
    report = HealReport()
    undos = undo_table()
    for run_id in sorted({i.run_id for i in items if i.run_id}):
        healed = heal(undos, run_id, directory=(runs or {}).get(run_id))
        for name in ("runs", "undone", "failed"):
            getattr(report, name).extend(getattr(healed, name))
    return report
