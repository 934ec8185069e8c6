"""Runs tests/parallel/test_hierarchical.py and test_network_plan.py on 4 ranks: two pseudo-nodes of two.

tests/test_parallel.py runs the same files on 2 and 3 ranks, where no even
multi-node layout exists and the engine must fall back to the flat path; on
4 ranks with HVDCOMPAT_HIERARCHICAL_LOCAL_SIZE=2 the three-step collectives
run (the files assert which path ran from the engine's counters), and the
network plan's pipelined segments take the hierarchical steps. Both files
share one launch.
"""

import os
import sys

from harness import run_ranks

TIMEOUT = int(os.environ.get("HVDCOMPAT_TEST_TIMEOUT", "300"))
FILES = [os.path.join("tests", "parallel", name)
         for name in ("test_hierarchical.py", "test_network_plan.py")]


def test_hierarchical_collectives_on_two_pseudo_nodes_of_two():
    result = run_ranks(4, [sys.executable, "-m", "pytest", "-x", "-q", "-s", "--color=no",
                           "-p", "no:cacheprovider", "-p", "rankplugin", *FILES],
                       timeout=TIMEOUT, env={"PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"},
                       what=" ".join(FILES))
    assert "passed" in result.output, result.output
