"""A Compose override that runs docker-compose.yml on the local test image (no registry).

    python -m harness.cluster.docker compose-override docker-compose.local.yml
    docker compose -f docker-compose.yml -f docker-compose.local.yml up

Every service of the compose file gets the local test image (imported if the engine lacks
it), this host's Python environment and the project bind-mounted read-only at the same
paths (harness.cluster.docker.image), its command run by this interpreter, and ulimits
capped at this host's hard limits (a VM that refuses `memlock: -1` would otherwise refuse
to start the container). The file names this host's paths: write it where it is used.
"""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import yaml

from chaos.errors import HarnessError
from harness.cluster.docker.image import ensure_local_image, host_python_mounts
from harness.cluster.docker.template import COMPOSE_FILE, PROJECT_ROOT, _mapping, _read, _ulimits


def local_override(image: str, compose_file: Path = COMPOSE_FILE) -> dict[str, Any]:
    """The override for every service of `compose_file`, running `image` with this host's Python."""
    doc = _mapping(_read(compose_file), compose_file, "the file")
    services = _mapping(doc.get("services"), compose_file, "services")
    volumes = [f"{path}:{mount['bind']}:ro" for path, mount in host_python_mounts().items()]
    out: dict[str, Any] = {}
    for name, service in services.items():
        service = _mapping(service, compose_file, f"services.{name}")
        command = service.get("command")
        if not (isinstance(command, list) and command and command[0] == "python"):
            raise HarnessError(f"{compose_file}: services.{name}.command: {command!r}; expected "
                             "[python, -m, ...] (the override runs it with this host's interpreter)")
        override: dict[str, Any] = {
            "image": image, "command": [sys.executable, *command[1:]], "volumes": volumes,
            "working_dir": str(PROJECT_ROOT),
            # this checkout's code, whatever the environment's installed copy points at
            "environment": {"PYTHONPATH": str(PROJECT_ROOT)}}
        if service.get("ulimits"):
            override["ulimits"] = {u.name: {"soft": u.soft, "hard": u.hard}
                                   for u in _ulimits(service["ulimits"])}
        out[name] = override
    return {"services": out}


class _PlainDumper(yaml.SafeDumper):
    """Writes every service's mounts out in full: no `&id001` anchors for a reader to chase."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def write_local_override(client: Any, path: Path) -> str:
    """Import the local test image if needed and write the override to `path`; its image."""
    image = ensure_local_image(client)
    header = f"# made by `python -m harness.cluster.docker compose-override` for this host ({__name__})\n"
    path.write_text(header + yaml.dump(local_override(image), Dumper=_PlainDumper, sort_keys=False))
    return image
