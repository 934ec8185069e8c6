"""Rank 1 dies (os._exit) mid-training; the others report what they see.

Survivors write `SURVIVOR <rank> <seconds> <ExceptionType>: <message>` (and an
`AFTER` line) to $LOSE_RANK_OUT/<rank> — a file, since the launcher may stop
forwarding output once the job has lost a process.
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
out = open(os.path.join(os.environ["LOSE_RANK_OUT"], str(rank)), "w", buffering=1)
start = time.monotonic()
try:
    while time.monotonic() - start < 120:
        for name, p in model.named_parameters():
            hvd.allreduce_(p.data, name=f"w.{name}")
    out.write(f"SURVIVOR {rank} no error after 120 s\n")
except Exception as e:  # noqa: BLE001 - reporting what arrived
    out.write(f"SURVIVOR {rank} {time.monotonic() - start:.2f} {type(e).__name__}: {e}\n")
    # Later calls fail at once with the same explanation.
    try:
        hvd.allreduce(torch.ones(1), name="after")
    except hvd.HorovodInternalError as e2:
        out.write(f"AFTER {rank} {type(e2).__name__}\n")
out.close()
sys.stdout.flush()
os._exit(0)
