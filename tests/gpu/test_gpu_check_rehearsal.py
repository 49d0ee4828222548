"""bench/gpu_check.sh rehearsed as the first GPU machine will run it (its CPU side here):
a fresh copy of the checkout without .venv, a Python with its own torch but without this
project's other dependencies, the carried wheels only (no index), as root and as uid 65534.
The same rehearsal with torch 2.11.0+cu130 (the GPU machine's) is in docs/gpu-check.md."""
from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from tests.conftest import REPO


@pytest.fixture
def out():
    """A folder uid 65534 can reach (pytest's temporary folders are root's, mode 700)."""
    folder = Path(tempfile.mkdtemp(prefix="chaos-rehearsal-"))
    os.chmod(folder, 0o755)
    try:
        yield folder / "rehearsal"
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@pytest.mark.requires_root  # to become uid 65534 for the second run
def test_the_gpu_check_installs_beside_a_foreign_torch_and_runs_as_root_and_as_a_user(out):
    done = subprocess.run(["bash", "bench/gpu_check_rehearsal.sh", str(out)], cwd=REPO,
                          capture_output=True, text=True, timeout=400)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "rehearsal: root: exit 0" in done.stdout and "rehearsal: 65534: exit 0" in done.stdout, done.stdout
    for who, uid in (("as-root", "uid 0 (root)"), ("as-user", "uid 65534 as root of a user namespace of its own")):
        log = (out / who / "out" / "gpu_check.log").read_text()
        assert "from bench/wheels into" in log and "(no index)" in log  # installed beside, not from an index
        assert f"  user             yes  {uid}" in log
        assert "  backend local    yes" in log
        assert "GPU behaviour NOT verified" in log  # this machine has no GPU: said, not hidden
        assert "timeout failed-fast" in log, log[-2000:]  # the kill ran on the local backend
        assert "done in" in log
        assert (out / who / "out" / "cpu_kill.csv").exists()
        assert not (out / "tree" / ".venv").exists()
    assert "  clsact_bpf       no " in (out / "as-user" / "out" / "gpu_check.log").read_text()  # BPF: root only
