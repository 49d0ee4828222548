"""What takes back the slurm backend's side effects: the run's allocation, cancelled by its
name (`chaos-<run id>`, recorded before it was submitted, so a harness killed before it read
the job's id still leaves a job a heal finds). Kept light: every heal imports it."""
from __future__ import annotations

from typing import Any

from chaos.mechanism import UndoTable
from harness.cluster.slurm import commands


def _cancel_job(args: dict[str, Any]) -> None:
    commands.cancel_named(args["name"])


UNDOS = UndoTable({"slurm_job": _cancel_job})
