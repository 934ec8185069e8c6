"""Runs chosen tests/parallel files again, launched with engine settings changed.

Engine knobs are read at hvd.init(), so a setting that must hold for a
whole job (fusion off, cache off, dynamic process sets allowed) is given to
every rank by the launcher. The parallel files adapt their assertions to the
configuration they find (hvdcompat.basics._core.config(),
_core.dynamic_process_sets()), so each must pass both here and in the
default launch of tests/test_parallel.py. (test_process_sets.py with dynamic
process sets allowed at launch runs there, in the launch of the files that
allow them.)
"""

import os

import pytest

from harness import run_pytest_ranks

# (parallel test file, environment of every rank)
VARIANTS = [
    # Fusion and the response cache disabled: results identical, and the
    # counters show neither happened.
    ("test_fusion_and_cache.py", {"HOROVOD_FUSION_THRESHOLD": "0", "HOROVOD_CACHE_CAPACITY": "0"}),
    # Every tensor above 4 KiB reduced in place and split into 4 KiB MPI calls.
    ("test_allreduce.py", {"HVDCOMPAT_MAX_CALL_BYTES": "4096", "HVDCOMPAT_INPLACE_MIN_BYTES": "4096"}),
]

TIMEOUT = int(os.environ.get("HVDCOMPAT_TEST_TIMEOUT", "300"))


def _id(variant):
    name, env = variant
    return name[:-3] + "[" + ",".join(f"{k}={v}" for k, v in sorted(env.items())) + "]"


@pytest.mark.parametrize("np", [2, 3])
@pytest.mark.parametrize("variant", VARIANTS, ids=_id)
def test_parallel_file_with_env(variant, np):
    name, env = variant
    result = run_pytest_ranks(np, os.path.join("tests", "parallel", name), timeout=TIMEOUT,
                              env=env)
    assert "passed" in result.output, result.output
