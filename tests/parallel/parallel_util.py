"""Shared inputs and reference arithmetic for the parallel collective tests.

Every rank can rebuild every other rank's input (`rank_input` is a pure
function of rank, shape, dtype and a key), so each test computes its
expectation locally and independently of the engine. The reference
arithmetic follows the engine's documented rules: integers are scaled by a
double multiply truncated toward zero (Horovod's rule, so integer Average is
trunc(sum / size)); float16/bfloat16 are reduced and scaled in float32 and
rounded once at the end; float32/float64 are scaled in their own precision.
"""

import contextlib
import os
import zlib

import torch

import hvdcompat as hvd

__all__ = [
    "INT_DTYPES", "FLOAT_DTYPES", "DTYPES", "SHAPES", "NONSCALAR_SHAPES", "dtype_id",
    "shape_id", "key_of", "rank_input", "all_inputs", "scale", "expected_sum", "expected_reduce",
    "assert_same", "engine", "default_group",
]

INT_DTYPES = [torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64]
FLOAT_DTYPES = [torch.float16, torch.bfloat16, torch.float32, torch.float64]
DTYPES = INT_DTYPES + FLOAT_DTYPES

# A scalar, 1-D, 2-D, 3-D, and two zero-size shapes.
SHAPES = [(), (7,), (3, 4), (2, 3, 2), (0,), (2, 0, 3)]
NONSCALAR_SHAPES = [s for s in SHAPES if len(s) > 0]


def dtype_id(dtype):
    return str(dtype).replace("torch.", "")


def shape_id(shape):
    return "x".join(map(str, shape)) if shape else "scalar"


def key_of(*parts):
    """A stable integer from the parts (seeds the per-rank inputs)."""
    return zlib.crc32(repr(parts).encode())


def rank_input(rank, shape, dtype, key, lo=-5, hi=6):
    """Rank `rank`'s input: small integers in [lo, hi) (>= 0 for uint8), exact in every dtype."""
    g = torch.Generator().manual_seed(key_of(key, rank))
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=g).bool()
    if dtype == torch.uint8:
        lo = max(lo, 0)
    return torch.randint(lo, hi, shape, generator=g, dtype=torch.int64).to(dtype)


def all_inputs(shape, dtype, key, ranks=None, **kw):
    """Every listed rank's input (default: all ranks of the job), in rank order."""
    ranks = range(hvd.size()) if ranks is None else ranks
    return [rank_input(r, shape, dtype, key, **kw) for r in ranks]


def _acc(dtype):
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


def scale(x, factor, dtype):
    """One rank-side multiply as the engine does it, in its accumulation dtype."""
    if not dtype.is_floating_point:
        return (x.double() * factor).trunc().to(torch.int64)
    acc = _acc(dtype)
    return x.to(acc) * torch.tensor(factor, dtype=acc)


def expected_sum(xs, dtype, op=hvd.Sum, prescale=1.0, postscale=1.0, size=None):
    """Sum or Average of `xs` with pre/postscale, rounded to `dtype` once."""
    size = len(xs) if size is None else size
    post = postscale / size if op == hvd.Average else postscale
    total = sum(scale(x, prescale, dtype) for x in xs)
    if not dtype.is_floating_point:
        return (total.double() * post).trunc().to(dtype)
    if op == hvd.Average and dtype == torch.float32:
        # Average's factor (postscale / size) is applied in double, rounded once.
        return (total.double() * post).to(dtype)
    acc = _acc(dtype)
    return (total.to(acc) * torch.tensor(post, dtype=acc)).to(dtype)


