"""A short randomised soak: random ops, dtypes, sizes, names and async orders, all checked."""

import importlib.util
import os

import torch

import hvdcompat as hvd

_SPEC = importlib.util.spec_from_file_location(
    "soak", os.path.join(os.path.dirname(__file__), "..", "..", "scripts", "soak.py"))
soak = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(soak)


def test_short_soak_has_no_mismatches():
    done, mismatches, rss_start, rss_end = soak.run(ops=300, seed=hvd.size() * 7 + 1)
    assert done >= 300
    assert mismatches == 0
    stats = hvd.engine_stats()
    assert stats["cache_hits"] > 0 and stats["fused_tensors"] > 0, stats


def test_timed_soak_stops_every_rank_after_the_same_op():
    # Deadlines that differ per rank: the ranks must still agree where to stop
    # (a rank that stopped alone would leave the others' ops unmatched).
    done, mismatches, _, _ = soak.run(seconds=1.0 + 0.7 * hvd.rank(), seed=hvd.size() * 11 + 3)
    assert mismatches == 0
    counts = hvd.allgather(torch.tensor([done]), name="soak.timed.counts").tolist()
    assert done > 0 and len(set(counts)) == 1, f"ops run per rank: {counts}"
