"""Topology and lifecycle queries agree with the launcher and across ranks."""

import os
import socket
import zlib

import pytest
import torch

import hvdcompat as hvd
from parallel_util import engine


def _launcher(what):
    """The launcher's RANK or SIZE for this process (Open MPI's or Hydra's PMI name)."""
    return int(os.environ.get(f"OMPI_COMM_WORLD_{what}") or os.environ[f"PMI_{what}"])


def test_rank_and_size_match_the_launcher():
    assert hvd.rank() == _launcher("RANK")
    assert hvd.size() == _launcher("SIZE")
    assert hvd.is_initialized()


def test_local_and_cross_topology_is_consistent():
    n = hvd.size()
    mine = torch.tensor([[hvd.rank(), hvd.local_rank(), hvd.local_size(), hvd.cross_rank(),
                          hvd.cross_size(), zlib.crc32(socket.gethostname().encode())]],
                        dtype=torch.int64)
    table = hvd.allgather(mine, name="topology")
    assert table.shape == (n, 6)
    assert table[:, 0].tolist() == list(range(n))
    for host in set(table[:, 5].tolist()):
        rows = table[table[:, 5] == host]
        # local ranks on a host are 0..local_size-1 and every rank agrees on local_size
        assert sorted(rows[:, 1].tolist()) == list(range(len(rows)))
        assert set(rows[:, 2].tolist()) == {len(rows)}
    # ranks sharing a local_rank form the cross communicator
    for lr in set(table[:, 1].tolist()):
        rows = table[table[:, 1] == lr]
        assert sorted(rows[:, 3].tolist()) == list(range(len(rows)))
        assert set(rows[:, 4].tolist()) == {len(rows)}
    hosts = len(set(table[:, 5].tolist()))
    sizes = {int(r[2]) for r in table}
    assert hvd.is_homogeneous() == (len(sizes) == 1)
    assert hvd.cross_size() == sum(1 for h in set(table[:, 5].tolist())
                                   if (table[table[:, 5] == h][:, 1] == hvd.local_rank()).any())
    assert hosts >= 1


def _launch_layout():
    """Ranks per host, in host order, as the launch placed them.

    ``HVDCOMPAT_TEST_LAYOUT`` ("2,1": two ranks on the first host, one on the
    second; ranks fill hosts in order) is set by the multi-host runs of
    tests/cluster; a single-host launch has every rank on one host.
    """
    text = os.environ.get("HVDCOMPAT_TEST_LAYOUT")
    return [int(x) for x in text.split(",")] if text else [hvd.size()]


def _expected_topology(layout, rank):
    start = 0
    for host, count in enumerate(layout):
        if rank < start + count:
            break
        start += count
    local_rank = rank - start
    hosts_with_it = [h for h, c in enumerate(layout) if c > local_rank]
    return {"host": host, "local_rank": local_rank, "local_size": layout[host],
            "cross_rank": hosts_with_it.index(host), "cross_size": len(hosts_with_it)}


def test_topology_matches_the_launch_layout():
    layout = _launch_layout()
    assert sum(layout) == hvd.size(), (layout, hvd.size())
    want = _expected_topology(layout, hvd.rank())
    got = {"local_rank": hvd.local_rank(), "local_size": hvd.local_size(),
           "cross_rank": hvd.cross_rank(), "cross_size": hvd.cross_size()}
    assert got == {k: want[k] for k in got}, (f"rank {hvd.rank()} of layout {layout}: "
                                              f"{got} != {want}")
    assert hvd.is_homogeneous() == (len(set(layout)) == 1)
    # Ranks the layout puts on one host share a hostname; other hosts' differ.
    names = hvd.allgather(torch.tensor([zlib.crc32(socket.gethostname().encode())],
                                       dtype=torch.int64), name="topology.hostnames").tolist()
    hosts = [_expected_topology(layout, r)["host"] for r in range(hvd.size())]
    for r in range(hvd.size()):
        for q in range(hvd.size()):
            assert (names[r] == names[q]) == (hosts[r] == hosts[q]), (r, q, names, hosts)


def test_local_leaders_reduce_in_their_own_process_set():
    # One rank per host (local_rank 0), as a node-level step picks them.
    layout = _launch_layout()
    leaders = [r for r in range(hvd.size()) if _expected_topology(layout, r)["local_rank"] == 0]
    with engine(dynamic_process_sets=1):
        ps = hvd.add_process_set(leaders)
        if hvd.local_rank() == 0:
            out = hvd.allreduce(torch.tensor([float(hvd.rank() + 1)]), op=hvd.Sum,
                                name="leaders", process_set=ps)
            assert out.item() == sum(r + 1 for r in leaders)
        total = hvd.allreduce(torch.tensor([float(hvd.local_size())]), op=hvd.Sum,
                              name="local_sizes")
        assert total.item() == sum(c * c for c in layout)
        hvd.remove_process_set(ps)


def test_ddp_bootstrap_takes_local_rank_and_address_from_the_topology():
    from hvdcompat.ddp.bootstrap import bootstrap_env

    env = {"OMPI_COMM_WORLD_SIZE": str(hvd.size())}
    bootstrap_env(env)
    assert env["LOCAL_RANK"] == str(hvd.local_rank())
    assert env["LOCAL_WORLD_SIZE"] == str(hvd.local_size())
    if len(_launch_layout()) == 1:
        assert env["MASTER_ADDR"] == "127.0.0.1"
    else:
        # Every host must be able to reach it: rank 0's own address, not loopback.
        assert not env["MASTER_ADDR"].startswith("127."), env