def expected_reduce(xs, dtype, op, prescale=1.0, postscale=1.0, size=None):
    """Reference for any allreduce op (Sum, Average, Min, Max, Product)."""
    if op in (hvd.Sum, hvd.Average):
        return expected_sum(xs, dtype, op, prescale, postscale, size)
    if dtype == torch.bool:
        stacked = torch.stack([x.to(torch.uint8) for x in xs])
    else:
        stacked = torch.stack([scale(x, prescale, dtype) for x in xs])
    if op == hvd.Min:
        out = stacked.amin(0)
    elif op == hvd.Max:
        out = stacked.amax(0)
    elif op == hvd.Product:
        out = stacked.prod(0)
    else:
        raise AssertionError(f"no reference for op {op}")
    if dtype == torch.bool:
        return out.bool()
    if not dtype.is_floating_point:
        return (out.double() * postscale).trunc().to(dtype)
    acc = _acc(dtype)
    return (out.to(acc) * torch.tensor(postscale, dtype=acc)).to(dtype)


def assert_same(actual, expected, exact=True, what=""):
    """Same dtype, shape and values (bitwise-equal values when `exact`)."""
    assert isinstance(actual, torch.Tensor), f"{what}: expected a tensor, got {type(actual)}"
    assert actual.dtype == expected.dtype, f"{what}: dtype {actual.dtype} != {expected.dtype}"
    assert tuple(actual.shape) == tuple(expected.shape), \
        f"{what}: shape {tuple(actual.shape)} != {tuple(expected.shape)}"
    if exact:
        assert torch.equal(actual, expected), \
            f"{what} on rank {hvd.rank()}:\nactual   {actual}\nexpected {expected}"
    else:
        # Relative to the dtype's precision, allowing a couple of roundings.
        tol = _TOLERANCE[actual.dtype]
        ok = torch.allclose(actual.double(), expected.double(), rtol=tol, atol=tol)
        assert ok, (f"{what} on rank {hvd.rank()} (tolerance {tol}):\nactual   {actual}\n"
                    f"expected {expected}")


# torch.testing.assert_close costs seconds on first use; this is enough here.
_TOLERANCE = {torch.float16: 2e-3, torch.bfloat16: 1.6e-2, torch.float32: 1e-5,
              torch.float64: 1e-12}


@contextlib.contextmanager
def saved_environ(*names):
    """Restores the environment variables `names` (their values, or their absence) on exit."""
    saved = {k: os.environ.get(k) for k in names}
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@contextlib.contextmanager
def restarted(env):
    """Runs the body on an engine re-initialised with the variables `env` set.

    The launch's environment and engine are restored afterwards. Collective:
    every rank must enter it together.
    """
    hvd.shutdown()
    with saved_environ(*env):
        os.environ.update(env)
        hvd.init()
        try:
            yield
        finally:
            hvd.shutdown()
    hvd.init()


@contextlib.contextmanager
def engine(**knobs):
    """Runs the body on an engine re-initialised with HVDCOMPAT_<KNOB>=value.

    Knobs are read at hvd.init(); the launch settings are restored (and the
    engine re-initialised again) afterwards. Collective: every rank must
    enter it together. Yields the engine's configuration.
    """
    from hvdcompat.basics import _core

    with restarted({f"HVDCOMPAT_{k.upper()}": str(v) for k, v in knobs.items()}):
        yield _core.config()


@contextlib.contextmanager
def default_group(backend):
    """torch.distributed's default group on `backend`, at a rendezvous port of its own.

    Files of one launch share the environment the DDP bootstrap filled, and so
    its MASTER_PORT: a rank that reached the next file's init_process_group
    could join rank 0's store of the previous file before rank 0 closed it,
    and lose it mid-handshake. Rank 0 picks a free port for each group and
    broadcasts it. Collective: every rank must enter it together.
    """
    import torch.distributed as dist

    from hvdcompat.common.ports import free_port

    port = hvd.broadcast_object(free_port() if hvd.rank() == 0 else None, root_rank=0,
                                name=f"default_group.{backend}.port")
    with saved_environ("MASTER_PORT"):
        os.environ["MASTER_PORT"] = str(port)
        dist.init_process_group(backend)
        try:
            yield
        finally:
            dist.destroy_process_group()
