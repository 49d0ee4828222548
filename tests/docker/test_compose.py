"""docker-compose.yml, as `docker compose` and the harness read it (no engine needed)."""
from __future__ import annotations

import yaml

from harness.cluster.container import config_from_env
from harness.cluster.docker.template import (
    COMPOSE_FILE,
    GPU_COMPOSE_FILE,
    PROJECT_ROOT,
    RankTemplate,
    _interpolate,
    _ulimits,
)


def _compose() -> dict:
    return yaml.safe_load(COMPOSE_FILE.read_text())


def test_sixteen_rank_services_and_the_rendezvous() -> None:
    services = _compose()["services"]
    ranks = {name: s for name, s in services.items() if s["labels"]["io.chaos-harness.role"] == "rank"}
    assert sorted(int(s["environment"]["CHAOS_RANK"]) for s in ranks.values()) == list(range(16))
    assert services["control"]["command"][-1] == "control"
    assert services["control"]["cap_add"] == ["SYS_NICE"]  # harness.job.detector.run_ahead
    # it exits once that many ranks have ended, so that `docker compose up` returns
    assert services["control"]["environment"]["CHAOS_WORLD_SIZE"] == str(len(services) - 1)
    for s in ranks.values():
        env = s["environment"]
        assert env["CHAOS_WORLD_SIZE"] == "16" and env["CHAOS_STORE_ADDRESS"] == "control"
        assert env["GLOO_SOCKET_IFNAME"] == "eth0"
        assert "TORCH_NCCL_ASYNC_ERROR_HANDLING" not in env  # derived from the policy by each rank
        assert {"NET_ADMIN", "SYS_NICE"} <= set(s["cap_add"]) and s["init"] is False
        assert "deploy" not in s  # the GPU request is docker-compose.gpu.yml's: Compose 1.29 cannot remove it
        assert s["networks"] == ["job"] and s["depends_on"] == ["control"]


def test_the_gpu_override_gives_every_rank_the_gpu_request_and_nothing_else() -> None:
    gpu = yaml.safe_load(GPU_COMPOSE_FILE.read_text())
    ranks = {name for name in _compose()["services"] if name != "control"}
    assert set(gpu["services"]) == ranks
    for service in gpu["services"].values():
        assert service == gpu["x-gpu"]
        (device,) = service["deploy"]["resources"]["reservations"]["devices"]
        assert device["driver"] == "nvidia" and device["capabilities"] == ["gpu"]


def test_the_file_needs_nothing_compose_1_29_refuses() -> None:
    """No top-level `name:` (1.29's schema refuses it) and no tag such as `!reset` (Compose
    v2.24+; 1.29 reads with PyYAML's safe loader, which raises on it):
    tests/docker/test_compose_up.py runs the files with 1.29 where it is installed."""
    for path in (COMPOSE_FILE, GPU_COMPOSE_FILE):
        assert "name" not in yaml.safe_load(path.read_text())


def test_every_rank_environment_makes_a_valid_rank_config() -> None:
    services = _compose()["services"]
    for name, s in services.items():
        if name == "control":
            continue
        cfg = config_from_env({k: str(v) for k, v in _interpolate(s["environment"]).items()})
        assert cfg["rank"] == int(name.removeprefix("rank")) and cfg["world_size"] == 16
        assert cfg["store_address"] == "control" and cfg["store_port"] == 29400
        assert cfg["policy"]["name"] == "retry" and cfg["policy"]["timeout"] == 30.0
        assert cfg["events_path"] == "/runs/compose/events.jsonl" and cfg["max_steps"] == 200


