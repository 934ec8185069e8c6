"""hvd.join(): joined ranks contribute zeros to allreduce; other collectives fail meanwhile."""

import pytest
import torch

import hvdcompat as hvd


def test_joined_rank_contributes_zeros_and_everyone_learns_the_last_joiner():
    n, r = hvd.size(), hvd.rank()
    for first in range(n):
        x = torch.full((5,), 6.0 * (r + 1))
        if r == first:
            last = hvd.join()
        else:
            got = hvd.allreduce(x, op=hvd.Sum, name="join_sum")
            want = sum(6.0 * (k + 1) for k in range(n) if k != first)
            assert torch.equal(got, torch.full((5,), want))
            last = hvd.join()
        assert last != first
        assert hvd.allgather_object(last) == [last] * n


@pytest.mark.parametrize("op", ["allgather", "broadcast", "alltoall"])
def test_unnamed_non_allreduce_ops_fail_while_a_rank_is_joined(op):
    # The rank that joins first skips one unnamed op per round, so the ranks'
    # unnamed-op counters drift apart: with 3 ranks the two callers name their
    # op differently and each must still get the error instead of a hang.
    n, r = hvd.size(), hvd.rank()
    if n == 1:
        pytest.skip("needs a second rank")
    t = torch.ones(2 * n, 3)
    calls = {
        "allgather": lambda: hvd.allgather(t),
        "broadcast": lambda: hvd.broadcast(t, root_rank=r),
        "alltoall": lambda: hvd.alltoall(t),
    }
    for first in range(n):
        if r != first:
            with pytest.raises(RuntimeError, match=r"hvd\.join\(\)"):
                calls[op]()
        hvd.join()
    # Still usable afterwards.
    assert hvd.allreduce(torch.ones(1), op=hvd.Sum, name="after_join").item() == n
