"""Runs tests/parallel/test_hierarchical.py on 4 ranks: two pseudo-nodes of two.

tests/test_parallel.py runs the same file on 2 and 3 ranks, where no even
multi-node layout exists and the engine must fall back to the flat path; on
4 ranks with HVDCOMPAT_HIERARCHICAL_LOCAL_SIZE=2 the three-step collectives
run (the file asserts which path ran from the engine's counters).
"""

import os

from harness import run_pytest_ranks

TIMEOUT = int(os.environ.get("HVDCOMPAT_TEST_TIMEOUT", "300"))


def test_hierarchical_collectives_on_two_pseudo_nodes_of_two():
    result = run_pytest_ranks(4, os.path.join("tests", "parallel", "test_hierarchical.py"),
                              timeout=TIMEOUT)
    assert "passed" in result.output, result.output
