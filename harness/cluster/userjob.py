"""The user's own training job: what to run (`JobSpec`), its environment, and its two
processes on a rank host, both forked by the rank launcher (`harness.cluster.zygote`).

    job child    becomes the user's command in the host's namespace, so the pid the harness
                 knows, kills and pauses is the job's own: in the forked interpreter, which
                 imported torch once for every rank (`job.start: preloaded`,
                 harness.cluster.preload), or by execvpe (`exec`, and any command a preloaded
                 start cannot give); stdout and stderr go into a pipe
    tap          reads that pipe: every line into the host's log, and, timestamped on
                 arrival, each error line `runfolder.classify` recognises as a
                 `job_output` event and each line matching `step_pattern` as a `step`

Environment: the torchrun contract (`rank_environment`). MASTER_ADDR is rank 0's host
address on the cluster network, MASTER_PORT `JOB_MASTER_PORT`: with the `direct` launcher
the job's rank 0 holds the TCPStore (init_method env://), as on a real multi-node launch
where every node names the first node, so a fault on rank 0's link cuts every rank off the
store exactly as it would there. The harness's own control plane stays on the switch and
is not the job's business. The step hook (`harness.job.hook`) is put on PYTHONPATH; it and
the tap write into the trial's events file named by CHAOS_EVENTS_PATH.
"""
from __future__ import annotations

import os
import re
import shutil
import sys
from pathlib import Path
from typing import Annotated, Any, Literal, Sequence

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, create_model, field_validator, model_validator

from chaos import topology
from chaos.faults import Seconds
from chaos.reach import why_unreadable
from harness.cluster.agent import AgentHost, agent_command
from harness.cluster.frameworks import FRAMEWORKS, Framework
from harness.cluster.spec import JOB_MASTER_PORT
from harness.cluster.workers import SERVER_ENV, server_name, stub_command
from harness.job.hook import chaos_hook
from harness.job.hook.chaos_hook import EVENTS_ENV, HOST_RANK_ENV, REPO_ENV, STATE_EVERY_ENV, TRIAL_ENV
import runfolder
from runfolder.frameworks import coordinator_host
from runfolder.layout import LOGS_DIR, TORCHRUN_LOGS_DIR

HOOK_DIR = Path(chaos_hook.__file__).resolve().parent  # sitecustomize.py is there
REPO_ROOT = Path(runfolder.__file__).resolve().parent.parent  # for the hook's recorder
TRIAL_DIR_FIELD = "{trial_dir}"


def _env_text(value: Any) -> Any:
    # YAML reads `OMP_NUM_THREADS: 1` as a number; the environment holds text
    if isinstance(value, dict):
        return {k: v if isinstance(v, str) else str(v) for k, v in value.items()}
    return value


Env = Annotated[dict[str, str], BeforeValidator(_env_text)]


SECONDS_FIELD = "{seconds}"
# the options torchrun's c10d rendezvous reads from --rdzv-conf, each a whole number
# (torch.distributed.elastic.rendezvous.dynamic_rendezvous.create_handler): its timeouts and
# the keep-alive by which the others drop an agent that is gone (interval x attempts)
RdzvKey = Literal["join_timeout", "last_call_timeout", "close_timeout", "heartbeat_timeout",
                  "keep_alive_interval", "keep_alive_max_attempt"]
RdzvConf = dict[RdzvKey, Annotated[int, Field(ge=1)]]
# direct: the command once per host; torchrun: one torchrun agent per host; a framework's
# name (harness.cluster.frameworks): its own processes on each host
Launcher = Literal[("direct", "torchrun", *FRAMEWORKS)]  # type: ignore[valid-type]


