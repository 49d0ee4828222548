"""`chaos report RUN_DIR... [--out DIR]`: re-analyze stored runs and write their reports.

Exit status: 0 written; 2 bad input (usage, a folder that is not a run folder), with one
line on stderr; 1 the reports could not be written (e.g. a read-only stored run: use --out).
A run that did not finish is reported first as INCOMPLETE, naming where each trial ended
and the trials that never began.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from reports.analysis import incomplete_text, run_frame, run_label
from reports.history import RunRecord, load_run
from reports.tables import format_table
from reports.writer import compare_markdown, write_run_reports
from runfolder.info import RunFolderError
from runfolder.layout import COMPARE_FILE, REPORT_HTML

PROG = "chaos report"


class _UsageError(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        raise _UsageError(message)  # one line, not argparse's usage block


def add_report_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("runs", nargs="+", type=Path, metavar="RUN_DIR", help="a run folder (has run.json)")
    parser.add_argument("--out", type=Path, help="write here instead of into each run folder "
                        "(one sub-folder per run when there are several)")


DESCRIPTION = ("Re-analyze stored runs: metrics.csv, report.md, report.html and timeline plots; "
               "print the comparison table.")


def _out_dir(run: RunRecord, out: Path | None, several: bool) -> Path:
    if out is None:
        return run.path
    return out / run.path.name if several else out


def report_main(argv: list[str]) -> int:
    parser = _Parser(prog=PROG, description=DESCRIPTION)
    add_report_arguments(parser)
    try:
        args = parser.parse_args(argv)
    except _UsageError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    except SystemExit as exc:  # --help
        return int(exc.code or 0)
    return report_command(args)


def report_command(args: argparse.Namespace) -> int:
    try:
        runs = [load_run(path) for path in args.runs]  # all checked before anything is written
    except RunFolderError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    several = len(runs) > 1
    analyzed = [(run, run_frame(run)) for run in runs]
    try:
        for run, frame in analyzed:
            out = _out_dir(run, args.out, several)
            out.mkdir(parents=True, exist_ok=True)
            written = write_run_reports(run, frame, out)
            print(f"## {run_label(run)}\n\n{incomplete_text(run, frame)}{format_table(frame)}\n\n"
                  f"wrote {written[REPORT_HTML]}\n")
        if several:
            comparison = compare_markdown(analyzed)
            print(comparison)
            if args.out is not None:
                (args.out / COMPARE_FILE).write_text(comparison)
    except OSError as exc:
        print(f"{PROG}: error: cannot write reports: {exc} (use --out DIR)", file=sys.stderr)
        return 1
    return 0
