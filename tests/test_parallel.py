"""Runs every tests/parallel/test_*.py under mpirun with 2 and with 3 ranks.

The files share launches: one pytest session per group and rank count runs
every file of the group, one after the other, so the ranks start (mpirun,
Python, torch, hvd.init) once per group rather than once per file. A group
holds the files that need the same launch: the files that allow dynamic
process sets at import (HOROVOD_DYNAMIC_PROCESS_SETS, read at hvd.init) run
together, apart from the files that must see the default. Every test of
every file runs; the first failure stops its launch with that test's report
and every rank's output (tests/rankplugin.py), and a hang fails through the
launch's timeout with every rank's stacks.

HVDCOMPAT_TEST_PARALLEL_FILES (comma-separated file names) runs only those
files (tests/mpich_smoke.sh runs a subset so).
"""

import glob
import os
import re

import pytest

from harness import REPO, run_pytest_ranks

FILES = sorted(os.path.basename(p) for p in glob.glob(os.path.join(REPO, "tests", "parallel",
                                                                  "test_*.py")))
# Wall-clock limit per file in a launch; a launch's limit is the sum over its
# files, so a hang fails the test with every rank's stacks.
TIMEOUT = int(os.environ.get("HVDCOMPAT_TEST_TIMEOUT", "300"))


def _sets_dynamic_process_sets(name):
    with open(os.path.join(REPO, "tests", "parallel", name)) as f:
        return re.search(r"^os\.environ\.setdefault\(\"HOROVOD_DYNAMIC_PROCESS_SETS\"", f.read(),
                         re.M) is not None


# Files run at one rank count only: the property-based test draws its own
# variety (shapes, splits, roots) and would only repeat it on 3 ranks.
ONE_COUNT = {"test_fuzz_collectives.py": 2}
DYNAMIC = [name for name in FILES if _sets_dynamic_process_sets(name)]
GROUPS = {
    "default": [name for name in FILES if name not in DYNAMIC],
    # test_process_sets.py runs in both: its fixture takes the launch's dynamic
    # sets when they are allowed at import (here) and re-initialises otherwise.
    "dynamic": DYNAMIC + ["test_process_sets.py"],
}
_ONLY = [n for n in os.environ.get("HVDCOMPAT_TEST_PARALLEL_FILES", "").split(",") if n]


def _files(group, np):
    return [name for name in GROUPS[group]
            if ONE_COUNT.get(name, np) == np and (not _ONLY or name in _ONLY)]


CASES = [(group, np) for group in GROUPS for np in (2, 3) if _files(group, np)]


def test_every_parallel_file_is_in_a_group():
    grouped = {name for names in GROUPS.values() for name in names}
    assert set(FILES) <= grouped, sorted(set(FILES) - grouped)
    assert not (set(_ONLY) - set(FILES)), f"HVDCOMPAT_TEST_PARALLEL_FILES names no file: {_ONLY}"


@pytest.mark.parametrize("group,np", CASES, ids=[f"{group}-{np}" for group, np in CASES])
def test_parallel_files(group, np):
    files = _files(group, np)
    paths = [os.path.join("tests", "parallel", name) for name in files]
    result = run_pytest_ranks(np, paths, timeout=TIMEOUT * len(files))
    assert "passed" in result.output, result.output
