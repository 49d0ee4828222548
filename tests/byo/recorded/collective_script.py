"""The script the recorded logs come from: `torchrun --nproc-per-node 2 collective_script.py
timeout|exit` (rank 1 sleeps past the 3 s timeout, or exits with code 3). Recorded as gl.py
with the same statements on fewer lines: the logs' line numbers are that file's."""
import datetime
import os
import sys
import time

import torch
import torch.distributed as dist

mode = sys.argv[1]
dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=3))
rank = dist.get_rank()
tensor = torch.ones(1000)
dist.all_reduce(tensor)
if mode == "timeout" and rank == 1:
    time.sleep(8)
    sys.exit(0)
if mode == "exit" and rank == 1:
    os._exit(3)
time.sleep(0.5)
dist.all_reduce(tensor)
