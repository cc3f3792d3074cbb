"""On one GPU: the per-step stop vote (NCCL all-reduce, pinned copies, lagged read) makes no host-device sync,
and a signal noted on the host stops at the same lagged step."""

import datetime
import os
import signal
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "app"))
import torch
import torch.distributed as dist

from imagenet_train.training.dist import DistInfo
from imagenet_train.training.hooks import StepVote, StopRequest

os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29533")
dist.init_process_group("nccl", rank=0, world_size=1, timeout=datetime.timedelta(seconds=60))
device = torch.device("cuda", 0)
torch.cuda.set_device(device)
info = DistInfo(rank=0, world=2, local_rank=0, device=device)  # world > 1: the all-reduce path runs (group of 1)
request = StopRequest()
vote = StepVote(request, info)
x = torch.randn(4096, 4096, device=device)
for _ in range(3):  # warm-up outside the check (allocations, NCCL set-up)
    x = x @ x
    x = x / x.norm()
    vote.cast()
vote.settle()
torch.cuda.synchronize()
torch.cuda.set_sync_debug_mode("error")
stopped_at, start = None, time.perf_counter()
for step in range(40):
    x = x @ x
    x = x / x.norm()
    if step == 20:
        request.signum = signal.SIGTERM
    if vote.cast():
        stopped_at = step
        break
torch.cuda.set_sync_debug_mode(0)
torch.cuda.synchronize()
print(f"no sync error in {step + 1} steps; signal at step 20, stop agreed at step {stopped_at} (lag {vote.lag})")
verdict, numbers = vote.settle(1, stopped_at)
print("settle:", verdict, numbers)
dist.destroy_process_group()
