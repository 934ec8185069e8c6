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


def test_restart_keeps_the_thread_level_mpi_started_with():
    # The engine reads the level MPI runs at on every init; nothing it does
    # in between (the MPI tool interface included) may lower it.
    first = hvd.mpi_threads_supported()
    for _ in range(2):
        hvd.shutdown()
        hvd.init()
        assert hvd.mpi_threads_supported() == first


def test_pending_async_ops_fail_at_shutdown_and_handles_are_dropped():
    # A name only this rank submits never completes; shutdown must not hang on it.
    h = hvd.allreduce_async(torch.ones(2), name=f"only_on_rank_{hvd.rank()}")
    hvd.shutdown()
    assert hvd.synchronize(h) is None  # handles from before shutdown are forgotten
    with pytest.raises(ValueError, match="was not created or has been cleared"):
        hvd.poll(h)
    hvd.init()
    assert hvd.allreduce(torch.ones(1), op=hvd.Sum, name="after").item() == hvd.size()
