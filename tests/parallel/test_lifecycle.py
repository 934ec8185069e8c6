"""Many shutdown/init cycles in one process; ops after shutdown fail clearly; settings read at
init (HOROVOD_THREAD_AFFINITY pins each rank's engine threads to its local rank's core)."""

import os

import pytest
import torch

import hvdcompat as hvd
from parallel_util import saved_environ


def test_fifty_shutdown_init_cycles():
    n = hvd.size()
    for cycle in range(50):
        hvd.shutdown()
        hvd.init()
        t = torch.full((3,), float(hvd.rank() + cycle))
        assert torch.equal(hvd.allreduce(t, op=hvd.Sum, name="cycle"),
                           torch.full((3,), float(sum(range(n)) + n * cycle)))
        if cycle % 10 == 0:
            g = hvd.allgather(torch.tensor([hvd.rank()]))
            assert g.tolist() == list(range(n))


def test_restart_keeps_the_thread_level_mpi_started_with():
    # The engine reads the level MPI runs at on every init; nothing it does
    # in between (the MPI tool interface included) may lower it.
    first = hvd.mpi_threads_supported()
    for _ in range(2):
        hvd.shutdown()
        hvd.init()
        assert hvd.mpi_threads_supported() == first


def test_pending_async_ops_fail_at_shutdown_and_handles_are_dropped():
    # A name only this rank submits never completes; shutdown must not hang on it.
    h = hvd.allreduce_async(torch.ones(2), name=f"only_on_rank_{hvd.rank()}")
    hvd.shutdown()
    assert hvd.synchronize(h) is None  # handles from before shutdown are forgotten
    with pytest.raises(ValueError, match="was not created or has been cleared"):
        hvd.poll(h)
    hvd.init()
    assert hvd.allreduce(torch.ones(1), op=hvd.Sum, name="after").item() == hvd.size()


def test_each_init_starts_a_session_of_its_own():
    from hvdcompat import _session

    first = _session.current()
    assert (first.rank, first.size) == (hvd.rank(), hvd.size())
    hvd.shutdown()
    assert _session.get() is None
    with pytest.raises(ValueError, match=r"has not been initialized; use hvd.init\(\)"):
        _session.current()
    assert hvd.global_process_set.ranks == []  # no world runs
    hvd.init()
    assert _session.current() is not first
    assert hvd.global_process_set.ranks == list(range(hvd.size()))


def test_unnamed_op_counts_start_again_after_shutdown_and_init():
    # Only rank 0 advances its count of unnamed allreduces. If the count
    # outlived shutdown, rank 0 would name the next unnamed op differently
    # from the others after init, and the allreduce below would not complete
    # (the launch's timeout fails the test).
    n, r = hvd.size(), hvd.rank()
    if r == 0:
        hvd.allreduce_async(torch.ones(1), op=hvd.Sum)  # never completes: the others skip it
    hvd.shutdown()
    hvd.init()
    got = hvd.allreduce(torch.full((2,), float(r + 1)), op=hvd.Sum)
    assert torch.equal(got, torch.full((2,), float(n * (n + 1) // 2)))


# ------------------------------------------------------------ HOROVOD_THREAD_AFFINITY


def _engine_thread_cores():
    """{thread name: allowed cores} of this process's engine threads."""
    found = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                name = f.read().strip()
            if not name.startswith("hvd-ps"):
                continue
            with open(f"/proc/self/task/{tid}/status") as f:
                for line in f:
                    if line.startswith("Cpus_allowed_list:"):
                        found[name] = line.split(":", 1)[1].strip()
        except FileNotFoundError:  # a thread that ended meanwhile
            continue
    return found


@pytest.fixture
def affinity_env():
    with saved_environ("HOROVOD_THREAD_AFFINITY", "HVDCOMPAT_THREAD_AFFINITY"):
        yield
        hvd.shutdown()
    hvd.init()


def test_engine_threads_run_on_the_local_rank_core(affinity_env):
    allowed = sorted(os.sched_getaffinity(0))
    local_size = hvd.local_size()
    # One core per local rank, taken from the cores this process may use, in
    # reverse so that local rank i's core is not simply core i.
    cores = [allowed[(len(allowed) - 1 - i) % len(allowed)] for i in range(local_size)]
    hvd.shutdown()
    os.environ["HOROVOD_THREAD_AFFINITY"] = ",".join(map(str, cores))
    hvd.init()
    mine = cores[hvd.local_rank()]
    out = hvd.allreduce(torch.full((4,), float(hvd.rank())), op=hvd.Sum, name="pinned")
    assert torch.equal(out, torch.full((4,), float(sum(range(hvd.size())))))
    threads = _engine_thread_cores()
    assert "hvd-ps0" in threads, threads
    assert all(v == str(mine) for v in threads.values()), (mine, threads)
    # The training thread itself is not pinned.
    assert sorted(os.sched_getaffinity(0)) == allowed


def test_too_few_cores_fail_init_naming_the_variable(affinity_env):
    local_size = hvd.local_size()
    hvd.shutdown()
    if local_size < 2:
        pytest.skip("one rank per host: every non-empty list has enough cores")
    os.environ["HOROVOD_THREAD_AFFINITY"] = "0"
    with pytest.raises(ValueError, match=r"HOROVOD_THREAD_AFFINITY=0 lists 1 core\(s\) but this "
                                         r"host runs \d+ rank\(s\); give one core per local rank"):
        hvd.init()


def test_malformed_list_fails_init(affinity_env):
    hvd.shutdown()
    os.environ["HOROVOD_THREAD_AFFINITY"] = "0,x"
    with pytest.raises(ValueError, match=r"HOROVOD_THREAD_AFFINITY=0,x is not valid: expected "
                                         r"comma-separated core numbers"):
        hvd.init()


def test_a_failed_elastic_reset_leaves_no_runtime_and_the_next_init_works(affinity_env):
    from hvdcompat import basics

    # Read by the rebuilt runtime on every rank: the reset fails everywhere.
    os.environ["HOROVOD_THREAD_AFFINITY"] = "0,x"
    with pytest.raises(ValueError, match=r"HOROVOD_THREAD_AFFINITY=0,x is not valid"):
        basics._elastic_reset()
    assert not hvd.is_initialized()
    del os.environ["HOROVOD_THREAD_AFFINITY"]
    hvd.init()
    n = hvd.size()
    out = hvd.allreduce(torch.full((2,), float(hvd.rank())), op=hvd.Sum, name="after.failed.reset")
    assert out.tolist() == [float(sum(range(n)))] * 2
