"""Adasum's tree at 4 ranks on both controllers: the first rank count where recursive halving
has two levels (and the dot products are summed over a group of four), beyond the 2- and 3-rank
launches of tests/test_parallel.py. Oversubscribed on small machines, so only the rule's tests
run here. The MPI and the Gloo launch run one algorithm over two transports (Note [Adasum
peers]), so every rank of both prints the same digest of the same results (tests/test_parallel.py
compares its 2- and 3-rank launches of the file the same way).
"""

import os
import re
import sys

from harness import flavor, run_ranks

TIMEOUT = int(os.environ.get("HVDCOMPAT_TEST_TIMEOUT", "300"))
# The tests that check results against the locally computed tree.
SELECTED = "orthogonal or parallel_inputs or random_inputs or grouped or known or same_bits"
# (The Gloo controller is not part of MPICH's smoke run.)
CONTROLLERS = ["mpi"] + (["gloo"] if flavor() != "mpich" else [])


def _digests(output):
    return dict(re.findall(r"ADASUM-BITS rank (\d+) of 4: ([0-9a-f]{64})", output))


def test_adasum_at_four_ranks_gives_the_same_bits_on_either_controller():
    digests = {}
    for controller in CONTROLLERS:
        env = {"PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
        if controller == "gloo":
            env["HVDCOMPAT_TEST_CONTROLLER"] = "gloo"  # the rank plugin checks it
        result = run_ranks(4, [sys.executable, "-m", "pytest", "-x", "-q", "-s", "--color=no",
                               "-p", "no:cacheprovider", "-p", "rankplugin", "-k", SELECTED,
                               os.path.join("tests", "parallel", "test_adasum.py")],
                           timeout=TIMEOUT, env=env, controller=controller,
                           what=f"test_adasum.py at 4 ranks ({controller})")
        assert "passed" in result.output and "failed" not in result.output, result.output
        digests[controller] = _digests(result.output)
        assert sorted(digests[controller]) == ["0", "1", "2", "3"], result.output
        # Every rank holds the same result.
        assert len(set(digests[controller].values())) == 1, digests
    assert len({d for per_rank in digests.values() for d in per_rank.values()}) == 1, digests
