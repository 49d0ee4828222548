"""Every `chaos` command line that README.md shows works as written, through the installed
`chaos` entry point (the console script pip made), not by calling functions.

A line with placeholders (`SCENARIO.yaml`, `RUN_DIR`, `[--seed N]`) is checked through its
subcommand's `--help` (`chaos export k8s --help` for `chaos export k8s ...`): it exits 0 and knows every option the line spells. A line without
placeholders is run as it is (a `chaos run` line with `--dry-run` only: a real run is the
scenario tests' job) and must exit 0.
"""
from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.conftest import CHAOS, REPO

README = REPO / "README.md"
PLACEHOLDER = re.compile(r"[A-Z]{2,}|\[|\.\.\.|\|")


def readme_command_lines() -> list[str]:
    lines, fenced = [], False
    for raw in README.read_text().splitlines():
        if raw.strip().startswith("```"):
            fenced = not fenced
            continue
        command = raw.split("#", 1)[0].strip()
        if fenced and command.startswith("chaos "):
            lines.append(command)
    return lines


LINES = readme_command_lines()


def test_the_readme_shows_chaos_commands():
    assert len(LINES) >= 5, LINES
    assert Path(CHAOS).is_file(), f"the `chaos` entry point is not installed at {CHAOS} (pip install -e .)"


def _chaos(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([CHAOS, *args], cwd=REPO, capture_output=True, text=True, timeout=timeout)


@pytest.mark.parametrize("line", LINES)
def test_readme_command_line_works(line):
    words = shlex.split(line)
    sub = words[1]
    command = []  # the subcommand path: `export k8s`
    for word in words[1:]:
        if word.startswith(("-", "[")) or PLACEHOLDER.search(word) or "." in word or "/" in word:
            break
        command.append(word)
    if PLACEHOLDER.search(line):
        helped = _chaos(*command, "--help")
        assert helped.returncode == 0, helped.stderr
        options = {w.strip("[]|.") for w in words if w.strip("[").startswith("--")}
        unknown = sorted(o for o in options if o not in helped.stdout)
        assert unknown == [], f"`chaos {' '.join(command)} --help` does not know {unknown}"
        return
    if sub == "run" and "--dry-run" not in words:
        pytest.skip("a real run of a scenario is what the scenario tests do")
    if words[1:] == ["nightly", "--quick"]:
        pytest.skip("tests/run/test_nightly_real.py runs this line as written, interrupted and resumed")
    needs_root = sub in ("heal", "doctor", "calibrate", "run") and "--dry-run" not in words
    if needs_root and os.geteuid() != 0:
        pytest.skip("needs root")
    before = set(REPO.iterdir())
    try:
        done = _chaos(*words[1:], timeout=600)
    finally:  # what the command made where a user runs it (`nights/` of `chaos nightly`) goes
        for made in set(REPO.iterdir()) - before:
            shutil.rmtree(made) if made.is_dir() else made.unlink()
    assert done.returncode == 0, (f"`{line}` exited {done.returncode}:\n{done.stdout[-3000:]}\n"
                                  f"{done.stderr[-2000:]}")
    if sub == "doctor":  # the speed to hold the README's figures against
        assert re.search(r"^machine: \d+ CPUs.*a Python loop step \d+ ns", done.stdout, re.MULTILINE), done.stdout
