"""A user's job's temporary folder on its host: one per trial and host, made by whatever
forks the host's processes on the machine the folder is on (the netns and local backends'
cluster, a Slurm node's agent), with its own ledger.

What a killed process leaves in its temporary folder (ft_launcher's IPC sockets, a
watchdog's files) then goes with the trial, not into the machine's /tmp: the folder is
recorded before it is made and removed with the rest of the trial's side effects, or by a
heal (the `remove_folder` undo). A job that sets TMPDIR itself keeps its own
(harness.cluster.userjob.launch_command says which).
"""
from __future__ import annotations

import os
import tempfile
from typing import Any

from chaos.ledger import Ledger


class TemporaryFolders:
    """The hosts' folders one ledger made, kept across a host's restarts."""

    def __init__(self, ledger: Ledger, run_id: str) -> None:
        self._ledger = ledger
        self._run_id = run_id
        self._made: dict[str, str] = {}

    def launch(self, host: str, launch: dict[str, Any]) -> dict[str, Any]:
        """`launch` (a job's `exec` entry) with `host`'s folder as its TMPDIR where it asks for one."""
        if not launch.get("own_temporary_folder"):
            return launch
        return {**launch, "env": {**launch["env"], "TMPDIR": self.folder(host)}}

    def folder(self, host: str) -> str:
        """`host`'s folder, made the first time. Its path is short: a Unix socket's is at
        most 107 bytes, and a framework puts its sockets there."""
        if host not in self._made:
            path = os.path.join(tempfile.gettempdir(), f"chaos-{self._run_id}-{host}")
            entry = self._ledger.record("remove_folder", path=path)
            os.mkdir(path, 0o700)
            self._ledger.mark(entry, "done")
            self._made[host] = path
        return self._made[host]
