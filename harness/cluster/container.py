"""Entry points of a process that is PID 1 of a container (docker backend, `docker compose up`).

    python -m harness.cluster.container rank --config FILE [--link-timeout S] [--barrier S]
                                          one rank, from a RankConfig file (the harness)
    python -m harness.cluster.container rank      one rank, configured from the CHAOS_* environment
                                          (a plain `docker compose up`)
    python -m harness.cluster.container control   the rendezvous store (TCPStore) on CHAOS_STORE_PORT

A SIGTERM handler is installed before anything heavy is imported: the kernel drops
signals that PID 1 of a namespace has no handler for, so a rank still importing torch
would ignore the harness's SIGTERM and wait for the SIGKILL. Until the rank has loaded,
SIGTERM exits at once with 0; from then on it raises `Terminated` (harness.signals).

Under the harness (`--backend docker`) the store runs on the harness's switch and the
rank gets a config file; under `docker compose up` the `control` service hosts the store.

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

import json
import os
import signal
import sys
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


def _rank(argv: list[str]) -> int:
    from harness.job import rank

    if argv:  # --config FILE ...: the harness's rank
        return rank.cli(argv)
    config = config_from_env(os.environ)
    run_dir = Path(config["events_path"]).parent
    (run_dir / "ranks").mkdir(parents=True, exist_ok=True)
    path = run_dir / "ranks" / f"r{config['rank']:03d}.json"
    path.write_text(json.dumps(config))
    return rank.cli(["--config", str(path)])


def _control() -> int:
    from harness.job import control

    return control.main({"port": int(_get(os.environ, "CHAOS_STORE_PORT", str(STORE_PORT)) or STORE_PORT)})


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
