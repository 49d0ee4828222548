"""Entry points of a process that is PID 1 of a container (docker backend, `docker compose up`).

    python -m harness.cluster.container rank --config FILE [--link-timeout S] [--barrier S]
                                          one rank, from a RankConfig file (the harness), or
                                          the user's own job when the file is a launch
                                          (harness.cluster.userjob.launch_command)
    python -m harness.cluster.container rank      one rank, configured from the CHAOS_* environment
                                          (a plain `docker compose up`)
    python -m harness.cluster.container control   the rendezvous store (TCPStore) on CHAOS_STORE_PORT;
                                          with CHAOS_WORLD_SIZE it exits once that many
                                          ranks have ended (`docker compose up` returns)

A SIGTERM handler is installed before anything heavy is imported: the kernel drops
signals that PID 1 of a namespace has no handler for, so a rank still importing torch
would ignore the harness's SIGTERM and wait for the SIGKILL. Until the rank has loaded,
SIGTERM exits at once with 0; from then on it raises `Terminated` (harness.signals).

Under the harness (`--backend docker`) the store runs on the harness's switch and the
rank gets a config file; under `docker compose up` the `control` service hosts the store.

A user's job: PID 1 waits for eth0 and for every rank's container (`--barrier`: a job with
a short timeout of its own would give up on peers whose containers start seconds later),
then forks what the netns rank launcher forks (the tap and the job's child, preloaded with
torch by this process or exec'd: `harness.cluster.userjob`), forwards SIGTERM and SIGINT to the job, reaps every process of
the container (it is their init), and exits with the job's code, or 128 + the signal that
ended it (the engine's convention, read back as a signal). A `docker kill` or `docker
pause` reaches the job with the whole container.

Environment of a compose rank (see docker-compose.yml, `x-env`):
    CHAOS_RANK, CHAOS_WORLD_SIZE              required
    CHAOS_STORE_ADDRESS, CHAOS_STORE_PORT     the `control` service (default control:29400)
    CHAOS_RUN_DIR                             events.jsonl, logs, checkpoints (shared volume)
    CHAOS_SEED, CHAOS_MAX_STEPS               CHAOS_MAX_STEPS empty or 0: train until stopped
    CHAOS_POLICY                              baseline | timeout | retry | isolation
    CHAOS_POLICY_TIMEOUT, CHAOS_MAX_RETRIES   overrides of the policy (empty: its default)
    CHAOS_STEP_PERIOD                         the workload's step pacing
    GLOO_SOCKET_IFNAME                        the link gloo binds to (default eth0)
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from collections.abc import Mapping
from pathlib import Path

from harness import signals

STORE_PORT = 29400  # harness.cluster.api.STORE_PORT, without importing the harness's dependencies


def _get(env: Mapping[str, str], key: str, default: str | None = None) -> str | None:
    value = env.get(key, "")
    return value if value != "" else default


def config_from_env(env: Mapping[str, str]) -> dict:
    """A RankConfig (as JSON-able dict) from the CHAOS_* environment of a compose service."""
    from harness.job.device import choose, rank_env, visible_gpus
    from harness.job.policies import policy_spec
    from harness.job.rank import RankConfig
    from harness.job.workload import WorkloadSpec

    missing = [k for k in ("CHAOS_RANK", "CHAOS_WORLD_SIZE") if not _get(env, k)]
    if missing:
        raise SystemExit(f"compose_entry: {', '.join(missing)} must be set")
    run_dir = Path(_get(env, "CHAOS_RUN_DIR", "/runs/compose") or "")
    overrides: dict = {}
    if _get(env, "CHAOS_POLICY_TIMEOUT"):
        overrides["timeout"] = _get(env, "CHAOS_POLICY_TIMEOUT")
    if _get(env, "CHAOS_MAX_RETRIES"):
        overrides["max_retries"] = int(_get(env, "CHAOS_MAX_RETRIES") or 0)
    if _get(env, "CHAOS_POLICY_OVERRIDES"):  # any other policy field, as a JSON object (k8s export)
        try:
            overrides.update(json.loads(_get(env, "CHAOS_POLICY_OVERRIDES") or "{}"))
        except (ValueError, TypeError) as exc:
            raise SystemExit(f"compose_entry: CHAOS_POLICY_OVERRIDES is not a JSON object of policy fields: {exc}") from None
    workload = {"step_period": _get(env, "CHAOS_STEP_PERIOD")} if _get(env, "CHAOS_STEP_PERIOD") else {}
    max_steps = int(_get(env, "CHAOS_MAX_STEPS", "0") or 0) or None
    rank, world = int(_get(env, "CHAOS_RANK") or 0), int(_get(env, "CHAOS_WORLD_SIZE") or 0)
    policy = policy_spec(_get(env, "CHAOS_POLICY", "retry") or "retry", overrides)
    ifname = _get(env, "GLOO_SOCKET_IFNAME", "eth0") or "eth0"
    # every rank sees the host's GPUs and picks its own (CUDA_VISIBLE_DEVICES in rank_env)
    placement = choose(_get(env, "CHAOS_DEVICE", "auto") or "auto", _get(env, "CHAOS_COMM", "auto") or "auto",
                       world, visible_gpus())
    return RankConfig(
        rank=rank, world_size=world,
        seed=int(_get(env, "CHAOS_SEED", "0") or 0),
        store_address=_get(env, "CHAOS_STORE_ADDRESS", "control") or "control",
        store_port=int(_get(env, "CHAOS_STORE_PORT", str(STORE_PORT)) or STORE_PORT),
        events_path=str(run_dir / "events.jsonl"), checkpoint_dir=str(run_dir / "ckpt"),
        policy=policy, workload=WorkloadSpec.model_validate(workload), max_steps=max_steps, ifname=ifname,
        device=placement.device, comm=placement.comm, env=rank_env(placement, rank, policy.base, ifname),
    ).model_dump(mode="json")


JOB_KEY = "argv"       # a config file holding it is a user's job's launch, not a RankConfig
TAP_DRAIN_S = 5.0      # after the job ended, how long its tap may take to record the last lines


def _launch_in(argv: list[str]) -> tuple[dict, argparse.Namespace] | None:
    """The launch and the options when `--config FILE` names a user's job, else None."""
    parser = argparse.ArgumentParser(prog="python -m harness.cluster.container rank")
    parser.add_argument("--config", required=True)
    parser.add_argument("--link-timeout", type=float, default=60.0)
    parser.add_argument("--barrier", type=float, default=None)
    parser.add_argument("--lease", default=None)
    options, _ = parser.parse_known_args(argv)
    with open(options.config) as f:
        config = json.load(f)
    return (config, options) if JOB_KEY in config else None


