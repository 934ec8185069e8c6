"""barrier: waits for every rank, and is not held up by unrelated pending ops."""

import os
import tempfile
import time

import torch

import hvdcompat as hvd
from parallel_util import all_inputs, assert_same, expected_reduce


def _shared_dir():
    """A directory every rank agrees on (chosen by rank 0, broadcast as bytes)."""
    path = tempfile.mkdtemp(prefix="hvd-barrier-") if hvd.rank() == 0 else ""
    raw = torch.zeros(256, dtype=torch.uint8)
    raw[:len(path)] = torch.tensor(list(path.encode()), dtype=torch.uint8)
    raw = hvd.broadcast(raw, 0, name="barrier.dir")
    return bytes(raw[raw != 0].tolist()).decode()


def test_barrier_returns_none_and_waits_for_every_rank():
    d = _shared_dir()
    for rnd in range(3):
        # The last rank arrives late; nobody may leave the barrier before it
        # has written its marker.
        if hvd.rank() == hvd.size() - 1:
            time.sleep(0.2)
        open(os.path.join(d, f"{rnd}.{hvd.rank()}"), "w").close()
        assert hvd.barrier() is None
        missing = [r for r in range(hvd.size())
                   if not os.path.exists(os.path.join(d, f"{rnd}.{r}"))]
        assert not missing, f"left barrier {rnd} before ranks {missing} arrived"
    hvd.barrier()  # nobody removes the directory while others still look
    if hvd.rank() == 0:
        for f in os.listdir(d):
            os.remove(os.path.join(d, f))
        os.rmdir(d)


def test_barrier_is_not_blocked_by_pending_unmatched_ops():
    # Each rank submits an allreduce no other rank has submitted yet; the
    # barrier must still complete, and the ops afterwards.
    n = hvd.size()
    xs = {q: all_inputs((4,), torch.float32, ("barrier-pending", q)) for q in range(n)}
    handles = {hvd.rank(): hvd.allreduce_async(xs[hvd.rank()][hvd.rank()], op=hvd.Sum,
                                               name=f"barrier.pending.{hvd.rank()}")}
    hvd.barrier()
    for q in range(n):
        if q != hvd.rank():
            handles[q] = hvd.allreduce_async(xs[q][hvd.rank()], op=hvd.Sum,
                                             name=f"barrier.pending.{q}")
    for q, h in handles.items():
        assert_same(hvd.synchronize(h), expected_reduce(xs[q], torch.float32, hvd.Sum))


def test_barrier_with_outstanding_async_collectives():
    # Horovod's pattern: unnamed async ops, a barrier, then only some results are read.
    bc = hvd.broadcast_async(torch.full((3,), float(hvd.rank())), 0)
    ag1 = hvd.allgather_async(torch.tensor([hvd.rank()]))
    ag2 = hvd.allgather_async(torch.tensor([hvd.rank() * 2]))
    ar = hvd.allreduce_async(torch.eye(5), op=hvd.Average)
    hvd.barrier()
    assert_same(hvd.synchronize(ar), torch.eye(5))
    assert hvd.synchronize(bc).tolist() == [0.0] * 3
    assert hvd.synchronize(ag2).tolist() == [2 * r for r in range(hvd.size())]
    assert hvd.synchronize(ag1).tolist() == list(range(hvd.size()))


def test_many_barriers_in_a_row():
    for _ in range(20):
        hvd.barrier()
    out = hvd.allreduce(torch.ones(1), op=hvd.Sum, name="barrier.after")
    assert out.item() == hvd.size()
