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
    """The paths a table's `source` names, a brace pair expanded (run4/fingerprint-{1,16}.json)."""
    paths = []
    for path in re.findall(r"bench/results/[^\s,;`(){]*(?:\{[^}]*\}[^\s,;`()]*)?", source):
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
