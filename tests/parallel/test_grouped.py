"""Grouped collectives: lists negotiated as one unit; results and return types as Horovod."""

import pytest
import torch

import hvdcompat as hvd
from parallel_util import (
    DTYPES, SHAPES, all_inputs, assert_same, dtype_id, expected_reduce, rank_input,
)

OPS = {"Sum": hvd.Sum, "Average": hvd.Average, "Min": hvd.Min, "Max": hvd.Max}


def _group(dtype, key, shapes=SHAPES):
    """Every rank's inputs for a group with one tensor per shape: [tensor][rank]."""
    return [all_inputs(shape, dtype, (key, i)) for i, shape in enumerate(shapes)]


def _check_all(outs, groups, dtype, op, pre=1.0, post=1.0):
    assert len(outs) == len(groups)
    exact = not dtype.is_floating_point or (op != hvd.Average and pre == 1.0 and post == 1.0)
    for i, (out, xs) in enumerate(zip(outs, groups)):
        assert_same(out, expected_reduce(xs, dtype, op, pre, post), exact=exact,
                    what=f"member {i}")


@pytest.mark.parametrize("op_name", list(OPS))
def test_grouped_allreduce_returns_a_list(op_name):
    for dtype in DTYPES:
        _check_grouped_allreduce(op_name, dtype)


def _check_grouped_allreduce(op_name, dtype):
    groups = _group(dtype, ("gar", op_name, dtype_id(dtype)))
    mine = [xs[hvd.rank()].clone() for xs in groups]
    outs = hvd.grouped_allreduce(mine, op=OPS[op_name], name=f"gar.{op_name}.{dtype_id(dtype)}")
    assert isinstance(outs, list)
    for t, xs in zip(mine, groups):
        assert_same(t, xs[hvd.rank()], what="inputs unchanged")
    _check_all(outs, groups, dtype, OPS[op_name])


@pytest.mark.parametrize("form", ["async", "inplace", "async_inplace"])
def test_grouped_allreduce_forms_return_tuples(form):
    for dtype in [torch.int32, torch.float16, torch.bfloat16, torch.float64]:
        _check_form(form, dtype)


def _check_form(form, dtype):
    groups = _group(dtype, ("gar-forms", form, dtype_id(dtype)))
    mine = [xs[hvd.rank()].clone() for xs in groups]
    name = f"gar.{form}.{dtype_id(dtype)}"
    if form == "async":
        outs = hvd.synchronize(hvd.grouped_allreduce_async(mine, op=hvd.Sum, name=name))
        for t, xs in zip(mine, groups):
            assert_same(t, xs[hvd.rank()], what="inputs unchanged")
    elif form == "inplace":
        outs = hvd.grouped_allreduce_(mine, op=hvd.Sum, name=name)
        assert all(o is t for o, t in zip(outs, mine))
    else:
        outs = hvd.synchronize(hvd.grouped_allreduce_async_(mine, op=hvd.Sum, name=name))
        assert all(o is t for o, t in zip(outs, mine))
    assert isinstance(outs, tuple)
    _check_all(outs, groups, dtype, hvd.Sum)


def test_grouped_allreduce_average_and_scaling():
    for dtype in DTYPES:
        _check_scaling(dtype)


def _check_scaling(dtype):
    groups = _group(dtype, ("gar-scale", dtype_id(dtype)), shapes=[(3,), (2, 2), ()])
    mine = [xs[hvd.rank()] for xs in groups]
    outs = hvd.grouped_allreduce(mine, op=hvd.Average, prescale_factor=0.5,
                                 postscale_factor=3.0, name=f"gar.scale.{dtype_id(dtype)}")
    _check_all(outs, groups, dtype, hvd.Average, 0.5, 3.0)
    with pytest.warns(DeprecationWarning):
        outs = hvd.grouped_allreduce(mine, average=False, name=f"gar.avgarg.{dtype_id(dtype)}")
    _check_all(outs, groups, dtype, hvd.Sum)


