"""Heal: undo what runs left behind, from their ledgers and from the system itself.

Everything a run makes is named after it (namespaces ``chaos-<run>-*``, see
`chaos.topology`; the capability probe's ``chaos-probe<pid>-x`` has a ledger of its own,
run ``probe<pid>``), so a heal finds leftovers even where a ledger was lost. A run whose
owner process is still alive is left alone unless named explicitly. An undo that fails
(a docker ledger while the engine is down) is reported in `HealReport.failed` and the heal
carries on: one stale ledger never blocks the rest, nor a run of another backend.
Idempotent: healing twice is the same as healing once. A heal runs the undo table it is given (`chaos.undotable.UndoTable`):
its ops undo the ledgers, its sweeps find what only a backend can see. This package knows
only its own table (`chaos.undo.UNDOS`); whoever runs backends passes theirs with it.
"""
from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path

from chaos import netlink, proc
from chaos.errors import ChaosError
from chaos.undo import STOP_GRACE_S, UNDOS
from chaos.ledger import Ledger, ledger_run_ids
from chaos.undotable import HealReport, UndoTable
from chaos.topology import NAMESPACE_PREFIX, namespace_name


def owner_alive(ledger: Ledger) -> bool:
    """Whether any process the ledger names as its owner lives (a run's harness; a local
    Slurm cluster's controller, which outlives the command that built it)."""
    return any(proc.start_time(entry.args["pid"]) == entry.args["started"]
               for entry in ledger.entries() if entry.op == "owner")


def owner_place(ledger: Ledger) -> str | None:
    """Where the ledger's entries mean what they say (`chaos.undo.record_owner`); None: anywhere
    on this machine."""
    return next((entry.args.get("place") for entry in ledger.entries() if entry.op == "owner"), None)


def _namespaced_runs() -> set[str]:
    runs = set()
    for name in netlink.list_namespaces():
        if name.startswith(NAMESPACE_PREFIX) and name.count("-") >= 2:
            runs.add(name.split("-")[1])
    return runs


def heal_run(run_id: str, report: HealReport, undos: UndoTable, directory: Path | None = None) -> None:
    """Undo the run's ledger; then what the system itself shows: its helper processes (a
    delayer or dead-man switch can start before its ledger entry is written), processes
    still in its namespaces, and the namespaces (with every qdisc, filter and rule
    in them). Each undo that fails is reported and the rest still run; the ledger stays
    while any of its entries is outstanding."""
    prefix = namespace_name(run_id, "")
    # the namespaces' identities before the ledger's undo removes their names: a process in
    # one keeps it alive, nameless
    inodes = netlink.namespace_inodes([name for name in netlink.list_namespaces() if name.startswith(prefix)])
    ledger = Ledger(run_id, directory)
    for entry in ledger.outstanding():
        with report.attempt(f"run {run_id}: {entry.op} {entry.args}"):
            undos.revert(entry, ledger)
            if entry.op != "owner":
                report.undone.append(f"{entry.op} {entry.args}")
    for pid in proc.helpers_of_run(run_id):
        proc.stop(pid, proc.start_time(pid), STOP_GRACE_S)
        report.undone.append(f"helper process {pid}")
    # What still runs in them is the dead run's: a rank's own children (torchrun's workers,
    # a job's data loaders) do not inherit the launcher's death signal. SIGKILL ends a
    # stopped process too.
    for pid, started in proc.in_namespaces(inodes):
        if proc.send_signal(pid, signal.SIGKILL, started, gone_ok=True):
            report.undone.append(f"process {pid} in the run's namespaces")
    namespaces = [name for name in netlink.list_namespaces() if name.startswith(prefix)]
    for name in namespaces:
        with report.attempt(f"run {run_id}: netns {name}"):
            netlink.remove_namespace(name)
            report.undone.append(f"netns {name}")
    ledger.close_if_clean()
    report.runs.append(run_id)


def heal(undos: UndoTable, run_id: str | None = None, everything: bool = False,
         directory: Path | None = None, place: str | None = None) -> HealReport:
    """Heal one run (`run_id`); or every run with a ledger here whose owner is dead (the
    default, safe beside live runs and beside runs that keep their ledgers elsewhere); or
    with `everything`, every run, also those found only by their namespaces' names. Then
    each sweep of `undos` looks for the same runs' leftovers that no ledger names. A ledger
    made at another place than this heal's (a Slurm node's, in a state folder the machine
    shares) is left to the heal there, whatever was asked: its entries would act here."""
    report = HealReport()
    if run_id:
        candidates = [run_id]
    elif everything:
        candidates = sorted(set(ledger_run_ids(directory)) | _namespaced_runs())
    else:
        candidates = ledger_run_ids(directory)
    for rid in candidates:
        ledger = Ledger(rid, directory)
        if ledger.path.exists():
            if (where := owner_place(ledger)) != place:
                report.elsewhere.append(f"{rid} ({where or 'this machine'})")
                continue
        elif run_id is None and not everything:
            continue  # taken back since it was listed (a Slurm run's heal takes its nodes' too)
        if run_id is None and not everything and owner_alive(ledger):
            report.skipped_live.append(rid)
            continue
        heal_run(rid, report, undos, directory)
    for name, sweep in undos.sweeps.items():
        with report.attempt(f"sweep {name}"):
            sweep(run_id, everything, report, directory)
    return report


def add_heal_arguments(parser: argparse.ArgumentParser) -> None:
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--run-id", help="heal this run, even if its owner still lives")
    which.add_argument("--all", action="store_true",
                       help="heal every run, also those known only by their namespaces' names")


def heal_command(args: argparse.Namespace, undos: UndoTable) -> int:
    """`chaos heal [--run-id ID | --all]`: remove what runs left behind; idempotent. Exits 1,
    naming each, when something could not be undone (run it again once the cause is fixed)."""
    try:
        report = heal(undos, args.run_id, everything=args.all)
    except ChaosError as exc:
        print(f"chaos heal: {exc}", file=sys.stderr)
        return 1
    print(report.summary())
    for item in report.undone:
        print(f"  {item}")
    for item in report.failed:
        print(f"chaos heal: could not undo {item}", file=sys.stderr)
    return 1 if report.failed else 0


def heal_main(argv: list[str] | None = None, undos: UndoTable = UNDOS) -> int:
    """`chaos heal` with `undos`: by default the fault library's own (chaos imports no
    backend); pass `harness.cluster.backends.undo_table()` to heal what backends made too."""
    parser = argparse.ArgumentParser(prog="chaos heal", description=heal_command.__doc__)
    add_heal_arguments(parser)
    return heal_command(parser.parse_args(argv), undos)
