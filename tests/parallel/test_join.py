"""join: joined ranks contribute zeros to allreduce; other collectives fail while joined.

A join round: one rank joins at once, the others keep working and join
later. Every rank runs every round, so the collectives inside the
``rank == first`` branches are matched by the engine's join protocol.
"""

import pytest
import torch

import hvdcompat as hvd
from parallel_util import DTYPES, all_inputs, assert_same, dtype_id, expected_reduce


def _agree_on(ret):
    """Every rank's join() result, gathered (all ranks must report the same one)."""
    return hvd.allgather(torch.tensor([ret], dtype=torch.int64), name="join.agree").tolist()


def _check_last_rank(ret, first):
    assert isinstance(ret, int)
    everyone = _agree_on(ret)
    assert len(set(everyone)) == 1, f"ranks disagree on the last rank to join: {everyone}"
    # The first rank joined before anyone else, so it cannot be the last
    # (with two ranks, the last is exactly the other one).
    assert ret != first and 0 <= ret < hvd.size()
    if hvd.size() == 2:
        assert ret == 1 - first


@pytest.mark.parametrize("cached", [False, True], ids=["uncached", "cached"])
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_joined_rank_contributes_zeros(dtype, cached):
    n = hvd.size()
    shape = (2, 3)
    for rnd in range(2):
        for first in range(n):
            suffix = f"{dtype_id(dtype)}" if cached else f"{dtype_id(dtype)}.{rnd}.{first}"
            xs = all_inputs(shape, dtype, ("join", dtype_id(dtype), rnd, first))
            if cached and rnd == 0 and first == 0:
                # Put the names in every rank's response cache first.
                hvd.allreduce(xs[hvd.rank()], op=hvd.Sum, name=f"join.sum.{suffix}")
                hvd.allreduce(xs[hvd.rank()], op=hvd.Average, name=f"join.avg.{suffix}")
            others = [x if r != first else torch.zeros_like(x) for r, x in enumerate(xs)]
            if hvd.rank() == first:
                ret = hvd.join()
            else:
                total = hvd.allreduce(xs[hvd.rank()], op=hvd.Sum, name=f"join.sum.{suffix}")
                assert_same(total, expected_reduce(others, dtype, hvd.Sum),
                            what=f"sum with rank {first} joined")
                avg = hvd.allreduce(xs[hvd.rank()], op=hvd.Average, name=f"join.avg.{suffix}")
                # Average divides by the full size, joined ranks included.
                assert_same(avg, expected_reduce(others, dtype, hvd.Average, size=n),
                            exact=not dtype.is_floating_point,
                            what=f"average with rank {first} joined")
                ret = hvd.join()
            _check_last_rank(ret, first)


def test_joined_rank_contributes_to_many_async_ops_and_grouped():
    n = hvd.size()
    for first in range(n):
        xs = [all_inputs((i + 1,), torch.float32, ("join-many", first, i)) for i in range(8)]
        gs = [all_inputs((2, 2), torch.int32, ("join-grp", first, i)) for i in range(2)]
        if hvd.rank() == first:
            ret = hvd.join()
        else:
            handles = [hvd.allreduce_async(x[hvd.rank()], op=hvd.Sum,
                                           name=f"join.many.{first}.{i}")
                       for i, x in enumerate(xs)]
            grouped = hvd.grouped_allreduce([g[hvd.rank()] for g in gs], op=hvd.Sum,
                                            name=f"join.grp.{first}")
            for x, h in zip(xs, handles):
                zeroed = [t if r != first else torch.zeros_like(t) for r, t in enumerate(x)]
                assert_same(hvd.synchronize(h), expected_reduce(zeroed, torch.float32, hvd.Sum))
            for g, out in zip(gs, grouped):
                zeroed = [t if r != first else torch.zeros_like(t) for r, t in enumerate(g)]
                assert_same(out, expected_reduce(zeroed, torch.int32, hvd.Sum))
            ret = hvd.join()
        _check_last_rank(ret, first)


def _allgather(first):
    return hvd.allgather(torch.ones(2, 2), name=f"join.ag.{first}")


def _broadcast(first):
    return hvd.broadcast(torch.ones(2), root_rank=(first + 1) % hvd.size(),
                         name=f"join.bc.{first}")


def _alltoall(first):
    return hvd.alltoall(torch.ones(hvd.size()), name=f"join.a2a.{first}")


def _reducescatter(first):
    return hvd.reducescatter(torch.ones(hvd.size() * 2), name=f"join.rs.{first}")


@pytest.mark.parametrize("cached", [False, True], ids=["uncached", "cached"])
@pytest.mark.parametrize("collective", [_allgather, _broadcast, _alltoall, _reducescatter],
                         ids=lambda f: f.__name__.strip("_"))
def test_other_collectives_fail_on_the_ranks_still_working(collective, cached):
    n = hvd.size()
    for first in range(n):
        if cached:
            # The same call on every rank first, so the name is in every cache.
            collective(first)
        if hvd.rank() == first:
            ret = hvd.join()
        else:
            with pytest.raises(hvd.HorovodInternalError, match="join") as info:
                collective(first)
            assert str(first) in str(info.value)
            ret = hvd.join()
        _check_last_rank(ret, first)
    # The job keeps working after the failed ops and the join.
    out = hvd.allreduce(torch.ones(3), op=hvd.Sum, name="join.after")
    assert out.tolist() == [float(n)] * 3


def test_join_with_nothing_else_returns_a_rank_everyone_agrees_on():
    for _ in range(3):
        ret = hvd.join()
        everyone = _agree_on(ret)
        assert len(set(everyone)) == 1 and 0 <= ret < hvd.size()


def test_uneven_number_of_steps_then_join():
    # The usual use: rank r has r + 1 batches; averages keep dividing by size.
    n = hvd.size()
    steps = hvd.rank() + 1
    for step in range(steps):
        out = hvd.allreduce(torch.ones(4), op=hvd.Sum, name="join.uneven")
        still_working = sum(1 for r in range(n) if r + 1 > step)
        assert out.tolist() == [float(still_working)] * 4
    ret = hvd.join()
    assert _agree_on(ret) == [n - 1] * n


@pytest.mark.parametrize("op", ["allgather", "broadcast", "alltoall"])
def test_unnamed_non_allreduce_ops_fail_while_a_rank_is_joined(op):
    # The rank that joins first skips one unnamed op per round, so the ranks'
    # unnamed-op counters drift apart: with 3 ranks the two callers name their
    # op differently and each must still get the error instead of a hang.
    n, r = hvd.size(), hvd.rank()
    if n == 1:
        pytest.skip("needs a second rank")
    t = torch.ones(2 * n, 3)
    calls = {
        "allgather": lambda: hvd.allgather(t),
        "broadcast": lambda: hvd.broadcast(t, root_rank=r),
        "alltoall": lambda: hvd.alltoall(t),
    }
    for first in range(n):
        if r != first:
            with pytest.raises(RuntimeError, match=r"hvd\.join\(\)"):
                calls[op]()
        hvd.join()
    # Still usable afterwards.
    assert hvd.allreduce(torch.ones(1), op=hvd.Sum, name="after_join").item() == n
