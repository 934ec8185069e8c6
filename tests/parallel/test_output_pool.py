"""Out-of-place outputs from the output pool (Note [Output pool]): reused only once let go.

Every output the caller still holds, directly or through a view, its storage,
a numpy array or a DLPack capsule, keeps the value it was returned with while
later calls of the same size run; outputs the caller dropped are reused.
Values are checked against a local reference of every rank's input.
"""

import pytest
import torch
from torch.utils.dlpack import from_dlpack, to_dlpack

import hvdcompat as hvd
from hvdcompat.ops import _pool
from hvdcompat.ops._pool import MIN_BYTES
from parallel_util import DTYPES, all_inputs, assert_same, dtype_id, engine, expected_reduce

ROUNDS = 12


def _op(dtype):
    return hvd.Max if dtype == torch.bool else hvd.Sum


def _shape(dtype, extra_rows=0):
    # Two rows of at least half the pool's smallest size each. Each test (and
    # dtype) takes its own row count: the pool then holds nothing of that size
    # but what the test itself let go, so a wrong reuse cannot hide behind
    # idle memory from an earlier test.
    itemsize = torch.empty(0, dtype=dtype).element_size()
    return (2 + extra_rows, MIN_BYTES // (2 * itemsize) + 3)


_ALL_DTYPES = DTYPES + [torch.bool]
_HOLDER_ROWS = 20   # row counts from here on: the holder test, one per kind
_OTHER_ROWS = 40    # the remaining tests


def _inputs(shape, dtype, key):
    return all_inputs(shape, dtype, key, lo=-5, hi=6)


def test_pool_is_on_by_default():
    assert _pool.current().limit() > 0, "the output pool is off on this torch build"


@pytest.mark.parametrize("dtype", _ALL_DTYPES, ids=dtype_id)
def test_held_outputs_keep_their_values_and_dropped_ones_are_reused(dtype):
    shape = _shape(dtype, extra_rows=_ALL_DTYPES.index(dtype))
    op = _op(dtype)
    kept, dropped_ptrs = [], set()
    reused_before = _pool.current().stats()[2]
    new_ptr_from_dropped = 0
    for i in range(ROUNDS):
        xs = _inputs(shape, dtype, ("pool", dtype_id(dtype), i))
        mine = xs[hvd.rank()].clone()
        out = hvd.allreduce(mine, op=op, name=f"pool.{dtype_id(dtype)}")
        assert_same(mine, xs[hvd.rank()], what=f"round {i}: the input must stay unchanged")
        ptr = out.data_ptr()
        assert ptr not in {o.data_ptr() for o, _ in kept}, \
            f"round {i}: the new output shares memory with an output still held"
        if ptr in dropped_ptrs:
            new_ptr_from_dropped += 1
        if i % 3 == 2:
            dropped_ptrs.add(ptr)  # let go: its memory may serve a later call
            del out
        else:
            kept.append((out, expected_reduce(xs, dtype, op)))
    for j, (out, expected) in enumerate(kept):
        assert_same(out, expected, what=f"{dtype} output {j} held across {ROUNDS} calls")
    assert new_ptr_from_dropped > 0, "no output reused the memory of one the caller let go"
    assert _pool.current().stats()[2] > reused_before


def _holders():
    def view(out):
        return out[1:], lambda h: h
    def storage(out):
        dtype, shape = out.dtype, tuple(out.shape)  # the reader must not keep `out`
        return out.untyped_storage(), lambda h: torch.empty(0, dtype=dtype).set_(h, 0, shape)
    def numpy(out):
        return out.numpy(), lambda h: torch.from_numpy(h)
    def capsule(out):
        return to_dlpack(out), lambda h: from_dlpack(h)
    def reshaped(out):
        return out.view(-1), lambda h: h
    return {"view": view, "storage": storage, "numpy": numpy, "dlpack": capsule,
            "reshaped": reshaped}


@pytest.mark.parametrize("kind", list(_holders()))
def test_memory_held_without_the_tensor_is_not_reused(kind):
    dtype = torch.float32
    shape = _shape(dtype, extra_rows=_HOLDER_ROWS + list(_holders()).index(kind))
    make = _holders()[kind]
    held = []
    for i in range(4):
        xs = _inputs(shape, dtype, ("holder", kind, i))
        out = hvd.allreduce(xs[hvd.rank()], op=hvd.Sum, name=f"holder.{kind}")
        expected = expected_reduce(xs, dtype, hvd.Sum)
        holder, read = make(out)
        held.append((holder, read, expected, out.data_ptr()))
        del out  # only the holder keeps the memory now
    ptrs = [p for *_, p in held]
    assert len(set(ptrs)) == len(ptrs), f"{kind}: a held output's memory was handed out again"
    for i, (holder, read, expected, _) in enumerate(held):
        value = read(holder)
        if kind == "view":
            expected = expected[1:]
        elif kind == "reshaped":
            expected = expected.reshape(-1)
        assert_same(value, expected, what=f"output {i}, held as a {kind}")


def test_shared_or_resized_storage_leaves_the_pool():
    dtype = torch.float32
    shape = _shape(dtype, extra_rows=_OTHER_ROWS)
    numel = shape[0] * shape[1]
    xs = _inputs(shape, dtype, ("shared",))
    expected = expected_reduce(xs, dtype, hvd.Sum)
    out = hvd.allreduce(xs[hvd.rank()], op=hvd.Sum, name="pool.shared")
    out.share_memory_()  # another process may map it from now on
    del out
    again = hvd.allreduce(xs[hvd.rank()], op=hvd.Sum, name="pool.shared")
    assert not again.is_shared(), "a storage moved to shared memory was handed out again"
    assert_same(again, expected, what="after a shared output")
    # Grown by the caller: its storage is no longer the size the pool keeps.
    again.resize_(numel * 2)
    del again
    third = hvd.allreduce(xs[hvd.rank()], op=hvd.Sum, name="pool.shared")
    assert third.untyped_storage().nbytes() == numel * 4, "a grown storage was handed out again"
    assert_same(third, expected, what="after a resized output")


def test_other_out_of_place_collectives_keep_held_outputs():
    dtype = torch.float64
    shape = _shape(dtype, extra_rows=_OTHER_ROWS + 1)
    kept = []
    for i in range(4):
        xs = _inputs(shape, dtype, ("others", i))
        mine = xs[hvd.rank()]
        outs = hvd.grouped_allreduce([mine, mine + 1], op=hvd.Sum, name="pool.grouped")
        ref = expected_reduce(xs, dtype, hvd.Sum)
        kept += [(outs[0], ref, "grouped 0"), (outs[1], ref + hvd.size(), "grouped 1")]
        root = i % hvd.size()
        kept.append((hvd.broadcast(mine, root_rank=root, name="pool.bcast"), xs[root],
                     "broadcast"))
        rows = torch.cat([xs[r] for r in range(hvd.size())] * hvd.size())  # size * size * 2 rows
        scattered = hvd.reducescatter(rows, op=hvd.Sum, name="pool.rs")
        full = sum(torch.cat([xs[r] for r in range(hvd.size())] * hvd.size())
                   for _ in range(hvd.size()))
        per = full.shape[0] // hvd.size()
        kept.append((scattered, full[hvd.rank() * per:(hvd.rank() + 1) * per], "reducescatter"))
    ptrs = [o.data_ptr() for o, _, _ in kept]
    assert len(set(ptrs)) == len(ptrs), "two held outputs share memory"
    for j, (out, expected, what) in enumerate(kept):
        assert_same(out, expected, what=f"{what} output {j}")


def test_pool_off_gives_fresh_outputs_and_same_values():
    dtype = torch.int32
    shape = _shape(dtype)
    with engine(output_pool_bytes=0):
        before = _pool.current().stats()
        assert before[0] == 0 and before[1] == 0
        for i in range(3):
            xs = _inputs(shape, dtype, ("off", i))
            out = hvd.allreduce(xs[hvd.rank()], op=hvd.Sum, name="pool.off")
            assert_same(out, expected_reduce(xs, dtype, hvd.Sum), what=f"pool off, call {i}")
        assert _pool.current().stats()[:2] == (0, 0)


def test_pool_limit_bounds_what_it_holds():
    dtype = torch.float32
    shape = _shape(dtype)
    nbytes = shape[0] * shape[1] * 4
    with engine(output_pool_bytes=2 * nbytes):
        kept = []
        for i in range(5):  # 5 outputs held, the pool may hold 2 of them
            xs = _inputs(shape, dtype, ("limit", i))
            kept.append((hvd.allreduce(xs[hvd.rank()], op=hvd.Sum, name="pool.limit"),
                         expected_reduce(xs, dtype, hvd.Sum)))
            assert _pool.current().stats()[1] <= 2 * nbytes
        for j, (out, expected) in enumerate(kept):
            assert_same(out, expected, what=f"output {j} beyond the pool's limit")
