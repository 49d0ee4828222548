"""A user's path that cannot be reached, said as such (chaos.reach: real permissions, read
as uid 65534), and the state folder that lets others through to a local Slurm cluster
(chaos.ledger.make_state_dir)."""
from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from chaos.ledger import Ledger, make_state_dir
from tests.conftest import NOBODY, REPO

pytestmark = pytest.mark.requires_root


def _as_nobody(code: str, *args: str) -> str:
    done = subprocess.run(["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", sys.executable,
                           "-c", code, *args], capture_output=True, text=True, cwd="/", timeout=60,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert done.returncode == 0, done.stderr
    return done.stdout


def _why(*paths: Path, folder: bool = False) -> list[str | None]:
    """`why_unreadable` of each path, as uid 65534 sees it."""
    code = ("import json, sys; from chaos.reach import why_unreadable; "
            f"print(json.dumps([why_unreadable(p, folder={folder}) for p in sys.argv[1:]]))")
    return json.loads(_as_nobody(code, *map(str, paths)))


@pytest.fixture
def tree() -> Iterator[Path]:
    """A folder open to all (pytest's own are closed), holding a closed folder, an open one
    and a file of root's own."""
    top = Path(tempfile.mkdtemp(prefix="chaos-reach-test-"))
    top.chmod(0o755)
    for name, mode in (("closed", 0o700), ("open", 0o755)):
        (top / name).mkdir()
        (top / name / "slurm.conf").write_text("x\n")
        (top / name / "slurm.conf").chmod(0o644)
        (top / name).chmod(mode)
    (top / "private.conf").write_text("x\n")
    (top / "private.conf").chmod(0o600)
    try:
        yield top
    finally:
        shutil.rmtree(top)


def test_a_path_behind_a_closed_folder_names_that_folder_and_the_fix(tree):
    closed, unreadable, missing, fine = (tree / "closed" / "slurm.conf", tree / "private.conf",
                                         tree / "open" / "absent.conf", tree / "open" / "slurm.conf")
    assert _why(closed, unreadable, missing, fine, tree / "open") == [
        f"cannot be read by uid {NOBODY} (permission denied on {tree}/closed: mode 0700, owner root; "
        f"`chmod a+x {tree}/closed` by its owner lets others through)",
        f"cannot be read by uid {NOBODY} (permission denied on {unreadable}: mode 0600, owner root; "
        f"`chmod a+r {unreadable}` by its owner lets others read it)",
        "no such file", None, "not a file"]
    assert _why(tree / "open", tree / "closed", fine, folder=True) == [
        None, f"cannot be read by uid {NOBODY} (permission denied on {tree}/closed: mode 0700, owner root; "
              f"`chmod a+x {tree}/closed` by its owner lets others through)", "not a folder"]


def test_the_state_folder_lets_others_through_whatever_made_it(tmp_path):
    """Made by a ledger under umask 077, or there before and closed (0700): 0711, its
    ledgers 0600; another user's folder is left as it is."""
    (tmp_path / "before").mkdir(mode=0o700)
    (tmp_path / "theirs").mkdir(mode=0o700)
    os.chown(tmp_path / "theirs", NOBODY, NOBODY)
    mask = os.umask(0o077)
    try:
        ledger = Ledger("made", tmp_path / "made")
        ledger.record("test")
        make_state_dir(tmp_path / "before")
        make_state_dir(tmp_path / "theirs")
    finally:
        os.umask(mask)
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in tmp_path.iterdir()}
    assert modes == {"made": 0o711, "before": 0o711, "theirs": 0o700}
    assert stat.S_IMODE(ledger.path.stat().st_mode) == 0o600