class EnvKnob(BaseModel):
    """A setting the job reads from an environment variable: `{env: TRAIN_TIMEOUT}`."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    env: Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")]


class JobKnobs(BaseModel):
    """Where `chaos tune` sets the job's settings (`job.tune:`): the timeout either as arguments
    appended to the command with {seconds} in them ("--timeout {seconds}") or as an environment
    variable ({env: NAME}) that the job reads; torchrun's --max-restarts where the job runs
    under torchrun (`max_restarts: torchrun`)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    timeout: str | EnvKnob = Field(description="the job's process-group timeout in seconds: \"--timeout "
                                               "{seconds}\" appended to the command, or {env: NAME}")
    max_restarts: Literal["torchrun"] | None = Field(
        default=None, description="torchrun: the job runs under torchrun, whose --max-restarts chaos tune "
                                  "sets (the tune runs it under torchrun whatever job.launcher says)")

    @field_validator("timeout")
    @classmethod
    def _has_seconds(cls, value: str | EnvKnob) -> str | EnvKnob:
        if isinstance(value, str) and SECONDS_FIELD not in value:
            raise ValueError(f"{value!r} has no {SECONDS_FIELD} for the value to go: write it as "
                             f"'{value.split()[0] if value.split() else '--timeout'} {SECONDS_FIELD}'")
        return value

    def timeout_variant(self, seconds: float) -> dict[str, Any]:
        """The `variants:` entry that gives the job this timeout."""
        text = f"{seconds:g}"
        if isinstance(self.timeout, EnvKnob):
            return {"env": {self.timeout.env: text}}
        return {"args": [arg.replace(SECONDS_FIELD, text) for arg in self.timeout.split()]}

    def restarts_variant(self, seconds: float, max_restarts: int, env: dict[str, str]) -> dict[str, Any]:
        """The `variants:` entry that runs the job under torchrun with this timeout, this
        --max-restarts and `env` besides."""
        timed = self.timeout_variant(seconds)
        merged = {**timed.get("env", {}), **env}
        return {**timed, **({"env": merged} if merged else {}), "launcher": "torchrun", "max_restarts": max_restarts}


