"""Tensor fusion and the response cache, observed through hvd.engine_stats().

The file adapts to the engine configuration it was launched with
(HOROVOD_FUSION_THRESHOLD, HOROVOD_CACHE_CAPACITY; tests/test_parallel_env.py
launches it with fusion and with the cache disabled). Tests that need a
particular setting re-initialise with HVDCOMPAT_* overrides (read at init)
and restore the launch settings afterwards; every rank does the same.
"""

import os

import pytest
import torch

import hvdcompat as hvd
from hvdcompat.basics import _core
from parallel_util import all_inputs, assert_same, engine, expected_reduce, rank_input

# A batching window (ms) long enough that a burst of async ops submitted by
# Python lands in one negotiation cycle on every rank, so fusion is certain
# rather than a matter of timing.
_WINDOW_MS = 100


def _delta(before):
    after = hvd.engine_stats()
    return {k: after[k] - before[k] for k in before}


def _burst(tag):
    """A mixed burst of collectives: [(submit, expected, exact)], inputs built up front."""
    n, me = hvd.size(), hvd.rank()
    jobs = []

    def allreduce(x, name, **kw):
        return lambda: hvd.allreduce_async(x, name=f"{tag}.{name}", **kw)

    # Small float32 and int32 allreduces (fusable with their own kind).
    for i in range(24):
        xs = all_inputs((i % 5 + 1, 3), torch.float32, ("burst-f", i))
        jobs.append((allreduce(xs[me], f"f.{i}", op=hvd.Sum),
                     expected_reduce(xs, torch.float32, hvd.Sum), True))
    for i in range(8):
        xs = all_inputs((7,), torch.int32, ("burst-i", i))
        jobs.append((allreduce(xs[me], f"i.{i}", op=hvd.Average),
                     expected_reduce(xs, torch.int32, hvd.Average), True))
    # 16-bit floats are reduced in float32; one tensor spans several chunks.
    for i, numel in enumerate([5, 700_000, 9]):
        xs = all_inputs((numel,), torch.float16, ("burst-h", i))
        jobs.append((allreduce(xs[me], f"h.{i}", op=hvd.Average, postscale_factor=0.7),
                     expected_reduce(xs, torch.float16, hvd.Average, postscale=0.7), False))
    # A large float32 tensor (reduced in place) between small ones.
    xs = all_inputs((300_000,), torch.float32, "burst-big")
    jobs.append((allreduce(xs[me], "big", op=hvd.Average),
                 expected_reduce(xs, torch.float32, hvd.Average), False))
    for i in range(6):
        rows = [r + i % 3 + (200_000 if i == 3 else 0) for r in range(n)]
        xs = [rank_input(r, (rows[r], 2), torch.int16, ("burst-ag", i)) for r in range(n)]
        jobs.append((lambda x=xs[me], i=i: hvd.allgather_async(x, name=f"{tag}.ag.{i}"),
                     torch.cat(xs), True))
    for i, numel in enumerate([2, 3, 300_000, 4, 5, 6]):
        # One broadcast spans several fusion chunks.
        x = rank_input(me, (numel,), torch.float64, ("burst-bc", i))
        jobs.append((lambda x=x, i=i: hvd.broadcast_async(x, 0, name=f"{tag}.bc.{i}"),
                     rank_input(0, (numel,), torch.float64, ("burst-bc", i)), True))
    for i, rows in enumerate([n, n + 1, 100_000, n + 3, 1, n + 5]):
        xs = all_inputs((rows, 2), torch.float32, ("burst-rs", i))
        full = expected_reduce(xs, torch.float32, hvd.Sum)
        q, m = divmod(full.shape[0], n)
        start = me * q + min(me, m)
        jobs.append((lambda x=xs[me], i=i: hvd.reducescatter_async(x, op=hvd.Sum,
                                                                   name=f"{tag}.rs.{i}"),
                     full[start:start + q + (1 if me < m else 0)], True))
    return jobs


def _run_burst(tag):
    jobs = _burst(tag)
    before = hvd.engine_stats()
    # Submitted back to back, so the batching window holds the whole burst.
    handles = [submit() for submit, _, _ in jobs]
    results = []
    for h, (_, expected, exact) in zip(handles, jobs):
        out = hvd.synchronize(h)
        assert_same(out, expected, exact=exact, what=tag)
        results.append(out)
    return results, _delta(before)


