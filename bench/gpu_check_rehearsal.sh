#!/usr/bin/env bash
# A rehearsal of bench/gpu_check.sh as the first GPU machine will run it: a fresh copy of
# this checkout (its tracked and untracked-not-ignored files, and bench/wheels) with no
# .venv, a Python that has its own torch and what such an image has but not this
# project's other dependencies, no package index (PIP_NO_INDEX), once as root and once as
# uid 65534. Each run must get through the install, the preflight and its parts.
#
#   bench/gpu_check_rehearsal.sh OUT_DIR [MACHINE_PYTHON]
#
# MACHINE_PYTHON: such a Python (docs/gpu-check.md: one with torch 2.11.0+cu130, the GPU
# machine's). Without it one is assembled here: a venv of the distribution's Python whose
# site-packages link every package of this checkout's .venv but the project and what
# bench/gpu_wheels.sh carries (its torch is then the development one).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=$(realpath -m "${1:?usage: bench/gpu_check_rehearsal.sh OUT_DIR [MACHINE_PYTHON]}")
rm -rf "$OUT"
mkdir -p "$OUT"
[ -n "$(ls bench/wheels/*.whl 2>/dev/null)" ] || bench/gpu_wheels.sh

MACHINE=${2:-}
if [ -z "$MACHINE" ]; then
    /usr/bin/python3 -m venv --without-pip "$OUT/machine"
    site=$("$OUT/machine/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
    dev_site=$(.venv/bin/python -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
    for entry in "$dev_site"/*; do
        name=$(basename "$entry" | tr 'A-Z-' 'a-z_')
        case "$name" in  # what the GPU machine's image lacks, and this project
            pydantic*|pyroute2*|py_spy*|annotated_types*|typing_inspection*|docker*|kubernetes*|jsonschema*|\
            ruff*|chaos_harness*|__editable__*|_chaos_harness*) continue ;;
        esac
        ln -s "$entry" "$site/"
    done
    MACHINE=$OUT/machine/bin/python
fi
"$MACHINE" -c "import torch; print('rehearsal: machine python', torch.__version__)"
if "$MACHINE" -c "import pydantic" 2>/dev/null; then
    echo "rehearsal: $MACHINE already has pydantic: it does not stand for the GPU machine" >&2
    exit 1
fi

tree=$OUT/tree
mkdir -p "$tree"
{ git ls-files -co --exclude-standard; ls bench/wheels/*.whl; } | sort -u | \
    while read -r f; do [ -e "$f" ] && echo "$f"; done | tar -cf - -T - | tar -xf - -C "$tree"
[ ! -e "$tree/.venv" ]

run_as() {  # who out
    local who=$1 dir=$OUT/$2
    mkdir -p "$dir"
    local env=(env -u VIRTUAL_ENV PIP_NO_INDEX=1 PIP_FIND_LINKS= PYTHON="$MACHINE" HOME="$dir") rc=0
    if [ "$who" = root ]; then
        "${env[@]}" "$tree/bench/gpu_check.sh" "$dir/out" > "$dir/stdout" 2>&1 || rc=$?
    else
        chown -R 65534:65534 "$dir"
        setpriv --reuid=65534 --regid=65534 --clear-groups "${env[@]}" CHAOS_STATE_DIR="$dir/state" \
            "$tree/bench/gpu_check.sh" "$dir/out" > "$dir/stdout" 2>&1 || rc=$?
    fi
    echo "rehearsal: $who: exit $rc; $(grep -c . "$dir/out/gpu_check.log") log lines in $dir/out"
}
run_as root as-root
run_as 65534 as-user
