"""The output pool on its own (Note [Output pool]): when a storage counts as idle, limits."""

import pytest
import torch

from hvdcompat.ops._pool import MIN_BYTES, OutputPool

N = MIN_BYTES // 4  # float32 elements of the smallest pooled size


@pytest.fixture
def pool():
    p = OutputPool()
    p.configure(64 * MIN_BYTES)
    assert p.limit() > 0, "the pool's self-check failed on this torch build"
    return p


def test_small_outputs_are_not_pooled(pool):
    assert pool.empty((N - 1,), torch.float32) is None
    assert pool.empty((), torch.float64) is None
    assert pool.empty((0, 5), torch.float32) is None
    assert pool.stats() == (0, 0, 0, 0)


def test_a_dropped_output_is_reused_with_any_dtype_and_shape_of_its_size(pool):
    a = pool.empty((N,), torch.float32)
    ptr = a.data_ptr()
    del a
    b = pool.empty((2, N // 4), torch.float64)  # the same bytes
    assert b.data_ptr() == ptr
    assert b.dtype == torch.float64 and b.shape == (2, N // 4) and b.is_contiguous()
    assert b._base is None  # an ordinary tensor, not a view of the pool's memory
    assert pool.stats() == (1, N * 4, 1, 1)


def _hold(a, how):
    if how == "tensor":
        return a
    if how == "view":
        return a[3:]
    if how == "storage":
        return a.untyped_storage()
    if how == "numpy":
        return a.numpy()
    if how == "dlpack":
        return torch.utils.dlpack.to_dlpack(a)
    return a[3:].clone()


@pytest.mark.parametrize("hold", ["tensor", "view", "storage", "numpy", "dlpack", "clone_of_view"])
def test_held_memory_is_not_handed_out(pool, hold):
    a = pool.empty((N,), torch.float32)
    a.fill_(7)
    keep = _hold(a, hold)
    ptr = a.data_ptr()
    del a
    b = pool.empty((N,), torch.float32)
    if hold == "clone_of_view":
        assert b.data_ptr() == ptr  # a copy does not hold the memory
    else:
        assert b.data_ptr() != ptr
        b.fill_(-1)
        if hold == "storage":
            seen = torch.empty(0).set_(keep, 0, (N,))
        elif hold == "dlpack":
            seen = torch.utils.dlpack.from_dlpack(keep)
        else:
            seen = torch.as_tensor(keep)
        assert bool((seen == 7).all())


def test_limit_counts_held_and_idle_memory(pool):
    pool.configure(3 * MIN_BYTES)
    held = [pool.empty((N,), torch.float32) for _ in range(3)]
    assert pool.empty((N,), torch.float32) is None  # full of held outputs
    assert pool.stats()[:2] == (3, 3 * MIN_BYTES)
    first = held[0].data_ptr()
    del held[0]
    # One idle storage cannot make room for a larger size: nothing is evicted.
    assert pool.empty((N + 16,), torch.float32) is None
    assert pool.stats()[:2] == (3, 3 * MIN_BYTES)
    held.append(pool.empty((N,), torch.float32))
    assert held[-1].data_ptr() == first  # the idle one is reused


def test_eviction_makes_room_for_another_size(pool):
    pool.configure(2 * MIN_BYTES)
    a = pool.empty((N,), torch.float32)
    b = pool.empty((N,), torch.float32)
    del a
    c = pool.empty((N // 2, 2), torch.float32)  # same size: reuses a's storage
    del b, c
    d = pool.empty((2 * N,), torch.float32)  # both idle storages make room for it
    assert d is not None and pool.stats()[:2] == (1, 2 * MIN_BYTES)


def test_shared_or_resized_storages_leave_the_pool(pool):
    a = pool.empty((N,), torch.float32)
    a.share_memory_()
    del a
    b = pool.empty((N,), torch.float32)
    assert not b.is_shared()
    b.resize_(2 * N)
    del b
    c = pool.empty((N,), torch.float32)
    assert c.untyped_storage().nbytes() == N * 4
    assert pool.stats()[0] == 1


def test_configure_zero_turns_it_off_and_drops_everything(pool):
    a = pool.empty((N,), torch.float32)
    pool.configure(0)
    assert pool.stats()[:2] == (0, 0)
    assert pool.empty((N,), torch.float32) is None
    a.fill_(1)  # still the caller's
    assert bool((a == 1).all())
