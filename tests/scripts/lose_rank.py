"""Rank 1 dies (os._exit) mid-training; the others report what they see.

Prints `SURVIVOR <rank> <seconds> <ExceptionType>: <message>` on survivors.
"""

import os
import sys
import time

import torch

import hvdcompat as hvd

hvd.init()
rank = hvd.rank()
model = torch.nn.Linear(16, 4)
for step in range(5):
    for name, p in model.named_parameters():
        hvd.allreduce_(p.data, name=f"w.{name}")
print(f"rank {rank} trained", flush=True)
if rank == 1:
    time.sleep(0.5)
    os._exit(3)
start = time.monotonic()
try:
    while time.monotonic() - start < 120:
        for name, p in model.named_parameters():
            hvd.allreduce_(p.data, name=f"w.{name}")
    print(f"SURVIVOR {rank} no error after 120 s", flush=True)
except Exception as e:  # noqa: BLE001 - reporting what arrived
    print(f"SURVIVOR {rank} {time.monotonic() - start:.2f} {type(e).__name__}: {e}", flush=True)
    # Later calls fail at once with the same explanation.
    try:
        hvd.allreduce(torch.ones(1), name="after")
    except hvd.HorovodInternalError as e2:
        print(f"AFTER {rank} {type(e2).__name__}", flush=True)
sys.stdout.flush()
time.sleep(1)  # let the launcher forward our output before the job is torn down
os._exit(0)
