#!/usr/bin/env bash
# Install (if missing) a kernel with sch_netem that runs as a process: Debian's User-Mode
# Linux (linux.uml, Linux 6.1, netem/veth/bridge as modules) and kmod's modprobe to load
# them. tests/chaos/test_netem_uml.py boots it to run the netem tests; this machine's own
# kernel has no sch_netem. Without it those tests skip, saying why, or fail the session
# where CHAOS_REQUIRE names uml_netem (CI; tests/conftest.py).
set -euo pipefail
if command -v linux.uml >/dev/null && command -v modprobe >/dev/null; then
    exit 0
fi
if [ "$(id -u)" = 0 ] && apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
        user-mode-linux kmod >/dev/null; then
    exit 0
fi
echo "uml-kernel: could not install user-mode-linux and kmod; the netem tests need them" >&2
