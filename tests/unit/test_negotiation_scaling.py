"""Negotiation's cost with many ranks (ranks as threads; docs/scaling.md).

The coordinator's memory for a first iteration must not grow with the
number of ranks when they agree (Note [Coordinator rows]: it held one full
request per rank and name, 33 MiB for ResNet-50 at 1,024 ranks); the
per-rank words combined in steady state are the cache's bits, whatever the
size; a rank that disagrees among many is still named in the error.
"""

import math

import core_testing
from hvdcompat.basics import _core

T = core_testing.load()

# Shapes of 161 gradients (ResNet-50's count; shapes here only need variety).
SHAPES = [[64, 3, 7, 7]] + [[c] for c in range(1, 81)] + [[c, 2, 3, 3] for c in range(1, 81)]


def test_coordinator_memory_is_independent_of_the_number_of_ranks():
    small = T.coordinator_footprint(64, SHAPES)
    large = T.coordinator_footprint(1024, SHAPES)
    # The request lists themselves grow with ranks (what was gathered) ...
    assert large["in_bytes"] == 16 * small["in_bytes"]
    # ... what the coordinator holds while deciding does not (one row per name).
    assert large["held_bytes"] < 2 * small["held_bytes"] + 64 * 1024, (small, large)
    assert large["out_bytes"] == small["out_bytes"]


def test_steady_state_cycles_combine_only_the_cache_bits():
    rows = T.simulate_scaling(64, SHAPES, 3)
    first, steady = rows[0], rows[1:]
    assert first["slow_path_cycles"] >= 1 and first["coordinator_in_bytes"] > 0
    words = 3 + 2 * math.ceil(len(SHAPES) / 64)  # Note [Cycle words]
    for row in steady:
        assert row["slow_path_cycles"] == 0, row
        assert row["coordinator_in_bytes"] == 0 and row["coordinator_out_bytes"] == 0, row
        assert row["flag_bytes"] == 8 * words * row["cycles"], row


def test_one_disagreeing_rank_among_many_is_named():
    size = 40
    base = dict(name="w", op=_core.OPS["allreduce"], dtype=_core.DTYPES["float32"],
                shapes=[[4]], reduce_op=_core.REDUCE_OPS["Sum"])
    per_rank = [dict(base) for _ in range(size)]
    per_rank[37]["dtype"] = _core.DTYPES["int32"]
    per_rank[5]["shapes"] = [[5]]
    results, _ = T.simulate(size, 1024, [[[q] for q in per_rank]])
    for rs in results[0]:
        assert len(rs) == 1, rs
        # dtype is checked first; every other rank agrees on float32.
        assert "ranks disagree on dtype" in rs[0]["error"], rs[0]["error"]
        assert "; rank 37: int32" in rs[0]["error"], rs[0]["error"]
    per_rank[37]["dtype"] = _core.DTYPES["float32"]
    results, _ = T.simulate(size, 1024, [[[q] for q in per_rank]])
    err = results[0][0][0]["error"]
    assert "tensor shape" in err and "rank 5: [5]" in err, err
