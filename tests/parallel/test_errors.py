"""Errors: cross-rank mismatches fail every rank with a useful message; caller mistakes
fail at call time with nothing enqueued; the job keeps working afterwards."""

import re
import time

import pytest
import torch

import hvdcompat as hvd
from parallel_util import engine


def _still_works(tag):
    out = hvd.allreduce(torch.ones(3), op=hvd.Sum, name=f"errors.after.{tag}")
    assert out.tolist() == [float(hvd.size())] * 3


def _assert_names_values_by_rank(message, op, name, value_of_rank):
    """The message names the op, the tensor and each rank's conflicting value."""
    assert op in message.lower(), message
    assert name in message, message
    for r in range(hvd.size()):
        value = re.escape(value_of_rank(r))
        # "rank 1: float32" or "ranks 0, 2: int32"
        pattern = rf"ranks? (\d+, )*{r}(, \d+)*: {value}"
        assert re.search(pattern, message), f"rank {r}'s value missing in: {message}"


def _mismatch(run, op, name, value_of_rank):
    with pytest.raises(hvd.HorovodInternalError) as info:
        run()
    assert isinstance(info.value, RuntimeError)
    _assert_names_values_by_rank(str(info.value), op, name, value_of_rank)
    _still_works(name)


def _parity_dtype(r):
    return torch.int32 if r % 2 == 0 else torch.float32


def test_dtype_mismatch_allreduce():
    t = torch.ones(4, dtype=_parity_dtype(hvd.rank()))
    _mismatch(lambda: hvd.allreduce(t, name="err.dtype"), "allreduce", "err.dtype",
              lambda r: str(_parity_dtype(r)).replace("torch.", ""))


@pytest.mark.parametrize("op", ["allgather", "broadcast", "alltoall", "reducescatter"])
def test_dtype_mismatch_other_ops(op):
    t = torch.ones(2 * hvd.size(), dtype=_parity_dtype(hvd.rank()))
    name = f"err.dtype.{op}"
    run = {"allgather": lambda: hvd.allgather(t, name=name),
           "broadcast": lambda: hvd.broadcast(t, 0, name=name),
           "alltoall": lambda: hvd.alltoall(t, name=name),
           "reducescatter": lambda: hvd.reducescatter(t, name=name)}[op]
    _mismatch(run, op, name, lambda r: str(_parity_dtype(r)).replace("torch.", ""))


def test_shape_mismatch_allreduce():
    shape = lambda r: [17 + r] * 3  # noqa: E731
    t = torch.ones(*shape(hvd.rank()))
    _mismatch(lambda: hvd.allreduce(t, name="err.shape"), "allreduce", "err.shape",
              lambda r: str(shape(r)))
    # Same number of elements, different shape: still a mismatch.
    t = torch.ones(17, 23 * 57) if hvd.rank() == 0 else torch.ones(17, 23, 57)
    with pytest.raises(hvd.HorovodInternalError, match="shape"):
        hvd.allreduce(t, name="err.shape2")
    _still_works("shape2")


def test_shape_mismatch_broadcast_and_reducescatter():
    shape = lambda r: [3, 10 * (r + 1)]  # noqa: E731
    t = torch.ones(*shape(hvd.rank()))
    _mismatch(lambda: hvd.broadcast(t, 0, name="err.shape.bc"), "broadcast", "err.shape.bc",
              lambda r: str(shape(r)))
    _mismatch(lambda: hvd.reducescatter(t, name="err.shape.rs"), "reducescatter",
              "err.shape.rs", lambda r: str(shape(r)))


def test_trailing_dimension_mismatch_allgather_and_alltoall():
    n = hvd.size()
    t = torch.ones(2 * n, 10 * (hvd.rank() + 1))
    with pytest.raises(hvd.HorovodInternalError) as info:
        hvd.allgather(t, name="err.ag.dims")
    msg = str(info.value)
    assert "allgather" in msg and "err.ag.dims" in msg and "10" in msg and "20" in msg
    _still_works("ag.dims")
    with pytest.raises(hvd.HorovodInternalError) as info:
        hvd.alltoall(t, name="err.a2a.dims")
    msg = str(info.value)
    assert "alltoall" in msg and "err.a2a.dims" in msg and "10" in msg and "20" in msg
    _still_works("a2a.dims")
    # A different number of dimensions is a mismatch too.
    t = torch.ones(2, 2) if hvd.rank() == 0 else torch.ones(2, 2, 1)
    with pytest.raises(hvd.HorovodInternalError, match="err.ag.ndim"):
        hvd.allgather(t, name="err.ag.ndim")
    _still_works("ag.ndim")


def test_reduce_op_mismatch():
    op = lambda r: hvd.Sum if r % 2 == 0 else hvd.Max  # noqa: E731
    _mismatch(lambda: hvd.allreduce(torch.ones(3), op=op(hvd.rank()), name="err.op"),
              "allreduce", "err.op", lambda r: "Sum" if r % 2 == 0 else "Max")


