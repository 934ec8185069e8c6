"""Hierarchical host collectives: same results as the flat ones, used exactly where they apply.

One host has one node, so the node split is forced with
HVDCOMPAT_HIERARCHICAL_LOCAL_SIZE=K (ranks r with equal r // K form a node).
The three-step path runs when the pseudo-nodes are even and both levels have
more than one rank (4 ranks with K=2); otherwise (2 or 3 ranks, K=3 on 4
ranks) the engine must fall back to the flat collectives. The engine's
counters show which path ran; the results are checked against references
computed here from every rank's input. Without the knob, nodes are the
launch's hosts (one here; two under tests/cluster's 2 x 2 launches). The file
runs on both controllers.
"""

import pytest
import torch

import hvdcompat as hvd
from parallel_util import (
    DTYPES, all_inputs, assert_same, dtype_id, engine, expected_reduce, rank_input,
)

OPS = {"Sum": hvd.Sum, "Average": hvd.Average, "Min": hvd.Min, "Max": hvd.Max,
       "Product": hvd.Product}
# Small shapes, a shape with fewer elements than a node has ranks, an empty
# one, and tensors past the in-place threshold (256 KiB) that skip the fusion copy.
SHAPES = [(7,), (3, 4), (1,), (0,)]
LARGE = 70_000


def _hierarchical(per_node):
    """Whether the three-step path applies to this job with nodes of `per_node` ranks."""
    n = hvd.size()
    return per_node > 1 and n % per_node == 0 and n // per_node > 1


def _exact(dtype, op):
    return dtype not in (torch.float16, torch.bfloat16) or op != hvd.Average


def _layout(per_node, fused):
    knobs = dict(hierarchical_allreduce=1, hierarchical_allgather=1,
                 hierarchical_local_size=per_node)
    if not fused:
        knobs["fusion_threshold"] = 0
    return engine(**knobs)


def _counters(since=(0, 0)):
    """Hierarchical (allreduces, allgathers) of this engine, less `since`."""
    s = hvd.engine_stats()
    return (s["hierarchical_allreduces"] - since[0], s["hierarchical_allgathers"] - since[1])


@pytest.fixture(scope="module", params=[(2, True), (2, False), (3, True), (3, False)],
                ids=["2-fused", "2-unfused", "3-fused", "3-unfused"])
def layout(request):
    """(ranks per pseudo-node, engine config): one re-initialisation per layout, shared by
    the tests that take it (pytest runs them one after the other)."""
    per_node, fused = request.param
    with _layout(per_node, fused) as cfg:
        yield per_node, cfg


def test_allreduce_every_dtype_op_and_scale(layout):
    per_node, cfg = layout
    before = _counters()
    assert cfg["hierarchical_allreduce"] and cfg["hierarchical_allgather"]
    cases = []
    for dtype in DTYPES:
        for op_name, op in OPS.items():
            lo, hi = (-2, 3) if op == hvd.Product else (-5, 6)
            for shape in SHAPES:
                key = ("hier", op_name, dtype_id(dtype), shape)
                xs = all_inputs(shape, dtype, key, lo=lo, hi=hi)
                cases.append((f"{op_name} {dtype} {shape}", xs, dtype, op, 1.0, 1.0))
        for op in (hvd.Sum, hvd.Average):
            xs = all_inputs((5,), dtype, ("hier.scaled", dtype_id(dtype), op))
            cases.append((f"scaled {op} {dtype}", xs, dtype, op, 0.5, 3.0))
    for dtype in (torch.float32, torch.float16, torch.int64):
        xs = all_inputs((LARGE,), dtype, ("hier.large", dtype_id(dtype)))
        cases.append((f"large {dtype}", xs, dtype, hvd.Average, 1.0, 1.0))
    handles = [hvd.allreduce_async(xs[hvd.rank()], op=op, prescale_factor=pre,
                                   postscale_factor=post, name=f"hier.ar.{i}")
               for i, (_, xs, _, op, pre, post) in enumerate(cases)]
    for (what, xs, dtype, op, pre, post), h in zip(cases, handles):
        assert_same(hvd.synchronize(h), expected_reduce(xs, dtype, op, pre, post),
                    exact=_exact(dtype, op), what=what)
    allreduces, allgathers = _counters(before)
    if _hierarchical(per_node):
        assert allreduces > 0, "the hierarchical allreduce never ran on an even layout"
    else:
        assert allreduces == 0, (f"{hvd.size()} ranks in nodes of {per_node}: the layout "
                                 "does not qualify, yet the hierarchical allreduce ran")
    assert allgathers == 0


