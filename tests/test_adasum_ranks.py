"""Adasum's tree at 4 ranks: the first rank count where recursive halving has two levels
(and the dot products are summed over a group of four), beyond the 2- and 3-rank launches of
tests/test_parallel.py. Oversubscribed on small machines, so only the rule's tests run here.
"""

import os
import sys

from harness import run_ranks

TIMEOUT = int(os.environ.get("HVDCOMPAT_TEST_TIMEOUT", "300"))
# The tests that check results against the locally computed tree.
SELECTED = "orthogonal or parallel_inputs or random_inputs or grouped or known"


def test_adasum_at_four_ranks():
    result = run_ranks(4, [sys.executable, "-m", "pytest", "-x", "-q", "-s", "--color=no",
                           "-p", "no:cacheprovider", "-p", "rankplugin", "-k", SELECTED,
                           os.path.join("tests", "parallel", "test_adasum.py")],
                       timeout=TIMEOUT, env={"PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"},
                       what="test_adasum.py at 4 ranks")
    assert "passed" in result.output and "failed" not in result.output, result.output
