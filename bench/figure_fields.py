"""Where each figure of docs/performance.md comes from: the file and the field, checked.

A figures table's cell is its text, or the text with the field of each figure in it:

    {"text": "14.0 ms (1.10x)", "from": ["bench/results/anchor_lag-2026-12-06.json#/step/median_s",
                                         "bench/results/a.json#/x / bench/results/b.json#/y"]}

A figure is a number with a decimal point, a ratio (`1.10x`) or a share (`26.9%`); whole
numbers are counts and labels. Each figure of the text, in order, has one field:
- `PATH#/json/pointer`: the number at that place of a JSON file (RFC 6901);
- `PATH:LINE`: a number on that line of a text file (a bench's printed table);
- `FIELD / FIELD`: the ratio of two fields (a ratio or a share computed from them);
- `FIELD - FIELD`, `FIELD + FIELD`: their difference (how much sooner) or sum (two phases);
- `none: WHY`: a figure no result file holds (a setting, a target, a figure measured before
  result files were kept), said so in the text it is in; not checked.
- `median(FIELD)`, `min(FIELD)`, `max(FIELD)`, `mean(FIELD)`: an aggregate of the numbers a
  field holds, a JSON list (`#/evidence/tuned_2_5s/silent_detected_s`) or a pointer with
  `*` for every member of a list or object (`#/per_fault/*/first_s`), NaN (a trial without
  that figure) left out;
The figure must be the field's value to the precision shown, in the unit shown (s as ms,
bytes as MB: a factor of 10^3 or 10^6 either way; a share as a fraction or in percent).

`python bench/performance.py --trace` writes the field of each figure that only one place
of the cited files gives (preferring, where several do, the JSON object or the text line
that the row's other figures come from) and lists the rest, to be written by hand.
"""
from __future__ import annotations

import json
import re
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Collection, Iterator

REPO = Path(__file__).resolve().parent.parent
# a number glued to a word is a label (4.2M-parameter, sm_90, v1.2), not a figure
FIGURE = re.compile(r"(?<![\w.])(\d+(?:\.\d+)?)(x|%)?(?![\w.]*\d|[A-Za-wyz])")
UNITS = (1.0, 1e3, 1e-3, 1e6, 1e-6, 100.0)  # s as ms, bytes as MB, a fraction in percent


UNRECORDED = "none:"  # a figure's field where no result file holds it, with why
AGGREGATES = {"median": statistics.median, "min": min, "max": max, "mean": statistics.fmean}


class FieldError(ValueError):
    pass


def figures(text: str) -> list[str]:
    """The figures of a cell's text, in order: decimals, ratios and shares."""
    return [m.group(0) for m in FIGURE.finditer(text) if "." in m.group(1) or m.group(2)]


def _value(shown: str) -> tuple[float, float]:
    """The number a figure shows, and half its last digit (the precision shown)."""
    number = shown.rstrip("x%")
    decimals = len(number.split(".")[1]) if "." in number else 0
    return float(number), 0.5 * 10 ** -decimals + 1e-9


def shows(shown: str, candidates: list[float]) -> bool:
    """Whether `shown` is one of `candidates`, to its precision, in some unit."""
    value, tolerance = _value(shown)
    return any(abs(x * unit - value) <= tolerance for x in candidates for unit in UNITS)


def _numbers(text: str) -> list[float]:
    # a minus after a digit is a range's dash (30.2-60.2 s), not a sign
    return [float(n) for n in re.findall(r"(?:(?<![\w.])-)?\d+(?:\.\d+)?(?:[eE]-?\d+)?", text)]


@dataclass(frozen=True)
class Place:
    """One place a number is read from: a JSON pointer or a text line of a file, or an
    aggregate of a JSON list's numbers."""

    path: str
    at: str  # "#/pointer" or ":LINE"
    aggregate: str = ""  # "median", "min", "max" of the list at `at`

    def __str__(self) -> str:
        return f"{self.aggregate}({self.path}{self.at})" if self.aggregate else f"{self.path}{self.at}"

    @property
    def group(self) -> str:
        """The JSON object or text line it sits in: the row's other figures' place."""
        return f"{self.path}{self.at}" if self.at.startswith(":") else f"{self.path}{self.at.rsplit('/', 1)[0]}"

    @property
    def json(self) -> bool:
        return self.at.startswith("#")


