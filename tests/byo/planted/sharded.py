"""DDP with ZeroRedundancyOptimizer (each rank keeps the optimizer state of its shard), or
FSDP2's fully_shard (each rank keeps a shard of the parameters): the state checker must
not call the shards diverged (tests/byo/test_hook.py)."""
import gc
import sys

import torch
import torch.distributed as dist
import torch.nn as nn

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
if sys.argv[1] == "zero":
    from torch.distributed.optim import ZeroRedundancyOptimizer
    model = nn.parallel.DistributedDataParallel(model)
    optimizer = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.Adam, lr=0.01)
else:
    from torch.distributed.fsdp import fully_shard
    for layer in (model[0], model[2]):
        fully_shard(layer)
    fully_shard(model)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
data = torch.Generator().manual_seed(rank)
for _ in range(4):
    loss = nn.functional.cross_entropy(model(torch.randn(8, 16, generator=data)),
                                       torch.randint(0, 4, (8,), generator=data))
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
dist.barrier()
# DDP and ZeRO released before the group: without it the ZeRO job ended with "terminate called
# without an active exception" (SIGABRT at exit) in 5 of 20 runs here, with it in 0 of 20
del optimizer, model
gc.collect()
dist.destroy_process_group()
