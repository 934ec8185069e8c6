"""Runs tests/parallel/test_hierarchical.py on 4 ranks, two pseudo-nodes of two, on both controllers.

tests/test_parallel.py runs the same file on 2 and 3 ranks, where no even
multi-node layout exists and the engine must fall back to the flat path; on
4 ranks with HVDCOMPAT_HIERARCHICAL_LOCAL_SIZE=2 the three-step collectives
run (the file asserts which path ran from the engine's counters). On MPI the
launch also runs test_network_plan.py, whose pipelined segments take the
hierarchical steps there; the Gloo controller has no network plan. The Gloo
launch places its ranks on two names of this machine (``-H
localhost:2,127.0.0.1:2``), so nodes made from the ranks' host names are two
of two there, without the testing knob.
"""

import os
import re
import sys

import pytest

from harness import flavor, run_ranks

TIMEOUT = int(os.environ.get("HVDCOMPAT_TEST_TIMEOUT", "300"))
FILES = {"mpi": ["test_hierarchical.py", "test_network_plan.py"],
         "gloo": ["test_hierarchical.py"]}
LAUNCHER_ARGS = {"mpi": [], "gloo": ["-H", "localhost:2,127.0.0.1:2"]}
# (The Gloo controller is not part of MPICH's smoke run.)
CONTROLLERS = ["mpi"] + (["gloo"] if flavor() != "mpich" else [])


@pytest.mark.parametrize("controller", CONTROLLERS)
def test_hierarchical_collectives_on_two_pseudo_nodes_of_two(controller):
    files = [os.path.join("tests", "parallel", name) for name in FILES[controller]]
    env = {"PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
    if controller == "gloo":
        env["HVDCOMPAT_TEST_CONTROLLER"] = "gloo"  # the rank plugin checks it
    result = run_ranks(4, [sys.executable, "-m", "pytest", "-x", "-q", "-s", "--color=no",
                           "-p", "no:cacheprovider", "-p", "rankplugin", *files],
                       timeout=TIMEOUT * len(files), env=env, controller=controller,
                       mpi_args=LAUNCHER_ARGS[controller],
                       what=f"{' '.join(files)} ({controller})")
    assert "passed" in result.output, result.output
    if controller == "gloo":
        # Two host names, two ranks each: every rank took the steps by host.
        by_host = re.findall(r"HIER-HOSTS rank (\d): 2 x 2, [1-9]\d* allreduces, [1-9]\d* "
                             r"allgathers by host", result.output)
        assert sorted(by_host) == ["0", "1", "2", "3"], result.output