def test_root_mismatch():
    _mismatch(lambda: hvd.broadcast(torch.ones(3), hvd.rank(), name="err.root"), "broadcast",
              "err.root", lambda r: str(r))


@pytest.mark.parametrize("which", ["prescale", "postscale"])
def test_scale_factor_mismatch(which):
    kw = {f"{which}_factor": 1.0 + hvd.rank()}

    def factors(r):
        pre, post = (1 + r, 1) if which == "prescale" else (1, 1 + r)
        return f"prescale {pre}, postscale {post}"

    _mismatch(lambda: hvd.allreduce(torch.ones(3), op=hvd.Sum, name=f"err.{which}", **kw),
              "allreduce", f"err.{which}", factors)
    _mismatch(lambda: hvd.reducescatter(torch.ones(2 * hvd.size()), op=hvd.Sum,
                                        name=f"err.rs.{which}", **kw),
              "reducescatter", f"err.rs.{which}", factors)


def test_group_length_mismatch():
    tensors = [torch.ones(2)] * (2 + hvd.rank() % 2)
    with pytest.raises(hvd.HorovodInternalError, match="err.group"):
        hvd.grouped_allreduce(tensors, name="err.group")
    _still_works("group")


def test_mismatch_in_a_batch_fails_only_that_tensor():
    n = hvd.size()
    good1 = hvd.allreduce_async(torch.ones(4), op=hvd.Sum, name="err.batch.good1")
    bad = hvd.allreduce_async(torch.ones(4 + hvd.rank()), op=hvd.Sum, name="err.batch.bad")
    good2 = hvd.allreduce_async(torch.ones(2, dtype=torch.int64), op=hvd.Sum,
                                name="err.batch.good2")
    assert hvd.synchronize(good2).tolist() == [n, n]
    with pytest.raises(hvd.HorovodInternalError, match="err.batch.bad"):
        hvd.synchronize(bad)
    assert hvd.synchronize(good1).tolist() == [float(n)] * 4


def test_repeated_mismatch_on_a_cached_name():
    # The name is first cached with a good shape; later mismatches must not
    # be served from the cache.
    for i in range(3):
        _still_works("cached")
        t = torch.ones(3 + (hvd.rank() if i % 2 else 0))
        if i % 2:
            with pytest.raises(hvd.HorovodInternalError, match="err.cached"):
                hvd.allreduce(t, op=hvd.Sum, name="err.cached")
        else:
            assert hvd.allreduce(t, op=hvd.Sum, name="err.cached").tolist() == [
                float(hvd.size())] * 3


@pytest.mark.parametrize("op", ["allreduce", "allgather", "broadcast", "reducescatter"])
def test_duplicate_in_flight_name_is_a_value_error(op):
    n = hvd.size()

    def start(owner):
        name = f"err.dup.{op}.{owner}"
        t = torch.full((2 * n,), float(owner))
        return {"allreduce": lambda: hvd.allreduce_async(t, op=hvd.Sum, name=name),
                "allgather": lambda: hvd.allgather_async(t, name=name),
                "broadcast": lambda: hvd.broadcast_async(t, owner, name=name),
                "reducescatter": lambda: hvd.reducescatter_async(t, op=hvd.Sum,
                                                                 name=name)}[op]()

    def expected(owner):
        return {"allreduce": [float(owner * n)] * 2 * n, "allgather": [float(owner)] * 2 * n * n,
                "broadcast": [float(owner)] * 2 * n, "reducescatter": [float(owner * n)] * 2}[op]

    # No other rank submits this rank's name before the barrier, so the
    # first op is surely still in flight when the second call comes.
    mine = start(hvd.rank())
    with pytest.raises(ValueError, match="same name"):
        start(hvd.rank())
    hvd.barrier()
    handles = {hvd.rank(): mine}
    handles.update({q: start(q) for q in range(n) if q != hvd.rank()})
    for q, h in handles.items():
        assert hvd.synchronize(h).tolist() == expected(q)
    # The rejected call left nothing behind: every name is free again.
    handles = {q: start(q) for q in range(n)}
    for q, h in handles.items():
        assert hvd.synchronize(h).tolist() == expected(q)


@pytest.mark.parametrize("op", ["allreduce", "allgather", "broadcast", "reducescatter"])
def test_horovods_duplicate_name_pattern_is_refused_every_time(op):
    # Horovod's own test: rank 0 submits a name twice, then (after a barrier)
    # the other ranks do. Their first op matches rank 0's pending one and may
    # finish at once, yet their second call must still be refused: the name
    # is taken until its handle is synchronized.
    t = torch.ones(2 * hvd.size())
    start = {"allreduce": lambda name: hvd.allreduce_async(t, name=name),
             "allgather": lambda name: hvd.allgather_async(t, name=name),
             "broadcast": lambda name: hvd.broadcast_async(t, 0, name=name),
             "reducescatter": lambda name: hvd.reducescatter_async(t, name=name)}[op]
    for trial in range(20):
        name = f"err.dup.pattern.{trial}"
        for turn in (0, 1):
            if (hvd.rank() == 0) == (turn == 0):
                first = start(name)
                with pytest.raises(ValueError, match="same name"):
                    start(name)
            hvd.barrier()
        if hvd.rank() == 0:
            # Rank 0's op was matched by the others' first call.
            assert hvd.synchronize(first) is not None
    _still_works(f"dup.pattern.{op}")


