#!/usr/bin/env bash
# GPU check (issue 12), one prepared script, under 8 minutes, as root from the repository root:
#
#   sudo bench/gpu_check.sh [OUT_DIR]
#
# On a GPU machine: a 16-rank gloo-on-CUDA job under a 10 s link-down of rank 5 with the
# retry and isolation policies, then a NCCL job with one rank per visible GPU (NCCL needs
# two ranks at least and refuses two on one GPU: with one GPU it is skipped, and says so),
# then the GPU faults on 16-rank gloo-on-CUDA jobs: a 10 s gpu_hang of rank 5 (a kernel
# spinning on its GPU) under retry and isolation, and a kill of rank 5 under timeout (the
# time until NVML no longer lists its GPU memory); prints the figures of each trial
# (detect, recover, breaker, GPU memory released after the breaker and after the kill,
# bytes through the faulted link) with the GPU model, and the ranks' log lines that show
# each hang's kernel was queued.
# Length (an estimate from the trials' timelines, not yet measured on a GPU): a trial is
# bring-up and warm-up (~20 s: 16 ranks import torch and start CUDA), its fault timeline
# (2 s + 10 s) and the settle steps (8 x 250 ms, or a 5 s timeout and backoff first):
# ~45-60 s; six trials (link-down x2, NCCL x1, gpu_hang x2, kill x1) ~5-6 min, and the
# GPU tests of tests/gpu (requires_gpu: the kernel's real length, NVML per pid) and the
# `chaos run`s are capped (timeout 60 + 125 + 80 + 125 + 70 s) so that the whole stays under 8 minutes.
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
timeout 60 "$PY" -m pytest -q -p no:cacheprovider tests/gpu || echo "gpu_check: tests/gpu on the GPU exited $?"

scenario() {  # name ranks device comm policies [fault: a link-down of rank 5 (1 in a smaller job)]
    local fault="{kind: link_down, target: {rank: $(( $2 > 5 ? 5 : 1 ))}, start: 2s, duration: 10s}"
    if [ $# -ge 6 ]; then fault=$6; fi
    cat > "$OUT/$1.yaml" <<YAML
name: $1
seed: 1
cluster: {ranks: $2, device: $3, comm: $4}
workload: {step_period: 250ms, checkpoint_every: 10}
warmup_steps: 8
settle_steps: 8
hang_cap: 30s
faults:
  - $fault
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
        "gpu_release_within_bar", "cuda_reserved_after", "gpu_freed_after_kill_s", "link_bytes_before", "link_window_s",
        "link_bytes_during", "bypassed_faults"]
print(reports.analyze_run(run)[cols].to_string(index=False))
PYEOF
}

start=$(date +%s)
scenario gloo_cuda 16 cuda gloo "  retry: {timeout: 5s, max_retries: 3, backoff_base: 1s, backoff_cap: 8s}
  isolation: {timeout: 5s, max_retries: 1, backoff_base: 1s, backoff_cap: 2s}"
timeout 125 .venv/bin/chaos run "$OUT/gloo_cuda.yaml" --out "$OUT" --quiet || echo "gpu_check: gloo_cuda exited $?"
figures "$(ls -d "$OUT"/gloo_cuda-* | tail -1)"

if [ "$GPUS" -ge 2 ]; then
    scenario nccl "$GPUS" cuda nccl "  retry: {timeout: 5s, max_retries: 3, backoff_base: 1s, backoff_cap: 8s}"
    timeout 80 .venv/bin/chaos run "$OUT/nccl.yaml" --out "$OUT" --quiet || echo "gpu_check: nccl exited $?"
    figures "$(ls -d "$OUT"/nccl-* | tail -1)"
else
    echo "gpu_check: NCCL job skipped: 1 GPU, a job needs 2 ranks and NCCL refuses two ranks on one GPU"
fi
scenario gpu_hang 16 cuda gloo "  retry: {timeout: 5s, max_retries: 3, backoff_base: 1s, backoff_cap: 8s}
  isolation: {timeout: 5s, max_retries: 1, backoff_base: 1s, backoff_cap: 2s}" \
    "{kind: gpu_hang, target: {rank: 5}, start: 2s, duration: 10s}"
timeout 125 .venv/bin/chaos run "$OUT/gpu_hang.yaml" --out "$OUT" --quiet || echo "gpu_check: gpu_hang exited $?"
run=$(ls -d "$OUT"/gpu_hang-* | tail -1)
figures "$run"
grep -h "gpu_hang .*a kernel spins" "$run"/trials/*/logs/* || echo "gpu_check: no rank queued the hang's kernel"

scenario gpu_kill 16 cuda gloo "  timeout: {timeout: 5s}" \
    "{kind: kill, target: {rank: 5}, start: 2s}"
timeout 70 .venv/bin/chaos run "$OUT/gpu_kill.yaml" --out "$OUT" --quiet || echo "gpu_check: gpu_kill exited $?"
figures "$(ls -d "$OUT"/gpu_kill-* | tail -1)"
echo "gpu_check: done in $(( $(date +%s) - start )) s"
