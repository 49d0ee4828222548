"""`python -m harness.cluster.docker image|compose-override|heal|check`: the docker backend's own chores.

    image   import the local test image if the engine lacks it (.ci/docker-engine.sh)
    compose-override FILE
            write a Compose override that runs docker-compose.yml on the local test image
            with this host's Python (harness.cluster.docker.compose)
    check   exit 0 if an engine answers, else print why and exit 1
    heal    remove containers labelled with a run id (`chaos heal` does this and more)
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from chaos.errors import ChaosError
from harness.cluster.docker.compose import write_local_override
from harness.cluster.docker.engine import engine, engine_unavailable_reason
from harness.cluster.docker.heal import heal_containers
from harness.cluster.docker.image import ensure_local_image


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m harness.cluster.docker")
    sub = p.add_subparsers(dest="cmd", required=True)
    sub.add_parser("image", help="import the local test image if the engine lacks it")
    o = sub.add_parser("compose-override", help="write a Compose override that runs docker-compose.yml "
                                                 "on the local test image with this host's Python")
    o.add_argument("file", type=Path)
    sub.add_parser("check", help="exit 0 if an engine answers, else print why and exit 1")
    h = sub.add_parser("heal", help="remove containers labelled with a run id")
    h.add_argument("run_id", nargs="?")
    h.add_argument("--all", action="store_true")
    args = p.parse_args(argv)
    try:
        if args.cmd == "check":
            reason = engine_unavailable_reason()
            print(reason or "engine answers")
            return 1 if reason else 0
        if args.cmd in ("image", "compose-override"):
            client = engine()
            try:
                print(ensure_local_image(client) if args.cmd == "image" else write_local_override(client, args.file))
            finally:
                client.close()
            return 0
        print(heal_containers(args.run_id, args.all).summary())
        return 0
    except ChaosError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