def _load(path: Path) -> object | None:
    text = path.read_text(errors="replace")
    try:
        return json.loads(text)
    except ValueError:
        return None


def _pointer(document: object, pointer: str) -> list[object]:
    """The nodes a pointer names: one, or one per member where a part is `*`."""
    nodes = [document]
    for part in pointer.lstrip("/").split("/") if pointer.strip("/") else []:
        key = part.replace("~1", "/").replace("~0", "~")
        found = []
        for node in nodes:
            if key == "*" and isinstance(node, (list, dict)):
                found += list(node.values() if isinstance(node, dict) else node)
            elif isinstance(node, list) and key.isdigit() and int(key) < len(node):
                found.append(node[int(key)])
            elif isinstance(node, dict) and key in node:
                found.append(node[key])
        if not found:
            raise FieldError(f"no field {pointer}")
        nodes = found
    return nodes


def read(field: str) -> list[float]:
    """The numbers a field names (one for a JSON number or an aggregate, those of a text line)."""
    field = field.strip()
    if " / " in field:
        top, bottom = field.split(" / ", 1)
        return [a / b for a in read(top) for b in read(bottom) if b]
    for sign, combine in ((" - ", float.__sub__), (" + ", float.__add__)):
        if sign in field:
            left, right = field.split(sign, 1)
            return [combine(a, b) for a in read(left) for b in read(right)]
    aggregate = re.fullmatch(r"(?P<name>\w+)\((?P<inner>.*)\)", field)
    if aggregate:
        if aggregate["name"] not in AGGREGATES:
            raise FieldError(f"{field!r}: no aggregate {aggregate['name']}(); use one of {', '.join(AGGREGATES)}")
        numbers = [n for n in _many(aggregate["inner"])[0] if n == n]  # NaN: a trial without it
        if not numbers:
            raise FieldError(f"{field!r}: no number to aggregate")
        return [AGGREGATES[aggregate["name"]](numbers)]
    numbers, listed = _many(field)
    if listed and len(numbers) > 1:
        raise FieldError(f"{field!r}: a list of {len(numbers)} numbers; name one, or an aggregate "
                         f"(median({field}))")
    return numbers


def _many(field: str) -> tuple[list[float], bool]:
    """Every number a field holds (a JSON number, list or `*` pointer, or a text line), and
    whether they are a list's members rather than one number or text."""
    match = re.fullmatch(r"(?P<path>[^#:]+)(?:#(?P<pointer>/.*)|:(?P<line>\d+))", field)
    if not match or not (REPO / match["path"]).is_file():
        raise FieldError(f"{field!r}: name a file under the repository and a #/json/pointer or :LINE in it")
    path = REPO / match["path"]
    if match["line"] is not None:
        lines = path.read_text(errors="replace").splitlines()
        if not 1 <= int(match["line"]) <= len(lines):
            raise FieldError(f"{field!r}: {match['path']} has {len(lines)} lines")
        return _numbers(lines[int(match["line"]) - 1]), False
    document = _load(path)
    if document is None:
        raise FieldError(f"{field!r}: {match['path']} is not JSON; name a :LINE of it")
    nodes = _pointer(document, match["pointer"])
    if len(nodes) == 1 and isinstance(nodes[0], str):
        return _numbers(nodes[0]), False
    listed = len(nodes) > 1 or isinstance(nodes[0], list)
    if len(nodes) == 1 and isinstance(nodes[0], list):
        nodes = nodes[0]
    if not nodes or any(isinstance(n, bool) or not isinstance(n, (int, float)) for n in nodes):
        raise FieldError(f"{field!r}: not a number, nor a list of numbers")
    return [float(n) for n in nodes], listed


