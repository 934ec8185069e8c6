"""The GPU data plane end to end on CPU-only machines, against a fake CUDA/NCCL.

tests/gpu_fake/fake_cudart.cc + fake_nccl.cc implements the slice of libcudart and libnccl the
core loads, on host memory, with collectives between mpirun ranks going
through files. The core loads it exactly as it loads the real libraries
(HVDCOMPAT_CUDART_LIB / HVDCOMPAT_NCCL_LIB), so every backend path runs:
lanes, fusion pack/unpack, hierarchical allreduce, uneven allgather and
reducescatter, alltoall over send/recv, host staging, joined ranks, DLPack
device outputs and their frees, asynchronous NCCL errors. Streams behave as
on a device (a queue and a worker each, events, stream waits, device-wide
syncs in cudaFree), and the fake counts ordering mistakes, so the stream rules
of Note [GPU stream order] are checked here; what it cannot show is a real
GPU's speed and kernels. The device script (tests/gpu/run_device_checks.sh)
covers that on a GPU.

The same checks run on the Gloo controller (hvdcompatrun --gloo, no MPI launcher): CUDA tensors
on NCCL with the unique ids carried over each set's Gloo context, GPU Adasum with its cross-node
step over Gloo, host staging through the Gloo backend, process sets, the hierarchical
communicators, an elastic reset; every rank asserts that MPI was never initialised and that
every communicator was joined by each of its ranks.
"""

import os
import sys

import pytest

from harness import flavor, run_ranks

CHECKS = os.path.join("tests", "gpu_fake", "rank_checks.py")
TIMEOUT = int(os.environ.get("HVDCOMPAT_TEST_TIMEOUT", "300"))


@pytest.fixture(scope="module")
def fake_lib(fake_gpu_lib):
    return fake_gpu_lib


def _launch(fake_lib, tmp_path, np, mode="full", controller="mpi", passing=None,
            launcher_args=(), **env):
    nccl_dir = tmp_path / "nccl"
    nccl_dir.mkdir()
    full = {"HVDCOMPAT_CUDART_LIB": fake_lib, "HVDCOMPAT_NCCL_LIB": fake_lib,
            "FAKE_NCCL_DIR": str(nccl_dir), "CHECK_MODE": mode, "CHECK_CONTROLLER": controller}
    full.update({k: str(v) for k, v in env.items()})
    result = run_ranks(np, [sys.executable, CHECKS], timeout=TIMEOUT, env=full,
                       what=f"GPU checks ({mode}, {controller})", controller=controller,
                       mpi_args=launcher_args)
    passed = result.output.count(f"CHECKS PASSED ({mode})")
    assert passed == (np if passing is None else passing), result.output
    return result


