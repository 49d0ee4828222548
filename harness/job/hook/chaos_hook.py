"""The step hook inside the user's job (see harness.job.hook): step events without code changes.

`install()` (from sitecustomize) records rank_start and arranges for torch's global
optimizer step post-hook to be registered once torch.optim.optimizer is imported (an import
watcher: a script that never imports torch pays nothing). `step()` is the opt-in for
scripts without torch.optim. Both do nothing when CHAOS_EVENTS_PATH is not set.
"""
from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import sys
import time
from typing import Any

EVENTS_ENV = "CHAOS_EVENTS_PATH"  # harness.cluster.userjob sets it
REPO_ENV = "CHAOS_HARNESS_ROOT"   # where runfolder/ is
TRIAL_ENV = "CHAOS_TRIAL"
OWNER_ENV = "CHAOS_HOOK_OWNER"    # the pid that measures; Python processes it starts do not
HOST_RANK_ENV = "CHAOS_RANK"      # the host's rank: torchrun's RANK is the rendezvous' choice
OPTIMIZER_MODULE = "torch.optim.optimizer"

_recorder: Any = None
_steps = 0
_last: float | None = None


def _open() -> Any:
    global _recorder
    if "RANK" not in os.environ or HOST_RANK_ENV not in os.environ:  # a torchrun agent: its worker measures
        return None
    owner = os.environ.setdefault(OWNER_ENV, str(os.getpid()))
    if _recorder is None and os.environ.get(EVENTS_ENV) and owner == str(os.getpid()):
        sys.path.append(os.environ[REPO_ENV])  # last: the job's own modules win
        from runfolder.events import RANK, EventRecorder
        _recorder = EventRecorder(os.environ[EVENTS_ENV], RANK, rank=int(os.environ[HOST_RANK_ENV]))
    return _recorder


def _local_rank() -> int:
    """Which of its host's processes this is (events carry the host's rank)."""
    return int(os.environ.get("LOCAL_RANK", "0"))


def step(*_: Any) -> None:
    """Record one training step of this process (also torch's optimizer post-hook)."""
    global _steps, _last
    recorder = _open()
    if recorder is None:
        return
    now = time.monotonic()
    _steps += 1
    recorder.emit("step", t=now, step=_steps, gen=int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")),
                  loss=None, dur=None if _last is None else round(now - _last, 6), local_rank=_local_rank())
    _last = now


def _register_optimizer_hook(module: Any) -> None:
    module.register_optimizer_step_post_hook(step)


class _AfterImport(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Runs `then(module)` right after `name` is imported, by wrapping its real loader."""

    def __init__(self, name: str, then: Any) -> None:
        self.name, self.then, self.loader = name, then, None

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname != self.name or self.loader is not None:
            return None
        sys.meta_path.remove(self)
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None:
            return None
        self.loader, spec.loader = spec.loader, self
        return spec

    def create_module(self, spec: Any) -> Any:
        return self.loader.create_module(spec)  # type: ignore[union-attr]

    def exec_module(self, module: Any) -> None:
        self.loader.exec_module(module)  # type: ignore[union-attr]
        self.then(module)


def install() -> None:
    recorder = _open()
    if recorder is None:
        return
    recorder.emit("rank_start", policy=os.environ.get(TRIAL_ENV, "job"),
                  world=int(os.environ.get("WORLD_SIZE", "1")), local_rank=_local_rank())
    sys.meta_path.insert(0, _AfterImport(OPTIMIZER_MODULE, _register_optimizer_hook))
