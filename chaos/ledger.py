"""The on-disk ledger: every side effect is written here before it happens.

One JSON-lines file per run under the state directory (``/run/chaos-harness`` by default,
``CHAOS_STATE_DIR`` to change it; /run is a tmpfs, cleared at boot like the namespaces it
describes). A line is appended with ``state: "recorded"`` before an action, then
``"done"`` once the kernel acknowledged it and ``"undone"`` once it was reverted. Each
entry carries everything its undo needs, so `chaos heal` can revert it from the file alone
after the harness was killed with SIGKILL.
"""
from __future__ import annotations

import json
import os
import stat
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

from chaos.errors import ChaosError

STATE_DIR_ENV = "CHAOS_STATE_DIR"
DEFAULT_STATE_DIR = "/run/chaos-harness"


def state_dir() -> Path:
    """``CHAOS_STATE_DIR``; else root's ``/run/chaos-harness``; else the user's own, as
    cleared at boot: ``$XDG_RUNTIME_DIR/chaos-harness``, or ``/tmp/chaos-harness-<uid>``
    (a heal as that user heals that user's runs)."""
    if STATE_DIR_ENV in os.environ:
        return Path(os.environ[STATE_DIR_ENV])
    uid = os.geteuid()
    if uid == 0:
        return Path(DEFAULT_STATE_DIR)
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime and os.path.isdir(runtime) and os.stat(runtime).st_uid == uid:
        return Path(runtime) / "chaos-harness"
    return Path(tempfile.gettempdir()) / f"chaos-harness-{uid}"


def make_state_dir(directory: Path | None = None) -> Path:
    """The state folder (`state_dir()` unless given), made where it is missing. Anyone may
    pass through it but not list it: a local Slurm cluster's folder inside is for its users
    (`chaos slurm up`), while each ledger is its owner's alone (0600). Made 0711 by chmod,
    so that no umask decides; one of this user's made before gets the search bits only."""
    folder = directory or state_dir()
    try:
        folder.mkdir(parents=True)
        folder.chmod(0o711)
    except FileExistsError:
        info = folder.stat()
        if info.st_uid == os.geteuid() and info.st_mode & 0o111 != 0o111:
            folder.chmod(stat.S_IMODE(info.st_mode) | 0o111)
    return folder


@dataclass(frozen=True)
class Entry:
    """One recorded side effect: `op` names the undo (see `chaos.undotable.UndoTable`), `args` feed it."""

    id: int
    run_id: str
    op: str
    args: dict[str, Any]
    state: str = "recorded"  # recorded -> done -> undone
    t: float = field(default=0.0)


class Ledger:
    """Append-only record of one run's side effects. Safe to use from one process."""

    def __init__(self, run_id: str, directory: Path | None = None) -> None:
        self.run_id = run_id
        self.path = make_state_dir(directory) / f"{run_id}.jsonl"
        if os.geteuid() != 0 and self.path.parent.stat().st_uid != os.geteuid():
            # another user's folder (a /tmp/chaos-harness-<uid> made first by someone else)
            raise ChaosError(f"{self.path.parent} belongs to another user; remove it, or set "
                             f"{STATE_DIR_ENV} to a folder of your own")
        self._next_id = 1 + max((e.id for e in self.entries()), default=0)

    def _append(self, record: dict[str, Any]) -> None:
        line = json.dumps(record, separators=(",", ":")) + "\n"
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(fd, line.encode())
            os.fsync(fd)
        finally:
            os.close(fd)

    def record(self, op: str, **args: Any) -> Entry:
        """Write the intent before acting; returns the entry to mark done/undone later."""
        entry = Entry(self._next_id, self.run_id, op, args, "recorded", time.monotonic())
        self._next_id += 1
        self._append({"id": entry.id, "run_id": self.run_id, "op": op, "args": args,
                      "state": "recorded", "t": entry.t})
        return entry

    def mark(self, entry: Entry, state: str) -> None:
        self._append({"id": entry.id, "state": state, "t": time.monotonic()})

    def entries(self) -> list[Entry]:
        """Entries folded to their latest state, in the order they were recorded."""
        return list(read_entries(self.path))

    def outstanding(self) -> list[Entry]:
        """Entries not yet undone, last-in first."""
        return [e for e in reversed(self.entries()) if e.state != "undone"]

    def close_if_clean(self) -> bool:
        """Remove the file once every entry is undone; returns whether it was removed."""
        if self.outstanding():
            return False
        self.path.unlink(missing_ok=True)
        return True


def read_entries(path: Path) -> Iterator[Entry]:
    by_id: dict[int, Entry] = {}
    try:
        lines = path.read_text().splitlines()
    except FileNotFoundError:
        return iter(())
    for line in lines:
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            continue  # a torn last line from a SIGKILL mid-write
        if "op" in rec:
            by_id[rec["id"]] = Entry(rec["id"], rec["run_id"], rec["op"], rec["args"],
                                     rec["state"], rec["t"])
        elif rec.get("id") in by_id:
            old = by_id[rec["id"]]
            by_id[rec["id"]] = Entry(old.id, old.run_id, old.op, old.args, rec["state"], rec["t"])
    return iter(sorted(by_id.values(), key=lambda e: e.id))


def ledger_run_ids(directory: Path | None = None) -> list[str]:
    d = directory or state_dir()
    return sorted(p.stem for p in d.glob("*.jsonl")) if d.is_dir() else []
