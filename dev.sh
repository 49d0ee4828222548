#!/usr/bin/env bash
# Set up this checkout and run it. Two commands, on a fresh machine, as root:
#
#   ./dev.sh demo [chaos run options]   venv + the main job: a link-down on one rank of a
#                                       16-rank job, under the four policies, with the table
#   ./dev.sh test [pytest options]      venv + a Docker engine + Slurm + ruff + the whole test suite
#
# And a contributor's quick loop:
#
#   ./dev.sh check [pytest options]     venv + ruff + the tests that start no process, daemon or
#                                       socket and need no root or kernel mechanism
#
# The venv (.venv) keeps torch 2.13.0 (the CPU wheel; constraints.txt) and is reused when it is current.
set -euo pipefail
cd "$(dirname "$0")"

# A Python that an ordinary user can run too (the rootless tests run as one; a pyenv
# interpreter under root's home, mode 700, is not theirs to open): python3 if it is, else
# the distribution's.
python_for_all() {
    for py in "$(command -v python3)" /usr/bin/python3; do
        if [ -x "$py" ] && { [ "$(id -u)" != 0 ] || setpriv --reuid=65534 --regid=65534 --clear-groups \
                /bin/sh -c "exec '$(readlink -f "$py")' -c ''" 2>/dev/null; }; then
            echo "$py"
            return
        fi
    done
    command -v python3
}

setup() {
    if [ ! -x .venv/bin/python ]; then
        "$(python_for_all)" -m venv .venv
    fi
    # Reinstall only when the dependency list changed since the last install.
    stamp=.venv/.installed-$(cat pyproject.toml constraints.txt | sha1sum | cut -c1-12)
    if [ ! -e "$stamp" ]; then
        echo "dev.sh: installing dependencies into .venv (torch 2.13.0 CPU, pyroute2, pandas, torchft, ...)" >&2
        .venv/bin/python -m pip install --quiet --disable-pip-version-check -c constraints.txt -e '.[test,docker,frameworks]'
        rm -f .venv/.installed-*
        touch "$stamp"
    fi
}

case "${1:-}" in
    demo)
        shift
        setup
        exec .venv/bin/chaos run scenarios/link_down.yaml "$@"
        ;;
    test)
        shift
        setup
        # The docker-backend tests need an engine, the slurm backend's a local Slurm cluster,
        # the netem tests a kernel with sch_netem that runs as a process (User-Mode Linux).
        # Where one cannot be had its tests skip, saying why, unless CHAOS_REQUIRE names it
        # (CI: .ci/run): then the session fails at collection, naming it (tests/conftest.py).
        bash .ci/docker-engine.sh || echo "dev.sh: no Docker engine or Compose; the docker tests need them" >&2
        bash .ci/slurm.sh || echo "dev.sh: Slurm could not be installed; the slurm tests need it" >&2
        bash .ci/fuse.sh || echo "dev.sh: fuse3 could not be installed; the FUSE storage faults' tests need it" >&2
        bash .ci/uml-kernel.sh
        .venv/bin/ruff check --quiet .
        # CI's tier by default (docs/nightly.md); a later -m wins: -m nightly for the nights'
        # tier, -m "" for every tier. Two pytest-xdist workers, whatever the machine: a trial
        # keeps about a third of CI's two CPUs busy, so two at once keep its timings; tests of
        # one shared daemon go to one worker (tests/conftest.py); -n 0 runs one at a time.
        # pytest exits 5 when it collected no test: that fails here like any other error.
        exec .venv/bin/python -m pytest -m "not nightly" -n 2 --dist loadgroup "$@"
        ;;
    check)
        shift
        setup
        .venv/bin/ruff check --quiet .
        # `system` marks what starts real processes or needs root (tests/conftest.py); the
        # nightly tier is left to the nights
        exec .venv/bin/python -m pytest -q -p no:cacheprovider -m "not system and not nightly" tests "$@"
        ;;
    *)
        echo "usage: ./dev.sh demo [chaos run options] | ./dev.sh test [pytest options] | ./dev.sh check [pytest options]" >&2
        exit 2
        ;;
esac
