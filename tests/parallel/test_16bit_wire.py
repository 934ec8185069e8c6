"""float16/bfloat16 across hosts travel as 16 bits (Note [16-bit wire], and on the Gloo
controller Note [16-bit wire on Gloo]), on both controllers.

One host stands for several: HVDCOMPAT_LINK_PLAN=network takes the route the ranks would
take across hosts, and with the automatic plan pseudo-nodes of one rank
(HVDCOMPAT_HIERARCHICAL_LOCAL_SIZE=1) make every rank a host of its own. The engine's
counters give the bytes each element took on the link; results are checked against
references computed here from every rank's input.
"""

import pytest
import torch

import hvdcompat as hvd
from parallel_util import all_inputs, assert_same, dtype_id, engine, expected_reduce

SEGMENT = 4096
COUNT = 6000  # past the MPI plan's 4 KiB segment and the Gloo ring's exchange: several steps


def _sum_checked(dtype, tag, exact=True):
    xs = all_inputs((COUNT,), dtype, (tag, dtype_id(dtype)))
    hvd.reset_engine_stats()
    out = hvd.allreduce(xs[hvd.rank()], op=hvd.Sum, name=tag)
    s = hvd.engine_stats()
    assert_same(out, expected_reduce(xs, dtype, hvd.Sum), exact=exact, what=f"16-bit Sum {tag}")
    return s


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=dtype_id)
@pytest.mark.parametrize("wire", [1, 0])
def test_16bit_floats_cross_as_16_bits_unless_widened(dtype, wire):
    """2 bytes per element on the link, or 4 with the wire widened."""
    n = hvd.size()
    with engine(link_plan="network", network_segment_bytes=SEGMENT,
                network_16bit_wire=wire) as cfg:
        assert cfg["network_16bit_wire"] is bool(wire)
        s = _sum_checked(dtype, f"wire.{wire}")
        assert s["network_bytes"] == COUNT * (2 if wire else 4), s["network_bytes"]
        # 1 + 2^-11 + ... : each partial sum rounded to float16 can lose the small terms,
        # the widened wire rounds once: only its result is predictable on 3+ ranks.
        if dtype == torch.float16 and n >= 3:
            t = torch.full((8,), 2.0 ** -11 if hvd.rank() else 1.0, dtype=dtype)
            got = hvd.allreduce(t, op=hvd.Sum, name=f"wire.round.{wire}")
            exact = 1.0 + (n - 1) * 2.0 ** -11
            once = torch.tensor(exact, dtype=torch.float16).item()
            if wire:
                # Each element is rounded in whatever order its part of the reduction met
                # the terms (n - 1 additions, each off by at most half a unit of 2^-10),
                # and every rank receives the same values.
                assert all(abs(v - exact) <= (n - 1) * 2.0 ** -11 for v in got.tolist()), got
                everyone = hvd.allgather(got[None], name=f"wire.same.{wire}")
                assert (everyone == got).all(), everyone
            else:
                assert torch.equal(got, torch.full((8,), once, dtype=dtype))


@pytest.mark.parametrize("per_node,expect_16", [(0, False), (1, True)],
                         ids=["one-host", "hosts-of-one-rank"])
def test_the_automatic_plan_narrows_the_wire_only_across_hosts(per_node, expect_16):
    """One host: widened, rounded once (exact); ranks on hosts of their own: 16 bits."""
    with engine(network_segment_bytes=SEGMENT, hierarchical_local_size=per_node) as cfg:
        assert cfg["link_plan"] == "auto"
        # Two ranks add once: the 16-bit wire rounds once too, so both are exact there.
        s = _sum_checked(torch.float16, f"auto.{per_node}", exact=not expect_16 or hvd.size() == 2)
        assert s["network_bytes"] == (COUNT * 2 if expect_16 else 0), s


def test_fused_16bit_and_float32_tensors_with_scaling_on_the_16bit_wire():
    """A fused mix (small and large, in and out of place, scaled) on the 16-bit route."""
    shapes = [(3,), (700,), (70_000,), (0,)]
    with engine(link_plan="network", network_segment_bytes=SEGMENT):
        cases, handles = [], []
        for dtype in (torch.float16, torch.bfloat16, torch.float32):
            for i, shape in enumerate(shapes):
                xs = all_inputs(shape, dtype, ("wire.mix", dtype_id(dtype), i))
                pre, post = (0.5, 4.0) if i % 2 else (1.0, 1.0)
                mine = xs[hvd.rank()].clone()
                name = f"wire.mix.{dtype_id(dtype)}.{i}"
                h = (hvd.allreduce_async(mine, op=hvd.Sum, prescale_factor=pre,
                                         postscale_factor=post, name=name) if i % 2 else
                     hvd.allreduce_async_(mine, op=hvd.Sum, name=name))
                cases.append((name, xs, dtype, pre, post))
                handles.append(h)
        for (name, xs, dtype, pre, post), h in zip(cases, handles):
            exact = dtype == torch.float32 or hvd.size() == 2
            assert_same(hvd.synchronize(h), expected_reduce(xs, dtype, hvd.Sum, pre, post),
                        exact=exact, what=name)
