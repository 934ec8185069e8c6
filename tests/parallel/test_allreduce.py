"""allreduce: every op, dtype and shape; scaling; sync/async/in-place forms; argument rules."""

import warnings

import pytest
import torch

import hvdcompat as hvd
from parallel_util import (
    DTYPES, FLOAT_DTYPES, INT_DTYPES, SHAPES, all_inputs, assert_same, dtype_id, expected_reduce,
    rank_input, shape_id,
)

OPS = {"Sum": hvd.Sum, "Average": hvd.Average, "Min": hvd.Min, "Max": hvd.Max,
       "Product": hvd.Product}


def _exact(dtype, op):
    # Small integers stay exact under Sum/Min/Max/Product in every dtype, and
    # the reference rounds Average as the engine does (float32/64 scaled in
    # double, once); 16-bit Average keeps a tolerance of a rounding.
    return dtype not in (torch.float16, torch.bfloat16) or op != hvd.Average


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@pytest.mark.parametrize("op_name", list(OPS))
def test_op_matches_local_reference(op_name, dtype):
    op = OPS[op_name]
    # Products of three values stay small (int8/uint8 must not wrap).
    lo, hi = (-2, 3) if op == hvd.Product else (-5, 6)
    cases = []
    for shape in SHAPES:
        xs = all_inputs(shape, dtype, ("ar", op_name, dtype_id(dtype), shape), lo=lo, hi=hi)
        mine = xs[hvd.rank()].clone()
        name = f"ar.{op_name}.{dtype_id(dtype)}.{shape_id(shape)}"
        cases.append((shape, xs, mine, hvd.allreduce_async(mine, op=op, name=name)))
    for shape, xs, mine, h in cases:
        what = f"{op_name} {dtype} {shape}"
        assert_same(hvd.synchronize(h), expected_reduce(xs, dtype, op),
                    exact=_exact(dtype, op), what=what)
        assert_same(mine, xs[hvd.rank()], what=f"{what}: input must stay unchanged")


@pytest.mark.parametrize("op_name", ["Min", "Max"])
def test_bool_min_is_and_max_is_or(op_name):
    for shape in SHAPES:
        xs = all_inputs(shape, torch.bool, ("bool", op_name, shape))
        out = hvd.allreduce(xs[hvd.rank()], op=OPS[op_name])
        expected = torch.stack(xs).all(0) if op_name == "Min" else torch.stack(xs).any(0)
        assert_same(out, expected, what=f"bool {op_name} {shape}")


@pytest.mark.parametrize("op_name", ["Sum", "Average", "Product"])
def test_bool_arithmetic_is_a_type_error_and_enqueues_nothing(op_name):
    t = torch.ones(4, dtype=torch.bool)
    with pytest.raises(TypeError, match="bool"):
        hvd.allreduce(t, op=OPS[op_name], name="bool.bad")
    with pytest.raises(TypeError):
        hvd.allreduce_async_(t, op=OPS[op_name], name="bool.bad")
    # Nothing was left in flight under that name: it can be used at once.
    out = hvd.allreduce(torch.ones(4, dtype=torch.int32), op=hvd.Sum, name="bool.bad")
    assert out.tolist() == [hvd.size()] * 4


@pytest.mark.parametrize("form", ["sync", "async", "inplace", "async_inplace", "positional"])
def test_call_forms(form):
    for dtype in DTYPES:
        _check_form(form, dtype)


def _check_form(form, dtype):
    xs = all_inputs((3, 4), dtype, ("forms", form, dtype_id(dtype)))
    expected = expected_reduce(xs, dtype, hvd.Sum)
    t = xs[hvd.rank()].clone()
    name = f"forms.{form}.{dtype_id(dtype)}"
    if form == "sync":
        out = hvd.allreduce(t, op=hvd.Sum, name=name)
        assert out is not t
        assert_same(t, xs[hvd.rank()], what="input")
    elif form == "async":
        h = hvd.allreduce_async(t, op=hvd.Sum, name=name)
        assert isinstance(h, int)
        out = hvd.synchronize(h)
        assert_same(t, xs[hvd.rank()], what="input")
        with pytest.raises(ValueError, match="not created or has been cleared"):
            hvd.poll(h)
        assert hvd.synchronize(h) is None
    elif form == "inplace":
        out = hvd.allreduce_(t, op=hvd.Sum, name=name)
        assert out is t
    elif form == "async_inplace":
        h = hvd.allreduce_async_(t, op=hvd.Sum, name=name)
        out = hvd.synchronize(h)
        assert out is t
    else:
        # Horovod's tests call allreduce_(tensor, average, name, op) positionally.
        out = hvd.allreduce_(t, None, name, hvd.Sum)
        assert out is t
    assert_same(out, expected, what=f"{form} {dtype}")


