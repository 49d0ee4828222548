#!/usr/bin/env bash
# chaos nightly --quick on the slurm backend, two cells at once and then cell after cell,
# wall time of each; SLURM_CONF names a 16-node cluster (`sudo chaos slurm up --nodes 16`).
cd "$(dirname "$0")/../../.."
export SLURM_CONF="${SLURM_CONF:?the slurm.conf of a 16-node cluster}"
rm -rf /tmp/nights-p1 /tmp/nights-p2
for p in 2 1; do
  s=$(date +%s.%N)
  .venv/bin/chaos nightly --quick --backend slurm --parallel $p --out /tmp/nights-p$p > /tmp/nights-p$p.log 2>&1
  rc=$?
  e=$(date +%s.%N)
  echo "parallel $p rc $rc wall $(python3 -c "print(round($e-$s,1))") s"
done
