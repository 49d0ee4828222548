"""What takes back the docker backend's side effects: its undo ops and its heal sweep.

Containers are written to the ledger before they are created (op ``docker_container``),
pauses through the engine before they are made (op ``docker_unpause``); `heal_containers`
finds labelled containers whose ledger was lost. `UNDOS` holds all three as a plain value;
`harness.cluster.backends.undo_table()` combines it with the fault library's for a heal,
a revert and a cluster's teardown. A container names the harness that made it (label
``io.chaos-harness.owner``), so the sweep knows a live run even where its ledger is kept
elsewhere (another `CHAOS_STATE_DIR`) and never removes it from under its owner. Both undos act only on what carries the run's label or
is already gone.
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from chaos.errors import HarnessError
from chaos.heal import owner_alive
from chaos.ledger import Ledger, state_dir
from chaos.undotable import HealReport, UndoTable
from chaos import proc
from harness.cluster.docker.engine import (LABEL_LEDGER, LABEL_OWNER, LABEL_RUN, conflict, engine, not_found,
                                           translated)


def _labelled(container: Any, run_id: str) -> bool:
    return (container.labels or {}).get(LABEL_RUN) == run_id


def _owner_alive(container: Any) -> bool:
    """Whether the harness named by the container's owner label still lives."""
    pid, _, started = (container.labels or {}).get(LABEL_OWNER, "").partition(":")
    return pid.isdigit() and str(proc.start_time(int(pid))) == started


def _ledger_elsewhere(found: list[Any], run_id: str, directory: Path | None) -> str | None:
    """The other folder where the run's ledger still is (its containers are that heal's), or None."""
    here = (directory or state_dir()).resolve()
    for container in found:
        folder = (container.labels or {}).get(LABEL_LEDGER)
        if folder and Path(folder).resolve() != here and (Path(folder) / f"{run_id}.jsonl").exists():
            return folder
    return None


REMOVAL_WAIT_S = 30.0  # another heal's removal of the same container, waited out


def _removal_in_progress(exc: BaseException) -> bool:
    return conflict(exc) and "already in progress" in str(exc)


def _wait_gone(client: Any, name: str) -> None:
    """Until the engine no longer has the container (another heal is removing it: gone only
    then, for this heal's report too)."""
    deadline = time.monotonic() + REMOVAL_WAIT_S
    while True:
        try:
            client.containers.get(name)
        except Exception as exc:
            if not_found(exc):
                return
            raise
        if time.monotonic() > deadline:
            raise HarnessError(f"container {name} is still being removed after {REMOVAL_WAIT_S:g} s; "
                               "run `chaos heal` again")
        time.sleep(0.1)


def undo_container(args: dict[str, Any]) -> None:
    """Remove the container (killing it first); only if it carries the run's label."""
    client = engine(args.get("engine"))
    try:
        try:
            container = client.containers.get(args["name"])
        except Exception as exc:
            if not_found(exc):
                return
            raise
        if not _labelled(container, args["run_id"]):
            return  # a foreign container took the name: not ours to remove
        with translated(f"remove container {args['name']}"):
            try:
                container.remove(force=True, v=True)
            except Exception as exc:
                if not_found(exc):
                    return
                if not _removal_in_progress(exc):
                    raise
                _wait_gone(client, args["name"])
    finally:
        client.close()


def undo_pause(args: dict[str, Any]) -> None:
    client = engine(args.get("engine"))
    try:
        with translated(f"unpause {args['name']}"):
            try:
                client.api.unpause(args["name"])
            except Exception as exc:
                if not (not_found(exc) or conflict(exc)):  # gone, or not paused any more
                    raise
    finally:
        client.close()


def heal_containers(run_id: str | None = None, everything: bool = False,
                    report: HealReport | None = None, directory: Path | None = None) -> HealReport:
    """Remove containers labelled with a run id: one run, or those whose owner is dead (and
    whose ledger is not kept in another folder, whose heal they are), or all.

    The ledger path (`chaos.heal.heal` with `UNDOS` in its table) covers what a run
    recorded; this finds what a lost or torn ledger no longer names. Without an engine it
    finds nothing and returns the report as it was.
    """
    report = report or HealReport()
    try:
        client = engine()
    except HarnessError:
        return report  # no engine (or no SDK) here: no container can be running or found
    try:
        with translated("list labelled containers"):
            filters = {"label": f"{LABEL_RUN}={run_id}" if run_id else LABEL_RUN}
            containers = client.containers.list(all=True, filters=filters)
        by_run: dict[str, list[Any]] = {}
        for c in containers:
            by_run.setdefault(c.labels[LABEL_RUN], []).append(c)
        for rid, found in sorted(by_run.items()):
            if run_id is None and not everything and (
                    owner_alive(Ledger(rid, directory)) or any(_owner_alive(c) for c in found)):
                if rid not in report.skipped_live:
                    report.skipped_live.append(rid)
                continue
            if run_id is None and not everything and (folder := _ledger_elsewhere(found, rid, directory)):
                report.elsewhere.append(f"{rid} (its ledger in {folder})")
                continue
            for c in found:
                undo_container({"name": c.name, "run_id": rid})
                report.undone.append(f"docker container {c.name}")
            if rid not in report.runs:
                report.runs.append(rid)
    finally:
        client.close()
    return report


UNDOS = UndoTable({"docker_container": undo_container, "docker_unpause": undo_pause},
                  sweeps={"docker containers": heal_containers})
