"""The undo table and the heal report: what the mechanisms, the injector and heal all speak.

A mechanism writes a ledger entry *before* each side effect; the entry's `op` names an
undo in an `UndoTable` and its `args` carry all the undo needs, so a revert from the live
harness, the dead-man switch and `chaos heal` after a SIGKILL all run the same code. Undos
tolerate only "already gone". Tables are plain values that their owners define (the fault
library's is `chaos.undo.UNDOS`, a backend defines its own) and that are combined
explicitly, refusing an op defined twice; nothing is registered as a side effect of an import.
A leaf: it imports no mechanism and no heal, so that both can import it.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, Callable, Iterator, Mapping, Optional

from chaos.errors import ChaosError, InjectionError
from chaos.ledger import Entry, Ledger

Undo = Callable[[dict[str, Any]], None]
# Finds leftovers only its owner knows how to see (docker's labelled containers), for a heal
# of one run (the id), of dead owners' runs, or of everything (the flag).
Sweep = Callable[[Optional[str], bool, "HealReport", Optional[Path]], object]


@dataclass(frozen=True)
class UndoTable:
    """How to take back what runs made: per ledger op the undo of an entry, and per name a
    sweep for what no ledger names."""

    ops: Mapping[str, Undo]
    sweeps: Mapping[str, Sweep] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "ops", MappingProxyType(dict(self.ops)))
        object.__setattr__(self, "sweeps", MappingProxyType(dict(self.sweeps)))

    @staticmethod
    def combine(tables: Mapping[str, UndoTable]) -> UndoTable:
        """One table from tables named by their owners; an op or sweep two owners define is
        refused (one of them would silently lose)."""
        ops: dict[str, tuple[str, Undo]] = {}
        sweeps: dict[str, tuple[str, Sweep]] = {}
        for owner, table in tables.items():
            for what, merged, own in (("undo op", ops, table.ops), ("sweep", sweeps, table.sweeps)):
                for key, fn in own.items():
                    if key in merged:
                        raise ValueError(f"{what} {key!r} is defined by both {merged[key][0]} and {owner}")
                    merged[key] = (owner, fn)
        return UndoTable({k: fn for k, (_, fn) in ops.items()}, {k: fn for k, (_, fn) in sweeps.items()})

    def revert(self, entry: Entry, ledger: Ledger) -> None:
        """Undo one entry of `ledger` and mark it undone."""
        undo = self.ops.get(entry.op)
        if undo is None:
            raise InjectionError(
                f"{ledger.path}: no undo for {entry.op!r} in this table (a backend's op, and its "
                "table was not given); run `chaos heal`, which takes every backend's undos")
        undo(entry.args)
        ledger.mark(entry, "undone")



@dataclass
class HealReport:
    runs: list[str] = field(default_factory=list)
    undone: list[str] = field(default_factory=list)
    skipped_live: list[str] = field(default_factory=list)
    elsewhere: list[str] = field(default_factory=list)  # runs whose ledger only a heal at its place takes back
    failed: list[str] = field(default_factory=list)  # what could not be undone, and why

    def summary(self) -> str:
        if not self.undone and not self.skipped_live and not self.failed and not self.elsewhere:
            return "nothing to heal"
        parts = [f"healed {len(self.runs)} run(s), {len(self.undone)} item(s) undone"]
        if self.failed:
            parts.append(f"{len(self.failed)} item(s) could not be undone")
        if self.skipped_live:
            parts.append(f"left alone (owner alive): {', '.join(self.skipped_live)}")
        if self.elsewhere:
            parts.append(f"left to a heal where they were made: {', '.join(self.elsewhere)}")
        return "; ".join(parts)

    @contextlib.contextmanager
    def attempt(self, what: str) -> Iterator[None]:
        """Run one undo; a ChaosError is recorded as `what` could not be done, and the heal goes on."""
        try:
            yield
        except ChaosError as exc:
            self.failed.append(f"{what}: {exc}")
