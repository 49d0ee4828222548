"""bench/control_plane.py: the real control plane under N stand-in ranks (root-free)."""
from __future__ import annotations

import itertools
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.system  # a real control plane and its clients: not in ./dev.sh check

BENCH = Path(__file__).resolve().parents[2] / "bench" / "control_plane.py"


def control_plane_bench(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(BENCH), *args], capture_output=True, text=True, timeout=180)


def control_planes() -> list[str]:
    """The bench's control plane processes still running."""
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            args = cmdline.read_bytes().split(b"\0")
        except OSError:
            continue  # gone meanwhile
        if any(b"from harness.job.control import main" in a for a in args):
            found.append(cmdline.parent.name)
    return found


def test_it_prints_each_sizes_figures_from_digests_it_read():
    """Each size, with this checkout's control plane, it recording heartbeat gaps (--gaps),
    and a tree's (here the same checkout, its digests read by the tree's own reader)."""
    done = control_plane_bench("--ranks", "4", "16", "--seconds", "1", "--gaps", "--tree", str(BENCH.parents[1]))
    assert done.returncode == 0, done.stderr
    assert control_planes() == []
    recording = "this checkout, recording gaps"
    for ranks, tree in itertools.product((4, 16), ("this checkout", recording, str(BENCH.parents[1]))):
        [row] = [line for line in done.stdout.splitlines() if line.startswith(f"| {ranks} | {tree} ")]
        if tree == recording:  # the gaps the server recorded: about one per heartbeat, on file by its last write
            gaps = int(re.search(r"\(([\d,]+) gaps on file\)", row).group(1).replace(",", ""))
            assert gaps >= ranks, row
        cells = [c.strip() for c in row.strip("|").split("|")][1:]
        assert re.fullmatch(r"\d+%", cells[1]), row
        # a digest: a 20-byte header and 21 bytes per rank it lists; beating ranks are not listed
        assert 20 <= int(cells[2].split(" B")[0]) < 20 + 21 * ranks / 2, row
        # digests every TICK_S (50 ms); a silence a digest reports is under a second here
        median_gap = int(cells[3].split(" / ")[0].removesuffix(" ms"))
        assert 20 <= median_gap <= 200, row
        longest = cells[4].split(" / ")[1]
        assert longest == "under 100 ms" or int(longest.removesuffix(" ms")) < 1000, row
        assert re.fullmatch(r"\d+%, latest \d+ ms", cells[6]), row
        assert re.fullmatch(r"\d[\d,]* \(\d+\.\d%\)", cells[7]), row


@pytest.mark.parametrize(("args", "says"), [
    (["--ranks", "0"], "--ranks takes 1-"),
    (["--seconds", "0"], "--seconds a positive number"),
    (["--tree", "/nonexistent"], "--tree /nonexistent: not a checkout of this project"),
])
def test_bad_arguments_say_what_to_give(args, says):
    done = control_plane_bench(*args)
    assert done.returncode == 2
    assert says in done.stderr and "Traceback" not in done.stderr


def scratch_folders() -> set[Path]:
    return set(Path(tempfile.gettempdir()).glob("control-plane-gaps-*"))


def test_its_control_plane_dies_with_it_even_when_it_is_killed():
    before = scratch_folders()
    bench = subprocess.Popen([sys.executable, str(BENCH), "--ranks", "4", "--seconds", "30"],
                             stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        assert bench.stdout is not None
        while (line := bench.stdout.readline()) and "|---|" not in line:
            pass  # to the table's head: the first size is starting
        assert line, "the bench ended before its table"
        deadline = time.monotonic() + 60
        while not control_planes() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert control_planes(), "the bench started no control plane"
    finally:
        bench.kill()
        bench.wait()
    deadline = time.monotonic() + 5
    while control_planes() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert control_planes() == []
    assert scratch_folders() == before  # without --gaps it makes no folder a SIGKILL would leave