def test_policy_from_the_environment(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("CHAOS_POLICY", "isolation")
    monkeypatch.setenv("CHAOS_POLICY_TIMEOUT", "5s")
    env = {k: str(v) for k, v in _interpolate(_compose()["x-env"]).items()}
    cfg = config_from_env({**env, "CHAOS_RANK": "3"})
    assert cfg["policy"]["name"] == "isolation" and cfg["policy"]["timeout"] == 5.0


def test_the_harness_reads_the_rank_template() -> None:
    t = RankTemplate.from_compose()
    assert t.image == "chaos-harness:gpu"
    assert not any(k.startswith("CHAOS_") for k in t.environment)  # the harness passes a config file
    assert t.environment["GLOO_SOCKET_IFNAME"] == "eth0" and "TORCH_NCCL_ASYNC_ERROR_HANDLING" not in t.environment
    assert t.cap_add == ("NET_ADMIN", "SYS_NICE") and t.gpu_requests and t.shm_size == "1gb"


def test_ulimits_are_capped_at_the_hosts_hard_limits() -> None:
    import resource
    (memlock,) = _ulimits({"memlock": -1})
    hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)[1]
    expected = -1 if hard == resource.RLIM_INFINITY else hard
    assert memlock["Hard"] == expected and memlock["Soft"] == expected


def test_dockerfile_uses_a_real_pytorch_base_image() -> None:
    text = (PROJECT_ROOT / "Dockerfile").read_text()
    assert "ARG TORCH_IMAGE=pytorch/pytorch:2.13.0-" in text and "FROM ${TORCH_IMAGE}" in text


def test_gpu_device_requests_keep_the_compose_spec_but_name_the_rank_s_one_gpu() -> None:
    from harness.cluster.docker.template import _device_requests
    everything, two = _device_requests((
        {"driver": "nvidia", "count": "all", "capabilities": ["gpu"]},
        {"driver": "nvidia", "device_ids": [0, 1], "capabilities": [["gpu", "utility"]]}), 3)
    assert everything["Count"] == 0 and everything["DeviceIDs"] == ["3"] and everything["Capabilities"] == [["gpu"]]
    assert two["DeviceIDs"] == ["3"] and two["Capabilities"] == [["gpu", "utility"]] and two["Driver"] == "nvidia"


def test_the_local_override_runs_every_service_on_this_host_s_python() -> None:
    import sys

    from harness.cluster.docker.compose import local_override
    from harness.cluster.docker.image import host_python_mounts
    services = local_override("chaos-harness-local:test")["services"]
    assert set(services) == set(_compose()["services"])
    for name, s in services.items():
        assert s["image"] == "chaos-harness-local:test" and s["command"][0] == sys.executable
        assert s["command"][-1] == ("control" if name == "control" else "rank")
        assert sorted(s["volumes"]) == sorted(f"{p}:{p}:ro" for p in host_python_mounts())
        assert s["environment"]["PYTHONPATH"] == str(PROJECT_ROOT)
    memlock = services["rank0"]["ulimits"]["memlock"]
    (capped,) = _ulimits({"memlock": -1})
    assert memlock == {"soft": capped["Soft"], "hard": capped["Hard"]}


def test_the_documented_compose_commands_name_files_that_exist() -> None:
    """Every `docker compose`/`docker-compose` command that README.md, docs/docker.md and the
    compose files show names files of this project (`docker-compose.local.yml`: the one
    `python -m harness.cluster.docker compose-override` writes, shown beside it)."""
    import re
    made = "docker-compose.local.yml"
    shown: dict[str, list[str]] = {}
    for path in (PROJECT_ROOT / "README.md", PROJECT_ROOT / "docs/docker.md", COMPOSE_FILE, GPU_COMPOSE_FILE):
        text = path.read_text()
        for command in re.findall(r"(?:docker compose|docker-compose) [^`\n#]*", text):
            shown.setdefault(path.name, []).append(command)
            for name in re.findall(r"-f (\S+)", command):
                assert (PROJECT_ROOT / name).is_file() or (
                    name == made and f"python -m harness.cluster.docker compose-override {made}" in text), \
                    f"{path.name}: `{command.strip()}` names {name}, which is not a file of the project"
    assert {"docker.md", "docker-compose.yml"} <= set(shown), shown
