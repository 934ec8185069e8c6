"""Knobs that shape the collectives, set differently on each rank: every rank takes rank 0's
values (Note [Plan knobs from set rank 0], cpp/engine/plan_agreement.h) and the results
stay exact, instead of ranks that fuse, split or route differently waiting on each other."""

import torch

import hvdcompat as hvd
from hvdcompat.basics import _core
from parallel_util import restarted


def _per_rank(rank):
    # Rank 0 fuses nothing, splits calls at 4 KiB and keeps no cache; the others fuse
    # everything, never split, and cache. Gloo segments and the 16-bit wire differ too.
    if rank == 0:
        return {"HOROVOD_FUSION_THRESHOLD": "0", "HOROVOD_CACHE_CAPACITY": "0",
                "HVDCOMPAT_MAX_CALL_BYTES": "4096", "HVDCOMPAT_GLOO_SEGMENT_BYTES": "4096",
                "HVDCOMPAT_INPLACE_MIN_BYTES": "1024", "HVDCOMPAT_LINK_PLAN": "network",
                "HVDCOMPAT_NETWORK_16BIT_WIRE": "1"}
    return {"HOROVOD_FUSION_THRESHOLD": str(64 << 20), "HOROVOD_CACHE_CAPACITY": "1024",
            "HVDCOMPAT_MAX_CALL_BYTES": str(1 << 30), "HVDCOMPAT_GLOO_SEGMENT_BYTES": str(1 << 20),
            "HVDCOMPAT_INPLACE_MIN_BYTES": str(1 << 30), "HVDCOMPAT_LINK_PLAN": "host",
            "HVDCOMPAT_NETWORK_16BIT_WIRE": "0"}


def _inputs(rank):
    g = torch.Generator().manual_seed(1000 + rank)
    sizes = [1, 7, 300, 5000, 20000]
    return ([torch.randint(-50, 50, (n,), generator=g).to(torch.float32) for n in sizes] +
            [torch.randint(-8, 8, (n,), generator=g).to(torch.float16) for n in sizes] +
            [torch.randint(-100, 100, (n,), generator=g) for n in sizes])


def test_every_rank_takes_rank_0s_plan_knobs_and_results_stay_exact():
    me, n = hvd.rank(), hvd.size()
    with restarted(_per_rank(me)):
        config = _core.config()
        assert config["fusion_threshold_bytes"] == 0 and config["cache_capacity"] == 0
        assert config["max_call_bytes"] == 4096 and config["gloo_segment_bytes"] == 4096
        assert config["inplace_min_bytes"] == 1024 and config["link_plan"] == "network"
        assert config["network_16bit_wire"] is True
        expected = [sum(x) for x in zip(*(_inputs(r) for r in range(n)))]
        for step in range(3):  # the cache (on for ranks > 0 by their own knob) stays off
            handles = [hvd.allreduce_async(t, op=hvd.Sum, name=f"plan.{i}")
                       for i, t in enumerate(_inputs(me))]
            for i, (h, want) in enumerate(zip(handles, expected)):
                got = hvd.synchronize(h)
                assert torch.equal(got, want), (step, i, got[:5], want[:5])
        gathered = hvd.allgather(torch.full((me + 1, 3), float(me)), name="plan.gather")
        assert gathered.shape == (sum(range(1, n + 1)), 3)

