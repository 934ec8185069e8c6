"""broadcast: every root, every dtype and shape; out-of-place and in-place forms."""

import pytest
import torch

import hvdcompat as hvd
from parallel_util import DTYPES, SHAPES, assert_same, dtype_id, rank_input, shape_id

ALL_DTYPES = DTYPES + [torch.bool]


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=dtype_id)
def test_out_of_place_from_every_root(dtype):
    for shape in SHAPES:
        for root in range(hvd.size()):
            key = ("bc", dtype_id(dtype), shape, root)
            mine = rank_input(hvd.rank(), shape, dtype, key)
            before = mine.clone()
            out = hvd.broadcast(mine, root, name=f"bc.{dtype_id(dtype)}.{shape_id(shape)}.{root}")
            assert out is not mine
            assert_same(out, rank_input(root, shape, dtype, key), what=f"{shape} from {root}")
            # The input is left alone on every rank, the root included.
            assert_same(mine, before, what="input unchanged")


@pytest.mark.parametrize("form", ["inplace", "async_inplace", "async"])
def test_other_forms(form):
    for dtype in ALL_DTYPES:
        for root in range(hvd.size()):
            _check_form(form, dtype, root)


def _check_form(form, dtype, root):
    key = ("bc-forms", form, dtype_id(dtype), root)
    mine = rank_input(hvd.rank(), (3, 5), dtype, key)
    before = mine.clone()
    expected = rank_input(root, (3, 5), dtype, key)
    name = f"bc.{form}.{dtype_id(dtype)}.{root}"
    if form == "inplace":
        out = hvd.broadcast_(mine, root, name=name)
        assert out is mine
    elif form == "async_inplace":
        out = hvd.synchronize(hvd.broadcast_async_(mine, root, name=name))
        assert out is mine
    else:
        out = hvd.synchronize(hvd.broadcast_async(mine, root_rank=root, name=name))
        assert out is not mine
        assert_same(mine, before, what="input unchanged")
    assert_same(out, expected)


def test_unnamed_broadcasts_from_each_root_in_turn():
    outs = [hvd.broadcast(torch.tensor([hvd.rank() * 10 + root]), root)
            for root in range(hvd.size())]
    assert [o.item() for o in outs] == [root * 10 + root for root in range(hvd.size())]


@pytest.mark.parametrize("root", [-1, "size", "size+3"])
def test_root_out_of_range_is_a_value_error_and_enqueues_nothing(root):
    root = {"size": hvd.size(), "size+3": hvd.size() + 3}.get(root, root)
    t = torch.ones(2)
    for fn in (hvd.broadcast, hvd.broadcast_, hvd.broadcast_async, hvd.broadcast_async_):
        with pytest.raises(ValueError, match="root rank"):
            fn(t, root, name="bc.badroot")
    assert hvd.broadcast(torch.tensor([hvd.rank()]), 0, name="bc.badroot").item() == 0


def test_many_async_broadcasts_from_mixed_roots():
    n = 12
    keys = [("bc-many", i) for i in range(n)]
    handles = [hvd.broadcast_async(rank_input(hvd.rank(), (i + 1,), torch.float32, keys[i]),
                                   i % hvd.size(), name=f"bc.many.{i}") for i in range(n)]
    for i, h in enumerate(handles):
        assert_same(hvd.synchronize(h), rank_input(i % hvd.size(), (i + 1,), torch.float32,
                                                   keys[i]))


def test_gradient_reaches_only_the_root():
    for root in range(hvd.size()):
        x = torch.full((3,), float(hvd.rank()), requires_grad=True)
        out = hvd.broadcast(x, root, name=f"bc.grad.{root}")
        assert out.tolist() == [float(root)] * 3
        out.sum().backward()
        assert x.grad.tolist() == [1.0 if hvd.rank() == root else 0.0] * 3
