#!/usr/bin/env bash
# The wheels bench/gpu_check.sh needs on a GPU machine that has its own Python and CUDA
# torch but no network: the project's dependencies that such a machine's image lacks (the
# H200 image of the device tool has torch, numpy, pandas, matplotlib, pyyaml,
# prometheus-client, nvidia-ml-py, pytest and setuptools; see KINDS.md there), for
# CPython 3.11-3.13 on x86-64 Linux, into bench/wheels/ (git ignores it; it travels with
# the tree as a carried path). Never torch.
#
#   bench/gpu_wheels.sh            # here, where pip reaches an index
set -euo pipefail
cd "$(dirname "$0")/.."
DEST=bench/wheels
# the versions the development venv resolved (pydantic-core must match pydantic exactly)
WHEELS=(pyroute2==0.9.7 pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0
        typing-inspection==0.4.5 py-spy==0.4.3)
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] && PY=.venv/bin/python
mkdir -p "$DEST"
for version in 3.11 3.12 3.13; do
    "$PY" -m pip download --quiet --disable-pip-version-check --no-deps --only-binary=:all: \
        --python-version "$version" --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
        --platform manylinux1_x86_64 -d "$DEST" "${WHEELS[@]}" 2>&1 | grep -v "^WARNING: Location" || true
done
ls "$DEST"/*.whl | grep -qi torch && { echo "gpu_wheels: torch among the wheels: remove it" >&2; exit 1; }
echo "gpu_wheels: $(ls "$DEST"/*.whl | wc -l) wheels, $(du -sh "$DEST" | cut -f1), in $DEST"
