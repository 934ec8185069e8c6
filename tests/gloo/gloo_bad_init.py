"""hvd.init on the Gloo controller with bad input: RANK SIZE PORT CASE. Exits 0
when init failed with the expected kind of error (the test checks its text),
1 when it did not fail."""

import sys
import time

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from gloo_store import TorchStore, start_engine  # noqa: E402

RANK, SIZE, PORT = (int(a) for a in sys.argv[1:4])
CASE = sys.argv[4]
TIMEOUT = 3.0


class BrokenStore:
    def set(self, key, value):
        raise ConnectionRefusedError("no route to 198.18.0.1:29500")

    get = add = wait = set

    def __str__(self):
        return "BrokenStore at 198.18.0.1:29500"


if CASE == "missing":
    store, rank, size = TorchStore("127.0.0.1", PORT, 0, 1), 0, 2
elif CASE == "sizes":
    store, rank, size = TorchStore("127.0.0.1", PORT, RANK, SIZE), RANK, 2 + RANK
else:
    store, rank, size = BrokenStore(), 0, 1
start = time.monotonic()
try:
    start_engine(store, rank, size, timeout_s=TIMEOUT)
except (RuntimeError, ValueError) as e:
    took = time.monotonic() - start
    if CASE == "sizes" and RANK == 0:
        time.sleep(TIMEOUT + 2)  # it hosts the store the other rank still waits on
    print(f"rank {rank}: {type(e).__name__} after {took:.1f} s: {e}", flush=True)
    # Nothing waits past the timeout (plus the store's own round trips).
    sys.exit(0 if took < TIMEOUT + 10 else 2)
print(f"rank {rank}: init did not fail", flush=True)
sys.exit(1)
