#!/usr/bin/env bash
# A fast slice of the suite on the oldest torch the package supports (pyproject.toml:
# torch>=2.11), for the nights: the fingerprint (DTensor, FSDP2, ZeRO), the flight
# recorder, the state checker on real ranks, the startup hook, the command line, and the
# local backend as an ordinary user.
#
#   bench/oldest_torch.sh [VENV_DIR]    # default /tmp/chaos-torch-oldest; as root
#
# The venv is made once from the distribution's Python (an ordinary user can run it) with
# PyPI's torch 2.11.0 (the CUDA 13.0 build, ~4 GB with its libraries; it runs on the CPU),
# then this checkout is installed into it: pip keeps that torch (the range allows it).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${1:-/tmp/chaos-torch-oldest}
OLDEST=2.11.0
if [ ! -x "$VENV/bin/python" ]; then
    /usr/bin/python3 -m venv "$VENV"
    "$VENV/bin/pip" install --quiet --disable-pip-version-check "torch==$OLDEST"
fi
"$VENV/bin/pip" install --quiet --disable-pip-version-check -e '.[test,docker]'
"$VENV/bin/python" -c "import sys, torch; v = torch.__version__.split('+')[0]; print('torch', torch.__version__); \
sys.exit(0 if v == '$OLDEST' else 'pip replaced torch $OLDEST with ' + v)"
exec "$VENV/bin/python" -m pytest -q -p no:cacheprovider -rs \
    tests/harness/test_fingerprint.py tests/harness/test_flight.py tests/harness/test_state_job.py \
    tests/byo/test_hook.py tests/harness/test_job.py tests/run/test_local_backend.py
