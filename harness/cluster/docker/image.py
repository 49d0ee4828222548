"""Which image the ranks run, and the local test image for engines without a registry.

The rank template names the GPU image built from the top-level Dockerfile. Where that
image is not in the engine (the CI machine: no registry, no base image), the ranks run the
local test image (`LOCAL_IMAGE`: a few symlinks and /etc files, imported on the spot) with
the host's Python environment and the project bind-mounted read-only at the same paths.
"""
from __future__ import annotations

import hashlib
import io
import os
import sys
import tarfile
from typing import Any

from chaos.errors import HarnessError
from harness.cluster.docker.engine import LABEL_IMAGE, translated
from harness.cluster.docker.template import PROJECT_ROOT

LOCAL_IMAGE = "chaos-harness-local"
IMAGE_ENV = "CHAOS_DOCKER_IMAGE"        # force an image; "local" forces the local test image


def _local_rootfs() -> bytes:
    """A minimal root filesystem: merged-/usr symlinks, /etc basics, mount points. Deterministic."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        def add(name: str, kind: bytes, data: bytes = b"", target: str = "", mode: int = 0o755) -> None:
            info = tarfile.TarInfo(name)
            info.type, info.mode, info.mtime, info.size = kind, mode, 0, len(data)
            info.linkname = target
            tar.addfile(info, io.BytesIO(data) if data else None)
        for d in ("dev", "proc", "sys", "etc", "usr", "run", "var", "root", "work"):
            add(d, tarfile.DIRTYPE)
        add("tmp", tarfile.DIRTYPE, mode=0o1777)
        for link in ("bin", "sbin", "lib", "lib64"):
            add(link, tarfile.SYMTYPE, target=f"usr/{link}")
        add("etc/passwd", tarfile.REGTYPE, b"root:x:0:0:root:/root:/bin/sh\n", mode=0o644)
        add("etc/group", tarfile.REGTYPE, b"root:x:0:\n", mode=0o644)
        # dns: under `docker compose up` the ranks find the `control` service by name
        add("etc/nsswitch.conf", tarfile.REGTYPE, b"passwd: files\ngroup: files\nhosts: files dns\n",
            mode=0o644)
    return buf.getvalue()


def local_image_tag() -> str:
    return f"{LOCAL_IMAGE}:{hashlib.sha256(_local_rootfs()).hexdigest()[:12]}"


def ensure_local_image(client: Any) -> str:
    """Import the local test image if the engine lacks it; returns its tag. No registry needed."""
    import docker.errors
    tag = local_image_tag()
    try:
        client.images.get(tag)
        return tag
    except docker.errors.ImageNotFound:
        pass
    repo, _, version = tag.partition(":")
    with translated(f"import {tag}"):
        client.api.import_image_from_data(
            _local_rootfs(), repository=repo, tag=version,
            changes=[f"LABEL {LABEL_IMAGE}=local", 'CMD ["/bin/false"]'])
        client.images.get(tag)
    return tag


def host_python_mounts() -> dict[str, dict[str, str]]:
    """Read-only bind mounts that make this host's interpreter and project run in the image."""
    paths = {"/usr", os.path.realpath(sys.base_prefix), str(PROJECT_ROOT)}
    venv = os.path.realpath(sys.prefix)
    if not venv.startswith(str(PROJECT_ROOT) + os.sep):
        paths.add(venv)
    keep = sorted(p for p in paths if not any(p != q and p.startswith(q + os.sep) for q in paths))
    return {p: {"bind": p, "mode": "ro"} for p in keep}


def resolve_image(client: Any, forced: str | None, template_image: str) -> tuple[str, dict, str]:
    """(image, bind mounts, python) for the ranks: `forced` (an image, or "local"), else the
    template's if the engine has it, else the local test image with the host's Python."""
    import docker.errors
    wanted = forced or template_image
    if wanted != "local":
        try:
            client.images.get(wanted)
            return wanted, {}, "python"
        except docker.errors.ImageNotFound:
            if forced:
                raise HarnessError(f"image {wanted!r} is not in the engine (build it with "
                                   "`docker build -t IMAGE .`)") from None
    return ensure_local_image(client), host_python_mounts(), sys.executable
