"""`chaos export k8s`: every shipped trial exports to manifests the real CRD schemas and the
admission webhooks' rules accept, or is refused with its reason; the mapping keeps the
harness's parameters; the ranks' environment reads back as the trial's plan."""
from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest
import yaml

from chaos.errors import UsageError
from chaos.tc import tbf_sizes
from harness.cluster.container import config_from_env
from harness.k8s import cli
from harness.k8s.env import duration_text
from harness.k8s.export import FAULTS_FILE, JOB_FILE, export_trial
from harness.k8s.faults import phases
from harness.k8s.operators import OPERATORS
from harness.scenario.scenario import load_scenario
from harness.trial.plan import build_plan
from tests.k8s.admission import admission_problems

REPO = Path(__file__).resolve().parents[2]
SCENARIOS = sorted((REPO / "scenarios").glob("*.yaml"))
TRIALS = [(path, policy) for path in SCENARIOS for policy in load_scenario(path).policies]
APIS = sorted(OPERATORS)
POLICY_REFUSAL = re.compile(r"policies\.[\w-]+: trial '[\w-]+' cannot reach a rank on Kubernetes: .*cannot carry: ")
FAULT_REFUSAL = re.compile(r":\d+: faults\.\d+: (\w+) has no exact equivalent in Chaos Mesh: ")
ANCHOR_REFUSAL = re.compile(r":\d+: faults\.\d+\.start: a fault anchored on an event \(\w+\) is applied by the harness ")


def documents(text: str) -> list[dict]:
    return [doc for doc in yaml.safe_load_all(text) if doc is not None]


def exported(export) -> list[dict]:
    return [doc for text in export.files.values() for doc in documents(text)]


def carried(path: Path, tmp_path: Path) -> Path:
    """The scenario under one policy the rank environment carries (a timeout), and the default
    model (a larger one is not carried: slow_compute_bound.yaml's), for its faults."""
    data = yaml.safe_load(path.read_text())
    data.update(policies={"timeout": {"timeout": "5s"}}, expect={}, tier={},
                workload={k: v for k, v in data.get("workload", {}).items() if k not in ("batch", "features", "hidden")})
    copy = tmp_path / path.name
    copy.write_text(yaml.safe_dump(data))
    return copy


@pytest.mark.parametrize("api", APIS)
@pytest.mark.parametrize("path, policy", TRIALS, ids=[f"{p.stem}-{q}" for p, q in TRIALS])
def test_every_shipped_trial_exports_valid_manifests_or_is_refused_with_its_reason(path, policy, api):
    try:
        export = export_trial(path, policy, api=api)
    except UsageError as exc:
        message = str(exc)
        assert message.startswith(str(path))
        fault = FAULT_REFUSAL.search(message)
        if load_scenario(path).job is not None:
            assert ": job: a scenario that runs your own training job cannot be exported yet" in message
            return
        assert (POLICY_REFUSAL.search(message) or ANCHOR_REFUSAL.search(message)
                or (fault and fault.group(1) in ("pause", "slow", "step_delay"))), message
        return
    assert admission_problems(exported(export)) == []
    assert (FAULTS_FILE in export.files) == bool(load_scenario(path).faults)


@pytest.mark.parametrize("api", APIS)
@pytest.mark.parametrize("path", [p for p in SCENARIOS if load_scenario(p).faults and load_scenario(p).job is None], ids=lambda p: p.stem)
def test_every_shipped_timeline_of_mappable_kinds_exports_and_validates(path, api, tmp_path):
    kinds = {event.fault.kind for event in load_scenario(path).faults}
    if any(event.fault.acts_on == "storage" for event in load_scenario(path).faults):  # not exported (harness/k8s/faults.py says why)
        with pytest.raises(UsageError, match=r"cannot reach a rank on Kubernetes|no exact equivalent in Chaos Mesh"):
            export_trial(carried(path, tmp_path), "timeout", api=api)
        return
    if any(not isinstance(event.start, (int, float)) for event in load_scenario(path).faults):
        with pytest.raises(UsageError, match=ANCHOR_REFUSAL.pattern):  # a Workflow runs at set times
            export_trial(carried(path, tmp_path), "timeout", api=api)
        return
    if "pause" in kinds:
        with pytest.raises(UsageError, match=r"faults\.\d+: pause has no exact equivalent in Chaos Mesh: it has no "
                                             r"way to freeze a process"):
            export_trial(carried(path, tmp_path), "timeout", api=api)
        return
    if "slow" in kinds:
        with pytest.raises(UsageError, match=r"faults\.\d+: slow has no exact equivalent in Chaos Mesh: .*cannot cap"):
            export_trial(carried(path, tmp_path), "timeout", api=api)
        return
    if "step_delay" in kinds:
        with pytest.raises(UsageError, match=r"faults\.\d+: step_delay has no exact equivalent in Chaos Mesh: .*command "
                                             r"file"):
            export_trial(carried(path, tmp_path), "timeout", api=api)
        return
    export = export_trial(carried(path, tmp_path), "timeout", api=api)
    assert admission_problems(exported(export)) == []


