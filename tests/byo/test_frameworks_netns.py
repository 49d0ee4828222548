"""torchft on namespace hosts when its coordinator never comes up, through `chaos run`: the
trial ends promptly with an error naming what did not come, never as a hang at the cap, and
leaves nothing behind. (torchft working, under a kill, is scenarios/frameworks_kill.yaml.)"""
from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import REPO, chaos_cli

pytestmark = pytest.mark.requires_root

# the Lighthouse replaced by a program of the same name, found first on the job's PATH (then
# this interpreter's folder: torchrun, python)
BROKEN = {"exits": "#!/bin/sh\necho 'no lighthouse here' >&2\nexit 3\n",
          "silent": "#!/bin/sh\nexec sleep 1000\n"}


def scenario(tmp_path: Path, lighthouse: str) -> Path:
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "torchft_lighthouse").write_text(BROKEN[lighthouse])
    (fake / "torchft_lighthouse").chmod(0o755)
    path = tmp_path / "ft.yaml"
    path.write_text(f"""\
name: ft_{lighthouse}
cluster: {{ranks: 3}}
job:
  command: [python, train_torchft.py, --step-period, "0.25"]
  workdir: {REPO / "examples"}
  launcher: torchft
  env: {{PATH: "{fake}:{Path(sys.executable).parent}:{os.environ["PATH"]}"}}
  start_timeout: 15s
warmup_steps: 3
faults:
  - {{kind: kill, target: {{rank: 1}}, start: 1s}}
hang_cap: 60s
""")
    return path


@pytest.mark.parametrize("lighthouse, said", [
    ("exits", "the coordinator (torchft_lighthouse on r002) exited during warm-up"),
    ("silent", "ranks did not make 3 steps within 15 s (step 0..0  live 2/2  errors 0; no step from r000, r001)"),
])
def test_a_lighthouse_that_never_comes_up_ends_the_trial_naming_it(tmp_path, leaves_nothing, lighthouse, said):
    began = time.monotonic()
    done = chaos_cli("run", str(scenario(tmp_path, lighthouse)), "--out", str(tmp_path / "out"), timeout=120)
    assert done.returncode == 1, done.stderr
    assert said in done.stderr
    assert "Traceback" not in done.stderr
    assert time.monotonic() - began < 45  # its start_timeout, never the hang cap after it
