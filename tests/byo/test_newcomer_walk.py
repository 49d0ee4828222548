"""A newcomer's walk through the installed `chaos`, as the README says it (issue 53): `chaos
init --job "python ddp_train.py ... --ckpt ck.pt ... --timeout 5"`, then `chaos run` on what
it wrote. tests/byo/newcomer/ddp_train.py is written like a user's script (`--ckpt`, not
`--checkpoint`; a checkpoint by torch.save to a temporary file and os.replace). Two ranks,
and the fault timeline `chaos init` writes moved closer together (its link down at 20 s and
kill at 45 s would make three trials take minutes): every trial still meets a pause, a link
down and a kill."""
from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from tests.conftest import chaos_cli

FOLDER = Path(__file__).resolve().parent / "newcomer"
JOB = "python ddp_train.py --steps 100000 --ckpt ck.pt --sleep 0.1 --timeout 5"
# chaos init's timeline -> a shorter one with the same faults in the same order
SHORTER = {"start: 2s, duration: 3s": "start: 1s, duration: 1s", "start: 20s, duration: 10s": "start: 3s, duration: 3s",
           "start: 45s": "start: 8s", "hang_cap: 30s": "hang_cap: 10s"}


def listing(folder: Path) -> dict[str, int]:
    return {str(p.relative_to(folder)): p.stat().st_mtime_ns for p in folder.rglob("*")}


@pytest.mark.requires_root
def test_chaos_init_then_chaos_run_on_a_newcomer_s_ddp_script(tmp_path, leaves_nothing):
    before = listing(FOLDER)
    out = tmp_path / "my_job.yaml"
    init = chaos_cli("init", "--job", JOB, "--out", str(out), "--ranks", "2", cwd=FOLDER)
    assert init.returncode == 0, init.stderr
    assert f"checkpoint: --ckpt ck.pt -> {{trial_dir}}/ck.pt: each trial its own, nothing written to {FOLDER}" \
        in init.stdout
    assert "wrote " in init.stdout and "3 trials (default, timeout_2_5s, torchrun_restarts)" in init.stdout
    text = out.read_text()
    assert '--ckpt, "{trial_dir}/ck.pt", --sleep, "0.1"]' in text  # its --timeout went into the variants
    assert 'default: {args: [--timeout, "5"]}' in text and 'timeout_2_5s: {args: [--timeout, "2.5"]}' in text
    assert "TORCH_DISABLE_SHARE_RDZV_TCP_STORE" in text
    for old, new in SHORTER.items():
        assert old in text
        text = text.replace(old, new)
    out.write_text(text)

    ran = chaos_cli("run", str(out), "--out", str(tmp_path / "runs"), "--quiet", timeout=300)
    assert ran.returncode in (0, 1), ran.stdout[-3000:] + ran.stderr[-3000:]
    assert "chaos: failed" not in ran.stderr and "INCOMPLETE" not in ran.stdout
    for trial in ("default", "timeout_2_5s", "torchrun_restarts"):
        assert f"| {trial} | pause on r1" in ran.stdout  # the table, one row per trial
    [run_dir] = (tmp_path / "runs").iterdir()
    assert (run_dir / "report.md").is_file()
    metrics = pd.read_csv(run_dir / "metrics.csv")
    assert list(metrics["trial"]) == ["default", "timeout_2_5s", "torchrun_restarts"]
    assert "incomplete" not in set(metrics["outcome"])
    # each trial trained on its own checkpoint, in its own folder, and loaded none from elsewhere
    assert all((run_dir / "trials" / trial / "ck.pt").is_file() for trial in metrics["trial"])
    assert metrics["checkpoints"].isna().all() and "checkpoint: " not in ran.stdout
    assert listing(FOLDER) == before  # nothing written to the script's folder
