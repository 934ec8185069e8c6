"""The last rank ends itself (os._exit(7)) after a few allreduces; the others
catch the HorovodInternalError, say so, and exit 1 — a script outside
hvd.elastic whose job must then end, whatever the launch.

Environment: FAIL_AFTER (allreduces before the failure, default 3; -1: no
rank fails and every rank exits with EXIT_CODE, default 0), FAIL_STAMP (a
file the failing rank writes time.time() to just before it ends),
MPI4PY_FIRST=1 (mpi4py initialises MPI before hvd.init).
"""

import os
import sys
import time

if os.environ.get("MPI4PY_FIRST") == "1":
    from mpi4py import MPI  # noqa: F401

import torch

import hvdcompat as hvd

hvd.init()
rank, size = hvd.rank(), hvd.size()
fail_after = int(os.environ.get("FAIL_AFTER", "3"))
if fail_after < 0:
    x = hvd.allreduce(torch.ones(2), name="clean", op=hvd.Sum)
    assert x.tolist() == [size, size]
    print(f"CLEAN {rank}", flush=True)
    sys.exit(int(os.environ.get("EXIT_CODE", "0")))
try:
    for step in range(1000):
        if rank == size - 1 and step == fail_after:
            with open(os.environ["FAIL_STAMP"], "w") as f:
                f.write(repr(time.time()))
            sys.stdout.flush()
            os._exit(7)
        x = hvd.allreduce(torch.full((4,), float(rank)), name=f"step{step}", op=hvd.Sum)
        assert x[0].item() == size * (size - 1) / 2
        time.sleep(0.01)
    print(f"NO ERROR {rank}", flush=True)
except hvd.HorovodInternalError as e:
    print(f"SURVIVOR {rank}: {e}", flush=True)
    sys.exit(1)
