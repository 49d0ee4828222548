"""The scenario loader: shipped files load, bad files get errors naming file:line, field,
value and form, targets resolve with the seed, pulses expand, the JSON Schema agrees."""
from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest
from pydantic import ValidationError
import yaml

from chaos.errors import UsageError
from harness.scenario.scenario import Scenario, job_checkpoint_dir, load_scenario
from harness.scenario.schema import json_schema

SCENARIOS = Path(__file__).resolve().parents[2] / "scenarios"
SHIPPED = sorted(SCENARIOS.glob("*.yaml"))

BASE = """\
cluster: {ranks: 8}
faults:
  - kind: loss
    percent: "20%"
    target: {rank: 5}
    start: 1s
    duration: 10s
policies: {timeout: {timeout: 5s}}
expect:
  timeout: {outcome: failed-fast, detect_within: 7s}
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "s.yaml"
    path.write_text(text)
    return path


def load_text(tmp_path: Path, text: str) -> Scenario:
    return load_scenario(write(tmp_path, text))


def error_of(tmp_path: Path, text: str) -> str:
    with pytest.raises(UsageError) as caught:
        load_text(tmp_path, text)
    return str(caught.value)


@pytest.mark.parametrize("path", SHIPPED, ids=[p.name for p in SHIPPED])
def test_every_shipped_scenario_loads_and_says_what_it_expects(path: Path) -> None:
    scenario = load_scenario(path)
    assert scenario.name == path.stem
    assert scenario.expect, "a shipped scenario states what each policy is expected to do"
    assert set(scenario.expect) == set(scenario.trial_names())


def test_the_document_rows_and_the_issue_list_are_shipped() -> None:
    kinds = {e.fault.kind for p in SHIPPED for e in load_scenario(p).faults}
    assert {"loss", "blackhole", "link_down", "pause", "kill", "delay", "bandwidth", "partition"} <= kinds
    assert any(e.pulses for p in SHIPPED for e in load_scenario(p).faults), "a flapping link"
    assert any(not load_scenario(p).faults for p in SHIPPED), "a fault-free control run"


@pytest.mark.parametrize("change, where, words", [
    # wrong type
    (("cluster: {ranks: 8}", "cluster: {ranks: many}"), ":1:", ["cluster.ranks", "'many'", "integer"]),
    # unknown key
    (("    start: 1s", "    strat: 1s"), ":6:", ["faults.0.strat", "unknown field"]),
    # missing target
    (("    target: {rank: 5}\n", ""), ":3:", ["faults.0.target", "missing", "rank: 5", "count: \"25%\""]),
    # a rank outside the cluster
    (("target: {rank: 5}", "target: {ranks: [2, 8]}"), ":5:", ["faults.0.target.ranks", "rank 8", "0..7"]),
    # impossible timeline: a cycle longer than the duration
    (("    duration: 10s", "    duration: 10s\n    pulses: {on_for: 6s, off_for: 6s}"), ":8:",
     ["faults.0.pulses", "12s", "10s"]),
    # a unit missing
    (('percent: "20%"', "percent: 20"), ":4:", ["faults.0.percent", "20", '"20%"']),
    # an unknown kind
    (("kind: loss", "kind: los"), ":3:", ["faults.0.kind", "'los'", "link_down"]),
    # an expectation for a policy the file does not run
    (("  timeout: {outcome", "  retry: {outcome"), ":10:", ["expect.retry", "no such policy"]),
    # a tier for a policy the file does not run, a tier that is none
    (("7s}\n", "7s}\ntier: {retry: nightly}\n"), ":11:", ["tier.retry", "no such policy (timeout)", "name one of"]),
    (("7s}\n", "7s}\ntier: {timeout: nighty}\n"), ":11:",
     ["tier.timeout", "'nighty' is not a tier (ci, nightly)", "tier: nightly", "tier: {retry: nightly}"]),
    (("7s}\n", "7s}\ntier: weekly\n"), ":11:", ["tier: 'weekly' is not a tier (ci, nightly)", "tier: nightly"]),
    (("outcome: failed-fast", "outcome: fast"), ":10:", ["outcome", "'fast'", "'failed-fast'"]),
    (("detect_within: 7s", "detect_within: soon"), ":10:", ["detect_within", "'soon'", '"250ms"']),
])
def test_a_bad_file_gets_an_error_naming_file_line_field_value_and_form(
        tmp_path: Path, change: tuple[str, str], where: str, words: list[str]) -> None:
    assert change[0] in BASE
    message = error_of(tmp_path, BASE.replace(*change))
    assert message.startswith(f"{tmp_path / 's.yaml'}{where} "), message
    for word in words:
        assert word in message, (word, message)


def test_a_trial_s_tier_is_set_per_trial_or_for_every_trial_and_is_ci_when_not_set(tmp_path: Path) -> None:
    two = BASE.replace("policies: {timeout: {timeout: 5s}}", "policies: {timeout: {timeout: 5s}, retry: {}}")

    def tiers(text: str) -> dict[str, str]:
        scenario = load_text(tmp_path, two + text)
        return {trial: scenario.tier_of(trial) for trial in scenario.trial_names()}

    assert tiers("") == {"timeout": "ci", "retry": "ci"}
    assert tiers("tier: {retry: nightly}\n") == {"timeout": "ci", "retry": "nightly"}
    assert tiers("tier: nightly\n") == {"timeout": "nightly", "retry": "nightly"}


@pytest.mark.parametrize("faults, words", [
    ("[{kind: pause, target: {rank: 1}, duration: 5s},"
     " {kind: pause, target: {ranks: [1, 2]}, start: 4s, duration: 5s}]", ["faults.1", "second pause", "rank 1"]),
    ("[{kind: kill, target: {rank: 1}, start: 2s}, {kind: pause, target: {rank: 1}, start: 3s, duration: 1s}]",
     ["faults.1", "killed by faults.0"]),
    ("[{kind: kill, target: {rank: 1}, duration: 2s}]", ["faults.0.duration", "cannot be undone"]),
    ("[{kind: link_down, target: {rank: 1}, pulses: {on_for: 1s, off_for: 1s}}]", ["faults.0.pulses", "duration"]),
    ("[{kind: link_down, target: {rank: 1}, duration: 4s, pulses: {on: 1s, off: 1s}}]", ["on_for"]),
    ("[{kind: partition, target: {count: '100%'}, duration: 2s}]", ["faults.0.target", "whole cluster"]),
    ("[{kind: loss, percent: '1%', target: {group: left}, duration: 2s}]", ["faults.0.target.group", "'left'"]),
    ("[{kind: loss, percent: '1%', target: {rank: 1, count: 2}, duration: 2s}]", ["exactly one", "rank and count"]),
    ("[{kind: loss, percent: '1%', target: {count: 9}, duration: 2s}]", ["faults.0.target.count", "9"]),
    ("[{kind: loss, percent: '1%', target: {rank: 1}, start: -1s}]", ["faults.0.start", "negative"]),
    ("[{kind: loss, percent: '1%', target: {rank: 1}, duration: 0s}]", ["faults.0.duration", "above 0"]),
])
def test_impossible_timelines_and_targets_are_refused(tmp_path: Path, faults: str, words: list[str]) -> None:
    message = error_of(tmp_path, f"cluster: {{ranks: 8}}\nfaults: {faults}\n")
    for word in words:
        assert word in message, (word, message)


@pytest.mark.parametrize("text, words", [
    ("", ["a mapping of fields"]),
    ("- 1\n- 2\n", ["a mapping of fields", "list"]),
    ("faults: [\n", [":2:", "not valid YAML"]),
    ("a: &x [*x]\n", ["a: unknown field"]),
])
def test_files_that_are_not_scenarios_get_a_usage_error(tmp_path: Path, text: str, words: list[str]) -> None:
    message = error_of(tmp_path, text)
    for word in words:
        assert word in message, (word, message)


def test_a_file_that_is_not_text_or_not_there(tmp_path: Path) -> None:
    (tmp_path / "bin.yaml").write_bytes(b"name: \xff\xfe\n")
    with pytest.raises(UsageError, match="not UTF-8"):
        load_scenario(tmp_path / "bin.yaml")
    with pytest.raises(UsageError, match="no such scenario file"):
        load_scenario(tmp_path / "absent.yaml")


def test_targets_resolve_once_and_the_same_with_the_same_seed(tmp_path: Path) -> None:
    text = ("seed: {seed}\ngroups: {{left: [3, 1, 2]}}\nfaults:\n"
            "  - {{kind: pause, target: {{count: '25%'}}, duration: 1s}}\n"
            "  - {{kind: link_down, target: {{count: 3}}, duration: 1s}}\n"
            "  - {{kind: loss, percent: '1%', target: {{group: left}}, duration: 1s}}\n"
            "  - {{kind: bandwidth, rate: 1mbit, target: {{ranks: [9, 4]}}, duration: 1s}}\n")
    first = load_text(tmp_path, text.format(seed=7))
    again = load_text(tmp_path, text.format(seed=7))
    assert [first.targets(i) for i in range(4)] == [again.targets(i) for i in range(4)]
    assert len(first.targets(0)) == 4 and len(first.targets(1)) == 3
    assert first.targets(2) == (1, 2, 3) and first.targets(3) == (4, 9)
    others = {load_text(tmp_path, text.format(seed=s)).targets(0) for s in range(8)}
    assert len(others) > 1, "the seed chooses the ranks"


def test_pulses_expand_into_on_phases_cut_at_the_end(tmp_path: Path) -> None:
    scenario = load_text(tmp_path, "faults:\n  - {kind: link_down, target: {rank: 1}, start: 2s,"
                                   " duration: 9s, pulses: {on_for: 2s, off_for: 2s}}\n")
    assert scenario.faults[0].windows() == [(2.0, 4.0), (6.0, 8.0), (10.0, 11.0)]


def test_overrides_are_checked_like_the_file(tmp_path: Path) -> None:
    path = write(tmp_path, BASE)
    assert load_scenario(path, {"cluster.ranks": 16, "seed": 3}).cluster.ranks == 16
    with pytest.raises(UsageError, match="rank 5 is outside the cluster"):
        load_scenario(path, {"cluster.ranks": 4})


def test_an_outcome_may_be_one_name_or_a_list(tmp_path: Path) -> None:
    scenario = load_text(tmp_path, BASE.replace("outcome: failed-fast", "outcome: [failed-fast, absorbed]"))
    assert scenario.expect["timeout"].outcome == ("failed-fast", "absorbed")
    assert load_text(tmp_path, BASE).expect["timeout"].outcome == ("failed-fast",)


def test_a_scenario_is_frozen(tmp_path: Path) -> None:
    scenario = load_text(tmp_path, BASE)
    with pytest.raises(ValidationError, match="frozen"):
        scenario.seed = 2  # type: ignore[misc]


def test_the_json_schema_accepts_the_shipped_files_and_refuses_mistakes() -> None:
    schema = json_schema()
    jsonschema.Draft202012Validator.check_schema(schema)
    validator = jsonschema.Draft202012Validator(schema)
    for path in SHIPPED:
        assert not list(validator.iter_errors(yaml.safe_load(path.read_text()))), path.name
    data = yaml.safe_load(BASE)
    for mistake in ({"faults": [{**data["faults"][0], "percent": 20}]},
                    {"faults": [{k: v for k, v in data["faults"][0].items() if k != "target"}]},
                    {"cluster": {"ranks": "many"}}, {"hang_cap": "soon"}, {"colour": "red"},
                    {"tier": "weekly"}, {"tier": {"timeout": "weekly"}}):
        assert list(validator.iter_errors({**data, **mistake})), mistake
    json.dumps(schema)  # printable as is


STORAGE_JOB = """\
cluster: {{ranks: 4{backend}}}
job:
  command: [python, train.py, --checkpoint, "{path}"]
