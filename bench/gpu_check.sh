#!/usr/bin/env bash
# The GPU check: one prepared script, every part capped (the whole ran in about 4 minutes on an H200), from
# the repository root, as root or as an ordinary user:
#
#   bench/gpu_check.sh OUT_DIR
#   GPU_CHECK_PARTS="tests gpu_hang" bench/gpu_check.sh OUT_DIR   # only these parts (a rerun):
#       tests gpu_hang gpu_hang_fd fingerprint tune gpu_slow gpu_kill nccl gloo_cuda_link netem
#
# Its Python: this checkout's .venv when it has one; else $PYTHON or python3, the
# machine's own with its CUDA torch. Then the project's other dependencies that Python
# lacks are installed beside it into OUT_DIR/site from bench/wheels (bench/gpu_wheels.sh
# fetches them where an index is reachable; the folder travels with the tree), with no
# index and never torch; the checkout itself is on PYTHONPATH.
#
# It prints a preflight (bench/gpu_preflight.py: GPU, driver, torch, CUDA, NCCL, NVML,
# each backend, the kernel mechanisms), then runs on the local backend (plain processes,
# no namespace: it works in gVisor and without root) the GPU parts: CUDA placement of 16
# gloo-on-CUDA ranks; a 10 s gpu_hang of rank 5 under retry and isolation (a kernel spins
# on its GPU while the rank's heartbeat thread stays alive); a kill of rank 5 under timeout
# (the time until NVML no longer lists its GPU memory); a NCCL group of one rank per GPU
# where there are two GPUs or more. Where network namespaces work (netns backend) it also
# runs a 10 s link-down of rank 5 under retry and isolation. Each part's figures (detect,
# recover, breaker, GPU memory released after the breaker and after the kill) are printed
# and kept as OUT_DIR/<part>.csv; the whole output is OUT_DIR/gpu_check.log.
# Without a GPU it says so (GPU behaviour NOT verified) and runs the same machinery on the
# CPU: the preflight and a kill on the local backend.
set -uo pipefail
cd "$(dirname "$0")/.."
REPO=$PWD
OUT=$(realpath -m "${1:-runs/gpu_check}")
mkdir -p "$OUT"
exec > >(tee -a "$OUT/gpu_check.log") 2>&1
start=$(date +%s)
say() { echo "gpu_check [+$(( $(date +%s) - start ))s]: $*"; }

if [ -x .venv/bin/python ]; then
    PY=$REPO/.venv/bin/python
