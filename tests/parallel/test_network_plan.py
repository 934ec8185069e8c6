"""The network plan of the host allreduce (Note [Link plans]): same results as references.

On one host the plan is forced (HVDCOMPAT_LINK_PLAN=network) with tiny
segments, so a modest tensor travels as many pipelined segments; nodes of
HVDCOMPAT_HIERARCHICAL_LOCAL_SIZE ranks make pseudo-hosts, and on an even
layout (4 ranks in nodes of 2) every segment takes the hierarchical steps.
Across test hosts (tests/cluster runs this file's auto-plan test) the plan is
chosen from the topology alone. The engine's counters show which path ran;
results are checked against references computed here from every rank's input.
"""

import pytest
import torch

import hvdcompat as hvd
from parallel_util import all_inputs, assert_same, dtype_id, engine, expected_reduce

OPS = {"Sum": hvd.Sum, "Average": hvd.Average, "Min": hvd.Min, "Max": hvd.Max}
DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.int32, torch.float64]
# 4 KiB segments: 3000 floats are 3 segments, 70,000 (past the 256 KiB in-place
# threshold, reduced where it lies) are 69; 5 elements are fewer than some hosts' ranks.
SHAPES = [(5,), (3, 1000), (70_000,), (0,), (1,)]
SEGMENT = 4096


def _exact(dtype, op):
    return dtype not in (torch.float16, torch.bfloat16) or op != hvd.Average


def _hosts_layout(per_node):
    """(hosts, ranks per host or None when uneven) of pseudo-nodes of `per_node` ranks."""
    n = hvd.size()
    if per_node == 0:
        return 1, n
    hosts = (n + per_node - 1) // per_node
    return hosts, per_node if n % per_node == 0 else None


def _reduce_cases(tag, out_of_place=True):
    """Submits a fused mix (every dtype and op, scaled ones, in and out of place); checks it."""
    cases = []
    for dtype in DTYPES:
        for op_name, op in OPS.items():
            for shape in SHAPES:
                if shape == (70_000,) and op_name in ("Min", "Max") and dtype != torch.float32:
                    continue  # the large shape once per dtype and op family is enough
                xs = all_inputs(shape, dtype, (tag, op_name, dtype_id(dtype), shape))
                cases.append((f"{op_name} {dtype} {shape}", xs, dtype, op, 1.0, 1.0))
        xs = all_inputs((3000,), dtype, (tag, "scaled", dtype_id(dtype)))
        cases.append((f"scaled Sum {dtype}", xs, dtype, hvd.Sum, 0.5, 4.0))
    handles = []
    for i, (_, xs, _, op, pre, post) in enumerate(cases):
        mine = xs[hvd.rank()].clone()
        if out_of_place and i % 2:
            handles.append((hvd.allreduce_async(mine, op=op, prescale_factor=pre,
                                                postscale_factor=post, name=f"{tag}.{i}"), None))
        else:
            handles.append((hvd.allreduce_async_(mine, op=op, prescale_factor=pre,
                                                 postscale_factor=post, name=f"{tag}.{i}"), mine))
    for (what, xs, dtype, op, pre, post), (h, inplace) in zip(cases, handles):
        out = hvd.synchronize(h)
        expected = expected_reduce(xs, dtype, op, pre, post)
        assert_same(out, expected, exact=_exact(dtype, op), what=what)
        if inplace is not None:
            assert_same(inplace, expected, exact=_exact(dtype, op), what=f"{what} (in place)")


@pytest.mark.parametrize("depth", [1, 3])
@pytest.mark.parametrize("per_node", [0, 1, 2])
def test_forced_network_plan_matches_reference(per_node, depth):
    with engine(link_plan="network", network_segment_bytes=SEGMENT,
                network_pipeline_depth=depth, hierarchical_local_size=per_node) as cfg:
        assert cfg["link_plan"] == "network"
        _reduce_cases(f"net.{per_node}.{depth}")
        s = hvd.engine_stats()
    hosts, per_host = _hosts_layout(per_node)
    assert s["network_allreduces"] > 0, "the forced network plan never ran"
    if hosts > 1 and per_host and per_host > 1:
        assert s["hierarchical_allreduces"] > 0, (
            f"{hosts} pseudo-hosts of {per_host} ranks: segments should run hierarchically")
    else:
        assert s["hierarchical_allreduces"] == 0, (
            f"{hosts} pseudo-host(s), ranks per host {per_host}: no hierarchy applies")


def test_hierarchical_off_keeps_the_network_plan_flat():
    with engine(link_plan="network", network_segment_bytes=SEGMENT, hierarchical_allreduce=0,
                hierarchical_local_size=2):
        _reduce_cases("net.flat", out_of_place=False)
        s = hvd.engine_stats()
    assert s["network_allreduces"] > 0
    assert s["hierarchical_allreduces"] == 0


def test_auto_plan_follows_the_topology():
    """Network plan exactly when the ranks span hosts; hierarchical on even multi-rank hosts."""
    with engine(network_segment_bytes=SEGMENT) as cfg:
        assert cfg["link_plan"] == "auto"
        _reduce_cases("auto")
        s = hvd.engine_stats()
    spans = hvd.local_size() < hvd.size()
    if not spans:
        assert s["network_allreduces"] == 0, "one host: the host plan should have run"
        return
    assert s["network_allreduces"] > 0, "the ranks span hosts, yet the host plan ran"
    if hvd.is_homogeneous() and hvd.local_size() > 1:
        assert s["hierarchical_allreduces"] > 0
    else:
        assert s["hierarchical_allreduces"] == 0


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=dtype_id)
def test_joined_rank_contributes_identities_on_the_network_plan(dtype):
    n = hvd.size()
    with engine(link_plan="network", network_segment_bytes=SEGMENT,
                hierarchical_local_size=2):
        first = n - 1
        xs = all_inputs((2500,), dtype, ("net.join", dtype_id(dtype)), lo=1, hi=4)
        if hvd.rank() == first:
            hvd.join()
        else:
            zeroed = [x if r != first else torch.zeros_like(x) for r, x in enumerate(xs)]
            others = [x for r, x in enumerate(xs) if r != first]
            hs = {name: hvd.allreduce_async(xs[hvd.rank()], op=op, name=f"net.join.{name}")
                  for name, op in (("Sum", hvd.Sum), ("Max", hvd.Max))}
            assert_same(hvd.synchronize(hs["Sum"]), expected_reduce(zeroed, dtype, hvd.Sum),
                        what="Sum with the last rank joined")
            assert_same(hvd.synchronize(hs["Max"]), expected_reduce(others, dtype, hvd.Max),
                        what="Max with the last rank joined")
            hvd.join()


# 16-bit floats on the link: tests/parallel/test_16bit_wire.py (both controllers).
