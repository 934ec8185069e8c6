"""Many shutdown/init cycles in one process; ops after shutdown fail clearly."""

import pytest
import torch

import hvdcompat as hvd


def test_fifty_shutdown_init_cycles():
    n = hvd.size()
    for cycle in range(50):
        hvd.shutdown()
        hvd.init()
        t = torch.full((3,), float(hvd.rank() + cycle))
        assert torch.equal(hvd.allreduce(t, op=hvd.Sum, name="cycle"),
                           torch.full((3,), float(sum(range(n)) + n * cycle)))
        if cycle % 10 == 0:
            g = hvd.allgather(torch.tensor([hvd.rank()]))
            assert g.tolist() == list(range(n))


def test_pending_async_ops_fail_at_shutdown_and_handles_are_dropped():
    # A name only this rank submits never completes; shutdown must not hang on it.
    h = hvd.allreduce_async(torch.ones(2), name=f"only_on_rank_{hvd.rank()}")
    hvd.shutdown()
    assert hvd.synchronize(h) is None  # handles from before shutdown are forgotten
    with pytest.raises(ValueError, match="was not created or has been cleared"):
        hvd.poll(h)
    hvd.init()
    assert hvd.allreduce(torch.ones(1), op=hvd.Sum, name="after").item() == hvd.size()


def test_each_init_starts_a_session_of_its_own():
    from hvdcompat import _session

    first = _session.current()
    assert (first.rank, first.size) == (hvd.rank(), hvd.size())
    hvd.shutdown()
    assert _session.get() is None
    with pytest.raises(ValueError, match=r"has not been initialized; use hvd.init\(\)"):
        _session.current()
    assert hvd.global_process_set.ranks == []  # no world runs
    hvd.init()
    assert _session.current() is not first
    assert hvd.global_process_set.ranks == list(range(hvd.size()))


def test_unnamed_op_counts_start_again_after_shutdown_and_init():
    # Only rank 0 advances its count of unnamed allreduces. If the count
    # outlived shutdown, rank 0 would name the next unnamed op differently
    # from the others after init, and the allreduce below would not complete
    # (the launch's timeout fails the test).
    n, r = hvd.size(), hvd.rank()
    if r == 0:
        hvd.allreduce_async(torch.ones(1), op=hvd.Sum)  # never completes: the others skip it
    hvd.shutdown()
    hvd.init()
    got = hvd.allreduce(torch.full((2,), float(r + 1)), op=hvd.Sum)
    assert torch.equal(got, torch.full((2,), float(n * (n + 1) // 2)))