class _JobFields(BaseModel):
    """The user's training job, as a scenario's `job:` names it; each framework's settings
    under its name (`job.torchft:`), fields JobSpec adds from the registry."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    command: Annotated[tuple[str, ...], Field(min_length=1)]
    workdir: str = "."                 # made absolute by the loader: relative to the scenario file
    env: Env = {}
    launcher: Launcher = "direct"
    nproc_per_host: Annotated[int, Field(ge=1)] = 1
    max_restarts: Annotated[int, Field(ge=0)] = 0
    min_hosts: Annotated[int, Field(ge=1)] | None = Field(
        default=None, description="torchrun's --nnodes MIN:MAX: after a restart the job goes on with as few "
                                  "as this many hosts (default: every host, --nnodes fixed)")
    rdzv_conf: RdzvConf = Field(
        default={}, description="torchrun's --rdzv-conf, in whole seconds (keep_alive_max_attempt: a count); "
                                "e.g. {last_call_timeout: 2, keep_alive_interval: 1}")
    start_timeout: Seconds = Field(default=300.0, description="from bring-up until every rank made the warm-up steps")
    step_pattern: str | None = Field(
        default=None, description="a regular expression; each output line it matches counts as a step")
    start: Literal["preloaded", "exec"] = Field(
        default="preloaded", description="preloaded: each rank forks from an interpreter that imported torch "
                                         "once (harness.cluster.preload); exec: a new interpreter per rank")
    preload: tuple[str, ...] = Field(
        default=(), description="modules imported once for every rank besides torch's (a preloaded start)")
    state_every: Annotated[int, Field(ge=1)] = Field(
        default=1, description="the step hook records a fingerprint of the model's and the optimizer's "
                               "state every this many optimizer steps (reports.state checks them)")
    tune: JobKnobs | None = Field(default=None, description="where `chaos tune` sets the job's settings")
    shared_checkpoint: bool = Field(
        default=False, description="true: a trial may load a checkpoint another trial or an earlier run wrote "
                                   "(reports.checkpoints otherwise fails that trial's expectations)")

    @property
    def framework(self) -> Framework | None:
        """The fault-tolerance framework the job runs under, or None (direct, torchrun)."""
        return FRAMEWORKS.get(self.launcher)

    @property
    def rendezvous_on_harness_store(self) -> bool:
        """Its hosts' agents meet in a c10d rendezvous on the harness's store (torchrun's, and
        a framework's that takes torchrun's elastic options): the store a fault can target
        on a host of its own (cluster.store: host)."""
        return self.launcher == "torchrun" or (self.framework is not None and self.framework.elastic)

    @property
    def one_process_per_host(self) -> bool:
        """The job's command runs once per host, with no agent (direct, or a framework that
        restarts inside the process)."""
        return self.launcher == "direct" or (self.framework is not None and not self.framework.agent)

    @model_validator(mode="after")
    def _framework_fits(self) -> "_JobFields":
        framework = self.framework
        for name in FRAMEWORKS:
            if getattr(self, name) is not None and self.launcher != name:
                raise ValueError(f"{name}: these are {name}'s settings, and the job's launcher is {self.launcher}: "
                                 f"set launcher: {name}, or drop {name}")
        if framework is None:
            return self
        if not framework.installed():
            raise ValueError(f"launcher: {framework.name}: its package ({framework.package}) is not installed in "
                             f"the harness's Python; install it: {framework.install}")
        for name, value in (("min_hosts", self.min_hosts), ("rdzv_conf", self.rdzv_conf)):
            if value and framework.agent and not framework.elastic:  # without an agent: below
                raise ValueError(f"{name}: it is torchrun's elastic rendezvous, and {framework.name} runs each "
                                 f"replica group as a torchrun of one node; drop {name}")
        return self

    @model_validator(mode="after")
    def _restarts_need_an_agent(self) -> "_JobFields":
        if not self.one_process_per_host:
            return self._step_pattern_fits()
        launcher = f"the {self.launcher} launcher"
        if self.max_restarts:
            raise ValueError(f"max_restarts: {launcher} starts each rank once; restarts are "
                             "torchrun's: set launcher: torchrun, or max_restarts: 0")
        if self.min_hosts is not None:
            raise ValueError(f"min_hosts: {self.min_hosts} is torchrun's --nnodes MIN:MAX; {launcher} "
                             "starts a fixed set of ranks: set launcher: torchrun, or drop min_hosts")
        if self.rdzv_conf:
            raise ValueError(f"rdzv_conf: it is torchrun's --rdzv-conf; {launcher} has no rendezvous: "
                             "set launcher: torchrun, or drop rdzv_conf")
        if self.nproc_per_host > 1:
            raise ValueError(f"nproc_per_host: {self.nproc_per_host} needs launcher: torchrun (its "
                             f"--nproc-per-node); {launcher} starts one process per host: "
                             "set launcher: torchrun, or nproc_per_host: 1")
        return self._step_pattern_fits()

    def _step_pattern_fits(self) -> "_JobFields":
        if self.nproc_per_host > 1 and self.step_pattern is not None:
            raise ValueError("step_pattern: the output lines of a host's processes cannot be told apart "
                             f"with nproc_per_host: {self.nproc_per_host}; count steps by the hook "
                             "(torch.optim, or chaos_hook.step()) and drop step_pattern")
        return self

    @field_validator("step_pattern")
    @classmethod
    def _compiles(cls, value: str | None) -> str | None:
        if value is not None:
            try:
                re.compile(value)
            except re.error as exc:
                raise ValueError(f"not a regular expression: {exc}; e.g. 'step \\d+'") from None
        return value


# a framework's settings under its name (harness.cluster.frameworks), given with its launcher
JobSpec = create_model(
    "JobSpec", __base__=_JobFields, __doc__=_JobFields.__doc__,
    **{name: (framework.settings | None,
              Field(default=None, description=f"launcher: {name}: its settings ({framework.settings.__module__})"))
       for name, framework in FRAMEWORKS.items()})


class _VariantFields(BaseModel):
    """Overrides of a job for one side of a comparison (`variants:` in a scenario); a
    framework's settings under its name, merged over the job's (fields JobVariant adds)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    env: Env = {}                     # added to the job's env
    command: Annotated[tuple[str, ...], Field(min_length=1)] | None = Field(
        default=None, description="instead of the job's command (another script: a framework's own)")
    args: tuple[str, ...] = ()        # appended to the (variant's) command
    launcher: Launcher | None = Field(
        default=None, description="instead of the job's; the job's settings of another framework are left out")
    max_restarts: Annotated[int, Field(ge=0)] | None = None
    min_hosts: Annotated[int, Field(ge=1)] | None = None
    rdzv_conf: RdzvConf = {}          # merged over the job's
    start: Literal["preloaded", "exec"] | None = None  # e.g. one side exec'd, to compare with

    def applied_to(self, job: Any) -> Any:
        """The job with these overrides (a JobSpec)."""
        changes: dict[str, Any] = {"env": {**job.env, **self.env},
                                   "command": (*(self.command or job.command), *self.args),
                                   "rdzv_conf": {**job.rdzv_conf, **self.rdzv_conf}}
        for name in FRAMEWORKS:
            if self.launcher is not None and self.launcher != name:
                changes[name] = getattr(self, name) or None  # the job's are for its own launcher
            elif given := getattr(self, name):
                settings = getattr(job, name)
                changes[name] = {**(settings.model_dump(exclude_unset=True) if settings else {}), **given}
        if self.start is not None:
            changes["start"] = self.start
        if self.launcher is not None:
            changes["launcher"] = self.launcher
        if self.max_restarts is not None:
            changes["max_restarts"] = self.max_restarts
        if self.min_hosts is not None:
            changes["min_hosts"] = self.min_hosts
        return JobSpec.model_validate({**job.model_dump(), **changes})


