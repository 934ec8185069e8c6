"""A short randomised soak: random ops, dtypes, sizes, names and async orders, all checked."""

import importlib.util
import os

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