def test_the_shipped_trials_that_export_cover_every_mappable_kind():
    """Not everything refused: the exported trials include every kind Chaos Mesh can inject."""
    kinds = set()
    for path, policy in TRIALS:
        try:
            export_trial(path, policy)
        except UsageError:
            continue
        kinds |= {event.fault.kind for event in load_scenario(path).faults}
    assert kinds == {"bandwidth", "blackhole", "delay", "kill", "link_down", "loss", "partition"}


def test_pause_is_refused_naming_file_line_fault_kind_and_why():
    with pytest.raises(UsageError) as caught:
        export_trial(REPO / "scenarios" / "detector_pause.yaml", "elastic")
    message = str(caught.value)
    assert re.match(rf"{re.escape(str(REPO / 'scenarios' / 'detector_pause.yaml'))}:\d+: faults\.0: pause ", message)
    assert "SIGSTOP" in message and "pod-failure" in message


def test_a_trial_the_environment_cannot_carry_is_refused_naming_each_field(tmp_path):
    data = yaml.safe_load((REPO / "scenarios" / "link_down.yaml").read_text())
    data["workload"] = {**data.get("workload", {}), "checkpoint_every": 3, "hidden": 128}
    path = tmp_path / "workload.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(UsageError) as caught:
        export_trial(path, "retry")
    message = str(caught.value)
    for field in ("checkpoint_every: 3 (a rank would run 10)", "hidden: 128 (a rank would run 256)"):
        assert f"workload {field}" in message
    assert "policy " not in message.split("cannot carry: ")[1].split(". ")[0]  # the whole policy reaches the rank
    assert "harness/cluster/container.py" in message