def test_async_op_waits_for_every_rank_then_completes():
    # Each rank first submits a name no other rank has submitted yet: its
    # handle cannot be done until the others submit it after the barrier.
    n = hvd.size()
    xs = {q: all_inputs((5,), torch.float32, ("solo", q)) for q in range(n)}
    own = hvd.allreduce_async(xs[hvd.rank()][hvd.rank()], op=hvd.Sum, name=f"solo.{hvd.rank()}")
    assert hvd.poll(own) is False
    hvd.barrier()
    handles = {hvd.rank(): own}
    for q in range(n):
        if q != hvd.rank():
            handles[q] = hvd.allreduce_async(xs[q][hvd.rank()], op=hvd.Sum, name=f"solo.{q}")
    for q, h in handles.items():
        assert_same(hvd.synchronize(h), expected_reduce(xs[q], torch.float32, hvd.Sum))


def test_many_async_ops_complete_in_any_synchronize_order():
    n = 20
    xs = [all_inputs((5,), torch.float32, ("many", i)) for i in range(n)]
    handles = [hvd.allreduce_async(xs[i][hvd.rank()], op=hvd.Sum, name=f"many.{i}")
               for i in range(n)]
    for i in reversed(range(n)):
        assert_same(hvd.synchronize(handles[i]), expected_reduce(xs[i], torch.float32, hvd.Sum))


_FACTORS = [(0.5, 1.0), (1.0, 0.3), (2.0, 1.7), (0.1, 3.0)]


@pytest.mark.parametrize("factors", _FACTORS, ids=lambda f: f"pre{f[0]}-post{f[1]}")
@pytest.mark.parametrize("op_name", ["Sum", "Average", "Min", "Max"])
def test_prescale_and_postscale(op_name, factors):
    pre, post = factors
    op = OPS[op_name]
    cases = []
    for dtype in DTYPES:
        xs = all_inputs((2, 5), dtype, ("scale", op_name, dtype_id(dtype), factors), lo=-8, hi=9)
        h = hvd.allreduce_async(xs[hvd.rank()], op=op, prescale_factor=pre,
                                postscale_factor=post,
                                name=f"scale.{op_name}.{dtype_id(dtype)}.{pre}.{post}")
        cases.append((dtype, xs, h))
    for dtype, xs, h in cases:
        assert_same(hvd.synchronize(h), expected_reduce(xs, dtype, op, pre, post),
                    exact=not dtype.is_floating_point,
                    what=f"{op_name} {dtype} pre={pre} post={post}")


def test_float32_average_equals_torchs_sum_divided_by_size():
    # What a user compares against: torch.stack(xs).sum(0) / size, bit for bit
    # (at 3 ranks a float32 1/3 factor would be an ulp off in many places).
    # float64 is scaled by 1/size like Horovod, so it may differ by an ulp.
    xs = [torch.randn(4099, generator=torch.Generator().manual_seed(17 + r)).mul(1000).round()
          for r in range(hvd.size())]
    out = hvd.allreduce(xs[hvd.rank()], op=hvd.Average, name="avg.vs.torch")
    assert torch.equal(out, torch.stack(xs).sum(0) / hvd.size())


