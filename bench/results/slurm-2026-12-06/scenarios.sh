#!/bin/bash
# 16 nodes x 1 rank, then 4 nodes x 4 ranks: the issue's four scenarios on --backend slurm
cd "$(dirname "$0")/../../.."
C=.venv/bin/chaos
$C slurm down >/dev/null
eval $($C slurm up --nodes 16 2>/dev/null)
for s in link_down kill_rank pause_rank byo_torchrun_kill; do
  echo "=== 16x1 $s"; timeout 1200 $C run scenarios/$s.yaml --backend slurm --out /tmp/s16/runs --quiet; echo "rc $?"
done
$C slurm down >/dev/null
eval $($C slurm up --nodes 4 2>/dev/null)
mkdir -p /tmp/s16/x4
for s in link_down kill_rank pause_rank byo_torchrun_kill; do
  python3 - "$s" <<'PY'
import sys, re
s = sys.argv[1]
text = open(f"scenarios/{s}.yaml").read()
text = re.sub(r"cluster: \{ranks: (\d+)\}", lambda m: "cluster: {ranks: %s, ranks_per_node: 4}" % ("16" if m.group(1) == "16" else "8"), text)
import os
text = text.replace("workdir: ../examples", "workdir: " + os.path.abspath("examples"))
open(f"/tmp/s16/x4/{s}.yaml", "w").write(text)
PY
  echo "=== 4x4 $s"; timeout 1200 $C run /tmp/s16/x4/$s.yaml --backend slurm --out /tmp/s16/runs4 --quiet; echo "rc $?"
done
$C slurm down