def test_every_policy_field_reaches_the_rank():
    """A label with its own base and every knob set (retry_fd: base retry, a detector) reads
    back exactly as planned."""
    path = REPO / "scenarios" / "detector_link_down.yaml"
    for policy in load_scenario(path).policies:
        export = export_trial(path, policy, api="pytorchjob")
        job = next(d for d in exported(export) if d["kind"] == "PyTorchJob")
        container = job["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]
        env = {e["name"]: e.get("value") for e in container["env"]}
        config = config_from_env({**env, "CHAOS_RANK": "1"})
        assert config["policy"] == build_plan(load_scenario(path), policy).trial.policy_spec


def test_the_rank_environment_reads_back_as_the_trials_plan():
    path = REPO / "scenarios" / "elastic_kill.yaml"
    export = export_trial(path, "elastic", api="pytorchjob")
    job = next(d for d in exported(export) if d["kind"] == "PyTorchJob")
    container = job["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e.get("value") for e in container["env"]}
    rank = next(e for e in container["env"] if e["name"] == "CHAOS_RANK")
    assert rank["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.labels['training.kubeflow.org/replica-index']"
    config = config_from_env({**env, "CHAOS_RANK": "5"})
    plan = build_plan(load_scenario(path), "elastic").trial
    assert (config["rank"], config["world_size"], config["seed"]) == (5, plan.ranks, plan.seed)
    assert config["policy"] == plan.policy_spec and config["workload"] == plan.workload
    assert config["store_address"] == f"{export.job}-master-0" and config["max_steps"] is None


def test_a_checkpoint_restoring_policy_may_keep_its_checkpoints_on_a_shared_volume(tmp_path):
    """Node-local disks are enough (rank 0's checkpoint is sent to the ranks that lack it,
    harness/job/restore.py); a claim keeps the checkpoints beyond the pods."""
    data = yaml.safe_load((REPO / "scenarios" / "link_down.yaml").read_text())
    data.update(policies={"retry": {"timeout": "5s"}}, expect={}, tier={})
    path = tmp_path / "retry.yaml"
    path.write_text(yaml.safe_dump(data))
    assert admission_problems(exported(export_trial(path, "retry"))) == []
    export = export_trial(path, "retry", checkpoint_claim="shared-ckpt")
    runtime = next(d for d in exported(export) if d["kind"] == "ClusterTrainingRuntime")
    node = runtime["spec"]["template"]["spec"]["replicatedJobs"][1]["template"]["spec"]["template"]["spec"]
    assert {"name": "checkpoints", "persistentVolumeClaim": {"claimName": "shared-ckpt"}} in node["volumes"]
    assert {"name": "checkpoints", "mountPath": "/runs/ckpt", "subPath": export.job} in node["containers"][0]["volumeMounts"]
    assert admission_problems(exported(export)) == []


def _templates(export) -> dict[str, dict]:
    (flow,) = documents(export.files[FAULTS_FILE])
    return {t["name"]: t for t in flow["spec"]["templates"]}


def test_a_pulsed_fault_keeps_its_offsets_in_suspend_and_deadline_templates():
    path = REPO / "scenarios" / "link_flap.yaml"
    templates = _templates(export_trial(path, "timeout"))
    t, spans = 0.0, []
    for name in templates["fault0"]["children"]:
        seconds = float(templates[name]["deadline"].removesuffix("s"))
        if templates[name]["templateType"] == "NetworkChaos":
            spans.append((t, t + seconds))
        t += seconds
    assert spans == phases(build_plan(load_scenario(path), "timeout").trial, 0) == [(1, 3), (7, 9), (13, 15)]


def test_link_faults_keep_the_harness_parameters_and_reach_every_pod_of_the_job():
    loss = _templates(export_trial(REPO / "scenarios" / "loss_20pct.yaml", "timeout"))["f0-on1-p0"]["networkChaos"]
    assert loss["loss"] == {"loss": "20", "correlation": "0"} and loss["direction"] == "both"
    assert loss["selector"]["expressionSelectors"] == [
        {"key": "batch.kubernetes.io/job-completion-index", "operator": "In", "values": ["5"]}]
    assert loss["target"]["selector"]["labelSelectors"] == {"jobset.sigs.k8s.io/jobset-name": "loss-20pct-timeout"}
    delay = _templates(export_trial(REPO / "scenarios" / "delay_50ms.yaml", "timeout"))["f0-on1-p0"]["networkChaos"]
    assert delay["delay"] == {"latency": "50ms", "jitter": "0s", "correlation": "0"}
    band = _templates(export_trial(REPO / "scenarios" / "bandwidth_10mbit.yaml", "timeout"))["f0-on1-p0"]
    rate, burst, limit = tbf_sizes(10e6, None)
    assert band["networkChaos"]["bandwidth"] == {"rate": f"{rate}bps", "limit": limit, "buffer": burst}
    assert rate == 1_250_000 and band["deadline"] == "10s"


def test_a_kill_is_a_container_kill_of_the_rank_container_that_never_heals():
    templates = _templates(export_trial(REPO / "scenarios" / "kill_rank.yaml", "timeout", api="pytorchjob"))
    kill = templates["f0-on1-p0"]
    assert "deadline" not in kill
    assert kill["podChaos"]["action"] == "container-kill" and kill["podChaos"]["containerNames"] == ["pytorch"]
    assert kill["podChaos"]["selector"]["labelSelectors"]["training.kubeflow.org/replica-type"] == "worker"


def test_a_partition_cuts_rank_pods_only_leaving_the_control_plane_reachable():
    spec = _templates(export_trial(REPO / "scenarios" / "partition_halves.yaml", "timeout"))["f0-on1-p0"]["networkChaos"]
    for side, ranks in ((spec, [str(r) for r in range(8)]), (spec["target"], [str(r) for r in range(8, 16)])):
        assert side["selector"]["labelSelectors"]["jobset.sigs.k8s.io/replicatedjob-name"] == "node"
        assert side["selector"]["expressionSelectors"][0]["values"] == ranks
    assert spec["loss"]["loss"] == "100" and spec["direction"] == "both"


@pytest.mark.parametrize("fault, why", [
    ('{kind: loss, percent: "20%", correlation: "25%"', "Markov chain"),
    ('{kind: loss, percent: "20%", burst: 3', "Markov chain"),
    ('{kind: delay, latency: 50ms, jitter: 10ms, distribution: normal', "no delay distribution"),
    ("{kind: kill, signal: SIGTERM", "SIGTERM cannot be sent"),
])
def test_variants_without_an_exact_equivalent_are_refused(fault, why, tmp_path):
    path = tmp_path / "variant.yaml"
    path.write_text(f"cluster: {{ranks: 4}}\nfaults:\n  - {fault}, target: {{rank: 1}}, start: 1s}}\n"
                    "policies: {timeout: {timeout: 5s}}\n")
    with pytest.raises(UsageError, match=rf"variant\.yaml:3: faults\.0: \w+ has no exact equivalent in Chaos Mesh: .*{why}"):
        export_trial(path, "timeout")


def test_partition_groups_map_to_one_chaos_per_group_against_the_later_ones(tmp_path):
    path = tmp_path / "thirds.yaml"
    path.write_text("cluster: {ranks: 6}\nfaults:\n  - {kind: partition, groups: [[0, 1], [r002, r003], [4, 5]], "
                    "target: {rank: 0}, start: 1s, duration: 2s}\npolicies: {timeout: {timeout: 5s}}\n")
    export = export_trial(path, "timeout")
    templates = _templates(export)
    assert templates["f0-on1"] == {"name": "f0-on1", "templateType": "Parallel",
                                   "children": ["f0-on1-p0", "f0-on1-p1"], "deadline": "2s"}
    sides = [(t["networkChaos"]["selector"]["expressionSelectors"][0]["values"],
              t["networkChaos"]["target"]["selector"]["expressionSelectors"][0]["values"])
             for t in (templates["f0-on1-p0"], templates["f0-on1-p1"])]
    assert sides == [(["0", "1"], ["2", "3", "4", "5"]), (["2", "3"], ["4", "5"])]
    assert admission_problems(exported(export)) == []


def test_every_mapping_decision_is_a_comment_marked_exact_or_approximated():
    export = export_trial(REPO / "scenarios" / "bandwidth_10mbit.yaml", "timeout")
    comments = [line for line in export.files[FAULTS_FILE].splitlines() if line.startswith("#")]
    assert any(line.startswith("#   exact: tbf with the harness's parameters") for line in comments)
    assert any(line.startswith("#   approximated: the way into the rank is capped") for line in comments)
    assert export.approximated and all(note.startswith("faults.0: ") for note in export.approximated)
    assert export.files[JOB_FILE].startswith("# One trial of chaos-harness on Kubernetes (trainjob)")


def test_durations_are_exact_in_go_and_in_the_harness():
    assert [duration_text(s) for s in (0.0, 5.0, 0.25, 1.5, 0.0001, 90.0)] == \
        ["0s", "5s", "250ms", "1500ms", "100us", "90s"]


def test_job_names_are_dns_labels_within_the_limit():
    with pytest.raises(UsageError, match="pass --name NAME"):
        export_trial(REPO / "scenarios" / "link_down.yaml", "timeout", name="Link_Down")
    with pytest.raises(UsageError, match="at most 40 characters"):
        export_trial(REPO / "scenarios" / "link_down.yaml", "timeout", name="x" * 41)


def test_export_main_writes_the_files_and_says_what_is_approximated(tmp_path, capsys):
    parser = argparse.ArgumentParser()
    cli.add_export_arguments(parser)
    args = parser.parse_args([str(REPO / "scenarios" / "delay_50ms.yaml"), "--policy", "timeout",
                              "--out", str(tmp_path), "--api", "pytorchjob", "--namespace", "chaos"])
    assert cli.export_main(args) == 0
    out = capsys.readouterr().out
    assert sorted(p.name for p in tmp_path.iterdir()) == [FAULTS_FILE, JOB_FILE]
    assert "approximated: faults.0: netem's queue" in out
    assert "chaos collect k8s --namespace chaos --job delay-50ms-timeout --out RUN_DIR" in out
    assert all(d["metadata"]["namespace"] == "chaos" for d in documents((tmp_path / JOB_FILE).read_text()))


@pytest.mark.parametrize("api", APIS)
def test_the_hosts_network_settings_reach_every_rank_pod(api, tmp_path):
    data = yaml.safe_load((REPO / "scenarios" / "link_down.yaml").read_text())
    settings = {"net.ipv4.neigh.eth0.retrans_time_ms": "100", "net.ipv4.tcp_keepalive_time": "60"}
    data.update(policies={"timeout": {"timeout": "5s"}}, expect={}, tier={})
    data["cluster"] = {**data.get("cluster", {}), "sysctls": settings}
    path = tmp_path / "settings.yaml"
    path.write_text(yaml.safe_dump(data))
    export = export_trial(path, "timeout", api=api)
    assert admission_problems(exported(export)) == []
    pods = [c for c in _pod_specs(exported(export)) if any(x["command"][-1] == "rank" for x in c["containers"])]
    assert pods and all(p["securityContext"]["sysctls"] == [{"name": k, "value": v} for k, v in settings.items()]
                        for p in pods)
    assert "--allowed-unsafe-sysctls" in export.files[JOB_FILE]
    plain = export_trial(carried(REPO / "scenarios" / "link_down.yaml", tmp_path), "timeout", api=api)
    assert all("securityContext" not in p for p in _pod_specs(exported(plain)))


def _pod_specs(node) -> list[dict]:
    """Every pod spec under `node` (a pod template's spec: it has containers)."""
    if isinstance(node, list):
        return [p for item in node for p in _pod_specs(item)]
    if not isinstance(node, dict):
        return []
    found = [node] if isinstance(node.get("containers"), list) else []
    return found + [p for key, value in node.items() if key != "containers" for p in _pod_specs(value)]
