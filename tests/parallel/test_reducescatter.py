"""reducescatter: even and uneven dim 0, every reduce op that applies, scaling, forms."""

import pytest
import torch

import hvdcompat as hvd
from parallel_util import (
    DTYPES, all_inputs, assert_same, dtype_id, expected_reduce,
)

OPS = {"Sum": hvd.Sum, "Average": hvd.Average, "Min": hvd.Min, "Max": hvd.Max}
TRAILING = [(), (3,), (2, 2), (0,)]
# dim 0 as a function of the set size: even, uneven (first dim0 % n ranks get
# an extra row), fewer rows than ranks (some ranks get none), no rows.
DIM0 = {"even": lambda n: 2 * n, "uneven": lambda n: 2 * n + n - 1,
        "fewer_rows_than_ranks": lambda n: 1, "empty": lambda n: 0}


def _my_rows(dim0, n, r):
    q, m = divmod(dim0, n)
    start = r * q + min(r, m)
    return start, q + (1 if r < m else 0)


def _expected(xs, dtype, op, pre=1.0, post=1.0):
    full = expected_reduce(xs, dtype, op, pre, post)
    start, count = _my_rows(full.shape[0], hvd.size(), hvd.rank())
    return full[start:start + count]


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@pytest.mark.parametrize("op_name", list(OPS))
def test_op_and_row_split(op_name, dtype):
    op = OPS[op_name]
    cases = []
    for dim0 in DIM0:
        for trailing in TRAILING:
            shape = (DIM0[dim0](hvd.size()),) + trailing
            xs = all_inputs(shape, dtype, ("rs", op_name, dtype_id(dtype), dim0, trailing))
            mine = xs[hvd.rank()].clone()
            name = f"rs.{op_name}.{dtype_id(dtype)}.{dim0}.{len(trailing)}.{sum(trailing)}"
            cases.append((shape, xs, mine, hvd.reducescatter_async(mine, op=op, name=name)))
    exact = not dtype.is_floating_point or op != hvd.Average
    for shape, xs, mine, h in cases:
        what = f"{op_name} {dtype} {shape}"
        assert_same(hvd.synchronize(h), _expected(xs, dtype, op), exact=exact, what=what)
        assert_same(mine, xs[hvd.rank()], what=f"{what}: input unchanged")


def test_functional_form_for_every_dtype():
    for dtype in DTYPES:
        xs = all_inputs((2 * hvd.size() + 1, 2), dtype, ("rs-sync", dtype_id(dtype)))
        out = hvd.reducescatter(xs[hvd.rank()], op=hvd.Sum, name=f"rs.sync.{dtype_id(dtype)}")
        assert_same(out, _expected(xs, dtype, hvd.Sum), what=str(dtype))


def test_default_op_is_average():
    xs = all_inputs((2 * hvd.size(), 2), torch.float64, "rs-default")
    out = hvd.reducescatter(xs[hvd.rank()], name="rs.default")
    assert_same(out, _expected(xs, torch.float64, hvd.Average), exact=False)


def test_horovods_sum_example():
    # dim0 = 4 * size, Sum: rank r gets rows [4r, 4r + 4) times size.
    n = hvd.size()
    t = torch.arange(4 * n * 3, dtype=torch.float32).reshape(4 * n, 3)
    out = hvd.reducescatter(t, op=hvd.Sum, name="rs.horovod")
    assert_same(out, t[4 * hvd.rank():4 * hvd.rank() + 4] * n)


@pytest.mark.parametrize("factors", [(0.5, 1.0), (1.0, 0.3), (2.0, 1.7)],
                         ids=lambda f: f"pre{f[0]}-post{f[1]}")
@pytest.mark.parametrize("op_name", ["Sum", "Average"])
def test_prescale_and_postscale(op_name, factors):
    pre, post = factors
    cases = []
    for dtype in DTYPES:
        xs = all_inputs((2 * hvd.size() + 1, 2), dtype,
                        ("rs-scale", op_name, dtype_id(dtype), factors), lo=-8, hi=9)
        h = hvd.reducescatter_async(xs[hvd.rank()], op=OPS[op_name], prescale_factor=pre,
                                    postscale_factor=post,
                                    name=f"rs.scale.{op_name}.{dtype_id(dtype)}.{pre}.{post}")
        cases.append((dtype, xs, h))
    for dtype, xs, h in cases:
        assert_same(hvd.synchronize(h), _expected(xs, dtype, OPS[op_name], pre, post),
                    exact=not dtype.is_floating_point, what=f"{op_name} {dtype}")


@pytest.mark.parametrize("form", ["async", "positional_process_set"])
def test_other_forms(form):
    xs = all_inputs((hvd.size() + 1, 3), torch.int32, ("rs-forms", form))
    if form == "async":
        h = hvd.reducescatter_async(xs[hvd.rank()], name="rs.async", op=hvd.Sum)
        out = hvd.synchronize(h)
    else:
        # reducescatter(tensor, name, compression, op, process_set, prescale, postscale)
        out = hvd.reducescatter(xs[hvd.rank()], "rs.positional", hvd.Compression.none, hvd.Sum,
                                hvd.global_process_set, 2.0, 1.0)
        xs = [x * 2 for x in xs]
    assert_same(out, _expected(xs, torch.int32, hvd.Sum))


def test_scalar_is_a_value_error():
    for fn in (hvd.reducescatter, hvd.reducescatter_async):
        with pytest.raises(ValueError, match="scalar"):
            fn(torch.tensor(float(hvd.rank())), op=hvd.Average, name="rs.scalar")
    out = hvd.reducescatter(torch.ones(hvd.size()), op=hvd.Sum, name="rs.scalar")
    assert out.tolist() == [float(hvd.size())]


def test_adasum_is_rejected_at_call_time():
    with pytest.raises(RuntimeError, match="Adasum"):
        hvd.reducescatter(torch.ones(4), op=hvd.Adasum, name="rs.adasum")


@pytest.mark.parametrize("op_name", ["Sum", "Average"])
def test_gradient(op_name):
    x = torch.ones(2 * hvd.size() + 1, 2, requires_grad=True)
    out = hvd.reducescatter(x, op=OPS[op_name], name=f"rs.grad.{op_name}")
    out.backward(torch.ones_like(out))
    expected = float(hvd.size()) if op_name == "Sum" else 1.0
    assert_same(x.grad, torch.full_like(x, expected))


def test_many_async_reducescatters_complete():
    n = 10
    xs = [all_inputs((i + 1, 2), torch.float32, ("rs-many", i)) for i in range(n)]
    handles = [hvd.reducescatter_async(x[hvd.rank()], op=hvd.Sum, name=f"rs.many.{i}")
               for i, x in enumerate(xs)]
    for x, h in zip(xs, handles):
        assert_same(hvd.synchronize(h), _expected(x, torch.float32, hvd.Sum))

