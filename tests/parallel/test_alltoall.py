"""alltoall: equal and explicit splits, received splits, return types and argument errors."""

import pytest
import torch

import hvdcompat as hvd
from parallel_util import DTYPES, assert_same, dtype_id, rank_input

ALL_DTYPES = DTYPES + [torch.bool]
TRAILING = [(), (3,), (2, 2), (0,)]


def _splits(src, n):
    """Rows rank `src` sends to each rank: uneven, with zeros."""
    return [(src + 2 * dst) % 3 for dst in range(n)]


def _expected(inputs, splits_of, me):
    """Rows every source sends to `me`, concatenated in source order."""
    blocks, received = [], []
    for src, x in enumerate(inputs):
        s = splits_of(src)
        start = sum(s[:me])
        blocks.append(x[start:start + s[me]])
        received.append(s[me])
    return torch.cat(blocks), received


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=dtype_id)
def test_equal_split_returns_only_the_tensor(dtype):
    n, per = hvd.size(), 2
    for trailing in TRAILING:
        key = ("a2a-eq", dtype_id(dtype), trailing)
        xs = [rank_input(r, (n * per,) + trailing, dtype, key) for r in range(n)]
        mine = xs[hvd.rank()].clone()
        out = hvd.alltoall(mine, name=f"a2a.eq.{dtype_id(dtype)}.{len(trailing)}.{sum(trailing)}")
        assert isinstance(out, torch.Tensor)
        assert_same(mine, xs[hvd.rank()], what="input unchanged")
        expected, _ = _expected(xs, lambda src: [per] * n, hvd.rank())
        assert_same(out, expected, what=f"{dtype} {trailing}")


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=dtype_id)
def test_explicit_splits_with_zeros(dtype):
    n = hvd.size()
    for trailing in TRAILING:
        for splits_as in ("list", "int32_tensor"):
            key = ("a2a-split", dtype_id(dtype), trailing, splits_as)
            # One extra row on every rank: rows past sum(splits) are not sent.
            xs = [rank_input(r, (sum(_splits(r, n)) + 1,) + trailing, dtype, key)
                  for r in range(n)]
            splits = _splits(hvd.rank(), n)
            if splits_as == "int32_tensor":
                splits = torch.tensor(splits, dtype=torch.int32)
            name = f"a2a.split.{dtype_id(dtype)}.{len(trailing)}.{sum(trailing)}.{splits_as}"
            out, received = hvd.alltoall(xs[hvd.rank()], splits=splits, name=name)
            expected, expected_received = _expected(xs, lambda src: _splits(src, n), hvd.rank())
            assert_same(out, expected, what=f"{dtype} {trailing} {splits_as}")
            assert isinstance(received, torch.Tensor) and received.dtype == torch.int32
            assert received.device.type == "cpu"
            assert received.tolist() == expected_received


def test_async_always_returns_output_and_received_splits():
    n = hvd.size()
    xs = [rank_input(r, (2 * n, 2), torch.float32, "a2a-async") for r in range(n)]
    out, received = hvd.synchronize(hvd.alltoall_async(xs[hvd.rank()], name="a2a.async"))
    expected, _ = _expected(xs, lambda src: [2] * n, hvd.rank())
    assert_same(out, expected)
    assert received.tolist() == [2] * n
    splits = _splits(hvd.rank(), n)
    ys = [rank_input(r, (sum(_splits(r, n)), 2), torch.int16, "a2a-async2") for r in range(n)]
    out, received = hvd.synchronize(hvd.alltoall_async(ys[hvd.rank()], splits, name="a2a.async2"))
    expected, expected_received = _expected(ys, lambda src: _splits(src, n), hvd.rank())
    assert_same(out, expected)
    assert received.tolist() == expected_received


def test_every_rank_receives_nothing_from_anyone():
    n = hvd.size()
    out, received = hvd.alltoall(torch.ones(3, 2), splits=[0] * n, name="a2a.nothing")
    assert tuple(out.shape) == (0, 2)
    assert received.tolist() == [0] * n


