"""allgather: concatenation along dim 0 with a different row count per rank."""

import pytest
import torch

import hvdcompat as hvd
from parallel_util import DTYPES, assert_same, dtype_id, rank_input

ALL_DTYPES = DTYPES + [torch.bool]
TRAILING = [(), (3,), (2, 2), (0,)]

# Rows per rank, as a function of the rank: equal, uneven, and uneven with
# an empty block on rank 1 (and every rank empty).
ROWS = {
    "equal": lambda r: 2,
    "uneven": lambda r: r + 1,
    "empty_on_rank1": lambda r: 0 if r == 1 else r + 2,
    "all_empty": lambda r: 0,
}


def _inputs(rows_of, trailing, dtype, key):
    return [rank_input(r, (rows_of(r),) + trailing, dtype, key) for r in range(hvd.size())]


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=dtype_id)
def test_blocks_in_rank_order(dtype):
    cases = []
    for rows in ROWS:
        for trailing in TRAILING:
            xs = _inputs(ROWS[rows], trailing, dtype, ("ag", rows, dtype_id(dtype), trailing))
            mine = xs[hvd.rank()].clone()
            name = f"ag.{rows}.{dtype_id(dtype)}.{len(trailing)}.{sum(trailing)}"
            cases.append((rows, trailing, xs, mine, hvd.allgather_async(mine, name=name)))
    for rows, trailing, xs, mine, h in cases:
        what = f"{dtype} {rows} rows x {trailing}"
        assert_same(hvd.synchronize(h), torch.cat(xs), what=what)
        assert_same(mine, xs[hvd.rank()], what=f"{what}: input unchanged")
    # The functional (differentiable) form.
    xs = _inputs(ROWS["uneven"], (2,), dtype, ("ag-sync", dtype_id(dtype)))
    assert_same(hvd.allgather(xs[hvd.rank()], name=f"ag.sync.{dtype_id(dtype)}"), torch.cat(xs))


def test_many_async_allgathers_of_mixed_shapes_and_dtypes():
    cases = [(dt, tr) for dt in (torch.int32, torch.float16, torch.float64, torch.bool)
             for tr in TRAILING[:3]]
    xs = [_inputs(ROWS["empty_on_rank1"], tr, dt, ("ag-mix", i)) for i, (dt, tr) in
          enumerate(cases)]
    handles = [hvd.allgather_async(x[hvd.rank()], name=f"ag.mix.{i}") for i, x in enumerate(xs)]
    for x, h in zip(xs, handles):
        assert_same(hvd.synchronize(h), torch.cat(x))


def test_unnamed_allgathers_match_in_call_order():
    xs = [_inputs(ROWS["uneven"], (), torch.int64, ("ag-noname", i)) for i in range(3)]
    outs = [hvd.allgather(x[hvd.rank()]) for x in xs]
    for x, out in zip(xs, outs):
        assert_same(out, torch.cat(x))


def test_scalar_input_is_rejected_at_call_time():
    with pytest.raises(ValueError, match="scalar"):
        hvd.allgather_async(torch.tensor(1.0), name="ag.scalar")
    # Horovod's functional form reads dim 0 first (IndexError); ours may say ValueError.
    with pytest.raises((ValueError, IndexError)):
        hvd.allgather(torch.tensor(1.0), name="ag.scalar")
    out = hvd.allgather(torch.tensor([1.0]), name="ag.scalar")
    assert out.tolist() == [1.0] * hvd.size()


def test_gradient_is_this_ranks_slice_of_the_averaged_gradient():
    rows = [r + 1 for r in range(hvd.size())]
    x = torch.ones(rows[hvd.rank()], 2, requires_grad=True)
    out = hvd.allgather(x, name="ag.grad")
    # Gradient block r holds the value r on every rank.
    grad = torch.cat([torch.full((rows[r], 2), float(r)) for r in range(hvd.size())])
    out.backward(grad)
    assert_same(x.grad, torch.full((rows[hvd.rank()], 2), float(hvd.rank())))
