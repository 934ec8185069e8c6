"""op=hvd.Adasum: the pairwise rule with its weights, the rank-order tree (with the fold for
non-powers of two), fusion, dtypes, scaling, join, the delta optimizer and the argument rules.

Every rank rebuilds every rank's input from a seed and computes the expected
result locally with `_reference` (a plain float64 transcription of the rule
over the tree built from the rank count, each operand weighed by the number of
ranks under it, rounded to the engine's working type after each combination),
so the engine is checked against arithmetic it did not do.
"""

import contextlib
import hashlib
import math
import os
import sys

import pytest
import torch

import hvdcompat as hvd
from parallel_util import FLOAT_DTYPES, dtype_id, key_of, saved_environ

_MIN_NORM_SQ = math.sqrt(sys.float_info.min)


@contextlib.contextmanager
def engine_knobs(**knobs):
    """HVDCOMPAT_<KNOB>=value in the environment for the body (read by hvd.init)."""
    names = {f"HVDCOMPAT_{k.upper()}": str(v) for k, v in knobs.items()}
    with saved_environ(*names):
        os.environ.update(names)
        yield


def _combine(a, b, wa=1, wb=1):
    """Adasum of two float64 vectors (whole tensors, flattened) standing for wa and wb ranks."""
    dot, aa, bb = float((a * b).sum()), float((a * a).sum()), float((b * b).sum())
    ca = 1.0 - dot / aa * (wa / (wa + wb)) if aa >= _MIN_NORM_SQ else 1.0
    cb = 1.0 - dot / bb * (wb / (wa + wb)) if bb >= _MIN_NORM_SQ else 1.0
    return ca * a + cb * b


