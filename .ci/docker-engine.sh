#!/usr/bin/env bash
# Install (if missing) and start a local Docker engine for the docker backend, make the
# offline test image, then install Compose if there is none (Debian's docker-compose 1.29:
# the v2 plugin is in no registry CI reaches; tests/docker/test_compose_up.py runs
# docker-compose.yml with it). Idempotent: an engine that already answers is left as it is.
#
# The engine is started so that it leaves the host's network alone (the netns backend and
# other jobs share this machine): no iptables/ip6tables rules, no docker0 bridge, no
# ip_forward / masquerade changes. The docker backend wires its containers itself (veth
# into a switch namespace), so it needs none of that.
#
#   CHAOS_DOCKER_DEADLINE_S   how long to wait for the engine to answer (default 90)
#   CHAOS_DOCKER_DATA_ROOT    data root (default /var/lib/docker)
#   CHAOS_DOCKER_LOG          dockerd log (default /var/log/chaos-dockerd.log)
# Exit codes: 0 engine answers, Compose is installed and the image exists; 1 otherwise.
set -euo pipefail

here="$(cd "$(dirname "$0")/.." && pwd)"
python="${CHAOS_PYTHON:-$here/.venv/bin/python}"
deadline_s="${CHAOS_DOCKER_DEADLINE_S:-90}"
data_root="${CHAOS_DOCKER_DATA_ROOT:-/var/lib/docker}"
log="${CHAOS_DOCKER_LOG:-/var/log/chaos-dockerd.log}"

say() { echo "docker-engine: $*" >&2; }

if ! command -v dockerd >/dev/null 2>&1; then
    if [ "$(id -u)" != 0 ]; then say "dockerd missing and not root: cannot install"; exit 1; fi
    say "installing docker.io (engine only; the client on PATH is kept)"
    # policy-rc.d (exit 101) keeps the package from starting a default dockerd, which
    # would add iptables rules and a docker0 bridge.
    created_policy=0
    if [ ! -e /usr/sbin/policy-rc.d ]; then
        printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d; chmod +x /usr/sbin/policy-rc.d
        created_policy=1
    fi
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends docker.io >/dev/null
    [ "$created_policy" = 1 ] && rm -f /usr/sbin/policy-rc.d
fi

if docker info >/dev/null 2>&1; then
    say "engine already answers"
else
    say "starting dockerd (log: $log)"
    mkdir -p "$data_root" "$(dirname "$log")"
    # setsid: the engine outlives this script and is not in the CI job's process group.
    # It closes what it inherited beyond stdio first: a lock or pipe of the caller's would
    # otherwise stay held for as long as the engine runs.
    (
        for fd in $(ls /proc/$BASHPID/fd); do
            if [ "$fd" -gt 2 ]; then eval "exec $fd>&-"; fi
        done
        exec setsid dockerd \
            --host unix:///var/run/docker.sock \
            --data-root "$data_root" \
            --iptables=false --ip6tables=false --ip-forward=false --ip-masq=false \
            --bridge=none --userland-proxy=false \
            --log-level=warn
    ) >>"$log" 2>&1 < /dev/null &
    end=$(( $(date +%s) + deadline_s ))
    until docker info >/dev/null 2>&1; do
        if [ "$(date +%s)" -ge "$end" ]; then
            say "engine did not answer within ${deadline_s}s; last log lines:"
            tail -n 20 "$log" >&2 || true
            exit 1
        fi
        sleep 0.5
    done
    say "engine answers: $(docker version --format '{{.Server.Version}}')"
fi

# The offline test image (no registry here): a tiny imported root filesystem; the
# project's Python environment is bind-mounted read-only at run time.
"$python" -m harness.cluster.docker image

# Last: an engine and its image are there even where Compose cannot be installed.
if ! command -v docker-compose >/dev/null 2>&1 && ! docker compose version >/dev/null 2>&1; then
    if [ "$(id -u)" != 0 ]; then say "no Compose and not root: cannot install docker-compose"; exit 1; fi
    say "installing docker-compose (Compose 1.29)"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends docker-compose >/dev/null \
        || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
             apt-get install -y -qq --no-install-recommends docker-compose >/dev/null; }
fi