def test_many_small_tensors_are_fused():
    with engine(cycle_time=_WINDOW_MS) as config:
        _, stats = _run_burst("fuse")
        if config["fusion_threshold_bytes"] == 0:
            assert stats["fused_collectives"] == 0 and stats["fused_tensors"] == 0, stats
            assert stats["collectives"] == stats["tensors"], stats
        else:
            assert stats["fused_collectives"] >= 1, stats
            assert stats["fused_tensors"] >= 2 * stats["fused_collectives"], stats
            # Far fewer collectives ran than tensors were reduced.
            assert stats["collectives"] <= stats["tensors"] // 4, stats


def test_fusion_off_and_a_tiny_threshold_give_identical_results():
    with engine(cycle_time=_WINDOW_MS, fusion_threshold=128 << 20):
        fused, fused_stats = _run_burst("same")
    with engine(cycle_time=_WINDOW_MS, fusion_threshold=0):
        unfused, unfused_stats = _run_burst("same")
    with engine(cycle_time=_WINDOW_MS, fusion_threshold=64):
        tiny, _ = _run_burst("same")
    assert fused_stats["fused_collectives"] >= 1, fused_stats
    assert unfused_stats["fused_collectives"] == 0, unfused_stats
    for a, b, c in zip(fused, unfused, tiny):
        # Bitwise: the inputs are exact, so only the final rounding remains.
        assert torch.equal(a, b) and torch.equal(a, c)


def test_steady_state_is_served_from_the_cache():
    names = [f"steady.{i}" for i in range(10)]
    xs = [all_inputs((i + 1, 2), torch.float32, ("steady", i)) for i in range(len(names))]
    expected = [expected_reduce(x, torch.float32, hvd.Sum) for x in xs]

    def iteration():
        handles = [hvd.allreduce_async(x[hvd.rank()], op=hvd.Sum, name=n)
                   for x, n in zip(xs, names)]
        for h, e in zip(handles, expected):
            assert_same(hvd.synchronize(h), e)

    iteration()  # first sight of the names: negotiated by the coordinator
    before = hvd.engine_stats()
    for _ in range(5):
        iteration()
    stats = _delta(before)
    if _core.config()["cache_capacity"] > 0:
        assert stats["cache_hits"] == 5 * len(names), stats
        assert stats["slow_path_cycles"] == 0, stats
        assert stats["cache_misses"] == 0, stats
    else:
        assert stats["cache_hits"] == 0, stats
        assert stats["slow_path_cycles"] >= 5, stats


def test_a_changed_shape_under_a_cached_name_is_renegotiated():
    for i, rows in enumerate([2, 2, 5, 5, 2]):
        xs = all_inputs((rows, 3), torch.float32, ("reshape", i))
        out = hvd.allreduce(xs[hvd.rank()], op=hvd.Sum, name="cached.reshape")
        assert_same(out, expected_reduce(xs, torch.float32, hvd.Sum))
        # So are a changed op and changed scale factors.
        out = hvd.allreduce(xs[hvd.rank()], op=hvd.Max if i % 2 else hvd.Sum,
                            prescale_factor=1.0 + i % 2, name="cached.reop")
        assert_same(out, expected_reduce(xs, torch.float32, hvd.Max if i % 2 else hvd.Sum,
                                         prescale=1.0 + i % 2))


def test_cache_smaller_than_the_working_set_stays_correct():
    with engine(cache_capacity=4) as config:
        assert config["cache_capacity"] == 4
        xs = [all_inputs((3,), torch.int64, ("evict", i)) for i in range(9)]
        for _ in range(3):
            handles = [hvd.allreduce_async(x[hvd.rank()], op=hvd.Sum, name=f"evict.{i}")
                       for i, x in enumerate(xs)]
            for h, x in zip(handles, xs):
                assert_same(hvd.synchronize(h), expected_reduce(x, torch.int64, hvd.Sum))


@pytest.mark.parametrize("knob,value", [("fusion_threshold", 0), ("cache_capacity", 0)])
def test_knobs_are_read_at_init(knob, value):
    key = {"fusion_threshold": "fusion_threshold_bytes"}.get(knob, knob)
    with engine(**{knob: value}) as config:
        assert config[key] == value
    assert _core.config()[key] == int(os.environ.get(f"HOROVOD_{knob.upper()}",
                                                     {"fusion_threshold": 128 << 20,
                                                      "cache_capacity": 1024}[knob]))
