"""NCCL on a machine with one GPU: what can be checked there, and the real error lines.

    python bench/gpu_nccl_one.py OUT_DIR

A NCCL group needs a GPU per rank, so with one GPU no two-rank NCCL job can run. What this
checks instead, each in a process of its own with a deadline:

- `recorder`: a one-rank NCCL group runs three all_reduce on the GPU; its flight recorder
  (harness.job.flight, as the harness's ranks and a user's job dump it) lists them as NCCL
  entries, and dumps into a trial folder.
- `two_on_one`: two ranks put on the one GPU call NCCL, as a user's 16-rank job would on
  such a machine; the lines NCCL and torch print are kept (OUT_DIR/nccl_lines.txt) with the
  cause runfolder.classify gives each, to be the classifier's test data.
- `device_assert`: an out-of-range index on the GPU: the CUDA error line a broken kernel
  prints, kept the same way.

Every part prints one line `nccl_one: PART ...`; none fails the check.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DEADLINE_S = 45

RECORDER = """
import os, sys, tempfile, json
from datetime import timedelta
from pathlib import Path
import torch, torch.distributed as dist
from harness.job import flight
store = dist.FileStore(tempfile.mktemp(), 1)
torch.cuda.set_device(0)
dist.init_process_group("nccl", store=store, rank=0, world_size=1, timeout=timedelta(seconds=20))
x = torch.ones(1 << 20, device="cuda")
for _ in range(3):
    dist.all_reduce(x)
torch.cuda.synchronize()
got = flight.entries()
trial = Path(sys.argv[1])
flight.dump(trial, 0)
print(json.dumps({"available": flight.available(), "entries": got["entries"],
                  "dumped": sorted(p.name for p in (trial / "flight").iterdir())}))
dist.destroy_process_group()
"""

TWO_ON_ONE = """
import os, sys
from datetime import timedelta
import torch, torch.distributed as dist
rank = int(sys.argv[2])
store = dist.FileStore(sys.argv[1], 2)
torch.cuda.set_device(0)
dist.init_process_group("nccl", store=store, rank=rank, world_size=2, timeout=timedelta(seconds=20))
x = torch.ones(16, device="cuda")
dist.all_reduce(x)
torch.cuda.synchronize()
print("rank", rank, "all_reduce gave", x[0].item())
dist.destroy_process_group()
"""

DEVICE_ASSERT = """
import torch
x = torch.zeros(4, device="cuda")
print(x[torch.tensor([7], device="cuda")].sum().item())
"""


def python(code: str, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", textwrap.dedent(code), *args], cwd=REPO,
                            env={**os.environ, "PYTHONPATH": f"{REPO}:{os.environ.get('PYTHONPATH', '')}",
                                 **(env or {})},
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def finish(child: subprocess.Popen) -> tuple[int | str, str]:
    try:
        out, _ = child.communicate(timeout=DEADLINE_S)
        return child.returncode, out
    except subprocess.TimeoutExpired:
        child.kill()
        out, _ = child.communicate()
        return f"hung >= {DEADLINE_S} s (killed)", out


def error_lines(part: str, output: str) -> list[dict[str, str | None]]:
    from runfolder.classify import classify_line
    keep = ("error", "nccl", "cuda", "exception", "failed", "warn")
    return [{"part": part, "line": line, "cause": classify_line(line)}
            for line in output.splitlines() if any(k in line.lower() for k in keep)]


def main() -> int:
    out = Path(sys.argv[1] if len(sys.argv) > 1 else ".")
    out.mkdir(parents=True, exist_ok=True)
    lines: list[dict[str, str | None]] = []

    with tempfile.TemporaryDirectory() as trial:
        code, output = finish(python(RECORDER, trial))
    try:
        got = json.loads(output.strip().splitlines()[-1])
        names = sorted({e["profiling_name"] for e in got["entries"]})
        print(f"nccl_one: recorder exit {code}; {len(got['entries'])} entries {names}; dumped {got['dumped']}")
    except (ValueError, IndexError, KeyError):
        print(f"nccl_one: recorder exit {code}; no JSON:\n{output[-3000:]}")
    lines += error_lines("recorder", output)

    with tempfile.TemporaryDirectory() as folder:
        store = os.path.join(folder, "store")
        children = [python(TWO_ON_ONE, store, str(rank), env={"NCCL_DEBUG": "WARN"}) for rank in (0, 1)]
        ended = [finish(child) for child in children]
    for rank, (code, output) in enumerate(ended):
        print(f"nccl_one: two_on_one rank {rank} exit {code}; last lines:")
        print(textwrap.indent("\n".join(output.strip().splitlines()[-6:]), "    "))
        lines += error_lines(f"two_on_one rank {rank}", output)

    code, output = finish(python(DEVICE_ASSERT))
    print(f"nccl_one: device_assert exit {code}; last lines:")
    print(textwrap.indent("\n".join(output.strip().splitlines()[-4:]), "    "))
    lines += error_lines("device_assert", output)

    with open(out / "nccl_lines.txt", "w") as f:
        for entry in lines:
            f.write(json.dumps(entry) + "\n")
    print(f"nccl_one: {len(lines)} error lines kept in {out / 'nccl_lines.txt'}; "
          f"{sum(1 for e in lines if e['cause'] is None)} of them the classifier does not name")
    return 0


if __name__ == "__main__":
    sys.exit(main())
