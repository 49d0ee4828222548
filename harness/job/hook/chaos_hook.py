"""The step hook inside the user's job (see harness.job.hook): step events without code changes.

`install()` (from sitecustomize) records rank_start and arranges for torch's global
optimizer step hooks to be registered once torch.optim.optimizer is imported (an import
watcher: a script that never imports torch pays nothing). Before the process's first
optimizer step the hook records the state it starts from (a `state` event at start: the
weights it initialised or restored) and from then on answers the harness's SIGUSR2 with its
flight recorder (`flight_ready`; harness.job.flight.serve). Each step records its compute
time (the step less its wait from its last gradient to the optimizer step), and every
CHAOS_STATE_EVERY-th step the state it reached: fingerprints of the optimizer's parameters
and of its per-parameter state (harness.job.fingerprint, computed where the tensors live).
`step()` is the opt-in for scripts without torch.optim; `step(model)` (a module, a state
dict or an optimizer) also records that state. Once torch.serialization (and torch.distributed.checkpoint) is imported,
their save and load are wrapped to record `checkpoint_begin` and `checkpoint_save` /
`checkpoint_load` with the file's path and identity, and once torch.distributed is,
init_process_group and destroy_process_group to record `group_init` and `group_destroyed`.
A process that makes its process group again (an in-process restart: nvidia-resiliency-ext's
Wrapper calls the training function again) begins a generation of its own, as a process a
launcher started again would: its steps count from 0 and its next step records the state it
starts from.
Once torchft.manager is imported, its Manager is remembered: its step is the job's (a group
healed from a peer takes up the peer's step) and each step says how many replica groups
took part (`participants`), with `step_source: torchft` on steps and states; a state also
fingerprints each part of the state dict the Manager heals peers with (`parts`).
All do nothing when CHAOS_EVENTS_PATH is not set.
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
STATE_EVERY_ENV = "CHAOS_STATE_EVERY"  # a `state` event every this many steps (job.state_every)
OWNER_ENV = "CHAOS_HOOK_OWNER"    # the pid that measures; Python processes it starts do not
HOST_RANK_ENV = "CHAOS_RANK"      # the host's rank: torchrun's RANK is the rendezvous' choice
OPTIMIZER_MODULE = "torch.optim.optimizer"
SERIALIZATION_MODULE = "torch.serialization"   # torch.save, torch.load
DCP_MODULE = "torch.distributed.checkpoint"    # its save, load
DISTRIBUTED_MODULE = "torch.distributed"       # its init_process_group
TORCHFT_MODULE = "torchft.manager"            # its Manager counts the job's steps
DCP_METADATA = ".metadata"  # a distributed checkpoint's folder is known by this file in it

_recorder: Any = None
_steps = 0
_depth = 0  # optimizer steps in progress (one inside another: ZeroRedundancyOptimizer's)
_last: float | None = None
_delays: Any = None  # the step_delay command of this process's host (harness.job.stepdelay), once read
_in_checkpoint = 0  # checkpoint calls in progress: a distributed checkpoint's own torch.save is not one
_grads_done: float | None = None  # when the step's last gradient was accumulated (its local work done)
_wait: float | None = None  # from then to its optimizer step: the step's wait for its peers
_timed = False  # every parameter of the first optimizer stepped notes its gradient (_time_gradients)
_manager: Any = None  # torchft's Manager in this process, once one is made
_groups_made = 0  # init_process_group calls of this process: each after the first, an in-process restart
_world_offset = 0  # the world's agreed generation less this process's own count (world_generation)
AGREE_S = 10.0  # the most the first init_process_group waits for the world's generation


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


def _generation() -> int:
    """The launcher's restarts of this process's worker, plus its own restarts in-process,
    raised to its world's where an elastic agent started it (_agree_generation)."""
    return int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")) + max(0, _groups_made - 1) + _world_offset


