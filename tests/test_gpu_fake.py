"""The GPU data plane end to end on CPU-only machines, against a fake CUDA/NCCL.

tests/gpu_fake/fake_cudart.cc + fake_nccl.cc implements the slice of libcudart and libnccl the
core loads, on host memory, with collectives between mpirun ranks going
through files. The core loads it exactly as it loads the real libraries
(HVDCOMPAT_CUDART_LIB / HVDCOMPAT_NCCL_LIB), so every backend path runs:
lanes, fusion pack/unpack, hierarchical allreduce, uneven allgather and
reducescatter, alltoall over send/recv, host staging, joined ranks, DLPack
device outputs and their frees, asynchronous NCCL errors. What it cannot
show is real device concurrency: streams run in call order here. The device
script (tests/gpu/run_device_checks.sh) covers that on a GPU.
"""

import os
import sys

import pytest

from harness import run_ranks

CHECKS = os.path.join("tests", "gpu_fake", "rank_checks.py")
TIMEOUT = int(os.environ.get("HVDCOMPAT_TEST_TIMEOUT", "300"))


@pytest.fixture(scope="module")
def fake_lib(fake_gpu_lib):
    return fake_gpu_lib


def _launch(fake_lib, tmp_path, np, mode="full", **env):
    nccl_dir = tmp_path / "nccl"
    nccl_dir.mkdir()
    full = {"HVDCOMPAT_CUDART_LIB": fake_lib, "HVDCOMPAT_NCCL_LIB": fake_lib,
            "FAKE_NCCL_DIR": str(nccl_dir), "CHECK_MODE": mode}
    full.update({k: str(v) for k, v in env.items()})
    result = run_ranks(np, [sys.executable, CHECKS], timeout=TIMEOUT, env=full,
                       what=f"GPU checks ({mode})")
    passed = result.output.count(f"CHECKS PASSED ({mode})")
    assert passed == np, result.output
    return result


@pytest.mark.parametrize("np,env", [
    (2, {}),
    (3, {"HOROVOD_NUM_NCCL_STREAMS": 3}),
    (4, {"HOROVOD_NUM_NCCL_STREAMS": 2, "HOROVOD_HIERARCHICAL_ALLREDUCE": 1,
         "HVDCOMPAT_HIERARCHICAL_LOCAL_SIZE": 2}),
], ids=["np2", "np3-3lanes", "np4-hierarchical-2lanes"])
def test_nccl_backend_every_collective(fake_lib, tmp_path, np, env):
    _launch(fake_lib, tmp_path, np, **env)


def test_old_nccl_falls_back_and_async_completion(fake_lib, tmp_path):
    # NCCL 2.9: no ncclAvg, no bfloat16, no PreMulSum -> host staging for those;
    # async completion: synchronize only orders the caller's stream.
    _launch(fake_lib, tmp_path, 3, FAKE_NCCL_VERSION=20900, HOROVOD_ENABLE_ASYNC_COMPLETION=1)


def test_mpi_staging_lets_ranks_share_a_gpu(fake_lib, tmp_path):
    _launch(fake_lib, tmp_path, 2, mode="shared", HOROVOD_GPU_OPERATIONS="MPI", CHECK_DEVICE=0)


def test_nccl_rejects_two_ranks_on_one_gpu(fake_lib, tmp_path):
    _launch(fake_lib, tmp_path, 2, mode="duplicate", CHECK_DEVICE=0)


def test_async_nccl_error_aborts_instead_of_hanging(fake_lib, tmp_path):
    result = _launch(fake_lib, tmp_path, 2, mode="async_error", FAKE_NCCL_FAIL_AFTER=0)
    assert "was aborted" in result.output


def test_adasum_node_average_then_across_nodes(fake_lib, tmp_path):
    # Note [GPU Adasum] on 3 "nodes" of 2 ranks: node-local reduce-scatter and allgather, the
    # cross-node tree with its fold of the third node, dot products summed over each node.
    _launch(fake_lib, tmp_path, 6, mode="adasum", HVDCOMPAT_HIERARCHICAL_LOCAL_SIZE=2,
            FAKE_CUDA_DEVICE_COUNT=6)