def _exit_code(status: int) -> int:
    code = os.waitstatus_to_exitcode(status)
    return 128 - code if code < 0 else code


def _run_job(launch: dict, options: argparse.Namespace) -> int:
    """PID 1 of a user's job's container: see the module's docstring."""
    from harness.cluster import preload
    preload.remember_launcher()  # before torch's import
    from harness.cluster.jobstart import run_tap, start_job
    from harness.job import lease
    from harness.job.rank import start_barrier, wait_for_link

    os.unlink(options.config)  # it holds the harness's environment: not kept in the run folder
    log = os.open(launch["log"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    for fd in (1, 2):  # the engine's log of a job's container is not collected: this one is
        os.dup2(log, fd)
    os.close(log)
    wait_for_link(launch["ifname"], options.link_timeout)
    if launch["start"] == "preloaded" and (problem := preload.import_all(launch["preload"])):
        print(f"chaos: {problem}; this rank's job starts by exec", flush=True)
        launch = {**launch, "start": "exec"}
    if options.barrier is not None:  # every container up before any job starts, as the netns forks
        start_barrier(os.path.dirname(os.path.abspath(options.config)), launch["rank"], launch["world"],
                      options.barrier)
    job: list[int] = []

    def forward(signum: int, frame: object) -> None:
        if not job:
            os._exit(0)  # not started yet (or in a child before it execs): nothing to release
        try:
            os.kill(job[0], signum)
        except ProcessLookupError:
            pass  # it ended: the exit is on its way

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    read_end, write_end = os.pipe()
    tap = os.fork()
    if tap == 0:
        os.close(write_end)  # the pipe ends when the job's processes close it
        os._exit(run_tap(read_end, launch["log"], launch))
    pid = os.fork()
    if pid == 0:
        os.close(read_end)
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.dup2(write_end, 1)
        os.dup2(write_end, 2)
        os._exit(start_job(launch))
    job.append(pid)
    os.close(read_end)
    os.close(write_end)
    if options.lease is not None:  # only now: no thread may exist while this process forks
        lease.watch(Path(options.lease))  # its SIGTERM is forwarded to the job like the harness's
    code, tapped = None, False
    while code is None:  # as init, reap every orphan too
        ended, status = os.waitpid(-1, 0)
        tapped = tapped or ended == tap
        if ended == pid:
            code = _exit_code(status)
    deadline = time.monotonic() + TAP_DRAIN_S
    while not tapped and time.monotonic() < deadline:  # the tap records the job's last lines
        tapped = os.waitpid(tap, os.WNOHANG)[0] == tap
        time.sleep(0.01)
    return code  # an orphan still holding the pipe ends with this process (the kernel's doing)


def _rank(argv: list[str]) -> int:
    from harness.job import rank

    if argv:  # --config FILE ...: the harness's rank, or the user's job
        job = _launch_in(argv)
        return rank.cli(argv) if job is None else _run_job(*job)
    config = config_from_env(os.environ)
    run_dir = Path(config["events_path"]).parent
    (run_dir / "ranks").mkdir(parents=True, exist_ok=True)
    path = run_dir / "ranks" / f"r{config['rank']:03d}.json"
    path.write_text(json.dumps(config))
    code = rank.cli(["--config", str(path)])
    _count_rank_ended(config["store_address"], config["store_port"])
    return code


# Under `docker compose up` the store (`control`) would serve forever, so `up` would never
# return: every rank that ends counts itself here, and a control that knows the world size
# (CHAOS_WORLD_SIZE) exits once all have. A killed rank never counts: control stays up.
RANKS_ENDED_KEY = "compose/ranks_ended"
RANK_ENDED_CONNECT_S = 5.0     # control already gone (`down`): give up telling it
RANKS_ENDED_POLL_S = 0.5


def _count_rank_ended(address: str, port: int) -> None:
    """Bounded (harness.job.store): a control plane that is paused or cut off must not keep a
    rank's container from ending."""
    from harness.job.store import DeadlineStore
    try:
        DeadlineStore((address, port), RANK_ENDED_CONNECT_S, RANK_ENDED_CONNECT_S).add(RANKS_ENDED_KEY, 1)
    except (RuntimeError, OSError):  # DistStoreError and StoreUnanswered are RuntimeErrors: control is gone
        pass


def _exit_once_every_rank_ended(port: int, world: int) -> None:
    """Ends the control process once `world` ranks have counted themselves ended. No
    deadline: a job of CHAOS_MAX_STEPS=0 trains until it is stopped."""
    from datetime import timedelta

    import torch.distributed as dist
    store = dist.TCPStore("127.0.0.1", port, is_master=False, wait_for_workers=False,
                          timeout=timedelta(seconds=60))
    while store.add(RANKS_ENDED_KEY, 0) < world:
        time.sleep(RANKS_ENDED_POLL_S)
    print(f"all {world} ranks ended: control plane exits", flush=True)
    os._exit(0)  # the store's threads hold nothing to save


def _control() -> int:
    import threading

    from harness.job import control

    port = int(_get(os.environ, "CHAOS_STORE_PORT", str(STORE_PORT)) or STORE_PORT)
    world = int(_get(os.environ, "CHAOS_WORLD_SIZE", "0") or 0)
    if world:
        threading.Thread(target=_exit_once_every_rank_ended, args=(port, world), daemon=True,
                         name="ranks-ended").start()
    return control.main({"port": port})


def _exit_now(signum: int, frame: object) -> None:
    os._exit(0)  # asked to stop before the rank started: nothing written, nothing to release


def main(argv: list[str] | None = None) -> int:
    # First thing: PID 1 ignores a SIGTERM it has no handler for. While the rank loads
    # (seconds of imports) a SIGTERM ends the process at once: raising inside an import
    # would leave half-initialised modules behind. `harness.job.rank.cli` installs the
    # `Terminated` handler once loading is done; the control plane keeps this one.
    signal.signal(signal.SIGTERM, _exit_now)
    signal.signal(signal.SIGINT, _exit_now)
    args = sys.argv[1:] if argv is None else argv
    try:
        if args[:1] == ["rank"]:
            return _rank(args[1:])
        if args == ["control"]:
            return _control()
    except signals.Terminated:
        return 0
    print("usage: python -m harness.cluster.container rank [--config FILE ...] | control", file=sys.stderr)
    return 2


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # no interpreter teardown (~2 s with torch loaded), as the zygote's children
