"""Heal: undo what runs left behind, from their ledgers and from the system itself.

Everything a run makes is named after it (namespaces ``chaos-<run>-*``), so a heal finds
leftovers even where a ledger was lost. A run whose owner process is still alive is left
alone unless named explicitly. Idempotent: healing twice is the same as healing once.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from chaos import netlink, proc
from chaos.inject import undo_outstanding
from chaos.ledger import Ledger, ledger_run_ids

NAMESPACE_PREFIX = "chaos-"


def namespace_name(run_id: str, host: str) -> str:
    return f"{NAMESPACE_PREFIX}{run_id}-{host}"


@dataclass
class HealReport:
    runs: list[str] = field(default_factory=list)
    undone: list[str] = field(default_factory=list)
    skipped_live: list[str] = field(default_factory=list)

    def summary(self) -> str:
        if not self.undone and not self.skipped_live:
            return "nothing to heal"
        parts = [f"healed {len(self.runs)} run(s), {len(self.undone)} item(s) undone"]
        if self.skipped_live:
            parts.append(f"left alone (owner alive): {', '.join(self.skipped_live)}")
        return "; ".join(parts)


def owner_alive(ledger: Ledger) -> bool:
    for entry in ledger.entries():
        if entry.op == "owner":
            return proc.start_time(entry.args["pid"]) == entry.args["started"]
    return False


def _namespaced_runs() -> set[str]:
    runs = set()
    for name in netlink.list_namespaces():
        if name.startswith(NAMESPACE_PREFIX) and name.count("-") >= 2:
            runs.add(name.split("-")[1])
    return runs


def heal_run(run_id: str, report: HealReport, directory: Path | None = None) -> None:
    ledger = Ledger(run_id, directory)
    report.undone += [f"{e.op} {e.args}" for e in undo_outstanding(ledger) if e.op != "owner"]
    for name in netlink.list_namespaces():
        if name.startswith(namespace_name(run_id, "")):
            netlink.remove_namespace(name)
            report.undone.append(f"netns {name}")
    ledger.close_if_clean()
    report.runs.append(run_id)


def heal(run_id: str | None = None, everything: bool = False,
         directory: Path | None = None) -> HealReport:
    """Heal one run (`run_id`), or every run whose owner is dead (default), or all (`everything`)."""
    report = HealReport()
    candidates = [run_id] if run_id else sorted(set(ledger_run_ids(directory)) | _namespaced_runs())
    for rid in candidates:
        if run_id is None and not everything and owner_alive(Ledger(rid, directory)):
            report.skipped_live.append(rid)
            continue
        heal_run(rid, report, directory)
    return report