def test_build_queries_answer_without_raising():
    assert hvd.mpi_built() is True and hvd.mpi_enabled() is True
    # Under mpirun the job runs on MPI whether or not this build has Gloo.
    assert hvd.gloo_built() is bool(getattr(hvd.basics._core, "gloo_built", lambda: False)())
    assert hvd.gloo_enabled() is False
    assert isinstance(hvd.nccl_built(), int)
    assert isinstance(hvd.cuda_built(), bool)
    assert hvd.ddl_built() is False and hvd.ccl_built() is False and hvd.rocm_built() is False
    assert isinstance(hvd.mpi_threads_supported(), bool)


def test_shutdown_then_init_again_works_many_times():
    for cycle in range(5):
        hvd.shutdown()
        assert not hvd.is_initialized()
        with pytest.raises(ValueError, match=r"Horovod has not been initialized; use hvd.init\(\)\."):
            hvd.rank()
        hvd.init()
        out = hvd.allreduce(torch.tensor([float(hvd.rank())]), op=hvd.Sum, name=f"cycle{cycle}")
        assert out.item() == sum(range(hvd.size()))


def test_second_init_is_harmless():
    hvd.init()
    assert hvd.size() == _launcher("SIZE")


def test_init_with_an_mpi4py_communicator_and_a_rank_list():
    from mpi4py import MPI

    hvd.shutdown()
    # Reverse the rank order: hvdcompat ranks follow the given communicator.
    world = MPI.COMM_WORLD
    comm = world.Split(color=0, key=world.Get_size() - 1 - world.Get_rank())
    hvd.init(comm)
    assert hvd.rank() == world.Get_size() - 1 - world.Get_rank()
    out = hvd.allgather(torch.tensor([world.Get_rank()]), name="order")
    assert out.tolist() == list(reversed(range(world.Get_size())))
    # User traffic on the communicator does not interfere with ours.
    assert comm.allreduce(1) == world.Get_size()
    hvd.shutdown()
    comm.Free()

    hvd.init(comm=list(range(world.Get_size())))
    assert hvd.rank() == world.Get_rank()
    hvd.shutdown()
    hvd.init()


# hvd.init compares every process's comm before making the job's
# communicator, so a bad or differing comm on one rank fails init on every
# rank, naming who passed what, instead of leaving the others waiting.


def _bad_comm_cases(rank, n, MPI, dup):
    """(case, what this rank passes, phrases in every rank's error); `dup`: a
    duplicate of the launch's world."""
    last = n - 1
    everyone = list(range(n))
    cases = [
        ("wrong type on one rank", "0,1" if rank == last else None,
         [f"rank {last} passed comm='0,1' (a str)", "expected None, a list of ranks"]),
        ("a rank out of range", everyone + [n] if rank == last else everyone,
         [f"rank {last} passed comm={everyone + [n]!r}", f"rank {n} is not in [0, {n})"]),
        ("a rank listed twice", [0] + everyone if rank == 0 else everyone,
         [f"rank 0 passed comm={[0] + everyone!r}", "rank 0 is listed twice"]),
        ("a communicator without this rank", MPI.COMM_NULL if rank == 0 else None,
         ["rank 0 passed comm=MPI.COMM_NULL", "not part of the communicator"]),
        ("comm on some ranks only", dup if rank == 0 else None,
         [f"rank 0 passed comm=an mpi4py communicator of launch ranks {everyone!r}",
          "passed comm=None"]),
    ]
    if n >= 3:
        cases.append(("lists that differ", [0, 2] if rank == 2 else everyone,
                      # Which of ranks 0 and 1 a message groups together depends on whose
                      # answer arrived first; the differing values are always named.
                      ["rank 2 passed comm=[0, 2]", f"passed comm={everyone!r}"]))
    return cases


def test_a_bad_or_differing_comm_on_one_rank_fails_init_on_every_rank():
    from mpi4py import MPI

    rank, n = hvd.rank(), hvd.size()
    dup = MPI.COMM_WORLD.Dup()
    for case, comm, phrases in _bad_comm_cases(rank, n, MPI, dup):
        hvd.shutdown()
        with pytest.raises(ValueError) as info:
            hvd.init(comm=comm)
        assert not hvd.is_initialized(), case
        message = str(info.value)
        assert message.startswith(f"hvd.init(comm=...) failed on rank {rank}: "), (case, message)
        for phrase in phrases + ["Pass the same comm on every process"]:
            assert phrase in message, (case, phrase, message)
        # Every rank is out of the failed attempt before the next one starts
        # (a rank still answering late peers of a failed attempt can, today,
        # fail a peer's immediate retry).
        MPI.COMM_WORLD.Barrier()
        hvd.init()
        out = hvd.allreduce(torch.tensor([float(rank)]), op=hvd.Sum, name=f"after.{case}")
        assert out.item() == sum(range(n)), case
    dup.Free()
    # Equal jobs however written: every rank listed (in any order) or None.
    hvd.shutdown()
    hvd.init(comm=list(reversed(range(n))) if rank == 0 else None)
    out = hvd.allgather(torch.tensor([rank]), name="comm.equal")
    assert out.tolist() == list(range(n))


def test_ops_after_shutdown_raise_clearly():
    hvd.shutdown()
    with pytest.raises(ValueError, match="not been initialized"):
        hvd.allreduce(torch.ones(2))
    hvd.init()