@pytest.mark.parametrize("op_name", ["Sum", "Average", "Min"])
def test_tensor_larger_than_one_mpi_call_is_split_and_exact(op_name):
    # Tensors above HVDCOMPAT_MAX_CALL_BYTES go as several equal MPI calls;
    # sizes that do not divide evenly check the boundaries between calls.
    # With the default limit (16 MiB) these tensors are large, so one dtype
    # does; tests/test_parallel_env.py runs this file with a 4 KiB limit.
    limit = hvd.basics._core.config()["max_call_bytes"]
    dtypes = (torch.float32, torch.int32, torch.float64) if limit <= (1 << 20) else (torch.float32,)
    op = OPS[op_name]
    cases = []
    for dtype in dtypes:
        esize = torch.tensor([], dtype=dtype).element_size()
        per_call = limit // esize
        for inplace, count in ((False, per_call + 1), (True, 2 * per_call + per_call // 2 + 7)):
            xs = all_inputs((count,), dtype, ("split", op_name, dtype_id(dtype), count),
                            lo=-8, hi=9)
            mine = xs[hvd.rank()].clone()
            name = f"split.{op_name}.{dtype_id(dtype)}.{count}"
            pre, post = (0.5, 3.0) if dtype.is_floating_point else (1.0, 1.0)
            h = (hvd.allreduce_async_ if inplace else hvd.allreduce_async)(
                mine, op=op, name=name, prescale_factor=pre, postscale_factor=post)
            cases.append((dtype, count, inplace, xs, mine, h, pre, post))
    for dtype, count, inplace, xs, mine, h, pre, post in cases:
        out = hvd.synchronize(h)
        assert_same(out, expected_reduce(xs, dtype, op, pre, post),
                    exact=_exact(dtype, op), what=f"{op_name} {dtype} x{count}")
        if inplace:
            assert out.data_ptr() == mine.data_ptr(), "in-place allreduce returned a new tensor"
        else:
            assert torch.equal(mine, xs[hvd.rank()]), "out-of-place allreduce changed its input"


@pytest.mark.parametrize("pre", [1.0, 0.5], ids=["pre1", "pre0.5"])
@pytest.mark.parametrize("op_name", list(OPS))
def test_out_of_place_large_tensors_reduce_from_the_input_into_a_new_output(op_name, pre):
    # Tensors past HVDCOMPAT_INPLACE_MIN_BYTES skip the fusion buffer: without a
    # prescale they are reduced from the input straight into the new output.
    # Every dtype, submitted together; the input must come back unchanged.
    op = OPS[op_name]
    lo, hi = (-2, 3) if op == hvd.Product else (-8, 9)
    count = hvd.basics._core.config()["inplace_min_bytes"] // 2 + 3  # >= the limit for 2+ bytes
    cases = []
    for dtype in DTYPES:
        xs = all_inputs((count,), dtype, ("oop", op_name, dtype_id(dtype), pre), lo=lo, hi=hi)
        mine = xs[hvd.rank()].clone()
        h = hvd.allreduce_async(mine, op=op, prescale_factor=pre,
                                name=f"oop.{op_name}.{dtype_id(dtype)}.{pre}")
        cases.append((dtype, xs, mine, h))
    for dtype, xs, mine, h in cases:
        what = f"out-of-place {op_name} {dtype} x{count} pre={pre}"
        out = hvd.synchronize(h)
        assert out.data_ptr() != mine.data_ptr(), f"{what}: returned its input"
        assert_same(out, expected_reduce(xs, dtype, op, pre),
                    exact=_exact(dtype, op) and (pre == 1.0 or not dtype.is_floating_point),
                    what=what)
        assert_same(mine, xs[hvd.rank()], what=f"{what}: input must stay unchanged")


@pytest.mark.parametrize("inplace", [False, True], ids=["out_of_place", "in_place"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=dtype_id)
def test_16bit_floats_reduce_in_float32_and_round_once(dtype, inplace):
    # Rank 0 holds 2048 (float16) / 256 (bfloat16), rank 1 holds 1: the sum is
    # not representable in the 16-bit type. Reducing in float32 and rounding
    # once after the postscale gives 0.75 * (big + 1) rounded; rounding the
    # sum to 16 bits first would give 0.75 * big.
    big = 2048.0 if dtype == torch.float16 else 256.0
    value = big if hvd.rank() == 0 else (1.0 if hvd.rank() == 1 else 0.0)
    t = torch.full((3,), value, dtype=dtype)
    expected = torch.full((3,), (big + 1) * 0.75, dtype=torch.float32).to(dtype)
    assert expected[0].item() != big * 0.75  # the case really tells the two apart
    if inplace:
        out = hvd.allreduce_(t, op=hvd.Sum, postscale_factor=0.75, name=f"once.{dtype_id(dtype)}")
    else:
        out = hvd.allreduce(t, op=hvd.Sum, postscale_factor=0.75, name=f"once.{dtype_id(dtype)}")
    assert_same(out, expected, what="rounded once")


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=dtype_id)
def test_16bit_floats_at_vector_lengths_match_torchs_rounding(dtype):
    # Long enough for the vectorised conversions, with an odd tail, random
    # values, subnormals, infinities and a NaN: the result must equal the
    # float32 sum rounded once by torch itself, element for element. Values
    # span few enough binades that the float32 sum is exact in any order.
    n = 10007
    g = torch.Generator().manual_seed(4242)
    xs = []
    for r in range(hvd.size()):
        x = torch.randn(n, generator=g) * (2.0 ** torch.randint(-3, 6, (n,), generator=g))
        x[:4] = torch.tensor([float("inf"), 1e-7, -3e-6, 65000.0])
        xs.append(x.to(dtype))
    xs[0][4] = float("nan")
    out = hvd.allreduce(xs[hvd.rank()], op=hvd.Sum, postscale_factor=0.5,
                        name=f"vec16.{dtype_id(dtype)}")
    want = (torch.stack([x.float() for x in xs]).sum(0) * 0.5).to(dtype)
    assert out.dtype == dtype
    assert torch.equal(out.isnan(), want.isnan())
    mask = ~want.isnan()
    assert torch.equal(out[mask], want[mask])


def test_float16_sum_does_not_overflow_in_the_intermediate():
    # 40000 per rank overflows float16 once summed; the float32 accumulator
    # and the postscale bring it back into range.
    t = torch.full((4,), 40000.0, dtype=torch.float16)
    out = hvd.allreduce(t, op=hvd.Sum, postscale_factor=1.0 / hvd.size(), name="f16.big")
    assert_same(out, torch.full((4,), 40000.0, dtype=torch.float16), what="no overflow")
    out = hvd.allreduce(torch.full((4,), 60000.0, dtype=torch.float16), op=hvd.Average,
                        name="f16.avg.big")
    assert_same(out, torch.full((4,), 60000.0, dtype=torch.float16), what="average no overflow")


@pytest.mark.parametrize("dtype", [d for d in INT_DTYPES if d != torch.uint8], ids=dtype_id)
def test_integer_average_truncates_toward_zero(dtype):
    n = hvd.size()
    # Sum -7 and +7: trunc(-7/n) differs from floor(-7/n) for n = 2 and 3.
    neg = torch.tensor([-7 if hvd.rank() == 0 else 0, 7 if hvd.rank() == 0 else 0], dtype=dtype)
    out = hvd.allreduce(neg, op=hvd.Average, name=f"trunc.{dtype_id(dtype)}")
    # The engine's rule, as Horovod's: a double multiply by 1/n, truncated.
    assert out.tolist() == [int(-7 * (1.0 / n)), int(7 * (1.0 / n))]
    assert out.tolist()[0] != -7 // n


def test_uint8_average_truncates():
    t = torch.tensor([5 if hvd.rank() == 0 else 0, 255 if hvd.rank() == 0 else 0],
                     dtype=torch.uint8)
    out = hvd.allreduce(t, op=hvd.Average, name="trunc.uint8")
    n = hvd.size()
    assert out.tolist() == [int(5 * (1.0 / n)), int(255 * (1.0 / n))]


def test_average_argument_is_deprecated_but_honoured():
    t = rank_input(hvd.rank(), (6,), torch.int32, "avg-arg")
    xs = all_inputs((6,), torch.int32, "avg-arg")
    with pytest.warns(DeprecationWarning, match="replaced with `op`"):
        summed = hvd.allreduce(t, average=False, name="avg.false")
    assert_same(summed, expected_reduce(xs, torch.int32, hvd.Sum))
    with pytest.warns(DeprecationWarning):
        averaged = hvd.allreduce(t, average=True, name="avg.true")
    assert_same(averaged, expected_reduce(xs, torch.int32, hvd.Average))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        # op= alone, and the default (Average), do not warn.
        default = hvd.allreduce(t, name="avg.default")
    assert_same(default, expected_reduce(xs, torch.int32, hvd.Average))
    with pytest.raises(ValueError, match="supersedes average"):
        hvd.allreduce(t, average=True, op=hvd.Sum, name="avg.both")
    with pytest.raises(ValueError, match="supersedes average"):
        hvd.allreduce_async_(t, average=True, op=hvd.Sum, name="avg.both")


@pytest.mark.parametrize("fn", ["allreduce", "allreduce_async", "allreduce_", "allreduce_async_"])
def test_adasum_runs_in_every_form(fn):
    # Identical inputs are parallel, so Adasum gives the input back (the rule
    # itself is tested in test_adasum.py).
    t = torch.full((4,), 2.0)
    out = getattr(hvd, fn)(t, op=hvd.Adasum, name="adasum")
    if "async" in fn:
        out = hvd.synchronize(out)
    assert out.tolist() == [2.0] * 4


def test_unknown_op_is_a_value_error():
    with pytest.raises(ValueError, match="op"):
        hvd.allreduce(torch.ones(2), op=42, name="badop")


def test_gradient_of_sum_and_average():
    x = torch.ones(3, requires_grad=True)
    hvd.allreduce(x, op=hvd.Sum, name="grad.sum").sum().backward()
    assert x.grad.tolist() == [float(hvd.size())] * 3
    y = torch.ones(3, dtype=torch.float64, requires_grad=True)
    hvd.allreduce(y, op=hvd.Average, name="grad.avg").sum().backward()
    assert y.grad.tolist() == [1.0] * 3


def test_compression_fp16_roundtrips_dtype():
    xs = all_inputs((4,), torch.float32, "comp")
    out = hvd.allreduce(xs[hvd.rank()], op=hvd.Sum, compression=hvd.Compression.fp16,
                        name="comp")
    assert_same(out, expected_reduce(xs, torch.float32, hvd.Sum))


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=dtype_id)
def test_scalar_average(dtype):
    t = torch.tensor(float(hvd.rank() + 1), dtype=dtype)
    out = hvd.allreduce(t, name=f"scalar.avg.{dtype_id(dtype)}")
    assert out.shape == ()
    expected = torch.tensor(sum(range(1, hvd.size() + 1)) / hvd.size(), dtype=dtype)
    assert_same(out, expected, exact=False)