def test_horovods_rank_plus_one_rows_pattern():
    # Rank r sends r + 1 rows to every rank, valued with the destination rank.
    n, r = hvd.size(), hvd.rank()
    t = torch.cat([torch.full((r + 1, 2), float(dst)) for dst in range(n)])
    out, received = hvd.alltoall(t, splits=torch.tensor([r + 1] * n, dtype=torch.int32),
                                 name="a2a.horovod")
    assert torch.all(out == r)
    assert out.numel() == n * (n + 1) // 2 * 2
    assert received.tolist() == [src + 1 for src in range(n)]


def test_gradient_flows_back_with_the_received_splits():
    n = hvd.size()
    splits = _splits(hvd.rank(), n)
    x = torch.ones(sum(splits), 2, requires_grad=True)
    out, _ = hvd.alltoall(x, splits=splits, name="a2a.grad")
    out.backward(torch.ones_like(out))
    assert_same(x.grad, torch.ones(sum(splits), 2))


_BAD = {
    "rows_not_divisible": (lambda n: torch.ones(n + 1), None, "even multiple"),
    "too_few_splits": (lambda n: torch.ones(3 * n), lambda n: [1] * (n - 1), "splits"),
    "too_many_splits": (lambda n: torch.ones(3 * n), lambda n: [1] * (n + 1), "splits"),
    "sum_exceeds_rows": (lambda n: torch.ones(n - 1), lambda n: [1] * n, "greater than"),
    "float_splits": (lambda n: torch.ones(n), lambda n: torch.ones(n), "32-bit integer"),
    "int64_splits": (lambda n: torch.ones(n),
                     lambda n: torch.ones(n, dtype=torch.int64), "32-bit integer"),
    "2d_splits": (lambda n: torch.ones(n),
                  lambda n: torch.ones(1, n, dtype=torch.int32), "1D"),
    "negative_split": (lambda n: torch.ones(n), lambda n: [-1] + [1] * (n - 1), "negative"),
    "scalar": (lambda n: torch.tensor(1.0), None, "scalar"),
    # Each entry above the rows, whose sum wraps around int64 to a negative value.
    "huge_splits": (lambda n: torch.ones(1, 4), lambda n: [2**62 + 100] * n, "greater than"),
    # On 3 ranks and more the wrapped sum equals the row count (2 ** 64 + 2).
    "splits_wrapping_to_the_rows": (
        lambda n: torch.ones(2, 4),
        lambda n: [2**63 - 1, 2**63 - 1] + ([4] + [0] * (n - 3) if n >= 3 else []),
        "greater than"),
    "split_beyond_int64": (lambda n: torch.ones(n), lambda n: [2**64] + [0] * (n - 1), "64-bit"),
}


@pytest.mark.parametrize("case", list(_BAD))
def test_bad_arguments_are_value_errors_and_enqueue_nothing(case):
    make_tensor, make_splits, message = _BAD[case]
    n = hvd.size()
    splits = make_splits(n) if make_splits else None
    with pytest.raises(ValueError, match=message):
        hvd.alltoall(make_tensor(n), splits=splits, name="a2a.bad")
    with pytest.raises(ValueError, match=message):
        hvd.alltoall_async(make_tensor(n), splits=splits, name="a2a.bad")
    out = hvd.alltoall(torch.full((n,), float(hvd.rank())), name="a2a.bad")
    assert out.tolist() == [float(r) for r in range(n)]


def test_split_entries_that_are_not_integers_are_type_errors():
    n = hvd.size()
    # int() would have truncated 1.5 to 1 and sent a row the caller never asked for.
    with pytest.raises(TypeError, match=r"alltoall 'a2a.float': splits entry 1.5 .*integer"):
        hvd.alltoall(torch.ones(2 * n), splits=[1.5] + [1] * (n - 1), name="a2a.float")
    out = hvd.alltoall(torch.full((n,), float(hvd.rank())), name="a2a.float")
    assert out.tolist() == [float(r) for r in range(n)]