JobVariant = create_model(
    "JobVariant", __base__=_VariantFields, __doc__=_VariantFields.__doc__,
    **{name: (dict[str, Any], Field(default={}, description=f"merged over the job's {name} settings"))
       for name in FRAMEWORKS})


def _python_first(search_path: str) -> str:
    """`python` is the interpreter chaos runs in (it has torch) unless the job's PATH says otherwise."""
    return os.pathsep.join([str(Path(sys.executable).parent), *filter(None, search_path.split(os.pathsep))])


def rank_environment(job: JobSpec, rank: int, world: int, run_id: str, trial: str, events_path: str,
                     ifname: str = "eth0", base: dict[str, str] | None = None,
                     device: dict[str, str] | None = None,
                     master: tuple[str, int] | None = None,
                     addresses: Sequence[str] | None = None) -> dict[str, str]:
    """The environment of `rank`'s process: `base` (default: the harness's), the hook first
    on PYTHONPATH, the harness's Python first on PATH, the sockets on the host's link; for
    the `direct` launcher (and a framework without an agent) the torchrun contract for one
    process per host (under `torchrun` the agent sets it for its worker); the host's GPU and NCCL transport (`device`:
    harness.job.device.job_device_env); a framework's own variables on the hosts that train
    (the coordinator's host is not a rank: no rank variables, no hook events); then the
    job's own env (the user's settings win, as they would over torchrun's defaults).
    `master`: rank 0's host and port (default: rank 0's address on the switch,
    JOB_MASTER_PORT); `addresses`: every host's (default: the switch's plan)."""
    master_addr, master_port = master or (topology.host_address(0), JOB_MASTER_PORT)
    env = dict(os.environ if base is None else base)
    python_path = [str(HOOK_DIR), *filter(None, env.get("PYTHONPATH", "").split(os.pathsep))]
    env.update({
        "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": ifname, "NCCL_SOCKET_IFNAME": ifname,
        "PYTHONPATH": os.pathsep.join(python_path), "PATH": _python_first(env.get("PATH", "")),
        "PYTHONUNBUFFERED": "1", EVENTS_ENV: events_path, REPO_ENV: str(REPO_ROOT), TRIAL_ENV: trial,
        HOST_RANK_ENV: str(rank), STATE_EVERY_ENV: str(job.state_every),
    })
    if job.one_process_per_host:
        env.update({
            "RANK": str(rank), "LOCAL_RANK": "0", "WORLD_SIZE": str(world), "LOCAL_WORLD_SIZE": "1",
            "GROUP_RANK": str(rank), "GROUP_WORLD_SIZE": str(world), "ROLE_RANK": str(rank),
            "ROLE_WORLD_SIZE": str(world), "ROLE_NAME": "default",
            "MASTER_ADDR": master_addr, "MASTER_PORT": str(master_port),
            "TORCHELASTIC_RUN_ID": run_id, "TORCHELASTIC_RESTART_COUNT": "0",
            "TORCHELASTIC_MAX_RESTARTS": str(job.max_restarts),
        })
    framework = job.framework
    if framework is not None:
        hosts = _addresses(addresses, world)
        if rank == coordinator_host(world, {"launcher": job.launcher}):
            del env[HOST_RANK_ENV]
        else:
            env.update(framework.host_environment(job, rank, hosts))
    if _runs_torchrun(job, rank, world) and job.start == "preloaded":
        env[SERVER_ENV] = server_name(run_id, rank)
    env.update(device or {})
    env.update(job.env)
    return env