def test_several_grouped_allreduces_in_flight():
    sets = [_group(torch.float32, ("gar-flight", k), shapes=[(k + 1,), (2, k + 1)])
            for k in range(6)]
    handles = [hvd.grouped_allreduce_async([xs[hvd.rank()] for xs in g], op=hvd.Sum,
                                           name=f"gar.flight.{k}") for k, g in enumerate(sets)]
    for h, g in zip(reversed(handles), reversed(sets)):
        _check_all(hvd.synchronize(h), g, torch.float32, hvd.Sum)


def test_grouped_allreduce_gradient():
    xs = [torch.ones(3, requires_grad=True), torch.ones(2, 2, requires_grad=True)]
    outs = hvd.grouped_allreduce(xs, op=hvd.Sum, name="gar.grad")
    (outs[0].sum() + outs[1].sum()).backward()
    for x in xs:
        assert_same(x.grad, torch.full_like(x, float(hvd.size())))


def test_empty_group_is_a_value_error():
    for fn in (hvd.grouped_allreduce, hvd.grouped_allreduce_async, hvd.grouped_allgather_async,
               hvd.grouped_reducescatter_async):
        with pytest.raises(ValueError, match="empty"):
            fn([], name="gar.empty")


def test_grouped_allgather_returns_a_tuple():
    for dtype in DTYPES + [torch.bool]:
        _check_grouped_allgather(dtype)


def _check_grouped_allgather(dtype):
    n = hvd.size()
    # Per member, rows per rank differ; member 1 is empty on rank 1.
    row_rules = [lambda r: r + 1, lambda r: 0 if r == 1 else 2, lambda r: 3]
    trailing = [(), (3,), (2, 2)]
    key = ("gag", dtype_id(dtype))
    groups = [[rank_input(r, (rule(r),) + tr, dtype, (key, i)) for r in range(n)]
              for i, (rule, tr) in enumerate(zip(row_rules, trailing))]
    mine = [xs[hvd.rank()] for xs in groups]
    outs = hvd.grouped_allgather(mine, name=f"gag.{dtype_id(dtype)}")
    assert isinstance(outs, tuple) and len(outs) == len(groups)
    for out, xs in zip(outs, groups):
        assert_same(out, torch.cat(xs))
    outs = hvd.synchronize(hvd.grouped_allgather_async(mine, name=f"gag.async.{dtype_id(dtype)}"))
    assert isinstance(outs, tuple)
    for out, xs in zip(outs, groups):
        assert_same(out, torch.cat(xs))


def test_grouped_allgather_gradient():
    n = hvd.size()
    xs = [torch.ones(hvd.rank() + 1, 2, requires_grad=True),
          torch.ones(2, requires_grad=True)]
    outs = hvd.grouped_allgather(xs, name="gag.grad")
    rows0 = [r + 1 for r in range(n)]
    # Gradient block r holds r on every rank: each rank gets back its own rank.
    outs[0].backward(torch.cat([torch.full((rows0[r], 2), float(r)) for r in range(n)]),
                     retain_graph=True)
    outs[1].backward(torch.cat([torch.full((2,), float(r)) for r in range(n)]))
    assert_same(xs[0].grad, torch.full_like(xs[0], float(hvd.rank())))
    assert_same(xs[1].grad, torch.full_like(xs[1], float(hvd.rank())))


def _rows(dim0, n, r):
    q, m = divmod(dim0, n)
    return r * q + min(r, m), q + (1 if r < m else 0)


@pytest.mark.parametrize("op_name", ["Sum", "Average"])
def test_grouped_reducescatter_returns_a_list(op_name):
    for dtype in DTYPES:
        _check_grouped_reducescatter(op_name, dtype)


