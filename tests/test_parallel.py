"""Runs every tests/parallel/test_*.py under mpirun with 2 and with 3 ranks."""

import glob
import os

import pytest

from harness import REPO, run_pytest_ranks

FILES = sorted(os.path.basename(p) for p in glob.glob(os.path.join(REPO, "tests", "parallel",
                                                                  "test_*.py")))
# Wall-clock limit per launch; a hang fails the test with every rank's stacks.
TIMEOUT = int(os.environ.get("HVDCOMPAT_TEST_TIMEOUT", "300"))


# Files run at one rank count only: the property-based test draws its own
# variety (shapes, splits, roots) and would only repeat it on 3 ranks.
ONE_COUNT = {"test_fuzz_collectives.py": 2}
CASES = [(name, np) for name in FILES for np in (2, 3) if ONE_COUNT.get(name, np) == np]


@pytest.mark.parametrize("name,np", CASES, ids=[f"{name}-{np}" for name, np in CASES])
def test_parallel_file(name, np):
    path = os.path.join("tests", "parallel", name)
    result = run_pytest_ranks(np, path, timeout=TIMEOUT)
    assert "passed" in result.output, result.output
