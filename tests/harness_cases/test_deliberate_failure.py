"""A parallel test that must fail: used by tests/test_harness.py, never run directly."""

import torch

import hvdcompat as hvd


def test_rank1_fails_while_rank0_waits():
    print(f"rank {hvd.rank()} reached the test", flush=True)
    if hvd.rank() == 1:
        assert False, "deliberate failure on rank 1"
    # Rank 0 waits for a collective rank 1 never joins: only the abort ends it.
    hvd.allreduce(torch.ones(1), name="never_completes")
