"""Hostile or careless input is refused at load or at the command line, with the field,
the value and the fix: it never fails later, inside a run, or escapes onto the host."""
from __future__ import annotations

import pytest

from chaos.errors import HarnessError, InvalidFault, UsageError
from chaos.faults import parse_fault
from harness.cluster.docker.template import RankTemplate
from harness.job.policies import policy_spec
from harness.scenario.scenario import load_scenario
from tests.conftest import chaos_cli


@pytest.mark.parametrize("value", [float("inf"), float("nan"), "1e999s"])
def test_a_policy_time_must_be_finite(value):
    with pytest.raises(UsageError, match=r"policies\.timeout: timeout: .* not a finite time"):
        policy_spec("timeout", {"timeout": value})


def test_a_fault_time_must_be_finite():
    with pytest.raises(InvalidFault, match="delay.latency: inf is not a finite time"):
        parse_fault({"kind": "delay", "latency": float("inf")})


def test_the_same_policy_twice_is_a_usage_error():
    done = chaos_cli("run", "scenarios/kill_rank.yaml", "--policy", "timeout", "--policy", "timeout", "--dry-run")
    assert done.returncode == 2
    assert "--policy timeout given more than once" in done.stderr


def test_an_unwritable_out_is_a_usage_error_not_a_traceback(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    done = chaos_cli("run", "scenarios/kill_rank.yaml", "--policy", "timeout", "--out", str(blocker / "runs"))
    if done.returncode == 2 and "needs root" in done.stderr:
        pytest.skip("chaos run needs root")
    assert done.returncode == 2, done.stderr
    assert f"--out {blocker / 'runs'}: cannot write run folders there" in done.stderr
    assert "Traceback" not in done.stderr


SCENARIO = """\
name: {name}
seed: {seed}
cluster: {{ranks: {ranks}}}
faults:
  - kind: partition
    groups: {groups}
    target: {{rank: 0}}
    start: 1s
    duration: 5s
policies: {{timeout: {{timeout: 5s}}}}
"""
GOOD = dict(name="ok", seed=1, ranks=8, groups="[[0, 1], [r002, 3]]")


def load(tmp_path, **changes):
    path = tmp_path / "s.yaml"
    path.write_text(SCENARIO.format(**{**GOOD, **changes}))
    return load_scenario(path), path


def refused(tmp_path, **changes) -> str:
    with pytest.raises(UsageError) as caught:
        load(tmp_path, **changes)
    return str(caught.value)


def test_the_valid_base_loads(tmp_path):
    scenario, _ = load(tmp_path)
    assert (scenario.name, scenario.seed, scenario.cluster.ranks) == ("ok", 1, 8)


@pytest.mark.parametrize("seed", [2**64, 2**70, -1])
def test_a_seed_outside_0_to_2_64_is_refused_with_its_line(tmp_path, seed):
    assert "s.yaml:2: seed: " in refused(tmp_path, seed=seed)


def test_the_largest_seed_loads(tmp_path):
    assert load(tmp_path, seed=2**64 - 1)[0].seed == 2**64 - 1


def test_more_ranks_than_one_bridge_takes_are_refused(tmp_path):
    assert load(tmp_path, ranks=1023)[0].cluster.ranks == 1023
    message = refused(tmp_path, ranks=1024)
    assert "s.yaml:3: cluster.ranks: 1024 ranks do not fit one Linux bridge (at most 1023" in message


@pytest.mark.parametrize(("groups", "bad"), [("[[0, 1], [8]]", "8"), ("[[0], [r009]]", "'r009'"),
                                             ("[[0], [r3]]", "'r3'"), ("[[0], [node1]]", "'node1'")])
def test_partition_groups_must_name_ranks_of_the_cluster(tmp_path, groups, bad):
    message = refused(tmp_path, groups=groups)
    assert f"s.yaml:6: faults.0.groups.1: {bad} is not a rank of this cluster (0..7 or r000..r007" in message


def test_a_key_given_twice_is_refused_naming_both_lines(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text(SCENARIO.format(**GOOD) + "seed: 7\n")
    with pytest.raises(UsageError, match=r"s\.yaml:11: seed: given twice \(first on line 2\)"):
        load_scenario(path)


def test_a_nested_key_given_twice_is_refused(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text(SCENARIO.format(**GOOD).replace("timeout: 5s}", "timeout: 5s, timeout: 6s}"))
    with pytest.raises(UsageError, match=r"s\.yaml:10: timeout: given twice \(first on line 10\)"):
        load_scenario(path)


@pytest.mark.parametrize("name", ["../../x", "/etc/x", "a/b", ".", "..", ".hidden", "-rf", "a b", ""])
def test_a_name_that_is_not_a_plain_label_is_refused(tmp_path, name):
    assert "s.yaml:1: name: " in refused(tmp_path, name=f"'{name}'")


def test_a_file_name_that_is_not_a_plain_label_is_refused(tmp_path):
    path = tmp_path / "my scenario.yaml"
    path.write_text(SCENARIO.format(**GOOD).replace("name: ok\n", ""))
    with pytest.raises(UsageError, match=r"my scenario\.yaml:1: name: 'my scenario' is not a plain label"):
        load_scenario(path)


def test_a_dry_run_never_makes_a_folder_outside_out(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text(SCENARIO.format(**{**GOOD, "name": "'../../escaped'"}))
    done = chaos_cli("run", str(path), "--out", str(tmp_path / "runs"))
    assert done.returncode == 2, done.stderr
    assert "name: '../../escaped' is not a plain label" in done.stderr
    assert "Traceback" not in done.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.yaml"]


COMPOSE = """\
x-rank:
  image: {image}
  cap_add: {cap_add}
services: {services}
"""
COMPOSE_GOOD = dict(image="chaos:1", cap_add="[NET_ADMIN]", services="{}")


@pytest.mark.parametrize(("changes", "message"), [
    ({"image": "[a, b]"}, "rank template: image: ['a', 'b']; expected an image name"),
    ({"image": "''"}, "rank template: image: empty"),
    ({"cap_add": "NET_ADMIN"}, "rank template: cap_add: 'NET_ADMIN'; expected a list"),
    ({"services": "[a]"}, "services: expected a mapping, got list"),
])
def test_a_malformed_compose_file_names_file_and_field(tmp_path, changes, message):
    path = tmp_path / "docker-compose.yml"
    path.write_text(COMPOSE.format(**{**COMPOSE_GOOD, **changes}))
    with pytest.raises(HarnessError) as caught:
        RankTemplate.from_compose(path)
    assert str(caught.value) == f"{path}: {message}" or str(caught.value).startswith(f"{path}: {message}")


@pytest.mark.parametrize(("deploy", "message"), [
    ("{resources: [1]}", "x-gpu.deploy.resources: expected a mapping, got list"),
    ("{resources: {reservations: {devices: gpu}}}",
     "x-gpu.deploy.resources.reservations.devices: 'gpu'; expected a list"),
])
def test_a_malformed_gpu_override_names_file_and_field(tmp_path, deploy, message):
    path, gpu_path = tmp_path / "docker-compose.yml", tmp_path / "docker-compose.gpu.yml"
    path.write_text(COMPOSE.format(**COMPOSE_GOOD))
    gpu_path.write_text(f"x-gpu:\n  deploy: {deploy}\n")
    with pytest.raises(HarnessError) as caught:
        RankTemplate.from_compose(path, gpu_path)
    assert str(caught.value).startswith(f"{gpu_path}: {message}")


def test_a_compose_file_that_is_not_a_mapping_names_the_file(tmp_path):
    path = tmp_path / "docker-compose.yml"
    path.write_text("- just\n- a list\n")
    with pytest.raises(HarnessError, match="docker-compose.yml: the file: expected a mapping, got list"):
        RankTemplate.from_compose(path)


def test_a_well_formed_compose_file_reads(tmp_path):
    path = tmp_path / "docker-compose.yml"
    path.write_text(COMPOSE.format(**COMPOSE_GOOD))
    assert RankTemplate.from_compose(path).cap_add == ("NET_ADMIN",)


SYSCTL_SCENARIO = """\
name: sysctls
cluster:
  ranks: 2
  sysctls: {{{settings}}}
policies: {{timeout: {{}}}}
"""


def sysctl_scenario(tmp_path, settings: str):
    path = tmp_path / "s.yaml"
    path.write_text(SYSCTL_SCENARIO.format(settings=settings))
    return path


def test_a_hosts_setting_must_be_a_network_one(tmp_path):
    done = chaos_cli("run", str(sysctl_scenario(tmp_path, "vm.swappiness: 10")), "--dry-run")
    assert done.returncode == 2, done.stderr
    assert ("s.yaml:4: cluster.sysctls.vm.swappiness: 'vm.swappiness' is not a host's network setting: "
            "a host is a network namespace, and only net.* settings are its own") in done.stderr


def test_a_dry_run_prints_the_hosts_settings(tmp_path):
    done = chaos_cli("run", str(sysctl_scenario(tmp_path, "net.ipv4.neigh.eth0.retrans_time_ms: 100, "
                                                          "net.ipv4.tcp_rmem: [4096, 87380, 6291456]")), "--dry-run")
    assert done.returncode == 0, done.stderr
    assert ("every host's own settings: net.ipv4.neigh.eth0.retrans_time_ms = 100, "
            "net.ipv4.tcp_rmem = 4096 87380 6291456") in done.stdout


@pytest.mark.requires_root
def test_a_setting_no_host_has_stops_the_run_at_bring_up_and_leaves_nothing(tmp_path, leaves_nothing):
    path = sysctl_scenario(tmp_path, "net.ipv4.neigh.eth9.retrans_time_ms: 100")
    done = chaos_cli("run", str(path), "--out", str(tmp_path / "runs"), "--quiet", timeout=120)
    assert done.returncode == 2, done.stderr
    assert ("cluster.sysctls: net.ipv4.neigh.eth9.retrans_time_ms: a host's network namespace has no such "
            "setting") in done.stderr
    assert "Traceback" not in done.stderr