def _check_grouped_reducescatter(op_name, dtype):
    n = hvd.size()
    shapes = [(2 * n, 3), (2 * n + 1,), (1, 2), (n + 1, 2, 2)]
    groups = _group(dtype, ("grs", op_name, dtype_id(dtype)), shapes=shapes)
    mine = [xs[hvd.rank()] for xs in groups]
    outs = hvd.grouped_reducescatter(mine, op=OPS[op_name], name=f"grs.{op_name}."
                                                                  f"{dtype_id(dtype)}")
    assert isinstance(outs, list)
    async_outs = hvd.synchronize(hvd.grouped_reducescatter_async(
        mine, op=OPS[op_name], name=f"grs.async.{op_name}.{dtype_id(dtype)}"))
    assert isinstance(async_outs, tuple)
    exact = not dtype.is_floating_point or op_name == "Sum"
    for result in (outs, async_outs):
        for out, xs in zip(result, groups):
            full = expected_reduce(xs, dtype, OPS[op_name])
            start, count = _rows(full.shape[0], n, hvd.rank())
            assert_same(out, full[start:start + count], exact=exact)


def test_grouped_reducescatter_scaling_and_scalar_error():
    n = hvd.size()
    groups = _group(torch.float32, "grs-scale", shapes=[(n + 1, 2), (3 * n,)])
    outs = hvd.grouped_reducescatter([xs[hvd.rank()] for xs in groups], op=hvd.Sum,
                                     prescale_factor=0.5, postscale_factor=3.0,
                                     name="grs.scale")
    for out, xs in zip(outs, groups):
        full = expected_reduce(xs, torch.float32, hvd.Sum, 0.5, 3.0)
        start, count = _rows(full.shape[0], n, hvd.rank())
        assert_same(out, full[start:start + count], exact=False)
    with pytest.raises(ValueError, match="scalar"):
        hvd.grouped_reducescatter([torch.zeros(3, 1), torch.tensor(1.0)], name="grs.scalar")


@pytest.mark.parametrize("op_name", ["Sum", "Average"])
def test_grouped_reducescatter_gradient(op_name):
    n = hvd.size()
    xs = [torch.ones(n + 1, 2, requires_grad=True), torch.ones(2 * n, requires_grad=True)]
    outs = hvd.grouped_reducescatter(xs, op=OPS[op_name], name=f"grs.grad.{op_name}")
    (outs[0].sum() + outs[1].sum()).backward()
    expected = float(n) if op_name == "Sum" else 1.0
    for x in xs:
        assert_same(x.grad, torch.full_like(x, expected))


def test_groups_may_mix_dtypes_like_horovod():
    # One handle, one result in the caller's order, although the engine runs
    # one fused collective per dtype.
    n, r = hvd.size(), hvd.rank()
    ts = [torch.full((3,), r + 1, dtype=torch.float32), torch.full((2, 2), r + 1, dtype=torch.int64),
          torch.full((4,), r + 1, dtype=torch.float64), torch.full((1,), r + 1, dtype=torch.int64)]
    total = n * (n + 1) // 2
    out = hvd.grouped_allreduce(ts, op=hvd.Sum, name="mixed.ar")
    assert [o.dtype for o in out] == [t.dtype for t in ts]
    assert all(torch.equal(o, torch.full_like(t, total)) for o, t in zip(out, ts))
    h = hvd.grouped_allreduce_async_([t.clone() for t in ts], op=hvd.Sum)
    res = hvd.synchronize(h)
    assert isinstance(res, tuple) and all(torch.equal(o, torch.full_like(t, total))
                                          for o, t in zip(res, ts))
    gathered = hvd.grouped_allgather([t.reshape(-1) for t in ts], name="mixed.ag")
    for g, t in zip(gathered, ts):
        assert g.dtype == t.dtype
        assert torch.equal(g, torch.cat([torch.full((t.numel(),), k + 1, dtype=t.dtype)
                                         for k in range(n)]))
    rows = [torch.full((n, 2), r + 1, dtype=d) for d in (torch.float32, torch.int32, torch.float32)]
    scattered = hvd.grouped_reducescatter(rows, op=hvd.Sum, name="mixed.rs")
    assert [s.dtype for s in scattered] == [x.dtype for x in rows]
    assert all(torch.equal(s, torch.full((1, 2), total, dtype=s.dtype)) for s in scattered)
