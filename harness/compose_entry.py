"""Entry points for the services of docker-compose.yml under a plain `docker compose up`.

    python -m harness.compose_entry control    the rendezvous store (TCPStore) on CHAOS_STORE_PORT
    python -m harness.compose_entry rank       one rank, configured from the CHAOS_* environment

Under the harness (`--backend docker`) neither is used: the harness hosts the store on its
switch and hands every rank a config file (`python -m harness.rank --config FILE`).

Environment of a rank (see docker-compose.yml, `x-env`):
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
import sys
from pathlib import Path
from typing import Mapping

from harness.api import STORE_PORT


def _get(env: Mapping[str, str], key: str, default: str | None = None) -> str | None:
    value = env.get(key, "")
    return value if value != "" else default


def config_from_env(env: Mapping[str, str]) -> dict:
    """A RankConfig (as JSON-able dict) from the CHAOS_* environment of a compose service."""
    from harness.policies import policy_spec
    from harness.rank import RankConfig
    from harness.workload import WorkloadSpec

    missing = [k for k in ("CHAOS_RANK", "CHAOS_WORLD_SIZE") if not _get(env, k)]
    if missing:
        raise SystemExit(f"compose_entry: {', '.join(missing)} must be set")
    run_dir = Path(_get(env, "CHAOS_RUN_DIR", "/runs/compose") or "")
    overrides: dict = {}
    if _get(env, "CHAOS_POLICY_TIMEOUT"):
        overrides["timeout"] = _get(env, "CHAOS_POLICY_TIMEOUT")
    if _get(env, "CHAOS_MAX_RETRIES"):
        overrides["max_retries"] = int(_get(env, "CHAOS_MAX_RETRIES") or 0)
    workload = {"step_period": _get(env, "CHAOS_STEP_PERIOD")} if _get(env, "CHAOS_STEP_PERIOD") else {}
    max_steps = int(_get(env, "CHAOS_MAX_STEPS", "0") or 0) or None
    return RankConfig(
        rank=int(_get(env, "CHAOS_RANK") or 0), world_size=int(_get(env, "CHAOS_WORLD_SIZE") or 0),
        seed=int(_get(env, "CHAOS_SEED", "0") or 0),
        store_address=_get(env, "CHAOS_STORE_ADDRESS", "control") or "control",
        store_port=int(_get(env, "CHAOS_STORE_PORT", str(STORE_PORT)) or STORE_PORT),
        events_path=str(run_dir / "events.jsonl"), checkpoint_dir=str(run_dir / "ckpt"),
        policy=policy_spec(_get(env, "CHAOS_POLICY", "retry") or "retry", overrides),
        workload=WorkloadSpec.model_validate(workload), max_steps=max_steps,
        ifname=_get(env, "GLOO_SOCKET_IFNAME", "eth0") or "eth0",
    ).model_dump(mode="json")


def _rank() -> int:
    from harness import rank

    config = config_from_env(os.environ)
    run_dir = Path(config["events_path"]).parent
    (run_dir / "ranks").mkdir(parents=True, exist_ok=True)
    path = run_dir / "ranks" / f"r{config['rank']:03d}.json"
    path.write_text(json.dumps(config))
    return rank.cli(["--config", str(path)])


def _control() -> int:
    from harness import control, signals

    signals.install()
    return control.main({"port": int(_get(os.environ, "CHAOS_STORE_PORT", str(STORE_PORT)) or STORE_PORT)})


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args not in (["rank"], ["control"]):
        print("usage: python -m harness.compose_entry rank|control", file=sys.stderr)
        return 2
    return _rank() if args == ["rank"] else _control()


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