else
    PY=$(command -v "${PYTHON:-python3}")
    SITE=$OUT/site
    # what this Python lacks of the carried wheels (their names: the part before the version)
    carried=$(ls bench/wheels/*.whl 2>/dev/null | xargs -rn1 basename | cut -d- -f1 | sort -u)
    missing=()
    for name in $carried; do
        "$PY" -c "import importlib.metadata as m, sys; m.version(sys.argv[1])" "$name" 2>/dev/null \
            || missing+=("$name")
    done
    if [ ${#missing[@]} -gt 0 ]; then
        say "installing ${missing[*]} from bench/wheels into $SITE (no index)"
        PIP_CONSTRAINT= "$PY" -m pip install --quiet --disable-pip-version-check --no-index --find-links bench/wheels \
            --no-deps --no-compile --target "$SITE" "${missing[@]}" || { say "the install failed"; exit 1; }
    fi
    export PYTHONPATH=$REPO:$SITE${PYTHONPATH:+:$PYTHONPATH}
    export PATH=$SITE/bin:$PATH  # py-spy
fi
export PYTHONUNBUFFERED=1
CHAOS=("$PY" -m harness.cli)
say "python $PY"
"$PY" bench/gpu_preflight.py "$OUT" || say "the preflight exited $?"
wanted() {  # GPU_CHECK_PARTS="tests gpu_hang ..." runs only those parts (a rerun); unset: every part
    [ -z "${GPU_CHECK_PARTS:-}" ] || [[ " $GPU_CHECK_PARTS " == *" $1 "* ]]
}
ok() { "$PY" -c "import json, sys; sys.exit(0 if json.load(open(sys.argv[1]))[sys.argv[2]]['ok'] else 1)" \
           "$OUT/preflight.json" "$1" 2>/dev/null; }
GPUS=$("$PY" -c "import torch; print(torch.cuda.device_count() if torch.cuda.is_available() else 0)" 2>/dev/null || echo 0)

scenario() {  # name backend ranks device comm fault policies
    cat > "$OUT/$1.yaml" <<YAML
name: $1
seed: 1
cluster: {ranks: $3, backend: $2, device: $4, comm: $5}
workload: {step_period: 250ms, checkpoint_every: 10}
warmup_steps: 8
settle_steps: 8
hang_cap: 30s
faults:
  - $6
policies:
$7
YAML
}

part() {  # name cap_s: run OUT/name.yaml within the cap, print and keep its figures
    local name=$1 cap=$2
    say "$name (at most $cap s)"
    timeout --kill-after=10 "$cap" "${CHAOS[@]}" run "$OUT/$name.yaml" --out "$OUT/runs" --quiet \
        || say "$name exited $? (124: it ran past its cap)"
    local run
    run=$(ls -d "$OUT/runs/$name"-* 2>/dev/null | tail -1)
    [ -n "$run" ] || { say "$name left no run folder"; return; }
    "$PY" - "$run" "$OUT/$name.csv" <<'PYEOF' || say "$name: no figures"
import json, sys
import reports
run, csv = sys.argv[1], sys.argv[2]
print("placement:", json.load(open(f"{run}/run.json")).get("placement"))
table = reports.analyze_run(run)
table.to_csv(csv, index=False)
cols = ["policy", "outcome", "ttd_s", "ttr_s", "breaker_open_s", "released_s", "gpu_released_s",
        "cuda_reserved_after", "gpu_freed_after_kill_s", "link_bytes_before", "link_bytes_during",
        "steps_per_s_before", "steps_per_s_during", "state"]
print(table[[c for c in cols if c in table]].to_string(index=False))
PYEOF
    grep -h "gpu_hang .*a kernel spins" "$run"/trials/*/logs/* 2>/dev/null | head -3
}

netem_tests() {  # the kernel's netem where it has one (this VM's has not): its tests, capped
    wanted netem && ok netem || return 0
    say "the tests marked requires_netem (at most 120 s)"
    timeout --kill-after=10 120 "$PY" -m pytest -q -p no:cacheprovider -m requires_netem -rs tests/chaos \
        || say "the requires_netem tests exited $?"
}

RETRY="  retry: {timeout: 5s, max_retries: 3, backoff_base: 1s, backoff_cap: 8s}"
ISOLATION="  isolation: {timeout: 5s, max_retries: 1, backoff_base: 1s, backoff_cap: 2s}"
if [ "$GPUS" = "0" ] || ! ok nvml; then
    say "no GPU visible to torch and NVML here: GPU behaviour NOT verified; the same machinery on the CPU instead"
    scenario cpu_kill local 4 cpu gloo "{kind: kill, target: {rank: 2}, start: 2s}" "  timeout: {timeout: 5s}"
    part cpu_kill 120
    netem_tests
    say "done in $(( $(date +%s) - start )) s"
    exit 0
fi

if wanted tests; then
    say "the tests marked requires_gpu (at most 90 s)"
    timeout 90 "$PY" -m pytest -q -p no:cacheprovider -m requires_gpu -rs \
        tests/gpu tests/harness/test_fingerprint.py tests/harness/test_runner.py \
        || say "the requires_gpu tests exited $?"
fi
wanted gpu_hang && scenario gpu_hang local 16 cuda gloo "{kind: gpu_hang, target: {rank: 5}, start: 2s, duration: 10s}" \
    "$RETRY
$ISOLATION"
wanted gpu_hang && part gpu_hang 125
# a hang longer than the timeout against the failure detector: the rank's heartbeat thread
# goes on while its kernel spins, so the detector is not expected to see it before the timeout
wanted gpu_hang_fd && scenario gpu_hang_fd local 16 cuda gloo "{kind: gpu_hang, target: {rank: 5}, start: 2s, duration: 20s}" \
    "  retry_fd: {base: retry, detector: {}, timeout: 10s, rendezvous_timeout: 30s, max_retries: 100,
             backoff_base: 20ms, backoff_cap: 200ms, jitter: [0s, 30ms]}
  elastic: {}"
wanted gpu_hang_fd && part gpu_hang_fd 170
if wanted fingerprint; then  # one rank per GPU (as jobs run), then 16 ranks sharing the GPUs (as the parts above)
    for ranks in "$GPUS" 16; do
        say "the state fingerprint's cost per step on the GPU, $ranks ranks (at most 120 s)"
        timeout --kill-after=10 120 "$PY" bench/state_fingerprint.py --device cuda --ranks "$ranks" --steps 40 \
            --out "$OUT/fingerprint-$ranks.json" || say "state_fingerprint exited $?"
    done
fi
if wanted tune; then  # chaos tune where GPU nodes are: no namespace (local backend), the ranks on the GPU
    say "chaos tune, 4 ranks on the GPU, local backend (at most 300 s)"
    timeout --kill-after=10 300 "${CHAOS[@]}" tune scenarios/kill_rank.yaml --backend local --ranks 4 --repeat 1 \
        --measure 10s --control 10s --no-references --budget 4m --out "$OUT/tunes" || say "chaos tune exited $?"
    cp "$OUT"/tunes/*/tune.md "$OUT/tune.md" 2>/dev/null
    "$PY" -c "import glob, json, sys; print('placement:', json.load(open(glob.glob(sys.argv[1])[0]))['placement'])" \
        "$OUT/tunes/*/runs/*-measure-*/run.json" || say "chaos tune left no measurement"
fi
# slow's GPU settings (chaos.nvml: root only): rank 1's GPU clock locked at its lowest for
# 10 s, its throughput against before; then the GPU's clock and power limit as they are
# after the run (the revert gives them back)
if wanted gpu_slow && [ "$(id -u)" = 0 ]; then
    scenario gpu_slow local 4 cuda gloo "{kind: slow, gpu_clock: $("$PY" -c "
import pynvml as n; n.nvmlInit(); h = n.nvmlDeviceGetHandleByIndex(1 % n.nvmlDeviceGetCount())
print(min(n.nvmlDeviceGetSupportedGraphicsClocks(h, n.nvmlDeviceGetMaxClockInfo(h, n.NVML_CLOCK_MEM))))"), target: {rank: 1}, start: 2s, duration: 10s}" \
        "  timeout: {timeout: 30s}"
    part gpu_slow 90
    "$PY" -c "
import pynvml as n; n.nvmlInit()
for i in range(n.nvmlDeviceGetCount()):
    h = n.nvmlDeviceGetHandleByIndex(i)
    print(f'GPU {i} after: graphics clock {n.nvmlDeviceGetClockInfo(h, n.NVML_CLOCK_GRAPHICS)} MHz,',
          f'power limit {n.nvmlDeviceGetPowerManagementLimit(h) // 1000} W')" || say "NVML could not be asked after gpu_slow"
elif wanted gpu_slow; then
    say "gpu_slow skipped: NVML lets only root set a GPU's clock"
fi
wanted gpu_kill && scenario gpu_kill local 16 cuda gloo "{kind: kill, target: {rank: 5}, start: 2s}" "  timeout: {timeout: 5s}"
wanted gpu_kill && part gpu_kill 70
if ! wanted nccl; then
    :
elif [ "$GPUS" -ge 2 ]; then
    scenario nccl local "$GPUS" cuda nccl "{kind: kill, target: {rank: 1}, start: 2s}" "  timeout: {timeout: 5s}"
    part nccl 80
else
    say "NCCL group of two ranks skipped: 1 GPU; NCCL's own one-GPU checks instead (at most 150 s)"
    timeout --kill-after=10 150 "$PY" bench/gpu_nccl_one.py "$OUT" || say "gpu_nccl_one exited $?"
fi
if ! wanted gloo_cuda_link; then
    :
elif ok "backend netns"; then
    scenario gloo_cuda_link netns 16 cuda gloo "{kind: link_down, target: {rank: 5}, start: 2s, duration: 10s}" \
        "$RETRY
$ISOLATION"
    part gloo_cuda_link 125
else
    say "link-down part skipped: the netns backend cannot run here ($(grep -o '"backend netns".*' "$OUT/preflight.json" | head -1))"
fi
netem_tests
say "done in $(( $(date +%s) - start )) s"