_CALL_OPS = ["allreduce", "allreduce_", "allgather", "broadcast", "broadcast_", "alltoall",
             "reducescatter", "grouped_allreduce"]


def _calls(t, name):
    n = hvd.size()
    return {
        "allreduce": lambda: hvd.allreduce(t, name=name),
        "allreduce_": lambda: hvd.allreduce_(t, name=name),
        "allgather": lambda: hvd.allgather_async(t, name=name),
        "broadcast": lambda: hvd.broadcast(t, 0, name=name),
        "broadcast_": lambda: hvd.broadcast_(t, 0, name=name),
        "alltoall": lambda: hvd.alltoall(t, splits=[1] * n, name=name),
        "reducescatter": lambda: hvd.reducescatter(t, name=name),
        "grouped_allreduce": lambda: hvd.grouped_allreduce([t], name=name),
    }


@pytest.mark.parametrize("op", _CALL_OPS)
def test_non_contiguous_input_is_a_value_error(op):
    t = torch.ones(2 * hvd.size(), 3).t()
    assert not t.is_contiguous()
    with pytest.raises(ValueError, match="contiguous"):
        _calls(t, "err.noncontig")[op]()
    _still_works(f"noncontig.{op}")


@pytest.mark.parametrize("dtype", [torch.complex64, torch.complex128], ids=str)
@pytest.mark.parametrize("op", _CALL_OPS)
def test_unsupported_dtype_is_a_type_error(op, dtype):
    t = torch.ones(2 * hvd.size(), dtype=dtype)
    with pytest.raises(TypeError, match="not supported"):
        _calls(t, "err.dtype.unsupported")[op]()
    _still_works(f"unsupported.{op}")


def test_root_out_of_range_is_a_value_error():
    for root in (-1, hvd.size(), 100):
        with pytest.raises(ValueError, match=str(root)):
            hvd.broadcast(torch.ones(2), root, name="err.root.range")
    _still_works("root.range")


@pytest.mark.parametrize("op", _CALL_OPS)
def test_non_tensor_input_is_a_type_error(op):
    with pytest.raises(TypeError, match="Tensor"):
        _calls([1.0, 2.0], "err.list")[op]()
    _still_works(f"list.{op}")


@pytest.mark.parametrize("cached", [False, True])
def test_stalled_ops_fail_after_the_stall_shutdown_time(cached):
    # HOROVOD_STALL_SHUTDOWN_TIME_SECONDS turns an op the other ranks never
    # submit into an error instead of a hang; as in Horovod, the engine then
    # shuts down (later ops fail with the same explanation) until hvd.init().
    n = hvd.size()
    with engine(stall_check_time_seconds=1, stall_shutdown_time_seconds=1):
        if cached:
            # Names in every rank's response cache: a stalled cached op fails too.
            for q in range(n):
                hvd.allreduce(torch.ones(1), op=hvd.Sum, name=f"stall.{q}")
        lonely = hvd.allreduce_async(torch.ones(1), op=hvd.Sum, name=f"stall.{hvd.rank()}")
        with pytest.raises(hvd.HorovodInternalError, match="STALL_SHUTDOWN_TIME") as info:
            hvd.synchronize(lonely)
        assert f"stall.{hvd.rank()}" in str(info.value)
        with pytest.raises(hvd.HorovodInternalError, match="STALL_SHUTDOWN_TIME"):
            hvd.allreduce(torch.ones(1), name="stall.after")
    _still_works("stall.reinit")


def test_a_late_rank_is_not_mistaken_for_a_stall():
    # Ranks other than 0 arrive 2 s late, inside the 4 s shutdown limit; while
    # they sleep, rank 0 waits inside negotiation (and logs a stall warning).
    # Nothing is cancelled, and what the late ranks then submit out of order
    # (second, then first) is not counted from rank 0's earlier wait.
    with engine(stall_check_time_seconds=1, stall_shutdown_time_seconds=4):
        n = hvd.size()
        if hvd.rank() == 0:
            first = hvd.allreduce_async(torch.ones(1), op=hvd.Sum, name="late.first")
            assert hvd.synchronize(first).item() == n
            second = hvd.allreduce_async(torch.ones(1), op=hvd.Sum, name="late.second")
            assert hvd.synchronize(second).item() == n
        else:
            time.sleep(2)
            second = hvd.allreduce_async(torch.ones(1), op=hvd.Sum, name="late.second")
            first = hvd.allreduce_async(torch.ones(1), op=hvd.Sum, name="late.first")
            assert hvd.synchronize(first).item() == n
            assert hvd.synchronize(second).item() == n
