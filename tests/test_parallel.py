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

from harness import REPO, flavor, run_pytest_ranks

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
# The same files on the Gloo controller (hvdcompatrun --gloo, no MPI at all):
# every file but those about MPI itself (mpi4py communicators, the MPI launch's
# variables, the MPI network plan), test_errors.py (its stall test expects the
# MPI controller's message; Gloo's stall handling is tests/gloo/test_gloo_engine.py's),
# the DDP files (their own process groups) and the soak. The slow lifecycle files
# run at 2 ranks only. (test_hierarchical.py's even layouts need 4 ranks:
# tests/test_hierarchical.py runs them on both controllers.)
MPI_ONLY = {"test_network_plan.py", "test_topology.py", "test_process_sets.py", "test_errors.py",
            "test_ddp_backend.py", "test_ddp_hooks.py", "test_soak.py",
            "test_fuzz_collectives.py"}
# (Not under MPICH's smoke run: the Gloo controller does not depend on the MPI.)
if flavor() != "mpich":
    GROUPS["gloo"] = [name for name in GROUPS["default"] if name not in MPI_ONLY]
    GROUPS["gloo-dynamic"] = list(GROUPS["dynamic"])
GLOO_ONE_COUNT = {"test_lifecycle.py": 2, "test_shutdown_race.py": 2, "test_autotune.py": 2,
                  "test_output_pool.py": 2}
# mpi4py communicators, and plain MPI messages between the ranks:
GLOO_DESELECT = ["tests/parallel/test_process_sets.py::test_a_communicator_set_on_one_rank_only",
                 "tests/parallel/test_process_sets.py::test_static_sets_from_mpi_communicators",
                 "tests/parallel/test_process_sets.py::test_a_set_runs_while_the_global_set_waits"]
_ONLY = [n for n in os.environ.get("HVDCOMPAT_TEST_PARALLEL_FILES", "").split(",") if n]


def _files(group, np):
    counts = {**ONE_COUNT, **(GLOO_ONE_COUNT if group.startswith("gloo") else {})}
    return [name for name in GROUPS[group]
            if counts.get(name, np) == np and (not _ONLY or name in _ONLY)]


CASES = [(group, np) for group in GROUPS for np in (2, 3) if _files(group, np)]


# test_adasum.py prints a digest of its results on every rank ("ADASUM-BITS"); the MPI and the
# Gloo launch of one rank count must print the same one (Note [Adasum peers]). The launch that
# runs second compares (tests/test_adasum_ranks.py does so at 4 ranks).
_ADASUM_DIGESTS = {}


def _check_adasum_bits(controller, np, output):
    digests = set(re.findall(rf"ADASUM-BITS rank \d+ of {np}: ([0-9a-f]{{64}})", output))
    if not digests:
        return  # test_adasum.py was not in this launch
    assert len(digests) == 1, f"ranks hold different Adasum results on {controller}: {digests}"
    _ADASUM_DIGESTS[controller, np] = digests.pop()
    other = {"mpi": "gloo", "gloo": "mpi"}[controller]
    if (other, np) in _ADASUM_DIGESTS:
        assert _ADASUM_DIGESTS[other, np] == _ADASUM_DIGESTS[controller, np], (
            f"Adasum at {np} ranks gave other bits on the Gloo controller than on MPI: "
            f"{_ADASUM_DIGESTS}")


def test_every_parallel_file_is_in_a_group():
    grouped = {name for group, names in GROUPS.items() if not group.startswith("gloo") for name in names}
    assert set(FILES) <= grouped, sorted(set(FILES) - grouped)
    assert not (set(_ONLY) - set(FILES)), f"HVDCOMPAT_TEST_PARALLEL_FILES names no file: {_ONLY}"


@pytest.mark.parametrize("group,np", CASES, ids=[f"{group}-{np}" for group, np in CASES])
def test_parallel_files(group, np):
    files = _files(group, np)
    paths = [os.path.join("tests", "parallel", name) for name in files]
    if group.startswith("gloo"):
        result = run_pytest_ranks(np, paths, timeout=TIMEOUT * len(files), controller="gloo",
                                  deselect=GLOO_DESELECT)
        # Every rank ran on Gloo (the launch gives the controller; a rank on MPI would fail).
        assert "passed" in result.output, result.output
        _check_adasum_bits("gloo", np, result.output)
        return
    result = run_pytest_ranks(np, paths, timeout=TIMEOUT * len(files))
    assert "passed" in result.output, result.output
    _check_adasum_bits("mpi", np, result.output)