@pytest.mark.parametrize("np,env", [
    (2, {"FAKE_CUDA_OP_DELAY_US": 20}),
    (3, {"HOROVOD_NUM_NCCL_STREAMS": 3, "FAKE_CUDA_NO_MEMPOOLS": 1}),
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
    result = _launch(fake_lib, tmp_path, 2, mode="async_error", FAKE_NCCL_FAIL_AFTER=0,
                     FAKE_CUDA_OP_DELAY_US=200)
    assert "was aborted" in result.output


def test_adasum_node_average_then_across_nodes(fake_lib, tmp_path):
    # Note [GPU Adasum] on 3 "nodes" of 2 ranks: node-local reduce-scatter and allgather, the
    # cross-node tree with its fold of the third node, dot products summed over each node.
    _launch(fake_lib, tmp_path, 6, mode="adasum", HVDCOMPAT_HIERARCHICAL_LOCAL_SIZE=2,
            FAKE_CUDA_DEVICE_COUNT=6)
def test_async_completion_watchdog_aborts_a_failed_communicator(fake_lib, tmp_path):
    _launch(fake_lib, tmp_path, 2, mode="async_watchdog", FAKE_NCCL_FAIL_AFTER=0,
            FAKE_NCCL_ERROR_DELAY_MS=300, HOROVOD_ENABLE_ASYNC_COMPLETION=1)


def test_abort_waits_for_a_launch_in_progress(fake_lib, tmp_path):
    _launch(fake_lib, tmp_path, 2, mode="abort_during_launch", FAKE_NCCL_FAIL_AFTER=0,
            FAKE_NCCL_ERROR_DELAY_MS=1000, FAKE_NCCL_HANG_CALL_MS=3500)


def test_nccl_launches_are_serialised_across_process_sets(fake_lib, tmp_path):
    _launch(fake_lib, tmp_path, 3, mode="process_sets", FAKE_NCCL_CALL_US=2000)


def test_elastic_reset_keeping_every_rank_makes_new_communicators(fake_lib, tmp_path):
    _launch(fake_lib, tmp_path, 2, mode="elastic_reset")


def test_elastic_reset_after_a_lost_rank_aborts_the_old_communicators(fake_lib, tmp_path):
    if flavor() == "mpich":
        pytest.skip("losing a rank needs fault-tolerant MPI (Open MPI 5's ULFM)")
    nccl_dir = tmp_path / "nccl"
    nccl_dir.mkdir()
    env = {"HVDCOMPAT_CUDART_LIB": fake_lib, "HVDCOMPAT_NCCL_LIB": fake_lib,
           "FAKE_NCCL_DIR": str(nccl_dir), "CHECK_MODE": "elastic_reset", "CHECK_LOSE_RANK": "1"}
    result = run_ranks(3, [sys.executable, CHECKS], timeout=TIMEOUT, env=env, check=False,
                       mpi_args=["--with-ft", "ulfm", "--mca", "btl", "tcp,self"],
                       what="GPU checks (elastic_reset, rank 1 lost)")
    out = result.output
    assert not result.timed_out, out
    assert "rank 1: LEAVING THE JOB" in out, out
    assert out.count("CHECKS PASSED (elastic_reset)") == 2, out
    for new_rank, old_rank in ((0, 0), (1, 2)):
        assert f"rank {new_rank}: old rank {old_rank} of 3, communicator" in out, out


@pytest.mark.parametrize("np,mode,env", [
    (2, "full", {}),
    (4, "full", {"HOROVOD_NUM_NCCL_STREAMS": 2, "HOROVOD_HIERARCHICAL_ALLREDUCE": 1,
                 "HVDCOMPAT_HIERARCHICAL_LOCAL_SIZE": 2}),
    (3, "shared", {"HOROVOD_GPU_OPERATIONS": "GLOO", "CHECK_DEVICE": 0}),
    (3, "process_sets", {"FAKE_NCCL_CALL_US": 2000}),
], ids=["np2", "np4-hierarchical-2lanes", "np3-staged-through-gloo", "np3-process-sets"])
def test_gloo_controller_runs_cuda_tensors_without_mpi(fake_lib, tmp_path, np, mode, env):
    # Every lane's, node's and set's communicator gets its unique id over Gloo; rank_checks
    # asserts MPI_Initialized is false and that each communicator was joined by all its ranks.
    result = _launch(fake_lib, tmp_path, np, mode, controller="gloo", **env)
    if mode != "shared":
        assert "each joined by every member" in result.output, result.output
    assert "MPI initialised: True" not in result.output, result.output


def test_gloo_elastic_reset_after_a_lost_rank_makes_new_communicators(fake_lib, tmp_path):
    # The survivors' reset through the store aborts the old communicator; the new world's first
    # CUDA collective makes one from a new unique id, carried over the new Gloo context. An
    # elastic launch (--min-np): a static one ends the job when a rank is lost.
    result = _launch(fake_lib, tmp_path, 3, "elastic_reset", controller="gloo", passing=2,
                     launcher_args=["--min-np", "2"], CHECK_LOSE_RANK=1)
    out = result.output
    assert "rank 1: LEAVING THE JOB" in out, out
    for new_rank, old_rank in ((0, 0), (1, 2)):
        assert f"rank {new_rank}: old rank {old_rank} of 3, communicator" in out, out
