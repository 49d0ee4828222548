"""docs/performance.md is what bench/performance.py makes of the result files, and a
figures file that does not say its machine, command and date is refused."""
from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from tests.conftest import REPO

sys.path.insert(0, str(REPO / "bench"))
import performance  # noqa: E402


def test_the_page_is_made_from_the_result_files():
    done = subprocess.run([sys.executable, str(REPO / "bench" / "performance.py"), "--check"], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr


def test_a_table_without_its_date_is_refused_naming_the_file_and_the_field(tmp_path):
    table = {"columns": ["what", "figure"], "rows": [["a step", "0.1 s"]], "machine": "2-CPU VM", "command": "bench/x.py"}
    (tmp_path / "x.json").write_text(json.dumps({"area": "X", "order": 1, "tables": [table]}))
    with pytest.raises(performance.FiguresError, match=r"x\.json: tables\.0\.date: missing"):
        performance.page(tmp_path)
    (tmp_path / "x.json").write_text(json.dumps({"area": "X", "order": 1, "tables": [{**table, "date": "2026-12-04"}]}))
    (tmp_path / "old.md").write_text("## Kept as recorded\n")
    text = performance.page(tmp_path)
    assert "| a step | 0.1 s |\n\n2-CPU VM; `bench/x.py`; 2026-12-04." in text
    assert text.index("## X") < text.index("## Kept as recorded")


def cited(source: str) -> list[str]:
    """The paths a table's `source` names, a brace pair expanded (run4/fingerprint-{1,16}.json):
    result files under bench/results/, or a scenario whose expectations record a measurement."""
    paths = []
    for path in re.findall(r"(?:bench/results|scenarios)/[^\s,;`(){]*(?:\{[^}]*\}[^\s,;`()]*)?", source):
        head, braces, tail = re.fullmatch(r"([^{]*)(?:\{([^}]*)\})?(.*)", path.rstrip(".")).groups()
        paths += [head + choice + tail for choice in braces.split(",")] if braces else [head + tail]
    return paths


def test_every_table_cites_result_files_that_are_there():
    """A figure on the page comes from a bench's own result files: each table names them,
    and each named one is in bench/results/ (the page check compares the page with the
    figures files only)."""
    for path in sorted(performance.FIGURES.glob("*.json")):
        for i, table in enumerate(json.loads(path.read_text())["tables"]):
            files = cited(table.get("source", ""))
            assert files, f"{path.name}: tables.{i}: no source under bench/results/"
            missing = [f for f in files if not (REPO / f).exists()]
            assert not missing, f"{path.name}: tables.{i}: cites {missing}, which are not there"


def _numbers(text: str) -> list[float]:
    return [float(n) for n in re.findall(r"\d+(?:\.\d+)?(?:e-?\d+)?", text)]


def _cited_text(source: str) -> str:
    texts = []
    for name in cited(source):
        path = REPO / name
        for file in sorted(path.rglob("*")) if path.is_dir() else [path]:
            if file.is_file():
                texts.append(file.read_text(errors="replace"))
    return "\n".join(texts)


UNITS = (1.0, 1e3, 1e-3, 1e6, 1e-6)  # a figure shown in ms from seconds, MB from bytes ...


def figures_not_in(table: dict, cited_text: str) -> list[str]:
    """Each decimal figure of `table` (outside its computed columns; a ratio `1.10x` or a
    share `26.9%` is computed by its form) that no number of the text of its cited files
    gives, to the precision shown, in some unit."""
    raw = _numbers(cited_text)
    computed = table.get("computed", {})
    missing = []
    for row in table["rows"]:
        for column, cell in zip(table["columns"], row, strict=False):
            if column in computed:
                continue
            for shown in re.findall(r"\d+\.\d+(?![\d.x%])", str(cell)):  # 1.10x, 26.9%: ratios
                tolerance = 0.5 * 10 ** -len(shown.split(".")[1]) + 1e-9
                if not any(abs(x * unit - float(shown)) <= tolerance for x in raw for unit in UNITS):
                    missing.append(f"{column}: {shown}")
    return missing


def test_every_figure_is_in_the_result_files_its_table_cites():
    """A figure typed by hand, or left from an older run, is found: each one must be in the
    files the table cites (computed columns, such as ratios, say how they are computed)."""
    problems = []
    for path in sorted(performance.FIGURES.glob("*.json")):
        for i, table in enumerate(json.loads(path.read_text())["tables"]):
            for column, how in table.get("computed", {}).items():
                assert column in table["columns"] and how.strip(), f"{path.name}: tables.{i}.computed.{column}"
            problems += [f"{path.name}: tables.{i}: {m}"
                         for m in figures_not_in(table, _cited_text(table.get("source", "")))]
    assert problems == []


def test_a_figure_missing_from_its_source_is_found():
    table = {"columns": ["detect", "lag", "ratio"], "rows": [["5.03 s (1.10x)", "14.0 ms", "0.58"]]}
    raw = '{"ttd_s": 5.031, "lag_s": 0.01402}'
    assert figures_not_in(table, raw) == ["ratio: 0.58"]
    assert figures_not_in({**table, "computed": {"ratio": "slurm / netns"}}, raw) == []
    assert figures_not_in(table, '{"ttd_s": 5.1}') == ["detect: 5.03", "lag: 14.0", "ratio: 0.58"]
