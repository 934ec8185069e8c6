"""The parallel suite's representative subset on several test hosts.

2 hosts x 2 ranks (``-npernode 2``) and an uneven 2 + 1 layout; the topology
tests assert local/cross rank and size, is_homogeneous() and what is derived
from local_size against the layout the launch asked for. The hierarchical
collectives also run on 2 hosts x 2 under ``hvdcompatrun --gloo``, where the
nodes are the hosts' names.
"""

import os
import sys

import pytest

from cluster_harness import (PARALLEL_SELECTION, host_list, run_hvdcompatrun,
                             run_pytest_across_hosts)

TIMEOUT = 240


def _assert_every_rank_passed(output, ranks):
    # Every rank's session passes every selected test (none skipped).
    finals = [l for l in output.splitlines() if " passed" in l and " in " in l]
    assert len(finals) == ranks, output
    assert all("skipped" not in l and "failed" not in l for l in finals), finals


@pytest.mark.parametrize("layout,npernode", [([2, 2], 2), ([2, 1], None)],
                         ids=["2x2-npernode", "2+1"])
def test_parallel_subset_across_hosts(cluster, layout, npernode):
    result = run_pytest_across_hosts(cluster, layout, PARALLEL_SELECTION, TIMEOUT,
                                     npernode=npernode)
    _assert_every_rank_passed(result.output, sum(layout))


def test_hierarchical_collectives_on_gloo_across_hosts(cluster):
    # The test asserts the steps ran (nodes from the hosts' names; the pseudo-node
    # layouts of the same file run on one host in tests/test_hierarchical.py). The
    # ssh stand-in first on PATH starts the second host's ranks.
    env = {"PATH": cluster.tmpdir + os.pathsep + os.environ["PATH"],
           "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1", "HVDCOMPAT_TEST_CONTROLLER": "gloo"}
    result = run_hvdcompatrun(
        cluster, ["--gloo", "-H", host_list(cluster, [2, 2]), sys.executable, "-m", "pytest",
                  "-x", "-q", "-s", "--color=no", "-p", "no:cacheprovider", "-p", "rankplugin",
                  "tests/parallel/test_hierarchical.py::"
                  "test_nodes_are_the_launch_hosts_without_the_testing_knob"], TIMEOUT, env=env)
    _assert_every_rank_passed(result.output, 4)