def _tree(n):
    """The combination tree of n ranks as nested (left, right) pairs of rank numbers: the first
    2E of N = P + E ranks pair up into leaves, and the P leaves split in halves, in rank order."""
    p = 1 << (n.bit_length() - 1)
    e = n - p
    leaves = [(2 * i, 2 * i + 1) for i in range(e)] + list(range(2 * e, n))

    def halves(nodes):
        return nodes[0] if len(nodes) == 1 else (halves(nodes[:len(nodes) // 2]),
                                                 halves(nodes[len(nodes) // 2:]))
    return halves(leaves)


def _ranks_under(node):
    return 1 if isinstance(node, int) else _ranks_under(node[0]) + _ranks_under(node[1])


def _reference(xs, dtype, pre=1.0, post=1.0):
    """The tree over the ranks, each operand weighed by its ranks; rounds like the engine."""
    work = torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype

    def rounded(v):
        return v.to(work).double()

    vals = [rounded(x.flatten().to(work) * torch.tensor(pre, dtype=work)) for x in xs]

    def value(node):
        if isinstance(node, int):
            return vals[node]
        left, right = node
        return rounded(_combine(value(left), value(right), _ranks_under(left),
                                _ranks_under(right)))

    out = value(_tree(len(xs))).to(work)
    if post != 1.0:
        out = out * torch.tensor(post, dtype=work)
    return out.to(dtype).reshape(xs[0].shape)


# Relative to the largest magnitude: Adasum's cancellations make elementwise
# relative error meaningless near zero.
_TOL = {torch.float16: 2e-3, torch.bfloat16: 1.6e-2, torch.float32: 2e-6, torch.float64: 1e-13}


def _assert_close(actual, expected, what):
    assert actual.dtype == expected.dtype, f"{what}: dtype {actual.dtype} != {expected.dtype}"
    assert actual.shape == expected.shape, f"{what}: shape {actual.shape} != {expected.shape}"
    tol = _TOL[actual.dtype]
    scale = max(float(expected.double().abs().max()) if expected.numel() else 0.0, 1e-30)
    err = float((actual.double() - expected.double()).abs().max()) if expected.numel() else 0.0
    assert err <= tol * scale, (f"{what} on rank {hvd.rank()}: max error {err:.3g} > "
                                f"{tol} x {scale:.3g}\nactual   {actual}\nexpected {expected}")


def _inputs(shape, dtype, key, lo=-1.0, hi=1.0):
    """Every rank's input: uniform in [lo, hi), rounded to `dtype`."""
    out = []
    for r in range(hvd.size()):
        g = torch.Generator().manual_seed(key_of(key, r))
        out.append((torch.rand(shape, generator=g, dtype=torch.float64) * (hi - lo) + lo)
                   .to(dtype))
    return out


# ----- the rule ---------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=dtype_id)
def test_orthogonal_inputs_give_the_sum(dtype):
    # Disjoint supports: every dot product is exactly 0, every coefficient 1.
    n = hvd.size()
    xs = []
    for r in range(n):
        x = torch.zeros(4 * n + 3, dtype=dtype)
        x[4 * r:4 * r + 4] = torch.arange(1, 5, dtype=dtype) * (r + 1)
        xs.append(x)
    out = hvd.allreduce(xs[hvd.rank()], op=hvd.Adasum, name=f"ad.orth.{dtype_id(dtype)}")
    assert torch.equal(out, sum(x.double() for x in xs).to(dtype)), out


def test_orthogonal_columns_give_the_sum():
    # Orthonormal columns of a QR factorisation: dot products of about 1e-16, not 0, and every
    # partial sum stays orthogonal to the other columns.
    g = torch.Generator().manual_seed(11)
    q, _ = torch.linalg.qr(torch.randn(300, hvd.size(), generator=g, dtype=torch.float64))
    out = hvd.allreduce(q[:, hvd.rank()].contiguous(), op=hvd.Adasum, name="ad.orth.qr")
    _assert_close(out, q.sum(1), "orthonormal columns")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=dtype_id)
@pytest.mark.parametrize("spread", [False, True], ids=["near", "spread"])
def test_parallel_inputs_give_the_mean(dtype, spread):
    # Every rank's vector is a multiple (either sign; with `spread`, magnitudes 1e-6 to 1e12)
    # of one vector. Each combination returns the mean of its operands weighed by their ranks
    # (Note [Adasum weights]), so the tree returns the mean over all ranks at any rank count:
    # at 3 ranks (r0 + r1 + r2)/3, where Horovod's unweighted rule gives r0/4 + r1/4 + r2/2.
    g = torch.Generator().manual_seed(7)
    v = torch.randn(257, generator=g, dtype=torch.float64)
    ks = [(-1) ** r * (10.0 ** (6 * r - 6) if spread else 0.5 + r) for r in range(hvd.size())]
    xs = [(k * v).to(dtype) for k in ks]
    out = hvd.allreduce(xs[hvd.rank()], op=hvd.Adasum,
                        name=f"ad.par.{dtype_id(dtype)}.{int(spread)}")
    _assert_close(out, torch.stack([x.double() for x in xs]).mean(0).to(dtype), "the mean")
    _assert_close(out, _reference(xs, dtype), "the reference tree")


def test_the_reference_tree_weighs_every_rank_alike():
    # The reference's own shape and weights for the documented rank counts (docs/adasum.md),
    # whatever this launch's size: parallel inputs average over all ranks.
    assert _tree(3) == ((0, 1), 2)
    assert _tree(5) == (((0, 1), 2), (3, 4))
    assert _tree(6) == (((0, 1), (2, 3)), (4, 5))
    assert _tree(8) == (((0, 1), (2, 3)), ((4, 5), (6, 7)))
    v = torch.linspace(-1.0, 2.0, 9, dtype=torch.float64)
    for n in range(2, 9):
        xs = [(r + 1.0) * v for r in range(n)]
        _assert_close(_reference(xs, torch.float64), (n + 1) / 2.0 * v, f"{n} parallel inputs")


def test_pairwise_rule_on_known_vectors():
    # a = (1, 0), b = (1, 1): a.b = 1, |a|^2 = 1, |b|^2 = 2 -> ca = 0.5, cb = 0.75.
    known = [torch.tensor([1.0, 0.0], dtype=torch.float64),
             torch.tensor([1.0, 1.0], dtype=torch.float64)]
    assert torch.equal(_combine(*known), torch.tensor([1.25, 0.75], dtype=torch.float64))
    xs = [known[r % 2] for r in range(hvd.size())]
    out = hvd.allreduce(xs[hvd.rank()], op=hvd.Adasum, name="ad.known")
    _assert_close(out, _reference(xs, torch.float64), "known vectors")
    if hvd.size() == 2:
        assert torch.equal(out, torch.tensor([1.25, 0.75], dtype=torch.float64))
    if hvd.size() == 3:
        # (r0 + r1) = (1.25, 0.75) stands for 2 ranks, r2 = (1, 0) for 1: a.b = 5/4,
        # |a|^2 = 17/8, |b|^2 = 1 -> ca = 1 - (2/3)(10/17) = 31/51, cb = 1 - (1/3)(5/4) = 7/12.
        _assert_close(out, torch.tensor([137 / 102, 31 / 68], dtype=torch.float64), "3 ranks")


def test_zero_vectors_keep_coefficient_one():
    # Only the last rank has data: zero vectors are Adasum's identity.
    n = hvd.size()
    x = torch.arange(1.0, 10.0) if hvd.rank() == n - 1 else torch.zeros(9)
    out = hvd.allreduce(x, op=hvd.Adasum, name="ad.zeros")
    assert torch.equal(out, torch.arange(1.0, 10.0))
    out = hvd.allreduce(torch.zeros(5), op=hvd.Adasum, name="ad.allzero")
    assert torch.equal(out, torch.zeros(5))


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=dtype_id)
def test_random_inputs_match_the_binary_tree(dtype):
    cases = []
    for shape in [(), (1,), (5,), (3, 7), (2, 3, 33), (1000,), (0,)]:
        xs = _inputs(shape, dtype, ("ad.rand", dtype_id(dtype), shape))
        name = f"ad.rand.{dtype_id(dtype)}.{'x'.join(map(str, shape))}"
        mine = xs[hvd.rank()].clone()
        cases.append((shape, xs, mine, hvd.allreduce_async(mine, op=hvd.Adasum, name=name)))
    for shape, xs, mine, h in cases:
        _assert_close(hvd.synchronize(h), _reference(xs, dtype), f"{dtype} {shape}")
        assert torch.equal(mine, xs[hvd.rank()]), "the input must stay unchanged"


def test_sync_async_and_in_place_forms_agree():
    xs = _inputs((4, 25), torch.float32, "ad.forms")
    expected = _reference(xs, torch.float32)
    mine = xs[hvd.rank()]
    _assert_close(hvd.allreduce(mine, op=hvd.Adasum, name="ad.f.sync"), expected, "sync")
    t = mine.clone()
    assert hvd.allreduce_(t, op=hvd.Adasum, name="ad.f.inplace") is t
    _assert_close(t, expected, "in place")
    t = mine.clone()
    hvd.synchronize(hvd.allreduce_async_(t, op=hvd.Adasum, name="ad.f.async_"))
    _assert_close(t, expected, "async in place")


def test_results_are_the_same_bits_on_either_controller():
    # One algorithm over either transport (Note [Adasum peers]): the digest of
    # these results is the same under mpirun and hvdcompatrun --gloo, which
    # tests/test_adasum_ranks.py checks across two launches.
    digest = hashlib.sha256()
    for dtype in FLOAT_DTYPES:
        shapes = [(1000,), (3, 7), (129,)]
        xss = [_inputs(s, dtype, ("ad.bits", dtype_id(dtype), s)) for s in shapes]
        outs = [hvd.allreduce(xs[hvd.rank()], op=hvd.Adasum,
                              name=f"ad.bits.{dtype_id(dtype)}.{i}")
                for i, xs in enumerate(xss)]
        outs += hvd.grouped_allreduce([xs[hvd.rank()] for xs in xss], op=hvd.Adasum,
                                      name=f"ad.bits.grp.{dtype_id(dtype)}")
        for out, xs in zip(outs, xss + xss):
            _assert_close(out, _reference(xs, dtype), f"{dtype} {tuple(xs[0].shape)}")
            digest.update(out.contiguous().flatten().view(torch.uint8).numpy().tobytes())
    print(f"ADASUM-BITS rank {hvd.rank()} of {hvd.size()}: {digest.hexdigest()}")


# ----- fusion: coefficients per tensor -----------------------------------------------------


def test_grouped_tensors_are_combined_one_by_one():
    shapes = [(3,), (17,), (1,), (4, 9), (64,)]
    # Different scales per tensor: one coefficient for the whole fused buffer
    # would not match the per-tensor reference.
    xss = [_inputs(s, torch.float32, ("ad.grp", i), lo=-10.0 ** i, hi=10.0 ** i)
           for i, s in enumerate(shapes)]
    mine = [xs[hvd.rank()] for xs in xss]
    outs = hvd.grouped_allreduce(mine, op=hvd.Adasum, name="ad.grouped")
    for i, (out, xs) in enumerate(zip(outs, xss)):
        _assert_close(out, _reference(xs, torch.float32), f"grouped tensor {i}")
    ins = [t.clone() for t in mine]
    hvd.grouped_allreduce_(ins, op=hvd.Adasum, name="ad.grouped_")
    for i, (out, xs) in enumerate(zip(ins, xss)):
        _assert_close(out, _reference(xs, torch.float32), f"grouped in place {i}")


# ----- scaling and dtypes -----------------------------------------------------------------


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=dtype_id)
def test_prescale_before_and_postscale_after(dtype):
    xs = _inputs((31,), dtype, ("ad.scale", dtype_id(dtype)))
    out = hvd.allreduce(xs[hvd.rank()], op=hvd.Adasum, prescale_factor=0.5, postscale_factor=3.0,
                        name=f"ad.scale.{dtype_id(dtype)}")
    _assert_close(out, _reference(xs, dtype, pre=0.5, post=3.0), "pre/postscale")
    # Adasum is scale-invariant in its coefficients: scaling moves the result alike.
    plain = _reference(xs, dtype).double()
    _assert_close(out, (plain * 1.5).to(dtype), "scale equivariance")


def test_norms_in_double_survive_float32_extremes():
    # Squared norms overflow (1e20) or underflow (1e-30) float32, not double.
    for scale, tag in [(1e20, "big"), (1e-30, "tiny")]:
        xs = [t * scale for t in _inputs((64,), torch.float32, ("ad.ext", tag))]
        out = hvd.allreduce(xs[hvd.rank()], op=hvd.Adasum, name=f"ad.ext.{tag}")
        assert torch.isfinite(out).all()
        _assert_close(out, _reference(xs, torch.float32), f"{tag} values")


def test_joined_rank_contributes_the_identity():
    last = hvd.size() - 1
    xs = _inputs((40,), torch.float32, "ad.join")
    if hvd.rank() == last:
        hvd.join()
        return
    out = hvd.allreduce(xs[hvd.rank()], op=hvd.Adasum, name="ad.join")
    zeroed = xs[:last] + [torch.zeros_like(xs[last])]
    _assert_close(out, _reference(zeroed, torch.float32), "with a joined rank")
    # The joined rank still counts for one rank, its share going to the operand it meets
    # (Note [Adasum weights]): at 3 ranks that is (r0 + r1), so parallel inputs give their mean.
    v = torch.linspace(-1.0, 1.0, 40, dtype=torch.float64)
    par = [((r + 1.0) * v).float() for r in range(last)]
    out = hvd.allreduce(par[hvd.rank()], op=hvd.Adasum, name="ad.join.par")
    _assert_close(out, _reference(par + [torch.zeros(40)], torch.float32), "parallel, joined")
    if hvd.size() == 3:
        _assert_close(out, (par[0] + par[1]) / 2, "parallel, rank 2 joined")
    hvd.join()


# ----- argument rules ---------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64, torch.uint8, torch.bool],
                         ids=dtype_id)
def test_non_floating_dtypes_are_a_type_error(dtype):
    t = torch.ones(3, dtype=dtype)
    with pytest.raises(TypeError, match=rf"allreduce 'allreduce\.ad\.int'.*Adasum.*{dtype_id(dtype)}"):
        hvd.allreduce(t, op=hvd.Adasum, name="ad.int")
    with pytest.raises(TypeError, match="Adasum"):
        hvd.grouped_allreduce([torch.ones(2), t], op=hvd.Adasum, name="ad.int.grp")
    # Nothing was enqueued: the name is free.
    assert hvd.allreduce(torch.ones(3), op=hvd.Adasum, name="ad.int").tolist() == [
        float(v) for v in _reference([torch.ones(3)] * hvd.size(), torch.float32).tolist()]


def test_reducescatter_refuses_adasum():
    with pytest.raises(NotImplementedError, match="Adasum"):
        hvd.reducescatter(torch.ones(4), op=hvd.Adasum, name="ad.rs")
    with pytest.raises(NotImplementedError, match="Adasum"):
        hvd.grouped_reducescatter([torch.ones(4)], op=hvd.Adasum, name="ad.grs")


# ----- the delta optimizer ----------------------------------------------------------------


def _model():
    torch.manual_seed(3)
    return torch.nn.Sequential(torch.nn.Linear(5, 4), torch.nn.Tanh(), torch.nn.Linear(4, 2))


def _batch(rank, step, k=0):
    g = torch.Generator().manual_seed(key_of("ad.opt", rank, step, k))
    return torch.randn(6, 5, generator=g), torch.randn(6, 2, generator=g)


def _local_updates(make_opt, start, rank, step, passes):
    """One rank's local step from `start`: the updates of every parameter."""
    model = _model()
    with torch.no_grad():
        for p, s in zip(model.parameters(), start):
            p.copy_(s)
    opt = make_opt(model.parameters())
    for k in range(passes):
        x, y = _batch(rank, step, k)
        torch.nn.functional.mse_loss(model(x), y).backward()
    opt.step()
    return [p.detach() - s for p, s in zip(model.parameters(), start)]


@pytest.mark.parametrize("passes,compression", [(1, "none"), (2, "none"), (1, "fp16")])
def test_delta_optimizer_combines_local_updates(passes, compression):
    make_opt = lambda params: torch.optim.SGD(params, lr=0.1)  # noqa: E731
    model = _model()
    opt = hvd.DistributedOptimizer(make_opt(model.parameters()),
                                   named_parameters=model.named_parameters(),
                                   op=hvd.Adasum, backward_passes_per_step=passes,
                                   compression=getattr(hvd.Compression, compression))
    assert isinstance(opt, torch.optim.SGD)
    for step in range(2):
        start = [p.detach().clone() for p in model.parameters()]
        for k in range(passes):
            x, y = _batch(hvd.rank(), step, k)
            torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        opt.zero_grad()
        updates = [_local_updates(make_opt, start, r, step, passes) for r in range(hvd.size())]
        for i, p in enumerate(model.parameters()):
            per_rank = [u[i] for u in updates]
            what = f"parameter {i} after step {step}"
            if compression == "fp16":
                # The update travels in float16: compare it at that precision.
                delta = _reference([d.half() for d in per_rank], torch.float16)
                _assert_close((p.detach() - start[i]).half(), delta, what)
            else:
                _assert_close(p.detach(), start[i] + _reference(per_rank, torch.float32), what)


def test_delta_optimizer_keeps_the_wrapped_rule_and_refuses_skip_synchronize():
    # Adam's moments are updated locally on each rank with its own gradient.
    make_opt = lambda params: torch.optim.Adam(params, lr=0.01)  # noqa: E731
    model = _model()
    opt = hvd.DistributedOptimizer(make_opt(model.parameters()),
                                   named_parameters=model.named_parameters(), op=hvd.Adasum)
    start = [p.detach().clone() for p in model.parameters()]
    x, y = _batch(hvd.rank(), 0)
    torch.nn.functional.mse_loss(model(x), y).backward()
    with pytest.raises(AssertionError, match="zero_grad"):
        opt.zero_grad()
    opt.step()
    updates = [_local_updates(make_opt, start, r, 0, 1) for r in range(hvd.size())]
    for i, p in enumerate(model.parameters()):
        expected = start[i] + _reference([u[i] for u in updates], torch.float32)
        _assert_close(p.detach(), expected, f"Adam parameter {i}")
    opt.synchronize()  # a no-op, as in Horovod
    with pytest.raises(AssertionError, match="Skipping synchronization"):
        with opt.skip_synchronize():
            pass


# ----- in a session with a batching window and a one-rank process set (last in the file:
# the module fixture re-initialises once and restores the plain session at the end) -------


@pytest.fixture(scope="module")
def windowed_session():
    """Re-initialised with a 50 ms cycle time (bursts fuse for certain) and set [0]."""
    hvd.shutdown()
    subset = hvd.ProcessSet([0])
    with engine_knobs(cycle_time=50):
        hvd.init(process_sets=[subset])
        try:
            yield subset
        finally:
            hvd.shutdown()
    hvd.init()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=dtype_id)
