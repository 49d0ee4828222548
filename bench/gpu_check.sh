#!/usr/bin/env bash
# GPU check (issue 12), one prepared script, under 8 minutes, as root from the repository root:
#
#   sudo bench/gpu_check.sh [OUT_DIR]
#
# On a GPU machine: a 16-rank gloo-on-CUDA job under a 10 s link-down of rank 5 with the
# retry and isolation policies, then a NCCL job with one rank per visible GPU (NCCL needs
# two ranks at least and refuses two on one GPU: with one GPU it is skipped, and says so),
# and prints the figures of each trial (detect, recover, breaker, GPU memory released,
# bytes through the faulted link) with the GPU model. The hung-kernel fault is not built.
# Without a GPU: says why, runs the CPU side of every GPU code path, and exits 0.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
OUT=${1:-runs/gpu_check}
mkdir -p "$OUT"

cpu_side() {
    timeout 300 "$PY" -m pytest -q -p no:cacheprovider tests/gpu tests/run/test_link_traffic.py \
        tests/chaos/test_linkstats.py
}

GPUS=$("$PY" -c "from harness.job.device import visible_gpus; print(visible_gpus())")
if [ "$GPUS" = "0" ]; then
    echo "gpu_check: no GPU visible to NVML (no NVIDIA driver or device here): GPU behaviour NOT verified."
    echo "gpu_check: running the CPU side of the GPU code paths instead."
    cpu_side
    exit 0
fi
"$PY" - <<'PYEOF'
import pynvml, torch
pynvml.nvmlInit()
names = [pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(i)) for i in range(pynvml.nvmlDeviceGetCount())]
print(f"gpu_check: {len(names)} GPU(s): {', '.join(map(str, names))}; driver {pynvml.nvmlSystemGetDriverVersion()}; "
      f"torch {torch.__version__}, CUDA {torch.version.cuda}, NCCL {'.'.join(map(str, torch.cuda.nccl.version()))}")
PYEOF

scenario() {  # name ranks device comm policies
    cat > "$OUT/$1.yaml" <<YAML
name: $1
seed: 1
cluster: {ranks: $2, device: $3, comm: $4}
workload: {step_period: 250ms, checkpoint_every: 10}
warmup_steps: 8
settle_steps: 8
hang_cap: 30s
faults:
  - {kind: link_down, target: {rank: $(( $2 > 5 ? 5 : 1 ))}, start: 2s, duration: 10s}
policies:
$5
YAML
}

figures() {  # run folder
    "$PY" - "$1" <<'PYEOF'
import json, sys
import reports
run = sys.argv[1]
print("placement:", json.load(open(f"{run}/run.json")).get("placement"))
cols = ["policy", "outcome", "ttd_s", "ttr_s", "breaker_open_s", "released_s", "gpu_released_s",
        "gpu_release_within_bar", "cuda_reserved_after", "link_bytes_before", "link_window_s",
        "link_bytes_during", "bypassed_faults"]
print(reports.analyze_run(run)[cols].to_string(index=False))
PYEOF
}

start=$(date +%s)
scenario gloo_cuda 16 cuda gloo "  retry: {timeout: 5s, max_retries: 3, backoff_base: 1s, backoff_cap: 8s}
  isolation: {timeout: 5s, max_retries: 1, backoff_base: 1s, backoff_cap: 2s}"
timeout 300 .venv/bin/chaos run "$OUT/gloo_cuda.yaml" --out "$OUT" --quiet || echo "gpu_check: gloo_cuda exited $?"
figures "$(ls -d "$OUT"/gloo_cuda-* | tail -1)"

if [ "$GPUS" -ge 2 ]; then
    scenario nccl "$GPUS" cuda nccl "  retry: {timeout: 5s, max_retries: 3, backoff_base: 1s, backoff_cap: 8s}"
    timeout 150 .venv/bin/chaos run "$OUT/nccl.yaml" --out "$OUT" --quiet || echo "gpu_check: nccl exited $?"
    figures "$(ls -d "$OUT"/nccl-* | tail -1)"
else
    echo "gpu_check: NCCL job skipped: 1 GPU, a job needs 2 ranks and NCCL refuses two ranks on one GPU"
fi
echo "gpu_check: hung-kernel fault: not built"
echo "gpu_check: done in $(( $(date +%s) - start )) s"
