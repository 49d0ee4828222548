"""`chaos init` through the installed command: the scenario it writes loads, plans and runs."""
from __future__ import annotations

import pytest

from harness.scenario.scenario import load_scenario
from harness.studies.init.command import scenario_text
from harness.trial.plan import build_plan
from tests.conftest import chaos_cli


def written(tmp_path, job: str, source: str = "print('training')\n"):
    """The scenario `chaos init --job JOB` writes beside a train.py with `source`, loaded,
    and what it said it did."""
    (tmp_path / "train.py").write_text(source)
    out = tmp_path / "s.yaml"
    text, said = scenario_text(job, out, 4, tmp_path)
    out.write_text(text)
    return load_scenario(out), text, said


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


def test_the_scenario_written_for_train_ddp_maps_its_options(tmp_path):
    """What it writes for examples/train_ddp.py; that such a scenario runs as written is the
    newcomer's walk (tests/byo/test_newcomer_walk.py, through the installed chaos)."""
    out = tmp_path / "byo.yaml"
    done = chaos_cli("init", "--job", "python examples/train_ddp.py", "--out", str(out), "--ranks", "4")
    assert done.returncode == 0, done.stderr
    text = out.read_text()
    assert "timeout_5s: {args: [--timeout" in text  # train_ddp.py has --timeout and --checkpoint
    assert '--checkpoint, "{trial_dir}/checkpoint.pt"]' in text
    done = chaos_cli("run", str(out), "--dry-run")
    assert done.returncode == 0 and "pause" in done.stdout, done.stderr


@pytest.mark.parametrize("given, moved", [
    ("--ckpt ck.pt", ["--ckpt", "{trial_dir}/ck.pt"]),
    ("--ckpt=ck.pt", ["--ckpt={trial_dir}/ck.pt"]),
    ("--checkpoint-path runs/last.pt", ["--checkpoint-path", "{trial_dir}/last.pt"]),
    ("--save-dir out/", ["--save-dir", "{trial_dir}/out"]),
    ("--output-dir .", ["--output-dir", "{trial_dir}"]),
    ("--resume=ck.pt --lr 0.1", ["--resume={trial_dir}/ck.pt", "--lr", "0.1"]),
])
def test_the_command_s_checkpoint_option_is_mapped_to_the_trial_folder_and_said(tmp_path, given, moved):
    scenario, text, said = written(tmp_path, f"python train.py {given}")
    assert scenario.job.command == ("python", "train.py", *moved)
    option, value = given.split()[0].split("=")[0], given.split()[0].split("=")[-1] if "=" in given else given.split()[1]
    assert said[0].startswith(f"checkpoint: {option} {value} -> {{trial_dir}}")
    assert f"  # {option} {value} -> {{trial_dir}}" in text  # the scenario says so too


def test_a_checkpoint_option_only_the_script_spells_is_added_and_none_at_all_is_said(tmp_path):
    scenario, _, said = written(tmp_path, "python train.py", 'parser.add_argument("--ckpt-dir")\n')
    assert scenario.job.command == ("python", "train.py", "--ckpt-dir", "{trial_dir}")
    assert said == [f"checkpoint: --ckpt-dir {{trial_dir}} added, as your script has the option: each trial its "
                    f"own, nothing written to {tmp_path}"]
    # a script that only reads a file to resume from is not given one: it may require it to exist
    scenario, text, said = written(tmp_path, "python train.py", 'parser.add_argument("--resume")\n')
    assert scenario.job.command == ("python", "train.py")
    assert "# no checkpoint option found" in text and "{trial_dir}" in text.split("# no checkpoint option")[1]
    assert said[0].startswith("checkpoint: no checkpoint option found")


@pytest.mark.parametrize("given, default, short", [("--timeout 5", "5", "2.5"), ("--timeout=60", "60", "5")])
def test_a_timeout_the_command_gives_is_varied_not_given_twice(tmp_path, given, default, short):
    scenario, text, said = written(tmp_path, f"python train.py {given} --ckpt ck.pt")
    assert "--timeout" not in " ".join(scenario.job.command)
    name = f"timeout_{short.replace('.', '_')}s"
    assert scenario.trial_names() == ["default", name, "torchrun_restarts"]
    commands = {trial: build_plan(scenario, trial).trial.job["command"] for trial in scenario.trial_names()}
    assert [c.count("--timeout") for c in commands.values()] == [1, 1, 1]
    assert commands["default"][-2:] == ["--timeout", default] and commands[name][-2:] == ["--timeout", short]
    assert commands["torchrun_restarts"][-2:] == ["--timeout", default]
    assert 'tune: {timeout: "--timeout {seconds}"}' in text
    assert f"timeout: your --timeout {default} moved into the variants, against a shorter one" in said


def test_the_torchrun_variant_restarts_on_a_store_per_round_and_names_the_torch_issue(tmp_path):
    scenario, text, _ = written(tmp_path, "python train.py")
    torchrun = build_plan(scenario, "torchrun_restarts").trial.job
    assert torchrun["launcher"] == "torchrun" and torchrun["env"] == {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}
    assert "pytorch/pytorch#135712" in text
