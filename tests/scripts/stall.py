"""Rank 1 never submits 'late' for a while; rank 0 must warn, naming rank 1."""

import os
import time

import torch

import hvdcompat as hvd

hvd.init()
rank = hvd.rank()
hvd.allreduce(torch.ones(4), name="warmup")
wait = float(os.environ.get("STALL_TEST_SLEEP", "5"))
if rank == 1:
    time.sleep(wait)
start = time.monotonic()
try:
    hvd.allreduce(torch.ones(4), name="late")
    print(f"DONE {rank} {time.monotonic() - start:.1f}", flush=True)
except hvd.HorovodInternalError as e:
    print(f"FAILED {rank} {time.monotonic() - start:.1f} {e}", flush=True)
    os._exit(0)
hvd.shutdown()
