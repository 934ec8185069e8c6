"""The parallel suite's representative subset on several test hosts.

2 hosts x 2 ranks (``-npernode 2``) and an uneven 2 + 1 layout; the topology
tests assert local/cross rank and size, is_homogeneous() and what is derived
from local_size against the layout the launch asked for.
"""

import pytest

from cluster_harness import PARALLEL_SELECTION, run_pytest_across_hosts

TIMEOUT = 240


@pytest.mark.parametrize("layout,npernode", [([2, 2], 2), ([2, 1], None)],
                         ids=["2x2-npernode", "2+1"])
def test_parallel_subset_across_hosts(cluster, layout, npernode):
    result = run_pytest_across_hosts(cluster, layout, PARALLEL_SELECTION, TIMEOUT,
                                     npernode=npernode)
    # Every rank's session passes every selected test (none skipped).
    finals = [l for l in result.output.splitlines() if " passed" in l and " in " in l]
    assert len(finals) == sum(layout), result.output
    assert all("skipped" not in l and "failed" not in l for l in finals), finals
