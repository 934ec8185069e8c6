"""The engine's rules are the core's: `_core` itself refuses each bad request.

tests/scripts/core_rules.py calls hvdcompat._core directly (no Python-layer
check runs) on one rank and reports what each call raised; each test here
checks one rule's error: its Python type (the one Horovod's users catch),
and a message that names the op, the tensor, the rank and what to do. A
rule removed from the core and written in Python again fails here. The
rules that need several ranks (membership, uneven rows, roots) are called
on the core directly by tests/parallel/test_engine_rules.py.
"""

import json
import os
import subprocess
import sys

import pytest

from harness import REPO, mpi_env

SCRIPT = os.path.join(REPO, "tests", "scripts", "core_rules.py")


@pytest.fixture(scope="module")
def seen():
    env = mpi_env({"HOROVOD_DYNAMIC_PROCESS_SETS": "0", "HVDCOMPAT_DYNAMIC_PROCESS_SETS": "0"})
    r = subprocess.run([sys.executable, SCRIPT], capture_output=True, text=True, timeout=120,
                       env=env)
    assert r.returncode == 0, f"stdout:\n{r.stdout}\nstderr:\n{r.stderr}"
    return json.loads(r.stdout.strip().splitlines()[-1])


def refused(seen, case, kinds, *parts):
    got = seen[case]
    assert "raised" in got, f"{case}: the core accepted it: {got}"
    assert sorted(got["kinds"]) == sorted(kinds), f"{case}: {got}"
    for part in parts:
        assert part in got["message"], f"{case}: {part!r} missing in: {got['message']}"


def test_process_sets_change_after_init_in_dynamic_mode_only(seen):
    for case, call in (("add without dynamic mode", "hvd.add_process_set([0])"),
                       ("remove without dynamic mode", "hvd.remove_process_set(0)")):
        refused(seen, case, ["ValueError"], f"{call} on rank 0", "HOROVOD_DYNAMIC_PROCESS_SETS=1",
                "process_sets='dynamic'")


def test_the_global_set_is_never_removed(seen):
    assert seen["remove the global set"] == {"returned": False}
    assert seen["sets after removing the global set"] == {"returned": [0]}


def test_an_unknown_set_is_refused_by_the_membership_rule(seen):
    refused(seen, "member of an unknown set", ["ValueError"], "ProcessSet.rank on rank 0",
            "does not exist, or has not been registered (id 5)", "hvd.add_process_set")


def test_adasum_runs_on_the_global_set_only(seen):
    refused(seen, "adasum on a process set", ["ValueError", "NotImplementedError"],
            "allreduce 'allreduce.ada' on rank 0", "does not support non-global process sets",
            "process set 3 (not registered)", "hvd.global_process_set")
    refused(seen, "adasum before any tensor", ["ValueError", "NotImplementedError"],
            "DistributedOptimizer(op=hvd.Adasum) on rank 0", "non-global process sets")
    refused(seen, "adasum on integers", ["ValueError", "TypeError"],
            "allreduce 'allreduce.ada_int' on rank 0", "not int32", "tensor.float()")
    assert seen["adasum on the global set"] == {"returned": True}


def test_allgather_refuses_scalars(seen):
    refused(seen, "allgather a scalar", ["ValueError"], "allgather 'allgather.s' on rank 0",
            "cannot allgather a scalar (0-dim) tensor", "reshape it to [1]")
    refused(seen, "grouped allgather with a scalar", ["ValueError"],
            "allgather 'grouped_allgather.s' on rank 0", "cannot allgather a scalar")
    assert seen["allgather a vector"] == {"returned": True}


def test_alltoall_refuses_scalars_and_a_split_list_of_another_length(seen):
    refused(seen, "alltoall a scalar", ["ValueError"], "alltoall 'alltoall.s' on rank 0",
            "cannot alltoall a scalar (0-dim) tensor", "reshape it to [1]")
    refused(seen, "alltoall splits per rank", ["ValueError"], "alltoall 'alltoall.n' on rank 0",
            "Number of entries in splits (2) does not equal number of workers (1 ranks",
            "one entry per rank")


def test_bool_reduces_with_min_and_max_only(seen):
    for op in ("Sum", "Average", "Product"):
        refused(seen, f"bool {op}", ["ValueError", "TypeError"],
                f"allreduce 'allreduce.b{op}' on rank 0", "op=hvd.Min (logical and)",
                f"not {op}", "integer dtype")
    refused(seen, "bool reducescatter Sum", ["ValueError", "TypeError"],
            "reducescatter 'reducescatter.b' on rank 0", "not Sum")
    assert seen["bool Min"] == {"returned": True} and seen["bool Max"] == {"returned": True}
