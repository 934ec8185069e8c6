"""The stall inspector on the Gloo controller: every rank but the last
submits 'stall.a', the last 'stall.b'. Rank 0 warns naming who submitted
which, and past HOROVOD_STALL_SHUTDOWN_TIME_SECONDS every rank's op fails
instead of hanging. Run as: gloo_stall.py RANK SIZE
PORT (started by tests/gloo/test_gloo_engine.py with the stall settings)."""

import sys

import torch

import hvdcompat as hvd

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from gloo_store import TorchStore, start_engine  # noqa: E402

RANK, SIZE, PORT = (int(a) for a in sys.argv[1:4])
start_engine(TorchStore("127.0.0.1", PORT, RANK, SIZE), RANK, SIZE)

name = "stall.b" if RANK == SIZE - 1 else "stall.a"
handle = hvd.allreduce_async(torch.ones(2), op=hvd.Sum, name=name)
try:
    hvd.synchronize(handle)
    raise SystemExit(f"rank {RANK}: the stalled allreduce '{name}' completed")
except hvd.HorovodInternalError as e:
    text = str(e)
assert name in text, text
# The first rank past the limit stops with the stall explanation; a peer
# still waiting on it in the same negotiation fails naming it instead.
assert "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS" in text or "failed (the process" in text, text
print(f"rank {RANK}/{SIZE}: stall shutdown: {text}", flush=True)
