"""The one allgather/reducescatter layout every backend follows
(cpp/ops/collective_layout.h), checked against a reference that moves data, and
the node groups of the hierarchical collectives (cpp/ops/node_layout.h)."""

import random

import pytest
import torch

import core_testing
from hvdcompat.basics import _core

T = core_testing.load()


def _cases(seed, count):
    rnd = random.Random(seed)
    for _ in range(count):
        size = rnd.randint(1, 5)
        tensors = rnd.randint(1, 4)
        # Mostly small, with empty tensors and whole empty ranks now and then.
        rows = [[rnd.choice([0, 1, 2, 3, 7]) for _ in range(tensors)] for _ in range(size)]
        row_sizes = [rnd.choice([1, 3, 4, 12]) for _ in range(tensors)]
        yield size, rows, row_sizes


def _gather_by_layout(layout, blocks, size, tensors):
    """Places every rank's packed block at its displacement, then unpacks the
    rank-major payload into one output per tensor, as the backends do."""
    payload = [None] * layout["total"]
    for rk in range(size):
        at, n = layout["rank_displs"][rk], layout["rank_counts"][rk]
        assert len(blocks[rk]) == n
        payload[at:at + n] = blocks[rk]
    outs = [[] for _ in range(tensors)]
    at = 0
    for rk in range(size):
        for i in range(tensors):
            n = layout["counts"][rk * tensors + i]
            outs[i].extend(payload[at:at + n])
            at += n
    return outs


@pytest.mark.parametrize("seed", range(4))
def test_allgather_layout_moves_every_rank_part_to_its_place(seed):
    for size, rows, row_sizes in _cases(seed, 50):
        tensors = len(row_sizes)
        # Element j of rank rk's tensor i is the tuple (rk, i, j).
        data = [[[(rk, i, j) for j in range(rows[rk][i] * row_sizes[i])] for i in range(tensors)]
                for rk in range(size)]
        flat_rows = [r for per_rank in rows for r in per_rank]
        g = T.plan_allgather(flat_rows, row_sizes, size)
        blocks = [[x for t in data[rk] for x in t] for rk in range(size)]
        outs = _gather_by_layout(g, blocks, size, tensors)
        for i in range(tensors):
            assert outs[i] == [x for rk in range(size) for x in data[rk][i]]
            assert g["out_rows"][i] == sum(rows[rk][i] for rk in range(size))
        sizes = [len(b) for b in blocks]
        assert g["total"] == sum(sizes)
        assert g["largest"] == max(sizes)
        assert g["even"] == (len(set(sizes)) == 1)
        assert g["uniform"] == all(rows[rk] == rows[0] for rk in range(size))


@pytest.mark.parametrize("seed", range(4))
def test_reducescatter_layout_matches_torch_tensor_split(seed):
    for size, rows, row_sizes in _cases(100 + seed, 50):
        rows = rows[0]
        tensors = len(rows)
        inputs = [torch.arange(r * w).reshape(r, w) + 1000 * i
                  for i, (r, w) in enumerate(zip(rows, row_sizes))]
        s = T.plan_reducescatter(rows, row_sizes, size)
        blocks = []
        for rk in range(size):
            block = []
            for i in range(tensors):
                k = rk * tensors + i
                flat = inputs[i].flatten().tolist()
                block.extend(flat[s["offsets"][k]:s["offsets"][k] + s["counts"][k]])
                # Horovod's split: the first rows % size ranks get one more row.
                want = torch.tensor_split(inputs[i], size, dim=0)[rk]
                assert flat[s["offsets"][k]:s["offsets"][k] + s["counts"][k]] == \
                    want.flatten().tolist()
                assert s["counts"][k] == _core.reducescatter_rows(rows[i], size, rk) * row_sizes[i]
            blocks.append(block)
            assert s["rank_counts"][rk] == len(block)
        assert s["total"] == sum(r * w for r, w in zip(rows, row_sizes))
        assert s["largest"] == max(len(b) for b in blocks)
        assert s["even"] == (len({len(b) for b in blocks}) == 1)


def test_a_layout_of_the_wrong_length_is_an_internal_error_naming_both_sizes():
    # Three first dimensions for two tensors on two ranks: the check prints both operands.
    with pytest.raises(RuntimeError, match=r"allgather layout.*failed: 3 vs 4"):
        T.plan_allgather([1, 2, 3], [1, 1], 2)
    with pytest.raises(RuntimeError, match=r"reducescatter layout.*failed: 2 vs 1"):
        T.plan_reducescatter([1, 2], [1], 2)


@pytest.mark.parametrize("count, max_bytes, esize", [
    (6 << 20, 16 << 20, 4), (4 << 20, 16 << 20, 4), (4 << 20 + 1, 16 << 20, 4), (0, 4096, 4),
    (1, 4096, 8), (1000, 3, 4), (10**12, 1 << 30, 2), (7, 8, 4)])
def test_equal_calls_cover_the_payload_without_a_short_tail(count, max_bytes, esize):
    # The split both host allreduce paths use (in-place calls and network segments).
    step = T.equal_call_elements(count, max_bytes, esize)
    limit = max(1, max_bytes // esize)
    calls = -(-count // limit)  # the fewest calls within the limit
    assert 1 <= step <= limit
    if count:
        assert -(-count // step) == calls  # no more calls than needed
        assert count - (calls - 1) * step > 0  # the last call is not empty...
        assert step - (count - (calls - 1) * step) < calls  # ...and at most `calls` short
    # 24 MiB of floats under a 16 MiB limit: two calls of 12 MiB, not 16 + 8.
    assert T.equal_call_elements(6 << 20, 16 << 20, 4) == 3 << 20


@pytest.mark.parametrize("nodes, groups, consecutive", [
    # Two hosts of two, consecutive (mpirun's -npernode 2, hvdcompatrun -H a:2,b:2).
    ("aabb", [([0, 1], [0, 2]), ([0, 1], [1, 3]), ([2, 3], [0, 2]), ([2, 3], [1, 3])], True),
    # Round-robin placement: the same groups by host, but node blocks are not contiguous.
    ("abab", [([0, 2], [0, 1]), ([1, 3], [0, 1]), ([0, 2], [2, 3]), ([1, 3], [2, 3])], False),
    # Uneven: 2 + 1 (no hierarchy: min_local 1 != max_local 2).
    ("aab", [([0, 1], [0, 2]), ([0, 1], [1]), ([2], [0, 2])], False),
    # One node.
    ("aaa", [([0, 1, 2], [0]), ([0, 1, 2], [1]), ([0, 1, 2], [2])], True),
])
def test_node_groups_follow_the_hosts_in_rank_order(nodes, groups, consecutive):
    # The hierarchical collectives' node (same host) and cross (same index in
    # the node) groups on the Gloo controller (ops/node_layout.h).
    sizes = [nodes.count(h) for h in nodes]
    for rank, (local, cross) in enumerate(groups):
        g = T.group_by_node(list(nodes), rank)
        assert (g["local"], g["cross"]) == (local, cross), (nodes, rank, g)
        assert g["local"][g["local_rank"]] == rank and g["cross"][g["cross_rank"]] == rank
        assert (g["min_local"], g["max_local"]) == (min(sizes), max(sizes))
        assert g["consecutive"] == consecutive, (nodes, g)
