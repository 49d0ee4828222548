"""The registry of backends: the one place their names are written (the scenario's
`cluster.backend`, `--backend`, the nightly plan), each name with the class that builds
its clusters; what each can do is declared by the class (`Traits`). A new backend is one
module and one line here (and its undos in harness.cluster.undos)."""
from __future__ import annotations

import importlib
import os
from typing import TYPE_CHECKING

from chaos.errors import UsageError

if TYPE_CHECKING:  # this module stays light: the command line takes its names at start
    from harness.cluster.api import Backend
    from harness.cluster.spec import Traits

# name -> "module:class"; the first is the default
BACKENDS = {
    "netns": "harness.cluster.netns:NetnsBackend",
    "docker": "harness.cluster.docker.cluster:DockerBackend",
    "local": "harness.cluster.local:LocalBackend",
    "slurm": "harness.cluster.slurm.cluster:SlurmBackend",
}
BACKEND_NAMES = tuple(BACKENDS)
DEFAULT_BACKEND = BACKEND_NAMES[0]


def backend_class(name: str) -> type[Backend]:
    if name not in BACKENDS:
        raise UsageError(f"unknown backend {name!r}; expected one of {', '.join(BACKEND_NAMES)}")
    module, _, cls = BACKENDS[name].partition(":")
    return getattr(importlib.import_module(module), cls)


def traits_of(name: str) -> Traits:
    return backend_class(name).traits


def backend_named(name: str) -> Backend:
    return backend_class(name)()


def backends_with(trait: str, value: bool = True) -> list[str]:
    """The backends whose `trait` (a `Traits` field) is `value`, for a refusal's fix."""
    return [name for name in BACKEND_NAMES if getattr(traits_of(name), trait) is value]


def require_privileges(what: str, backend: str | None = None) -> None:
    """Refuse `what` without root, unless it runs on `backend` and that one needs none; an
    ordinary user on a backend that allows it becomes root of a user namespace of its own
    (chaos.userns: namespaces, links and tc without sudo; not BPF)."""
    from chaos import userns
    from chaos.ledger import state_dir
    if os.geteuid() == 0 or (backend is not None and not traits_of(backend).needs_root):
        return
    why = userns.why_not()
    if (backend is None or traits_of(backend).user_namespace) and why is None:
        userns.enter(state_dir())  # the state folder is the caller's: computed before the uid changes
        return
    on = f" on the {backend} backend" if backend else ""
    unless = f" ({why})" if why and (backend is None or traits_of(backend).user_namespace) else ""
    raise UsageError(f"{what} needs root{on}{unless}: run it as root, e.g. "
                     f"`sudo $(which chaos) {what.split()[-1]} ...`, or with --backend "
                     f"{' or '.join(backends_with('needs_root', False))} (ranks as your own processes on "
                     "loopback: kill, pause and gpu_hang, no link faults)")