def cell_problems(cell: object) -> Iterator[str]:
    """What is wrong with one cell's fields: a figure without one, or not the value of its own."""
    if not isinstance(cell, dict):
        return
    text, fields = str(cell.get("text", "")), cell.get("from", [])
    fields = [fields] if isinstance(fields, str) else list(fields)
    shown = figures(text)
    if len(fields) != len(shown):
        yield f"{text!r}: {len(shown)} figures, {len(fields)} fields"
        return
    for figure, field in zip(shown, fields, strict=True):
        if field.startswith(UNRECORDED):
            continue
        try:
            values = read(field)
        except FieldError as exc:
            yield f"{figure}: {exc}"
            continue
        if not shows(figure, values):
            got = ", ".join(f"{v:g}" for v in values[:6])
            yield f"{figure}: not in {field} (it holds {got or 'no number'})"


def text_of(cell: object) -> str:
    return str(cell["text"]) if isinstance(cell, dict) else str(cell)


def places(files: list[str], aggregates: bool = False) -> Iterator[tuple[Place, float]]:
    """Every number of the cited files (a folder: the files under it), with its place; with
    `aggregates`, also the median, least and most of each JSON list of numbers."""
    for name in files:
        root = REPO / name
        for path in sorted(root.rglob("*")) if root.is_dir() else [root]:
            if not path.is_file():
                continue
            rel = str(path.relative_to(REPO) if path.is_relative_to(REPO) else path)
            document = _load(path)
            if document is None:
                for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
                    for value in _numbers(line):
                        yield Place(rel, f":{n}"), value
                continue
            for pointer, node in _nodes(document, ""):
                if isinstance(node, (int, float)) and not isinstance(node, bool):
                    yield Place(rel, "#" + (pointer or "/")), float(node)
                elif aggregates and isinstance(node, list) and all(
                        isinstance(n, (int, float)) and not isinstance(n, bool) for n in node):
                    numbers = [float(n) for n in node if n == n]  # NaN left out, as read() does
                    if len(numbers) > 1:  # the list already read: its aggregates from it
                        for kind in ("median", "min", "max"):
                            yield Place(rel, "#" + pointer, kind), AGGREGATES[kind](numbers)


def _nodes(node: object, pointer: str) -> Iterator[tuple[str, object]]:
    yield pointer, node
    if isinstance(node, dict):
        for key, value in node.items():
            yield from _nodes(value, f"{pointer}/{str(key).replace('~', '~0').replace('/', '~1')}")
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from _nodes(value, f"{pointer}/{i}")


def propose(row: list[object], files: list[str], computed: Collection[int] = ()) -> list[object]:
    """The row with each figure's field where the cited files give it one way (see the
    module's text); a ratio, a share or a figure of a `computed` column, the one pair of
    the row's other fields that gives it where no field does. A cell keeps its text where
    some figure has none or several."""
    numbers = list(places(files, aggregates=True))
    found: dict[tuple[int, int], list[Place]] = {}
    for c, cell in enumerate(row):
        for f, figure in enumerate(figures(text_of(cell))):
            matches = {p for p, v in numbers if shows(figure, [v])}
            # a folder's text files (a page, a log) render its JSON: the JSON is the field
            found[(c, f)] = sorted(({p for p in matches if p.json} or matches), key=str)
    groups = {ps[0].group for ps in found.values() if len(ps) == 1}
    # where several places give a figure, the one in a group the row's other figures come
    # from; an aggregate only where it alone gives the figure (a list's least or most is
    # too often some other figure's value)
    chosen = {k: [str(p) for p in (ps if len(ps) == 1 else [p for p in ps if p.group in groups and not p.aggregate])]
              for k, ps in found.items()}
    known = {p[0]: read(p[0])[0] for p in chosen.values() if len(p) == 1 and "#" in p[0] and len(read(p[0])) == 1}
    out = list(row)
    for c, cell in enumerate(row):
        if isinstance(cell, dict):
            continue
        shown = figures(str(cell))
        fields = []
        for f, figure in enumerate(shown):
            pick = chosen[(c, f)]
            if len(pick) != 1 and (figure.endswith(("x", "%")) or c in computed):
                pick = [f"{a} / {b}" for a in known for b in known if a != b and known[b]
                        and shows(figure, [known[a] / known[b]])]
            fields.append(pick)
        if shown and all(len(p) == 1 for p in fields):
            out[c] = {"text": cell, "from": [p[0] for p in fields]}
    return out
