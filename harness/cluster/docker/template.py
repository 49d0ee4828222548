"""The rank template of docker-compose.yml (`x-rank`), as the harness reads it.

Image, environment, capabilities, shared memory, ulimits, and the GPU device requests of
docker-compose.gpu.yml (`x-gpu`: an override there, so that the file runs on CPU hosts
with Compose 1.29, which cannot take a device request away), with
Compose's ${VAR} interpolation from this process's environment; turned here into the
engine's create options. The `docker compose` command is never needed.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from chaos.errors import HarnessError
from harness.cluster.docker.engine import LABEL_ROLE

PROJECT_ROOT = Path(__file__).resolve().parents[3]
COMPOSE_FILE = PROJECT_ROOT / "docker-compose.yml"
GPU_COMPOSE_FILE = PROJECT_ROOT / "docker-compose.gpu.yml"

_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::?-([^}]*))?\}")


def _interpolate(value: Any) -> Any:
    """Compose's ${VAR} / ${VAR:-default} / ${VAR-default}, from this process's environment."""
    if isinstance(value, str):
        return _VAR.sub(lambda m: os.environ.get(m.group(1)) or (m.group(2) or ""), value)
    if isinstance(value, list):
        return [_interpolate(v) for v in value]
    if isinstance(value, dict):
        return {k: _interpolate(v) for k, v in value.items()}
    return value


def _env_dict(env: Any) -> dict[str, str]:
    if env is None:
        return {}
    if isinstance(env, list):
        return dict(item.split("=", 1) if "=" in item else (item, os.environ.get(item, ""))
                    for item in env)
    return {str(k): "" if v is None else str(v) for k, v in env.items()}


@dataclass(frozen=True)
class RankTemplate:
    """What the harness takes from the compose file's rank service (`x-rank`)."""

    image: str
    environment: dict[str, str] = field(default_factory=dict)
    cap_add: tuple[str, ...] = ()
    shm_size: str | None = None
    ulimits: dict[str, Any] = field(default_factory=dict)
    stop_signal: str = "SIGTERM"
    gpu_requests: tuple[dict[str, Any], ...] = ()

    @classmethod
    def from_compose(cls, path: Path = COMPOSE_FILE, gpu_path: Path = GPU_COMPOSE_FILE) -> RankTemplate:
        doc = _read(path)
        services = _mapping(_mapping(doc, path, "the file").get("services"), path, "services")
        rank = doc.get("x-rank") or next(
            (s for name, s in services.items() if (_mapping(s, path, f"services.{name}").get("labels") or {})
             .get(LABEL_ROLE) == "rank"), None)
        if not rank:
            raise HarnessError(f"{path}: no rank template (an `x-rank` block or a service "
                               f"labelled {LABEL_ROLE}=rank)")
        rank = _interpolate(_mapping(rank, path, "the rank template"))
        for name, (types, form) in _FIELD_FORMS.items():
            if not isinstance(rank.get(name), types):
                raise HarnessError(f"{path}: rank template: {name}: {rank.get(name)!r}; expected {form}")
        if not rank["image"]:
            raise HarnessError(f"{path}: rank template: image: empty; expected {_FIELD_FORMS['image'][1]}")
        devices = _gpu_devices(gpu_path)
        return cls(
            image=rank["image"],
            # CHAOS_* configure a rank started by `docker compose up`; the harness passes a config file.
            environment={k: v for k, v in _env_dict(rank.get("environment")).items()
                         if not k.startswith("CHAOS_")},
            cap_add=tuple(rank.get("cap_add") or ()),
            shm_size=str(rank["shm_size"]) if rank.get("shm_size") else None,
            ulimits=dict(rank.get("ulimits") or {}),
            stop_signal=str(rank.get("stop_signal") or "SIGTERM"),
            gpu_requests=tuple(d for d in devices if "gpu" in _flat(d.get("capabilities"))),
        )

    def create_options(self, gpu: int | None) -> dict[str, Any]:
        """The engine's create options this template sets; `gpu`: the host GPU the rank's
        container gets as its only one (harness.job.device.Placement.gpu_of), None: no GPU."""
        options: dict[str, Any] = dict(
            environment={**self.environment, "PYTHONUNBUFFERED": "1"},
            cap_add=list(self.cap_add) or None, stop_signal=self.stop_signal)
        if self.shm_size:
            options["shm_size"] = self.shm_size
        if self.ulimits:
            options["ulimits"] = _ulimits(self.ulimits)
        if gpu is not None and self.gpu_requests:
            options["device_requests"] = _device_requests(self.gpu_requests, gpu)
        return options