def _agree_generation(world: int) -> None:
    """A worker an elastic agent started takes its world's generation (the largest restart
    count among its processes: harness.job.hook.world_generation), through the store torchrun
    made for this round of workers; where it is not agreed in time, its own count."""
    global _world_offset
    # an agent's worker (only an agent sets this), whose world's store is at MASTER_PORT
    if "TORCHELASTIC_USE_AGENT_STORE" not in os.environ or not os.environ.get("MASTER_PORT", "").isdigit() \
            or world < 2:
        return
    from harness.job.hook.world_generation import agree
    own = _generation()
    agreed = agree(os.environ.get("MASTER_ADDR", "127.0.0.1"), int(os.environ["MASTER_PORT"]), world, own, AGREE_S)
    _world_offset = 0 if agreed is None else max(0, agreed - own)


def _framework_step(before: bool = False) -> dict[str, Any]:
    """torchft's own step and the replica groups in its quorum, or, `before` the optimizer
    step it committed, the step whose state the process starts from (the one before); {}
    without a Manager. torchft counts a step once its quorum agreed to commit it, which is
    when the optimizer steps (its quorum is complete by then: num_participants waits for it)."""
    if _manager is None:
        return {}
    if before:
        return {"step": _manager.current_step() - 1, "step_source": "torchft"}
    return {"step": _manager.current_step(), "participants": _manager.num_participants(), "step_source": "torchft"}


def _framework_parts() -> dict[str, Any]:
    """The parts of the state torchft's Manager sends a healing peer (the script's
    state_dict: its model, optimizer, LR scheduler, data position, ...), each fingerprinted;
    {} without a Manager."""
    if _manager is None:
        return {}
    from harness.job.fingerprint import part_fingerprints
    parts: dict[str, str] = {}
    for key, state_dict in getattr(_manager, "_user_state_dicts", {}).items():  # torchft 0.2.0's registry
        for name, value in part_fingerprints(state_dict()).items():
            parts[name if key == "default" else f"{key}.{name}"] = value
    return {"parts": parts}


def _record_state(recorder: Any, holder: Any, at: str) -> None:
    from harness.job.fingerprint import fingerprints, optimizer_tensors, sharding, tensors_of
    import torch

    held, optim = fingerprints(tensors_of(holder), optimizer_tensors(holder)
                               if isinstance(holder, torch.optim.Optimizer) else [])
    sharded = {"sharded": kind} if (kind := sharding(holder)) else {}
    framework = _framework_step(before=at == "start")
    framework.pop("participants", None)  # the step event says it
    recorder.emit("state", **{"step": _steps, **framework}, gen=_generation(), at=at, fingerprint=held,
                  optim=optim, local_rank=_local_rank(), **sharded, **_framework_parts())


def step(state: Any = None, *_hook_args: Any) -> None:
    """Record one training step of this process, and with `state` (a model, a state dict,
    an optimizer) its fingerprint on the cadence. Also torch's optimizer post-hook, which
    passes the optimizer (and its step's args)."""
    global _steps, _last, _wait
    recorder = _open()
    if recorder is None:
        return
    now = time.monotonic()
    _steps += 1
    extra = {"cpu_s": round(time.process_time(), 3)} if _steps == 1 else {}  # its start's cost, imports included
    dur = None if _last is None else now - _last
    if dur is not None and _wait is not None and 0 <= _wait <= dur:
        extra["compute"] = round(dur - _wait, 5)
    recorder.emit("step", t=now, **{"step": _steps, **_framework_step()}, gen=_generation(),
                  loss=None, dur=None if dur is None else round(dur, 6), local_rank=_local_rank(), **extra)
    _last, _wait = now, None
    if state is not None and _steps % int(os.environ.get(STATE_EVERY_ENV, "1")) == 0:
        _record_state(recorder, state, "step")


def _before_step(optimizer: Any, *_: Any) -> None:
    """torch's optimizer pre-hook: before the first step, the state the process starts from
    and the gradient hooks that time its steps (`_time_gradients`); before every step, the
    wait since its last gradient, then a step_delay fault's wait (harness.job.stepdelay: a
    slow data loader is local work, not waiting)."""
    global _depth, _delays, _wait, _timed
    _depth += 1
    if _depth != 1 or (recorder := _open()) is None:
        return
    if _timed and _last is not None and _grads_done is not None and _grads_done > _last:
        _wait = time.monotonic() - _grads_done
    if _steps == 0:  # the process's first step, or its first after an in-process restart
        _record_state(recorder, optimizer, "start")
        if _groups_made <= 1:
            _serve_flight(recorder)
        _timed = _time_gradients(optimizer)
    if _delays is None:
        from pathlib import Path
        from harness.job.stepdelay import StepDelays, step_delay_file
        _delays = StepDelays(step_delay_file(Path(os.environ[EVENTS_ENV]).parent, int(os.environ[HOST_RANK_ENV])))
    if (delay := _delays.due()) > 0:
        time.sleep(delay)