def test_allgather_uneven_rows_every_dtype(layout):
    per_node, _ = layout
    n = hvd.size()
    before = _counters()
    cases = []
    for dtype in DTYPES + [torch.bool]:
        for cols in ((), (3,)):
            # Rank r holds r % 3 + 1 rows (rank 2 of 4 holds 3, rank 3 holds 1).
            parts = [rank_input(r, (r % 3 + 1, *cols), dtype, ("hier.ag", dtype_id(dtype),
                                                                cols)) for r in range(n)]
            cases.append((f"allgather {dtype} {cols}", parts))
    handles = [hvd.allgather_async(parts[hvd.rank()], name=f"hier.ag.{i}")
               for i, (_, parts) in enumerate(cases)]
    for (what, parts), h in zip(cases, handles):
        assert_same(hvd.synchronize(h), torch.cat(parts), what=what)
    # One tensor alone takes the unfused call even when fusion is on.
    single = [rank_input(r, (r + 2, 2), torch.float32, "hier.ag.single") for r in range(n)]
    assert_same(hvd.allgather(single[hvd.rank()], name="hier.ag.single"), torch.cat(single),
                what="single allgather")
    allreduces, allgathers = _counters(before)
    if _hierarchical(per_node):
        assert allgathers > 0, "the hierarchical allgather never ran on an even layout"
    else:
        assert allgathers == 0
    del allreduces  # negotiation of the rows is not an allreduce of ours


def test_joined_rank_contributes_zeros_and_identities():
    n = hvd.size()
    with _layout(2, True):
        for dtype in (torch.float32, torch.bfloat16, torch.int32):
            for first in range(n):
                xs = all_inputs((6,), dtype, ("hier.join", dtype_id(dtype), first), lo=1, hi=4)
                zeroed = [x if r != first else torch.zeros_like(x) for r, x in enumerate(xs)]
                others = [x for r, x in enumerate(xs) if r != first]
                if hvd.rank() == first:
                    hvd.join()
                    continue
                hs = {name: hvd.allreduce_async(
                          xs[hvd.rank()], op=op, name=f"hier.join.{name}.{dtype_id(dtype)}.{first}")
                      for name, op in OPS.items()}
                for name, op in OPS.items():
                    if op in (hvd.Sum, hvd.Average):
                        expected = expected_reduce(zeroed, dtype, op, size=n)
                    else:
                        expected = expected_reduce(others, dtype, op)
                    assert_same(hvd.synchronize(hs[name]), expected, exact=_exact(dtype, op),
                                what=f"{name} {dtype} with rank {first} joined")
                hvd.join()


def test_nodes_are_the_launch_hosts_without_the_testing_knob():
    # Nodes are the ranks sharing a host (MPI: shared memory; Gloo: the host
    # names): the steps run exactly where the job spans several hosts with the
    # same number of ranks each (consecutive, as launches place them).
    n = hvd.size()
    with engine(hierarchical_allreduce=1, hierarchical_allgather=1, hierarchical_local_size=0):
        xs = all_inputs((9,), torch.int32, "hier.hosts")
        assert_same(hvd.allreduce(xs[hvd.rank()], op=hvd.Sum, name="hier.hosts.ar"),
                    expected_reduce(xs, torch.int32, hvd.Sum), what="allreduce by host")
        parts = [rank_input(r, (r + 1, 2), torch.float64, "hier.hosts.ag") for r in range(n)]
        assert_same(hvd.allgather(parts[hvd.rank()], name="hier.hosts.ag"), torch.cat(parts),
                    what="allgather by host")
        allreduces, allgathers = _counters()
    layered = hvd.local_size() > 1 and hvd.cross_size() > 1 and hvd.is_homogeneous()
    # tests/test_hierarchical.py checks this line where its launch gives two hosts.
    print(f"HIER-HOSTS rank {hvd.rank()}: {hvd.cross_size()} x {hvd.local_size()}, "
          f"{allreduces} allreduces, {allgathers} allgathers by host")
    assert (allreduces > 0, allgathers > 0) == (layered, layered), (
        f"rank {hvd.rank()}: local size {hvd.local_size()}, cross size {hvd.cross_size()}, "
        f"homogeneous {hvd.is_homogeneous()}: {allreduces} hierarchical allreduces, "
        f"{allgathers} allgathers")
