"""docs/performance.md is what bench/performance.py makes of the result files, and a
figures file that does not say its machine, command and date is refused."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import REPO

sys.path.insert(0, str(REPO / "bench"))
import figure_fields  # noqa: E402
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


def test_every_table_cites_result_files_that_are_there():
    """A figure on the page comes from a bench's own result files: each table names them,
    and each named one is in bench/results/ (the page check compares the page with the
    figures files only)."""
    for path in sorted(performance.FIGURES.glob("*.json")):
        for i, table in enumerate(json.loads(path.read_text())["tables"]):
            files = performance.cited(table.get("source", ""))
            assert files, f"{path.name}: tables.{i}: no source under bench/results/"
            missing = [f for f in files if not (REPO / f).exists()]
            assert not missing, f"{path.name}: tables.{i}: cites {missing}, which are not there"


def test_every_figure_is_the_value_of_the_field_it_names():
    """A figure typed by hand, or left from an older run, is found: each one, in a table or
    in the prose around it, names the file and the field it comes from and is that field's
    value, or says that no file holds it and why."""
    problems = []
    for path in sorted(performance.FIGURES.glob("*.json")):
        for i, table in enumerate(json.loads(path.read_text())["tables"]):
            for r, row in enumerate(table["rows"]):
                for column, cell in zip(table["columns"], row, strict=True):
                    problems += [f"{path.name}: tables.{i}.rows.{r} {column}: {p}"
                                 for p in figure_fields.cell_problems(cell)]
                    if not isinstance(cell, dict) and figure_fields.figures(str(cell)):
                        problems.append(f"{path.name}: tables.{i}.rows.{r} {column}: {cell!r} names no field "
                                        "(write it: bench/performance.py --trace, then by hand)")
        for place, holder, key, _ in performance.prose(json.loads(path.read_text())):
            problems += [f"{path.name}: {place}: {p}" for p in figure_fields.cell_problems(holder[key])]
            if not isinstance(holder[key], dict) and figure_fields.figures(holder[key]):
                problems.append(f"{path.name}: {place} names no field for its figures (write them: "
                                "bench/performance.py --trace, then by hand; `none: why` for one no file holds)")
    assert problems == []


def test_a_figure_not_in_the_field_it_names_is_found(tmp_path):
    result = tmp_path / "r.json"
    result.write_text('{"rows": [{"ttd_s": 5.031, "lag_s": 0.01402}, {"ttd_s": 4.57}], "ratio": 0.58}')
    printed = tmp_path / "r.txt"
    printed.write_text("figures\nstep 14.0 ms, 5.03 s\n")
    good = {"text": "5.03 s (1.10x), 14.0 ms", "from": [f"{result}#/rows/0/ttd_s",
                                                         f"{result}#/rows/0/ttd_s / {result}#/rows/1/ttd_s",
                                                         f"{printed}:2"]}
    assert list(figure_fields.cell_problems(good)) == []
    # the same number elsewhere in the file is not the field named
    swapped = {**good, "from": [f"{result}#/rows/1/ttd_s", *good["from"][1:]]}
    assert list(figure_fields.cell_problems(swapped)) == [f"5.03: not in {result}#/rows/1/ttd_s (it holds 4.57)"]
    assert list(figure_fields.cell_problems({**good, "from": [*good["from"][:2], f"{printed}:1"]})) == \
        [f"14.0: not in {printed}:1 (it holds no number)"]
    wrong_ratio = {**good, "text": "5.03 s (1.20x), 14.0 ms"}
    assert [p.split(":")[0] for p in figure_fields.cell_problems(wrong_ratio)] == ["1.20x"]
    assert "1 figures, 3 fields" in next(figure_fields.cell_problems({**good, "text": "5.03 s"}))
    assert "no field /rows/2" in next(figure_fields.cell_problems({"text": "5.03", "from": f"{result}#/rows/2"}))
    assert figure_fields.figures("4.2M-parameter MLP, 26.9% of 1.36 s (2.24x), 16 ranks") == ["26.9%", "1.36", "2.24x"]


def test_an_aggregate_names_the_list_it_is_taken_over(tmp_path):
    result = tmp_path / "r.json"
    result.write_text('{"ttr_s": [0.168, 0.173, 0.154, NaN], "rows": [{"s": 2.0}, {"s": 4.0}, {"s": NaN}]}')
    ttr = f"{result}#/ttr_s"
    cell = {"text": "0.17 s (0.15-0.17)", "from": [f"median({ttr})", f"min({ttr})", f"max({ttr})"]}
    assert list(figure_fields.cell_problems(cell)) == []
    # the least is not the median, and a list is not one number: a figure names which
    assert [p.split(":")[0] for p in figure_fields.cell_problems({**cell, "from": [f"min({ttr})"] * 3})] == \
        ["0.17", "0.17"]
    assert "a list of 4 numbers; name one, or an aggregate" in \
        next(figure_fields.cell_problems({"text": "0.17 s", "from": [ttr]}))
    assert figure_fields.read(f"mean({result}#/rows/*/s)") == [3.0]  # NaN: a trial without it
    assert "no aggregate mode()" in next(figure_fields.cell_problems({"text": "3.0", "from": [f"mode({ttr})"]}))
    ratio = {"text": "1.33x", "from": [f"max({result}#/rows/*/s) / mean({result}#/rows/*/s)"]}
    assert list(figure_fields.cell_problems(ratio)) == [] and figure_fields.read(ratio["from"][0]) == [4.0 / 3.0]


def test_trace_writes_a_field_only_where_the_files_give_it_one_way(tmp_path):
    result = tmp_path / "r.json"
    result.write_text('{"rows": [{"event": "step", "median_s": 0.014, "worst_s": 0.0348},'
                      ' {"event": "all", "median_s": 0.016, "worst_s": 0.0348}]}')
    cited = [str(result)]
    step, every = figure_fields.propose(["step", "14.0 ms", "34.8 ms"], cited), \
        figure_fields.propose(["all", "16.0 ms", "34.8 ms"], cited)
    # 34.8 ms is in both rows: each takes the row its unique figure came from
    assert step[2] == {"text": "34.8 ms", "from": [f"{result}#/rows/0/worst_s"]}
    assert every[2] == {"text": "34.8 ms", "from": [f"{result}#/rows/1/worst_s"]}
    assert figure_fields.propose(["both", "34.8 ms"], cited) == ["both", "34.8 ms"]  # two places, no guess


def test_a_difference_a_sum_and_a_figure_no_file_holds(tmp_path):
    result = tmp_path / "r.json"
    result.write_text('{"before_s": 4.55, "after_s": 3.98, "up_s": 1.76, "warm_s": 1.60}')
    cell = {"text": "0.57 s sooner, warm in 3.36 s, at 0.5 ms apart",
            "from": [f"{result}#/before_s - {result}#/after_s", f"{result}#/up_s + {result}#/warm_s",
                     "none: the probe's spacing, a setting"]}
    assert list(figure_fields.cell_problems(cell)) == []
    wrong = {**cell, "text": cell["text"].replace("0.57", "0.75")}
    assert [p.split(":")[0] for p in figure_fields.cell_problems(wrong)] == ["0.75"]

