"""Running a night's cells: one run folder each, the manifest after every cell, one progress
line with the ETA; then the night's history rows, files and gate (reports.nightly)."""
from __future__ import annotations

import dataclasses
import threading
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from pathlib import Path
from typing import Any, Callable

from harness.studies.nightly.folder import RUNS, Done, Manifest, write_manifest
from harness.studies.nightly.plan import CampaignCell, Cell
from harness.trial.progress import Progress, duration_text

# (cell, runs folder) -> the run folder it made (a campaign cell: its campaign folder)
CellRunner = Callable[[Cell | CampaignCell, Path], Path]


class NightProgress:
    """The night's one progress line: trials done of the total, elapsed and ETA. The ETA is
    this invocation's seconds per trial times the trials left (unknown before the first cell)."""

    def __init__(self, progress: Progress, total: int, done: int, clock: Callable[[], float],
                 label: str = "nightly") -> None:
        self.progress = progress
        self.label = label
        self.total = total
        self.done = done
        self.resumed = done
        self.clock = clock
        self.start = clock()

    def eta_s(self) -> float | None:
        ran = self.done - self.resumed
        if not ran:
            return None
        return (self.clock() - self.start) / ran * (self.total - self.done)

    def line(self, text: str) -> str:
        eta = self.eta_s()
        return (f"{self.done}/{self.total} trials  elapsed {duration_text(self.clock() - self.start)}  "
                f"ETA {'?' if eta is None else duration_text(eta)}  {text}")

    def show(self, text: str) -> None:
        self.progress.phase(self.label, self.line(text))


def _cell_text(cell: Cell | CampaignCell) -> str:
    if isinstance(cell, CampaignCell):
        return f"campaign of {cell.scenario.name} ({', '.join(cell.policies)}, {cell.campaign.duration_s:g} s each)"
    return f"{cell.scenario.name} repeat {cell.repeat} ({', '.join(cell.policies)})"


def run_cells(night_dir: Path, manifest: Manifest, cells: tuple[Cell | CampaignCell, ...], run_cell: CellRunner,
              progress: NightProgress, clock: Callable[[], float], last: bool = True,
              parallel: int = 1) -> Manifest:
    """Run every cell not done yet, `parallel` at once (each on hosts of its own: a
    scheduler's allocations); the manifest is rewritten after each cell ends, in the order
    they end (`last`: these are the plan's last cells, and the progress line says the
    matrix is done)."""
    todo = [cell for cell in cells if cell.key not in manifest.keys()]
    lock = threading.Lock()
    running: dict[str, Cell | CampaignCell] = {}

    def one(cell: Cell | CampaignCell) -> Done:
        with lock:
            running[cell.key] = cell
            progress.show(f"running {' | '.join(_cell_text(c) for c in running.values())}")
        started = clock()
        try:
            run_dir = run_cell(cell, night_dir / RUNS)
        finally:
            with lock:
                running.pop(cell.key)
        return Done(cell.key, cell.repeat, str(run_dir.relative_to(night_dir)), cell.trials,
                    round(clock() - started, 3), cell.kind)

    def record(done: Done) -> None:
        nonlocal manifest
        with lock:
            manifest = dataclasses.replace(manifest, done=(*manifest.done, done))
            write_manifest(night_dir, manifest)
            progress.done += done.trials

    if parallel <= 1:
        for cell in todo:
            record(one(cell))
    else:
        # A stop (Ctrl-C, SIGTERM) reaches every cell's trial through signals.check, which
        # ends it the way it ends a lone one; the pool waits for them before it raises.
        with ThreadPoolExecutor(max_workers=parallel, thread_name_prefix="cell") as pool:
            pending: set[Future[Done]] = {pool.submit(one, cell) for cell in todo}
            try:
                while pending:
                    finished, pending = wait(pending, timeout=1.0, return_when=FIRST_COMPLETED)
                    for future in finished:
                        record(future.result())
            finally:
                for future in pending:
                    future.cancel()
    if last:
        progress.show("matrix done")
    return manifest


def campaign_bars(cells: tuple[Cell | CampaignCell, ...]) -> dict[str, tuple[str, str, dict[str, Any]]]:
    """Each campaign cell's key -> (its scenario's name, its command, policy -> its
    reports.nightly.EttrBar): what finish_night judges its campaign folder by."""
    from reports.nightly import EttrBar

    return {cell.key: (cell.scenario.name, cell.command,
                       {policy: EttrBar(gate.ettr_at_least, gate.ettr_of_reference_at_least)
                        for policy, gate in cell.gate.items()})
            for cell in cells if isinstance(cell, CampaignCell)}


def finish_night(night_dir: Path, manifest: Manifest, history_db: Path, seed: int,
                 campaigns: dict[str, tuple[str, str, dict[str, Any]]] | None = None) -> Any:
    """Append the night to the history (one transaction), write its files, mark it finished;
    returns the reports.nightly.NightReport. `campaigns` (campaign_bars) says how to judge
    each campaign cell of the manifest."""
    import numpy as np

    import reports
    from reports.nightly import (NightInfo, NightRun, append_night, campaign_trials, night_history, night_report,
                                 read_history, write_night_files)
    from runfolder.info import read_run_info

    def night_run(done: Done) -> Any:
        if done.kind == CampaignCell.kind:
            scenario, command, bars = (campaigns or {})[done.key]
            return NightRun(done.repeat, command, campaign_trials(night_dir / done.run, scenario, bars))
        return NightRun(done.repeat, read_run_info(night_dir / done.run).command,
                        reports.analyze_run(night_dir / done.run))

    runs = [night_run(d) for d in manifest.done]
    append_night(history_db, night_history(NightInfo(**manifest.info), runs))
    history = read_history(history_db)
    report = night_report(history, manifest.night, np.random.default_rng(seed))
    write_night_files(night_dir, history, report)
    write_manifest(night_dir, dataclasses.replace(manifest, finished=True))
    return report