faults:
  - {{kind: disk_full, after_bytes: 1mib, target: {{rank: 0}}, duration: 5s}}
"""


@pytest.mark.parametrize("path, backend, words", [
    ("/tmp/checkpoint.pt", "", [":5:", "faults.0.kind", "names no path under {trial_dir}", "{trial_dir}/ckpt/"]),
    ("{trial_dir}/checkpoint.pt", "", [":5:", "the trial's own folder", "events and logs", "{trial_dir}/ckpt/"]),
    ("{trial_dir}/../elsewhere/checkpoint.pt", "", [":5:", "outside the trial's folder"]),
    ("{trial_dir}/ckpt/checkpoint.pt", ", backend: slurm", [":5:", "faults.0.kind", "--backend netns or docker or local"]),
])
def test_a_storage_fault_without_a_checkpoint_folder_of_its_own_is_refused(
        tmp_path: Path, path: str, backend: str, words: list[str]) -> None:
    message = error_of(tmp_path, STORAGE_JOB.format(path=path, backend=backend))
    assert message.startswith(str(tmp_path / "s.yaml")), message
    for word in words:
        assert word in message, (word, message)


def test_a_storage_fault_acts_on_the_folder_its_job_names(tmp_path: Path) -> None:
    scenario = load_text(tmp_path, STORAGE_JOB.format(path="{trial_dir}/ckpt/checkpoint.pt", backend=""))
    assert scenario.job is not None and job_checkpoint_dir(scenario.job) == "ckpt"


GPU_SLOW = """\
cluster: {{ranks: 2, device: {device}}}
faults:
  - {{kind: slow, {setting}, target: {{rank: 1}}, start: 1s, duration: 5s}}
