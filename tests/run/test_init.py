"""`chaos init` through the installed command: the scenario it writes loads, plans and runs."""
from __future__ import annotations

import pytest

from harness.run.scenario import load_scenario
from tests.conftest import REPO, chaos_cli


def test_the_builtin_scenario_loads_and_an_existing_file_is_refused(tmp_path):
    out = tmp_path / "first.yaml"
    done = chaos_cli("init", "--out", str(out))
    assert done.returncode == 0, done.stderr
    assert f"next: chaos run {out}" in done.stdout and "baseline   timeout 21600 s" in done.stdout
    scenario = load_scenario(out)
    assert scenario.trial_names() == ["baseline", "timeout", "retry", "isolation"]
    assert [f.fault.kind for f in scenario.faults] == ["pause", "link_down", "kill"]
    again = chaos_cli("init", "--out", str(out))
    assert again.returncode == 2 and again.stderr.strip() == (
        f"chaos: error: --out {out}: exists; pick another file or pass --force to overwrite it")
    assert chaos_cli("init", "--out", str(out), "--force").returncode == 0


def test_a_script_without_a_timeout_option_gets_the_variant_commented_out(tmp_path):
    (tmp_path / "train.py").write_text("print('training')\n")
    out = tmp_path / "s.yaml"
    done = chaos_cli("init", "--job", "python train.py --lr 0.1", "--out", str(out), "--ranks", "4", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    scenario = load_scenario(out)
    assert scenario.trial_names() == ["default", "torchrun_restarts"]
    assert scenario.job.command == ("python", "train.py", "--lr", "0.1") and scenario.job.workdir == str(tmp_path)
    assert "# timeout_5s:" in out.read_text()
    bad = chaos_cli("init", "--job", "", "--out", str(tmp_path / "t.yaml"))
    assert bad.returncode == 2 and "--job: empty" in bad.stderr and not (tmp_path / "t.yaml").exists()


@pytest.mark.requires_root
@pytest.mark.slow
def test_the_scenario_written_for_train_ddp_runs_as_written(tmp_path, leaves_nothing):
    out = tmp_path / "byo.yaml"
    done = chaos_cli("init", "--job", "python examples/train_ddp.py", "--out", str(out), "--ranks", "4")
    assert done.returncode == 0, done.stderr
    text = out.read_text()
    assert "timeout_5s: {args: [--timeout" in text  # train_ddp.py has --timeout and --checkpoint
    assert '--checkpoint, "{trial_dir}/checkpoint.pt"]' in text
    ran = chaos_cli("run", str(out), "--policy", "default", "--out", str(tmp_path / "runs"), "--quiet", timeout=900)
    assert ran.returncode == 0, ran.stdout[-3000:] + ran.stderr[-3000:]
    assert "| default | pause on r5" not in ran.stdout and "| default | pause on r3" in ran.stdout
    assert "consistent" in ran.stdout and "met" in ran.stdout
    assert not (REPO / "checkpoint.pt").exists()  # the job's checkpoint went into its trial
