"""Two "hosts" of two ranks (HVDCOMPAT_HIERARCHICAL_LOCAL_SIZE=2): while every
rank runs large allreduces on the network plan, rank 3 stops rank 2 (SIGSTOP:
alive, never suspected before the detector's timeout) and kills itself.

Ranks 0 and 1 each write `SURVIVOR <rank> <wall time> <ExceptionType>:
<message>` to $LOSE_OUT/<rank>; rank 3 writes its death's wall time to
$LOSE_OUT/killed. Rank 0 may be waiting on rank 2 across "hosts" when rank 3
dies (Note [A known failure ends every wait], cpp/transport/request_wait.h).
The survivors then kill rank 2, so the job ends.
"""

import os
import signal
import threading
import time

import torch

import hvdcompat as hvd

hvd.init()
rank = hvd.rank()
out_dir = os.environ["LOSE_OUT"]
pids = hvd.allgather(torch.tensor([os.getpid()]), name="pids").tolist()
big = torch.ones(8 << 20)
for _ in range(2):
    hvd.allreduce(big, name="big", op=hvd.Sum)
hvd.allreduce(torch.ones(1), name="ready")

if rank == 3:
    def stop_and_die():
        time.sleep(0.5)  # the others are inside the allreduces below
        os.kill(pids[2], signal.SIGSTOP)
        with open(os.path.join(out_dir, "killed"), "w") as f:
            f.write(f"{time.time():.3f}\n")
        os.kill(os.getpid(), signal.SIGKILL)
    threading.Thread(target=stop_and_die, daemon=True).start()

start = time.monotonic()
try:
    while time.monotonic() - start < 120:
        hvd.allreduce(big, name="big", op=hvd.Sum)
    report = f"SURVIVOR {rank} no error after 120 s"
except Exception as e:  # noqa: BLE001 - reporting what arrived
    report = f"SURVIVOR {rank} {time.time():.3f} {type(e).__name__}: {e}"
if rank in (0, 1):
    with open(os.path.join(out_dir, str(rank)), "w") as f:
        f.write(report + "\n")
    deadline = time.monotonic() + 60
    while (len([n for n in os.listdir(out_dir) if n in ("0", "1")]) < 2
           and time.monotonic() < deadline):
        time.sleep(0.1)
    try:
        os.kill(pids[2], signal.SIGKILL)
    except ProcessLookupError:
        pass
os._exit(0)