"""


@pytest.mark.parametrize("setting, words", [
    ("gpu_clock: 900, power_limit: 150", ["faults.0", "give one of cpu_percent", "not gpu_clock and power_limit"]),
    ("gpu_clock: 900, stops: true", ["faults.0.stops", "remove stops"]),
])
def test_slow_takes_one_setting(tmp_path: Path, setting: str, words: list[str]) -> None:
    message = error_of(tmp_path, GPU_SLOW.format(device="cuda", setting=setting))
    for word in words:
        assert word in message, (word, message)


def test_a_gpu_setting_on_ranks_that_run_on_the_cpu_is_refused_with_its_line(tmp_path: Path) -> None:
    message = error_of(tmp_path, GPU_SLOW.format(device="cpu", setting="power_limit: 150"))
    assert ":3: faults.0.power_limit: sets the rank's GPU, and the ranks run on the CPU" in message
    assert "set cluster.device: cuda" in message


def test_chaos_run_refuses_a_gpu_setting_this_machine_cannot_make(tmp_path: Path) -> None:
    from chaos.nvml import why_no_gpu_settings
    from tests.conftest import chaos_cli
    why = why_no_gpu_settings()
    if why is None:
        pytest.skip("this machine can set its GPUs' clocks: nothing to refuse")
    scenario = tmp_path / "gpu.yaml"
    scenario.write_text(GPU_SLOW.format(device="cuda", setting="gpu_clock: 900"))
    done = chaos_cli("run", str(scenario), "--out", str(tmp_path / "runs"))
    assert done.returncode == 2 and not (tmp_path / "runs").exists()
    assert f"{scenario}:3: faults.0.gpu_clock: a GPU setting, and {why}; run it on a GPU node as root" in done.stderr


STORE_HOST = """\
cluster: {{ranks: {ranks}, store: host{backend}}}
faults:
  - {{kind: kill, target: {{rank: {last}}}, start: 1s}}
{trials}
"""
RUNNER = "policies: {timeout: {timeout: 5s}}"
USER_JOB = "job: {command: [python, train.py], workdir: .}"


@pytest.mark.parametrize("ranks, backend, trials, words", [
    (2, "", RUNNER, [":1: cluster.store: host: the store takes the last of the cluster's 2 hosts",
                     "give cluster.ranks: 3 or more"]),
    (4, ", backend: docker", RUNNER, ["cluster.store: host: the docker backend", "run with --backend netns or local"]),
    (4, "", USER_JOB, ["cluster.store: host places the rendezvous store the harness runs",
                       "the job (launcher: direct) does not rendezvous there", "only torchrun's and ft_launcher's"]),
    (4, "", USER_JOB.replace("workdir: .", "workdir: ., launcher: torchft"),
     ["the job (launcher: torchft) does not rendezvous there"]),
])
def test_a_store_on_a_host_of_its_own_is_refused_where_it_cannot_be(
        tmp_path: Path, ranks: int, backend: str, trials: str, words: list[str]) -> None:
    message = error_of(tmp_path, STORE_HOST.format(ranks=ranks, backend=backend, last=ranks - 1, trials=trials))
    for word in words:
        assert word in message, (word, message)


def test_a_store_on_a_host_of_its_own_takes_torchruns_and_ft_launchers_rendezvous(tmp_path: Path) -> None:
    from harness.cluster.userjob import rank_command
    for launcher in ("torchrun", "ft_launcher"):
        job = USER_JOB.replace("workdir: .", f"workdir: ., launcher: {launcher}")
        scenario = load_text(tmp_path, STORE_HOST.format(ranks=4, backend="", last=3, trials=job))
        assert scenario.cluster.store == "host" and scenario.job.rendezvous_on_harness_store
        # three agents, which rendezvous on the fourth host's store
        argv = rank_command(scenario.job, 0, 3, "r", "10.77.0.13:29400", addresses=["a", "b", "c"])
        assert "--nnodes=3" in argv and "--rdzv-endpoint=10.77.0.13:29400" in argv


def test_a_store_on_the_last_host_makes_the_others_the_ranks(tmp_path: Path) -> None:
    from harness.trial.plan import build_plan
    from runfolder.frameworks import training_hosts

    scenario = load_text(tmp_path, STORE_HOST.format(ranks=5, backend="", last=4, trials=RUNNER))
    trial = build_plan(scenario, "timeout").trial
    assert trial.store_host and trial.faults[0].targets == (4,)
    assert training_hosts(trial.ranks, trial.job, trial.store_host) == (0, 1, 2, 3)
    assert not build_plan(load_text(tmp_path, BASE), "timeout").trial.store_host
