"""Runs every tests/parallel/test_*.py under mpirun with 2 and with 3 ranks."""

import glob
import os

import pytest

from harness import REPO, run_pytest_ranks

FILES = sorted(os.path.basename(p) for p in glob.glob(os.path.join(REPO, "tests", "parallel",
                                                                  "test_*.py")))
# Wall-clock limit per launch; a hang fails the test with every rank's stacks.
TIMEOUT = int(os.environ.get("HVDCOMPAT_TEST_TIMEOUT", "300"))

# Known intermittent hang, not understood yet: about one 2-rank launch of
# test_ddp_backend.py in twelve stops with one rank inside
# test_ddp_on_hvdcompat_matches_ddp_on_gloo_and_a_single_process_reference
# (which builds a torch gloo group beside the hvdcompat default group) while
# its peer has gone on to the next test's allgather. Such a launch times out
# after RETRY_TIMEOUT and is run once more; any other failure fails at once,
# and a second timeout fails with every rank's stacks.
RETRIED_ON_TIMEOUT = {"test_ddp_backend.py"}
RETRY_TIMEOUT = 120


@pytest.mark.parametrize("np", [2, 3])
@pytest.mark.parametrize("name", FILES)
def test_parallel_file(name, np):
    path = os.path.join("tests", "parallel", name)
    if name in RETRIED_ON_TIMEOUT:
        first = run_pytest_ranks(np, path, timeout=min(TIMEOUT, RETRY_TIMEOUT), check=False)
        if first.timed_out:
            print(f"\n{path} on {np} ranks timed out once (known intermittent hang); "
                  "running it again", flush=True)
            result = run_pytest_ranks(np, path, timeout=TIMEOUT)
        else:
            assert first.returncode == 0, first.output
            result = first
    else:
        result = run_pytest_ranks(np, path, timeout=TIMEOUT)
    assert "passed" in result.output, result.output
