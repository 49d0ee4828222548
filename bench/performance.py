"""docs/performance.md, made from the result files it presents.

    .venv/bin/python bench/performance.py            # write docs/performance.md
    .venv/bin/python bench/performance.py --check    # exit 1 when it differs from what the files give

Each area is one figures file, bench/results/figures/<area>.json:

    {"area": "...", "order": 10, "about": "what is measured and how (markdown)",
     "tables": [{"caption": "optional", "columns": [...], "rows": [[...], ...],
                 "machine": "...", "command": "...", "date": "YYYY-MM-DD",
                 "source": "the bench's own result file(s) under bench/results/",
                 "computed": {"column": "how its figures come from the others (a ratio, a share)"}}],
     "notes": "what the figures mean (markdown)"}

A cell, a caption, `about` and `notes` are each a text, or {"text": ..., "from": [the field
of each figure in it]}: every figure names the file and the field it comes from, and is that
field's value to the precision shown (bench/figure_fields.py; tests/test_performance_doc.py);
every figure names its field, or `none: why` where no result file holds it.
`--trace` writes the field of each figure that the cited files give one way.

A table without its machine, command or date is refused, naming the file and the field.
After the areas (by order), the figures files' markdown pages (bench/results/figures/*.md),
by name, verbatim: figures kept as they were recorded, with no data of their own.
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Iterator

from figure_fields import figures as figures_in, propose, text_of

REPO = Path(__file__).resolve().parent.parent
FIGURES = REPO / "bench" / "results" / "figures"
DOC = REPO / "docs" / "performance.md"
TABLE_FIELDS = ("columns", "rows", "machine", "command", "date")
HEADER = """# Performance figures

Measured figures, each with its machine, command and date. The README says what the
harness does and guarantees; the figures that move with the machine are here. This page is
made from the result files (`bench/results/figures/`, beside each bench's own result files
under `bench/results/`) by `bench/performance.py`: add or change a figures file, then run
it; a test fails while the page and the files differ. Each figure here, in a table or in
the prose around it, names the field of a result file it comes from, and a test fails while
it is not that field's value; the few that no file holds (a setting, a target, a run not
kept) say so in their text.
"""


class FiguresError(ValueError):
    pass


def _table(path: Path, index: int, table: dict) -> list[str]:
    for field in TABLE_FIELDS:
        if not table.get(field):
            raise FiguresError(f"{path}: tables.{index}.{field}: missing; every table says its "
                               + ", ".join(TABLE_FIELDS))
    if not re.fullmatch(r"\d{4}-\d{2}-\d{2}", table["date"]):
        raise FiguresError(f"{path}: tables.{index}.date: {table['date']!r}; write it as YYYY-MM-DD")
    width = len(table["columns"])
    for r, row in enumerate(table["rows"]):
        if len(row) != width:
            raise FiguresError(f"{path}: tables.{index}.rows.{r}: {len(row)} cells for {width} columns")
    lines = [text_of(table["caption"]), ""] if table.get("caption") else []
    lines += ["| " + " | ".join(table["columns"]) + " |", "|" + "---|" * width]
    lines += ["| " + " | ".join(text_of(cell) for cell in row) + " |" for row in table["rows"]]
    source = f" Result file: `{table['source']}`." if table.get("source") else ""
    return lines + ["", f"{table['machine']}; `{table['command']}`; {table['date']}.{source}", ""]


def area_text(path: Path) -> tuple[int, str]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise FiguresError(f"{path}: not a figures file ({exc})") from None
    for field in ("area", "order"):
        if field not in data:
            raise FiguresError(f"{path}: {field}: missing")
    lines = [f"## {data['area']}", ""]
    if data.get("about"):
        lines += [text_of(data["about"]), ""]
    for index, table in enumerate(data.get("tables", [])):
        lines += _table(path, index, table)
    if data.get("notes"):
        lines += [text_of(data["notes"]), ""]
    return int(data["order"]), "\n".join(lines)


def page(figures: Path = FIGURES) -> str:
    areas = sorted(area_text(path) for path in sorted(figures.glob("*.json")))
    kept = [path.read_text().rstrip() + "\n" for path in sorted(figures.glob("*.md"))]
    return "\n".join([HEADER, *(text for _, text in areas), *kept])


def cited(source: str) -> list[str]:
    """The paths a table's `source` names, a brace pair expanded (run4/fingerprint-{1,16}.json):
    result files under bench/results/, or a scenario whose expectations record a measurement."""
    paths = []
    for path in re.findall(r"(?:bench/results|scenarios)/[^\s,;`(){]*(?:\{[^}]*\}[^\s,;`()]*)?", source):
        head, braces, tail = re.fullmatch(r"([^{]*)(?:\{([^}]*)\})?(.*)", path.rstrip(".")).groups()
        paths += [head + choice + tail for choice in braces.split(",")] if braces else [head + tail]
    return paths


def prose(data: dict) -> Iterator[tuple[str, dict, str, list[str]]]:
    """Each caption, `about` and `notes` of an area: its place, its holder and key, and the
    files its figures come from (a caption's table's; the area's tables' for the rest)."""
    every = [f for table in data.get("tables", []) for f in cited(table.get("source", ""))]
    for key in ("about", "notes"):
        if data.get(key):
            yield key, data, key, every
    for t, table in enumerate(data.get("tables", [])):
        if table.get("caption"):
            yield f"tables.{t}.caption", table, "caption", cited(table.get("source", ""))


def trace(figures: Path = FIGURES) -> list[str]:
    """Write the field of each figure the cited files give one way; the texts left, by place."""
    left = []
    for path in sorted(figures.glob("*.json")):
        data = json.loads(path.read_text())
        for t, table in enumerate(data.get("tables", [])):
            files = cited(table.get("source", ""))
            computed = {table["columns"].index(c) for c in table.get("computed", {}) if c in table["columns"]}
            table["rows"] = [propose(row, files, computed) for row in table["rows"]]
            left += [f"{path.name}: tables.{t}.rows.{r}.{c}: {cell!r}" for r, row in enumerate(table["rows"])
                     for c, cell in enumerate(row) if not isinstance(cell, dict) and figures_in(cell)]
        for place, holder, key, files in prose(data):
            holder[key] = propose([holder[key]], files)[0]
            if not isinstance(holder[key], dict) and figures_in(holder[key]):
                left.append(f"{path.name}: {place}: {holder[key]!r}")
        path.write_text(json.dumps(data, indent=1, ensure_ascii=False) + "\n")
    return left


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help=f"exit 1 when {DOC.relative_to(REPO)} differs")
    parser.add_argument("--trace", action="store_true",
                        help="write each figure's field where the cited files give it one way; list the rest")
    args = parser.parse_args(argv)
    if args.trace:
        left = trace()
        print("\n".join(left) or "every figure names its field")
        return 0
    try:
        text = page()
    except FiguresError as exc:
        print(f"performance: {exc}", file=sys.stderr)
        return 2
    if args.check:
        if DOC.read_text() != text:
            print(f"{DOC.relative_to(REPO)} differs from bench/results/figures/: run "
                  "`.venv/bin/python bench/performance.py`", file=sys.stderr)
            return 1
        return 0
    DOC.write_text(text)
    print(f"wrote {DOC.relative_to(REPO)} from {FIGURES.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
