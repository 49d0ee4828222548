"""bench/byo_compare.py builds its two scenarios per fault from one fault list (root-free)."""
from __future__ import annotations

import importlib
from pathlib import Path

import pytest

from harness.scenario.scenario import load_scenario

BENCH = Path(__file__).resolve().parents[2] / "bench"


@pytest.fixture
def byo_compare(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCH))  # how the bench imports its neighbour detector.py
    return importlib.import_module("byo_compare")


@pytest.mark.parametrize("fault", ["link_down", "kill", "pause"])
@pytest.mark.parametrize("ranks", [16, 7])
def test_both_sides_share_the_faults_and_the_seed(byo_compare, tmp_path, fault, ranks):
    paths = byo_compare.write_scenarios(fault, ranks, tmp_path)
    builtin, example = load_scenario(paths["built-in"]), load_scenario(paths["example"])
    assert builtin.faults == example.faults and len(builtin.faults) == 1
    assert builtin.faults[0].fault.kind == fault and builtin.targets(0) == example.targets(0) == (5,)
    for field in ("seed", "cluster", "warmup_steps", "hang_cap", "settle_steps"):
        assert getattr(builtin, field) == getattr(example, field), field
    assert builtin.cluster.ranks == ranks
    # the harness's runner on one side, the example script on the other
    assert builtin.job is None and example.job is not None
    assert builtin.trial_names() == [p.policy for p in byo_compare.PAIRS]
    assert example.trial_names() == [p.variant for p in byo_compare.PAIRS]
    assert (Path(example.job.workdir) / example.job.command[1]).is_file()
    command = example.job.command
    assert float(command[command.index("--step-period") + 1]) == builtin.workload.step_period
    assert int(command[command.index("--checkpoint-every") + 1]) == builtin.workload.checkpoint_every


def test_each_pair_has_one_process_group_timeout(byo_compare, tmp_path):
    """The example's default is torch's own gloo default; the harness's peer policy sets
    the same; the timeout pair passes one number to both sides."""
    from torch.distributed.constants import default_pg_timeout

    paths = byo_compare.write_scenarios("kill", 16, tmp_path)
    builtin, example = load_scenario(paths["built-in"]), load_scenario(paths["example"])
    for pair in byo_compare.PAIRS:
        command = example.variants[pair.variant].applied_to(example.job).command
        given = float(command[command.index("--timeout") + 1]) if "--timeout" in command \
            else default_pg_timeout.total_seconds()
        assert builtin.policy(pair.policy).timeout == given, pair


def test_a_side_without_a_run_folder_says_why(byo_compare, tmp_path, capsys):
    failed = {"byo_compare_kill_example": "HarnessError: the ranks did not start"}
    byo_compare.print_table(byo_compare.fault_lines(tmp_path, "kill", failed))
    table = capsys.readouterr().out
    assert "| kill | example | default | not observed: HarnessError: the ranks did not start |" in table
    assert "| kill | built-in | timeout | not observed: no run folder byo_compare_kill_builtin-*" in table


@pytest.mark.parametrize("argv", [["--faults", "loss"], ["--ranks", "5"]])
def test_bad_arguments_name_the_fix(byo_compare, argv, capsys):
    with pytest.raises(SystemExit) as exit_:
        byo_compare.main(argv)
    assert exit_.value.code == 2
    assert argv[0] in capsys.readouterr().err
