"""hvd.shutdown() on the Gloo controller while a peer is stopped: RANK SIZE PORT.

Rank 1 publishes its pid, takes part in one allreduce and stops itself
(SIGSTOP: alive, its sockets open). Rank 0 starts an allreduce that can never
complete, then calls hvd.shutdown() under HVDCOMPAT_SHUTDOWN_TIMEOUT_SECONDS=2:
it must return, and the pending op must fail naming the bound and the peer.
Rank 0 then kills rank 1, runs the exit hook's finalize and exits 0 when every check
held.
"""

import os
import signal
import sys
import threading
import time

import torch

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from gloo_store import TorchStore, start_engine  # noqa: E402

RANK, SIZE, PORT = (int(a) for a in sys.argv[1:4])
os.environ["HVDCOMPAT_SHUTDOWN_TIMEOUT_SECONDS"] = "2"

import hvdcompat as hvd  # noqa: E402

store = TorchStore("127.0.0.1", PORT, RANK, SIZE)
start_engine(store, RANK, SIZE)
assert hvd.allreduce(torch.ones(2), op=hvd.Sum, name="first").tolist() == [2.0, 2.0]
if RANK == 1:
    store.set("pid", str(os.getpid()).encode())
    os.kill(os.getpid(), signal.SIGSTOP)
    sys.exit(5)  # never reached: rank 0 kills this process
peer = int(store.get("pid"))
time.sleep(0.5)  # rank 1 is stopped by now
handle = hvd.allreduce_async(torch.ones(2), name="never")
errors = []


def wait():
    try:
        hvd.synchronize(handle)
    except Exception as e:  # noqa: BLE001 - the test checks the message
        errors.append(f"{type(e).__name__}: {e}")


waiter = threading.Thread(target=wait)
waiter.start()
time.sleep(0.5)
start = time.monotonic()
hvd.shutdown()
took = time.monotonic() - start
waiter.join(10)
error = errors[0] if errors else None
os.kill(peer, signal.SIGKILL)
# What hvd.init()'s exit hook runs (start_engine registers none); it must not speak of MPI.
hvd.basics._core.finalize()
print(f"rank 0: shutdown returned after {took:.1f} s; the pending op: {error}", flush=True)
ok = (error is not None and "HVDCOMPAT_SHUTDOWN_TIMEOUT_SECONDS" in error
      and "rank(s) 1" in error and took < 20)
sys.exit(0 if ok else 1)
