"""A parallel test that hangs: used by tests/test_harness.py, never run directly."""

import time

import torch

import hvdcompat as hvd


def test_rank0_waits_forever():
    print(f"rank {hvd.rank()} reached the test", flush=True)
    if hvd.rank() == 0:
        hvd.allreduce(torch.ones(1), name="never_completes")
    else:
        time.sleep(3600)