def _time_gradients(optimizer: Any) -> bool:
    """Note when each of the optimizer's parameters has its gradient: the last one of a step
    ends the rank's own work. What follows until its optimizer step is the data-parallel
    wait for its peers (DDP's all-reduce of the last bucket, or the job's own), and a
    step's duration less that wait is its compute time, which straggler scores compare
    (reports.straggler): a synchronous collective makes every rank's step equally long.
    False where a parameter takes no such hook (its steps then carry no compute)."""
    try:
        for group in optimizer.param_groups:
            for param in group["params"]:
                if param.requires_grad:
                    param.register_post_accumulate_grad_hook(_gradient_done)
    except (AttributeError, RuntimeError):  # not a leaf tensor, or a subclass without the hook
        return False
    return True


def _gradient_done(_param: Any) -> None:
    global _grads_done
    _grads_done = time.monotonic()


def _serve_flight(recorder: Any) -> None:
    """Its process groups exist by its first step: from now on the process answers the
    harness's SIGUSR2 with its flight recorder (where a main thread holds the step)."""
    import threading
    from pathlib import Path
    from harness.job import flight
    if threading.current_thread() is threading.main_thread() \
            and flight.serve(Path(os.environ[EVENTS_ENV]).parent, int(os.environ[HOST_RANK_ENV])):
        recorder.emit("flight_ready")


def _after_step(optimizer: Any, *args: Any) -> None:
    """torch's optimizer post-hook: a step, unless an outer optimizer's step is still going
    (ZeroRedundancyOptimizer steps its local optimizer inside its own: one step, not two)."""
    global _depth
    _depth = max(0, _depth - 1)
    if _depth == 0:
        step(optimizer, *args)


def _register_optimizer_hook(module: Any) -> None:
    module.register_optimizer_step_pre_hook(_before_step)
    module.register_optimizer_step_post_hook(_after_step)


def _file_of(path: str) -> dict[str, int] | None:
    """What identifies the file at `path` (a distributed checkpoint: its folder's metadata),
    kept by a rename: inode, modification time, size. None: no such file."""
    try:
        stat = os.stat(path)
        if os.path.isdir(path):
            stat = os.stat(os.path.join(path, DCP_METADATA))
    except OSError:
        return None
    return {"ino": stat.st_ino, "mtime_ns": stat.st_mtime_ns, "size": stat.st_size}


def _path_of(target: Any) -> str | None:
    """The absolute path a checkpoint call names: a path, a file object opened by name, or a
    distributed checkpoint's storage writer or reader; None for a stream (BytesIO)."""
    if isinstance(target, (str, os.PathLike)):
        return os.path.abspath(os.fspath(target))
    for name in ("name", "path"):
        value = getattr(target, name, None)
        if isinstance(value, (str, os.PathLike)):
            return os.path.abspath(os.fspath(value))
    return None


def _watched(call: Any, event: str, api: str, target: Any) -> Any:
    """`call` recording a `checkpoint_begin` before it and a `checkpoint_save` after it, or a
    `checkpoint_load` before it (the file as it was when the read began), of the path
    `target(args, kwargs)` names."""
    def watched(*args: Any, **kwargs: Any) -> Any:
        global _in_checkpoint
        recorder = _open() if _in_checkpoint == 0 else None
        path = _path_of(target(args, kwargs)) if recorder is not None else None
        if path is not None and event == "checkpoint_load":
            recorder.emit(event, path=path, step=_steps, file=_file_of(path), local_rank=_local_rank(), api=api)
        elif path is not None:  # a fault may be anchored on the save's beginning
            recorder.emit("checkpoint_begin", path=path, step=_steps, local_rank=_local_rank(), api=api)
        _in_checkpoint += 1
        try:
            result = call(*args, **kwargs)
        finally:
            _in_checkpoint -= 1
        if path is not None and event == "checkpoint_save":
            recorder.emit(event, path=path, step=_steps, file=_file_of(path), local_rank=_local_rank(), api=api)
        return result
    watched.__wrapped__ = call  # type: ignore[attr-defined]
    watched.__name__, watched.__doc__ = call.__name__, call.__doc__
    return watched


