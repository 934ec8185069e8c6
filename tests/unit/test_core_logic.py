"""Negotiation, caching, encoding and fusion planning, with ranks simulated as threads."""

import pytest
import torch

import core_testing
from hvdcompat.basics import _core

T = core_testing.load()
OP = {k: int(v) for k, v in _core.OPS.items()}  # the testing module speaks ints
DT = {k: int(v) for k, v in _core.DTYPES.items()}
RO = {k: int(v) for k, v in _core.REDUCE_OPS.items()}


def req(name, shape=(4,), op="allreduce", dtype="float32", **kw):
    d = dict(name=name, op=OP[op], dtype=DT[dtype], shapes=[list(shape)], reduce_op=RO["Sum"])
    d.update(kw)
    return d


def test_requests_and_responses_roundtrip():
    reqs = [req("a", (2, 3), prescale=0.5, postscale=2.0, root=1, rank=3, auto_named=True),
            req("b", (), op="broadcast", dtype="bfloat16")]
    reqs[1]["shapes"] = [[], [5, 6, 7]]
    back = T.roundtrip_requests(reqs)
    for a, b in zip(reqs, back):
        for k, v in a.items():
            assert b[k] == v, k
    resps = [dict(op=OP["allgather"], names=["x", "y"], shapes=[[[1, 2]], [[3]]], error=""),
             dict(op=OP["allreduce"], names=["z"], shapes=[[[4]]], error="boom")]
    back = T.roundtrip_responses(resps)
    assert [r["names"] for r in back] == [["x", "y"], ["z"]]
    assert back[1]["error"] == "boom" and back[0]["shapes"] == [[[1, 2]], [[3]]]


def test_truncated_message_is_an_error_not_a_crash():
    with pytest.raises(RuntimeError, match="truncated control message"):
        T.decode_requests(b"\x05\x00\x00\x00\x01")


@pytest.mark.parametrize("size", [2, 3])
def test_steady_state_uses_the_cache_and_all_ranks_agree(size):
    rounds = [[[req("g1"), req("g2", (8,))] for _ in range(size)] for _ in range(4)]
    results, stats = T.simulate(size, 1024, rounds)
    for k, per_rank in enumerate(results):
        names = [sorted(n for r in rs for n in r["names"]) for rs in per_rank]
        assert all(n == ["g1", "g2"] for n in names), (k, names)
        # identical order on every rank (it decides MPI call matching)
        assert all([r["names"] for r in rs] == [r["names"] for r in per_rank[0]] for rs in per_rank)
    for s in stats:
        assert s["slow_path_cycles"] == 1  # only the first round negotiates names
        assert s["cache_hits"] == 6 and s["cache_misses"] == 2


def test_cache_disabled_always_negotiates():
    rounds = [[[req("g1")], [req("g1")]] for _ in range(3)]
    _, stats = T.simulate(2, 0, rounds)
    assert all(s["slow_path_cycles"] == 3 and s["cache_hits"] == 0 for s in stats)


def test_unnamed_ops_are_never_cached():
    rounds = [[[req(f"allreduce.noname.{k}", auto_named=True)] for _ in range(2)] for k in range(3)]
    _, stats = T.simulate(2, 1024, rounds)
    assert all(s["cache_hits"] == 0 and s["cache_misses"] == 0 for s in stats)


def test_changed_shape_invalidates_the_cache_entry_and_still_completes():
    rounds = [[[req("w")], [req("w")]], [[req("w", (9,))], [req("w", (9,))]]]
    results, stats = T.simulate(2, 1024, rounds)
    assert results[1][0][0]["shapes"] == [[[9]]]
    assert results[1][0][0]["error"] == ""


def test_tensor_ready_on_one_rank_waits_for_the_other():
    rounds = [[[req("a")], []], [[], [req("a")]]]
    results, _ = T.simulate(2, 1024, rounds)
    assert results[0] == [[], []]
    assert [r["names"] for r in results[1][0]] == [["a"]]


@pytest.mark.parametrize("field,values,fragment", [
    ("dtype", (DT["float32"], DT["int32"]), "ranks disagree on dtype: rank 0: float32; rank 1: int32"),
    ("shapes", ([[4]], [[5]]), "ranks disagree on tensor shape: rank 0: [4]; rank 1: [5]"),
    ("reduce_op", (RO["Sum"], RO["Max"]), "ranks disagree on the reduce op"),
    ("prescale", (1.0, 2.0), "ranks disagree on scale factors"),
])
def test_mismatches_become_error_responses_on_every_rank(field, values, fragment):
    a, b = req("m"), req("m")
    a[field], b[field] = values
    results, _ = T.simulate(2, 1024, [[[a], [b]]])
    for rs in results[0]:
        assert len(rs) == 1 and fragment in rs[0]["error"], rs
        assert "'m'" in rs[0]["error"]


def test_broadcast_root_mismatch_names_both_roots():
    a = req("b", op="broadcast", root=0)
    b = req("b", op="broadcast", root=1)
    results, _ = T.simulate(2, 1024, [[[a], [b]]])
    assert "the root rank: rank 0: 0; rank 1: 1" in results[0][0][0]["error"]


