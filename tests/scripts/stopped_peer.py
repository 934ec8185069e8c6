"""Rank 1 is stopped (SIGSTOP) with a collective in flight; rank 0's shutdown must end.

The stop usually lands in the data phase of a long allreduce (many small
calls, HVDCOMPAT_MAX_CALL_BYTES); when that allreduce was already done, rank 0
starts another one, which then waits in negotiation. Rank 0 prints
"ENDED <seconds> <phase> <error of the pending op>" once hvd.shutdown() has
returned. Rank 1 stays stopped: the launcher ends it when rank 0 exits.
"""

import os
import signal
import threading
import time

import torch

import hvdcompat as hvd

hvd.init()
rank = hvd.rank()
pids = hvd.allgather(torch.tensor([os.getpid()])).tolist()
handle = hvd.allreduce_async_(torch.ones(8 << 20), name="big", op=hvd.Sum)
errors = []


def wait(h):
    try:
        hvd.synchronize(h)
        errors.append("completed")
    except hvd.HorovodInternalError as e:
        errors.append(str(e))


if rank == 1:
    wait(handle)
    time.sleep(300)  # stopped meanwhile; the launcher ends it
phase = "data"
time.sleep(0.5)
os.kill(pids[1], signal.SIGSTOP)
if hvd.poll(handle):
    hvd.synchronize(handle)
    phase = "negotiation"
    handle = hvd.allreduce_async_(torch.ones(4), name="after", op=hvd.Sum)
waiter = threading.Thread(target=wait, args=(handle,))
waiter.start()
time.sleep(0.2)
start = time.monotonic()
hvd.shutdown()
waiter.join(60)
print(f"ENDED {time.monotonic() - start:.1f} {phase} {errors[0] if errors else 'no error'}",
      flush=True)
