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
from test_parallel import GLOO_DESELECT

# (parallel test file, environment of every rank, controller)
VARIANTS = [
    # Fusion and the response cache disabled: results identical, and the
    # counters show neither happened.
    ("test_fusion_and_cache.py", {"HOROVOD_FUSION_THRESHOLD": "0", "HOROVOD_CACHE_CAPACITY": "0"},
     "mpi"),
    # Every tensor above 4 KiB reduced in place and split into 4 KiB MPI calls.
    ("test_allreduce.py", {"HVDCOMPAT_MAX_CALL_BYTES": "4096", "HVDCOMPAT_INPLACE_MIN_BYTES": "4096"},
     "mpi"),
    # The Gloo controller's ring (Note [Gloo ring]) for every allreduce, even
    # of one element, in 4 KiB segments with two receives ahead; fused tensors
    # above 4 KiB reduced where they lie beside packed ones.
    ("test_allreduce.py", {"HVDCOMPAT_GLOO_EXCHANGE_MAX_BYTES": "0",
                           "HVDCOMPAT_GLOO_SEGMENT_BYTES": "4096",
                           "HVDCOMPAT_GLOO_PIPELINE_DEPTH": "2",
                           "HVDCOMPAT_INPLACE_MIN_BYTES": "4096"}, "gloo"),
]

TIMEOUT = int(os.environ.get("HVDCOMPAT_TEST_TIMEOUT", "300"))


def _id(variant):
    name, env, controller = variant
    return (name[:-3] + "[" + ",".join(f"{k}={v}" for k, v in sorted(env.items())) + "]" +
            ("-gloo" if controller == "gloo" else ""))


# The Gloo variant at 3 ranks only (every ring stage kind; 2 ranks run the
# ring in the default launch's large tensors).
CASES = [(v, np) for v in VARIANTS for np in ((3,) if v[2] == "gloo" else (2, 3))]


@pytest.mark.parametrize("variant,np", CASES, ids=[f"{_id(v)}-{np}" for v, np in CASES])
def test_parallel_file_with_env(variant, np):
    name, env, controller = variant
    deselect = ()
    if controller == "gloo":
        deselect = [d for d in GLOO_DESELECT if d.startswith(f"tests/parallel/{name}::")]
    result = run_pytest_ranks(np, os.path.join("tests", "parallel", name), timeout=TIMEOUT,
                              env=env, controller=controller, deselect=deselect)
    assert "passed" in result.output, result.output