def _addresses(addresses: Sequence[str] | None, world: int) -> list[str]:
    return list(addresses) if addresses is not None else [topology.host_address(r) for r in range(world)]


def _runs_torchrun(job: JobSpec, rank: int, world: int) -> bool:
    """Whether `rank`'s host runs a torchrun agent (torchrun, or a framework's training host)."""
    if job.framework is not None:
        return job.framework.agent and rank != coordinator_host(world, {"launcher": job.launcher})
    return job.launcher == "torchrun"


def rank_command(job: JobSpec, rank: int, world: int, run_id: str, rendezvous: str,
                 addresses: Sequence[str] | None = None) -> list[str]:
    """What runs on `rank`'s host: the job's command itself (`direct`), or one torchrun agent
    that runs it as its `nproc_per_host` workers in a c10d rendezvous on the harness's store
    (`rendezvous`, host:port on the switch; harness.cluster.agent), or what a framework runs
    on each of its hosts (harness.cluster.frameworks). A preloaded job's workers are run
    through the stub that forks them warm (harness.cluster.workers). `addresses`: every
    host's (default: the switch's plan)."""
    if job.one_process_per_host:
        return list(job.command)
    workers = stub_command(job.command) if job.start == "preloaded" else list(job.command)
    host = AgentHost(number=rank, addresses=_addresses(addresses, world), run_id=run_id, workers=workers,
                     log_dir=f"{TRIAL_DIR_FIELD}/{LOGS_DIR}/{TORCHRUN_LOGS_DIR}/{topology.host_name(rank)}",
                     rendezvous=rendezvous)
    if job.framework is not None:
        return job.framework.command(job, host)
    return agent_command("torchrun", job, host, world)


def command_problem(job: JobSpec) -> str | None:
    """Why the job cannot be started, or None."""
    workdir = Path(job.workdir)
    if why := why_unreadable(workdir, folder=True):
        return f"job.workdir: {workdir}: {why}; give a folder relative to the scenario file"
    program = job.command[0]
    if "/" in program:
        if os.path.isfile(workdir / program):  # run, not read: execute-only is fine
            return None
        return (f"job.command: {program!r} ({workdir / program}): {why_unreadable(workdir / program) or 'not a file'}; "
                "give an installed command (python, torchrun) or a path relative to job.workdir")
    search_path = job.env.get("PATH", _python_first(os.environ.get("PATH", "")))
    if not shutil.which(program, path=search_path):
        return (f"job.command: {program!r} is not a program found on PATH or under {workdir}; "
                "give an installed command (python, torchrun) or a path relative to job.workdir")
    return None


def launch_command(job: JobSpec, argv: list[str], env: dict[str, str], trial_dir: Path,
                   address: str | None = None) -> dict[str, Any]:
    """What the rank launcher's `exec` entry needs: argv, cwd, env, the step pattern, the
    hostname its processes see where a framework advertises it (the host's `address`), and
    whether the host gives it a temporary folder of its own (TMPDIR), unless the job names
    one.
    `{trial_dir}` in an argument or an env value becomes the trial's folder (where a job
    keeps its checkpoint, fresh for every trial)."""
    def expand(text: str) -> str:
        return text.replace(TRIAL_DIR_FIELD, str(trial_dir))
    framework = job.framework
    # a framework's coordinator is a native server behind a Python entry point: it reads the
    # process's own argv, which only a new program has
    start = "exec" if framework is not None and argv[:1] == [framework.coordinator] else job.start
    return {"argv": [expand(a) for a in argv], "cwd": job.workdir,
            "env": {k: expand(v) for k, v in env.items()},
            "step_pattern": job.step_pattern, "start": start, "preload": list(job.preload),
            "serve_workers": SERVER_ENV in env, "own_temporary_folder": "TMPDIR" not in job.env,
            "hostname": address if framework is not None and framework.own_hostname else None}