# the rank template's fields the harness reads: their accepted YAML types and the form to write
_FIELD_FORMS: dict[str, tuple[tuple[type, ...], str]] = {
    "image": ((str,), "an image name, such as chaos-harness:latest"),
    "environment": ((dict, list, type(None)), "a mapping or a list of NAME=value"),
    "cap_add": ((list, type(None)), "a list of capabilities, such as [NET_ADMIN]"),
    "ulimits": ((dict, type(None)), "a mapping such as {memlock: -1}"),
}


def _read(path: Path) -> Any:
    try:
        return yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise HarnessError(f"cannot read the compose file {path}: {exc}") from exc


def _gpu_devices(path: Path) -> list[dict[str, Any]]:
    """The device requests of the GPU override's `x-gpu` block (none: the file is absent)."""
    if not path.exists():
        return []
    node = _interpolate(_mapping(_read(path), path, "the file"))
    for where in ("x-gpu", "x-gpu.deploy", "x-gpu.deploy.resources", "x-gpu.deploy.resources.reservations"):
        node = _mapping(node.get(where.rpartition(".")[2]), path, where)
    devices = node.get("devices") or []
    if not isinstance(devices, list) or not all(isinstance(d, dict) for d in devices):
        raise HarnessError(f"{path}: x-gpu.deploy.resources.reservations.devices: {devices!r}; "
                           "expected a list of device mappings")
    return devices


def _mapping(value: Any, path: Path, where: str) -> dict[str, Any]:
    """`value` if it is a mapping (None: an empty one), else an error naming file and field."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise HarnessError(f"{path}: {where}: expected a mapping, got {type(value).__name__} {value!r:.60}")
    return value


def _flat(caps: Any) -> list[str]:
    out: list[str] = []
    for c in caps or []:
        out += _flat(c) if isinstance(c, list) else [str(c)]
    return out


def _device_requests(requests: tuple[dict[str, Any], ...], gpu: int) -> list[Any]:
    """Compose's `deploy.resources.reservations.devices` as the engine's DeviceRequests, each
    narrowed to the rank's one GPU (device_ids; the file's count or ids are for compose)."""
    from docker.types import DeviceRequest
    return [DeviceRequest(driver=d.get("driver", ""), count=0, device_ids=[str(gpu)],
                          capabilities=[_flat(d.get("capabilities"))], options=d.get("options") or {})
            for d in requests]


def _ulimits(ulimits: dict[str, Any]) -> list[Any]:
    """The template's ulimits, capped at this host's hard limits (-1: unlimited). A GPU node
    grants `memlock: -1`; a VM that does not would otherwise refuse to start the container."""
    import resource

    from docker.types import Ulimit
    out = []
    for name, v in ulimits.items():
        soft, hard = (v, v) if not isinstance(v, dict) else (v.get("soft"), v.get("hard"))
        soft, hard = int(soft), int(hard)
        limit = getattr(resource, f"RLIMIT_{name.upper()}", None)
        if limit is not None:
            host_hard = resource.getrlimit(limit)[1]
            if host_hard != resource.RLIM_INFINITY:
                hard = host_hard if hard < 0 else min(hard, host_hard)
                soft = hard if soft < 0 else min(soft, hard)
        out.append(Ulimit(name=name, soft=soft, hard=hard))
    return out