def _argument(position: int, name: str) -> Any:
    return lambda args, kwargs: args[position] if len(args) > position else kwargs.get(name)


def _storage(io: str) -> Any:
    """A distributed checkpoint's path: checkpoint_id, else its storage writer or reader."""
    return lambda args, kwargs: kwargs.get("checkpoint_id") or kwargs.get(io)


def _watch_serialization(module: Any) -> None:
    module.save = _watched(module.save, "checkpoint_save", "torch.save", _argument(1, "f"))
    module.load = _watched(module.load, "checkpoint_load", "torch.save", _argument(0, "f"))
    torch = sys.modules.get("torch")
    if torch is not None and hasattr(torch, "save"):  # torch bound them before the hook came
        torch.save, torch.load = module.save, module.load


def _watch_dcp(module: Any) -> None:
    module.save = _watched(module.save, "checkpoint_save", "dcp", _storage("storage_writer"))
    module.load = _watched(module.load, "checkpoint_load", "dcp", _storage("storage_reader"))


def _watch_group(module: Any) -> None:
    """torch.distributed's init_process_group records `group_init` once it returned: the
    process (a worker torchrun started again, too) is in its group; destroy_process_group()
    of every group, `group_destroyed`: what the process does after it is its teardown (a
    crash there is not its training's: reports.metrics)."""
    init, destroy = module.init_process_group, module.destroy_process_group

    def init_process_group(*args: Any, **kwargs: Any) -> Any:
        global _groups_made, _steps, _last
        result = init(*args, **kwargs)
        _groups_made += 1
        if _groups_made > 1:  # restarted in-process: a new generation, its steps from 0
            _steps, _last = 0, None
        recorder = _open()
        if recorder is not None:
            if _groups_made == 1:
                _agree_generation(module.get_world_size())
            recorder.emit("group_init", gen=_generation(), world=module.get_world_size(), local_rank=_local_rank())
        return result

    def destroy_process_group(group: Any = None, *args: Any, **kwargs: Any) -> Any:
        result = destroy(group, *args, **kwargs)
        recorder = _open()
        if recorder is not None and group is None:
            recorder.emit("group_destroyed", gen=_generation(), local_rank=_local_rank())
        return result
    for wrapper, wrapped in ((init_process_group, init), (destroy_process_group, destroy)):
        wrapper.__wrapped__ = wrapped  # type: ignore[attr-defined]
        wrapper.__doc__ = wrapped.__doc__
    module.init_process_group, module.destroy_process_group = init_process_group, destroy_process_group


def _watch_torchft(module: Any) -> None:
    """torchft's Manager remembered as it is made: it counts the job's steps."""
    init = module.Manager.__init__

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        global _manager
        init(self, *args, **kwargs)
        _manager = self
    __init__.__wrapped__ = init  # type: ignore[attr-defined]
    __init__.__doc__ = init.__doc__
    module.Manager.__init__ = __init__


def _after_import(name: str, then: Any) -> None:
    """`then(module)` once `name` is imported: now if it is (a preloaded start), else right
    after its import."""
    if name in sys.modules:
        then(sys.modules[name])
    else:
        sys.meta_path.insert(0, _AfterImport(name, then))


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
                  world=int(os.environ.get("WORLD_SIZE", "1")), local_rank=_local_rank(), restart=_generation())
    # a preloaded start (harness.cluster.preload) has torch in already
    _after_import(OPTIMIZER_MODULE, _register_optimizer_hook)
    _after_import(SERIALIZATION_MODULE, _watch_serialization)
    _after_import(DCP_MODULE, _watch_dcp)
    _after_import(DISTRIBUTED_MODULE, _watch_group)
    _after_import(TORCHFT_MODULE, _watch_torchft)
