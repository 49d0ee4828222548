#!/usr/bin/env bash
# The pytest plugin and `chaos tune` with --backend slurm, on a local 16-node cluster (root).
set -euo pipefail
cd "$(dirname "$0")/../../.."
out=bench/results/slurm-2026-12-06b
eval "$(.venv/bin/chaos slurm up --nodes 16)"
trap '.venv/bin/chaos slurm down' EXIT
.venv/bin/python -m pytest -p no:cacheprovider -q scenarios/kill_rank.yaml scenarios/pause_rank.yaml \
    --backend slurm --basetemp /tmp/bt-plugin-slurm 2>&1 | tail -25 | tee $out/pytest-scenarios-slurm.txt
( time .venv/bin/chaos tune scenarios/kill_rank.yaml --backend slurm --ranks 4 --measure 6s --control 4s \
    --repeat 1 --no-references --faults pause:3s --budget 12m --out /tmp/tune-slurm ) 2>&1 \
    | tail -40 | tee $out/tune-slurm.txt
cp /tmp/tune-slurm/*/tune.md $out/tune-slurm.md