def test_allgather_allows_different_first_dimension_only():
    ok, _ = T.simulate(2, 1024, [[[req("g", (2, 3), op="allgather")],
                                  [req("g", (5, 3), op="allgather")]]])
    assert ok[0][0][0]["error"] == ""
    bad, _ = T.simulate(2, 1024, [[[req("g", (2, 3), op="allgather")],
                                   [req("g", (2, 4), op="allgather")]]])
    assert "all dimensions but the first must match" in bad[0][0][0]["error"]


def test_join_lets_others_allreduce_and_reports_last_joiner():
    join = dict(name="join.0", op=OP["join"], shapes=[])
    rounds = [[[join], [req("x")], [req("x")]],
              [[], [join], [join]]]
    results, _ = T.simulate(3, 1024, rounds)
    assert [r["names"] for r in results[0][0]] == [["x"]]  # rank 0 joined, x still ran
    last = [[r["last_joined"] for r in rs if r["op"] == OP["join"]] for rs in results[1]]
    assert last == [[2], [2], [2]]  # set rank 2 was the last request the coordinator read


def test_broadcast_during_join_is_an_error():
    join = dict(name="join.0", op=OP["join"], shapes=[])
    rounds = [[[join], [req("b", op="broadcast", root=1)]]]
    results, _ = T.simulate(2, 1024, rounds)
    assert "hvd.join()" in results[0][1][0]["error"]


def test_cached_broadcast_during_join_is_an_error_not_a_stall():
    join = dict(name="join.0", op=OP["join"], shapes=[])
    b = req("b", op="broadcast", root=1)
    rounds = [[[b], [b]],          # negotiated once: cached on both ranks
              [[join], [b]],       # rank 0 joined; rank 1 repeats the cached broadcast
              [[], []], [[], []]]
    results, _ = T.simulate(2, 1024, rounds)
    errors = [r["error"] for k in (1, 2, 3) for r in results[k][1] if r["names"] == ["b"]]
    assert errors and "hvd.join()" in errors[0]


def test_non_allreduce_during_join_fails_without_waiting_for_other_ranks():
    # Ranks that joined at different times have issued different numbers of
    # unnamed ops, so the others' allgathers carry different names: each must
    # fail on its own instead of waiting for a partner that never comes.
    join = dict(name="join.0", op=OP["join"], shapes=[])
    rounds = [[[join], [req("allgather.noname.1", op="allgather")],
               [req("allgather.noname.2", op="allgather")]]]
    results, _ = T.simulate(3, 1024, rounds)
    for rs in results[0]:
        errors = {r["names"][0]: r["error"] for r in rs}
        assert set(errors) == {"allgather.noname.1", "allgather.noname.2"}
        assert all("hvd.join()" in e for e in errors.values()), errors


def test_allreduce_during_join_still_waits_for_every_unjoined_rank():
    join = dict(name="join.0", op=OP["join"], shapes=[])
    rounds = [[[join], [req("x")], []], [[], [], [req("x")]]]
    results, _ = T.simulate(3, 1024, rounds)
    assert results[0] == [[], [], []]
    assert all([r["names"] for r in rs] == [["x"]] and rs[0]["error"] == ""
               for rs in results[1])


def test_fusion_merges_compatible_neighbours_up_to_the_threshold():
    def resp(name, n, op="allreduce", dtype="float32"):
        return dict(op=OP[op], dtype=DT[dtype], names=[name], shapes=[[[n]]])

    plan = T.fuse([resp("a", 10), resp("b", 10), resp("c", 10, dtype="float64"),
                   resp("d", 10, dtype="float64"), resp("e", 10, op="broadcast")], 1 << 20)
    assert [p["names"] for p in plan] == [["a", "b"], ["c", "d"], ["e"]]
    plan = T.fuse([resp("a", 10), resp("b", 10), resp("c", 10)], 80)  # 40 bytes each
    assert [p["names"] for p in plan] == [["a", "b"], ["c"]]
    plan = T.fuse([resp("a", 10), resp("b", 10)], 0)
    assert [p["names"] for p in plan] == [["a"], ["b"]]


def test_half_and_bfloat16_conversions_match_torch():
    values = [0.0, -0.0, 1.0, 1.0009765625, 65504.0, 65520.0, 1e-8, 5.96e-8, 3.0e-5, -2.5,
              float("inf"), float("-inf"), 0.1, 123.456, 2.0 ** -24, 2.0 ** -25 * 3]
    halves = torch.tensor(values, dtype=torch.float32).to(torch.float16).view(torch.int16)
    assert T.float_to_half_bits(values) == [v & 0xFFFF for v in halves.tolist()]
    back = torch.tensor(T.half_bits_to_float(T.float_to_half_bits(values)))
    assert torch.equal(back, torch.tensor(values).to(torch.float16).float())
    bf = torch.tensor(values, dtype=torch.float32).to(torch.bfloat16).view(torch.int16)
    assert T.float_to_bfloat16_bits(values) == [v & 0xFFFF for v in bf.tolist()]
    nan = T.half_bits_to_float(T.float_to_half_bits([float("nan")]))[0]
    assert nan != nan


def test_reducescatter_split_gives_extra_rows_to_the_first_ranks():
    rows = [_core.reducescatter_rows(10, 4, r) for r in range(4)]
    assert rows == [3, 3, 2, 2] and sum(rows) == 10