def test_many_async_tensors_fuse_and_stay_per_tensor(windowed_session, dtype):
    inputs = [_inputs((1 + 7 * i,), dtype, ("ad.many", i), lo=-(i + 1.0), hi=(i + 1.0) * 0.5)
              for i in range(24)]
    before = hvd.engine_stats()
    handles = [hvd.allreduce_async(xs[hvd.rank()], op=hvd.Adasum,
                                   name=f"ad.many.{dtype_id(dtype)}.{i}")
               for i, xs in enumerate(inputs)]
    outs = [hvd.synchronize(h) for h in handles]
    fused = hvd.engine_stats()["fused_tensors"] - before["fused_tensors"]
    assert fused >= 2, f"the burst was not fused ({fused} fused tensors)"
    for i, (xs, out) in enumerate(zip(inputs, outs)):
        _assert_close(out, _reference(xs, dtype), f"async tensor {i}")


def test_only_the_global_process_set(windowed_session):
    subset = windowed_session
    if subset.included():
        with pytest.raises(ValueError, match="non-global process sets") as info:
            hvd.allreduce(torch.ones(2), op=hvd.Adasum, name="ad.ps", process_set=subset)
        assert isinstance(info.value, NotImplementedError)  # Horovod's type, too
        model = torch.nn.Linear(2, 1)
        with pytest.raises(NotImplementedError, match="non-global process sets"):
            hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                     op=hvd.Adasum, process_set=subset)
    out = hvd.allreduce(torch.ones(2), op=hvd.Adasum, name="ad.ps.global")
    assert out.tolist() == _reference([torch.ones(2)] * hvd.size(), torch.float32).tolist()
