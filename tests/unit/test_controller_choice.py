"""hvd.init()'s controller choice and a Gloo launch's variables (hvdcompat.rendezvous),
and the ranks' agreement over the store before the engine starts (hvdcompat.gloo_init)."""

import os
import threading
import time

import pytest

from hvdcompat import gloo_init, rendezvous
from hvdcompat.store import StoreError, serve

TORCHRUN = {"RANK": "1", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2",
            "GROUP_RANK": "0", "GROUP_WORLD_SIZE": "2", "MASTER_ADDR": "10.0.0.1",
            "MASTER_PORT": "29500", "TORCHELASTIC_RUN_ID": "x", "TORCHELASTIC_RESTART_COUNT": "2",
            "TORCHELASTIC_USE_AGENT_STORE": "True"}
GLOO_RUN = {"HOROVOD_GLOO_RENDEZVOUS_ADDR": "10.0.0.9", "HOROVOD_GLOO_RENDEZVOUS_PORT": "4000",
            "HOROVOD_CONTROLLER": "gloo", "HOROVOD_CPU_OPERATIONS": "gloo", "HOROVOD_RANK": "2",
            "HOROVOD_SIZE": "3", "HOROVOD_LOCAL_RANK": "0", "HOROVOD_LOCAL_SIZE": "1",
            "HOROVOD_CROSS_RANK": "2", "HOROVOD_CROSS_SIZE": "3", "HOROVOD_HOSTNAME": "n3",
            "HOROVOD_GLOO_IFACE": "eth1"}
MPIRUN = {"OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_RANK": "0"}


@pytest.mark.parametrize("environ, want", [
    ({}, "mpi"),                                              # python train.py
    (MPIRUN, "mpi"),
    ({**MPIRUN, "RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "a"}, "mpi"),  # ddp bootstrap
    (TORCHRUN, "gloo"),
    ({"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "a", "MASTER_PORT": "1"}, "gloo"),
    (GLOO_RUN, "gloo"),
    ({**MPIRUN, "HOROVOD_CONTROLLER": "gloo"}, "gloo"),
    ({**TORCHRUN, "HOROVOD_CONTROLLER": "MPI"}, "mpi"),
    ({**TORCHRUN, "HOROVOD_CONTROLLER": "mpi", "HVDCOMPAT_CONTROLLER": "gloo"}, "gloo"),
    ({"HOROVOD_CONTROLLER": ""}, "mpi"),
    ({**TORCHRUN, "HOROVOD_CONTROLLER": "auto"}, "gloo"),
])
def test_controller_choice(environ, want):
    assert rendezvous.controller_choice(environ) == want


def test_an_unknown_controller_names_the_variable():
    with pytest.raises(ValueError, match=r"HVDCOMPAT_CONTROLLER=nccl is not valid: expected "
                                         r"auto, mpi or gloo"):
        rendezvous.controller_choice({"HVDCOMPAT_CONTROLLER": "nccl", "HOROVOD_CONTROLLER": "mpi"})
    with pytest.raises(ValueError, match=r"HOROVOD_CONTROLLER=tcp is not valid"):
        rendezvous.controller_choice({"HOROVOD_CONTROLLER": "tcp"})


def test_torchrun_variables_give_rank_topology_and_the_agent_store():
    launch = rendezvous.gloo_launch(TORCHRUN)
    assert (launch.rank, launch.size, launch.local_rank, launch.local_size, launch.cross_rank,
            launch.cross_size) == (1, 4, 1, 2, 0, 2)
    assert (launch.store_host, launch.store_port, launch.store_source) == (
        "10.0.0.1", 29500, "MASTER_ADDR:MASTER_PORT")
    assert launch.attempt == 2 and launch.agent_store and launch.timeout_s == 30.0
    bare = rendezvous.gloo_launch({"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "h",
                                   "MASTER_PORT": "7"})
    assert (bare.local_rank, bare.local_size, bare.cross_rank, bare.cross_size) == (-1,) * 4
    assert not bare.agent_store


def test_horovod_gloo_variables_win_and_give_the_launchers_store():
    launch = rendezvous.gloo_launch({**TORCHRUN, **GLOO_RUN, "HOROVOD_GLOO_TIMEOUT_SECONDS": "7"})
    assert (launch.rank, launch.size, launch.local_rank, launch.local_size, launch.cross_rank,
            launch.cross_size, launch.hostname, launch.iface) == (2, 3, 0, 1, 2, 3, "n3", "eth1")
    assert (launch.store_host, launch.store_port) == ("10.0.0.9", 4000)
    assert launch.timeout_s == 7.0 and launch.launcher == "hvdcompatrun --gloo"


@pytest.mark.parametrize("change, needle", [
    ({"RANK": "4"}, r"RANK=4 must be 0\.\.3"),
    ({"WORLD_SIZE": "two"}, r"WORLD_SIZE='two' is not a whole number"),
    ({"WORLD_SIZE": ""}, r"WORLD_SIZE is not set"),
    ({"MASTER_PORT": "0"}, r"MASTER_PORT=0 must be"),
    ({"LOCAL_RANK": "2"}, r"LOCAL_RANK=2 must be 0\.\.1"),
    ({"HOROVOD_GLOO_TIMEOUT_SECONDS": "-1"}, r"HOROVOD_GLOO_TIMEOUT_SECONDS=-1 is not valid"),
    ({"HVDCOMPAT_GLOO_TIMEOUT_SECONDS": "soon"}, r"HVDCOMPAT_GLOO_TIMEOUT_SECONDS=soon is not"),
    ({"HOROVOD_GLOO_TIMEOUT_SECONDS": "0"}, r"GLOO_TIMEOUT_SECONDS\) is 0: give a positive"),
])
def test_bad_launch_variables_name_the_variable(change, needle):
    with pytest.raises(ValueError, match=needle):
        rendezvous.gloo_launch({**TORCHRUN, **change})


class _Core:
    def __init__(self, gloo):
        self._gloo = gloo

    def gloo_built(self):
        return self._gloo


def test_no_gloo_build_fails_clearly_before_touching_the_store():
    # The store address is unreachable: the build's answer must come first, at once.
    started = time.monotonic()
    with pytest.raises(RuntimeError, match="this build has no Gloo controller"):
        gloo_init.prepare(_Core(False), {**TORCHRUN, "MASTER_ADDR": "127.0.0.1",
                                         "MASTER_PORT": "1"})
    assert time.monotonic() - started < 5
    with pytest.raises(RuntimeError, match="this build has no Gloo controller"):
        gloo_init.prepare(_Core(False), {"HOROVOD_CONTROLLER": "gloo"})
    assert gloo_init.prepare(_Core(False), MPIRUN) is None
    assert gloo_init.prepare(_Core(False), {}) is None


def test_gloo_asked_for_without_a_store_says_how_to_launch():
    with pytest.raises(ValueError, match="no launcher gave this process a store"):
        gloo_init.prepare(_Core(True), {"HOROVOD_CONTROLLER": "gloo"})


def _ranks(port, environs, processes=None, stagger=0.0):
    """Runs prepare() for each environment at once (one thread per rank), with fresh
    per-process state unless `processes` is given; each thread starts `stagger` s after
    the one before."""
    processes = processes or [gloo_init._GlooProcess() for _ in environs]
    results = [None] * len(environs)

    def run(i):
        try:
            results[i] = gloo_init.prepare(_Core(True), environs[i], processes[i])
        except Exception as e:  # noqa: BLE001 - compared below
            results[i] = e

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(environs))]
    for t in threads:
        t.start()
        time.sleep(stagger)
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads)
    return results


def _gloo_env(port, rank, size, **extra):
    return {"HOROVOD_GLOO_RENDEZVOUS_ADDR": "127.0.0.1", "HOROVOD_GLOO_RENDEZVOUS_PORT": str(port),
            "HOROVOD_RANK": str(rank), "HOROVOD_SIZE": str(size), "HOROVOD_HOSTNAME": f"h{rank}",
            "HOROVOD_GLOO_TIMEOUT_SECONDS": "5", **extra}


@pytest.fixture
def store():
    server, port = serve("127.0.0.1", 0, timeout_s=10)
    yield port
    del server


def test_agreeing_ranks_get_the_engine_options(store):
    results = _ranks(store, [_gloo_env(store, r, 3) for r in range(3)])
    for r, opts in enumerate(results):
        assert isinstance(opts, dict), opts
        assert (opts["controller"], opts["rank"], opts["size"], opts["hostname"],
                opts["gloo_timeout_s"]) == ("gloo", r, 3, f"h{r}", 5.0)
        client = opts["store"]
        assert client.prefix.startswith("hvdcompat/0/") and client.address.endswith(str(store))
    # Every rank's client shares one prefix: a key one sets, the others read.
    results[0]["store"].set("k", b"v")
    assert results[2]["store"].get("k") == b"v"


def test_a_rank_with_another_world_size_fails_every_rank(store):
    envs = [_gloo_env(store, 0, 3), _gloo_env(store, 1, 2), _gloo_env(store, 2, 3)]
    results = _ranks(store, envs)
    messages = {str(e).split(": ", 1)[1] for e in results}
    assert all(isinstance(e, ValueError) for e in results), results
    assert len(messages) == 1, messages
    assert "disagree on the world size" in messages.pop()
    assert "rank 1 on h1: size 2" in str(results[0])


def test_a_rank_on_mpi_under_a_gloo_launch_fails_every_rank(store):
    envs = [_gloo_env(store, r, 2) for r in range(2)]
    envs[1]["HOROVOD_CONTROLLER"] = "mpi"
    results = _ranks(store, envs)
    assert all(isinstance(e, ValueError) and "controller mpi" in str(e) for e in results), results


def test_mpi_for_every_rank_of_a_gloo_launch_is_refused(store):
    envs = [_gloo_env(store, r, 2, HOROVOD_CONTROLLER="mpi") for r in range(2)]
    results = _ranks(store, envs)
    assert all(isinstance(e, ValueError) and "MPI cannot join processes" in str(e)
               for e in results), results


def test_a_rank_that_never_comes_is_named_within_the_timeout(store):
    started = time.monotonic()
    results = _ranks(store, [_gloo_env(store, r, 3, HOROVOD_GLOO_TIMEOUT_SECONDS="2")
                             for r in (0, 1)])
    assert time.monotonic() - started < 15
    for e in results:
        assert isinstance(e, StoreError), e
        assert "rank(s) 2 of 3 did not reach hvd.init() within 2 s" in str(e)
        assert f"127.0.0.1:{store}" in str(e)


def test_the_engine_spans_a_torchrun_launch_only_with_gloo_built():
    assert gloo_init.engine_spans_launch(_Core(False), MPIRUN) == (True, "")
    assert gloo_init.engine_spans_launch(_Core(True), TORCHRUN) == (True, "")
    assert gloo_init.engine_spans_launch(_Core(True), GLOO_RUN) == (True, "")
    ok, why = gloo_init.engine_spans_launch(_Core(False), TORCHRUN)
    assert not ok and "not started by an MPI launcher" in why and "no Gloo controller" in why
    ok, why = gloo_init.engine_spans_launch(_Core(True), {})
    assert not ok and "nor by torchrun or hvdcompatrun --gloo" in why
    # MPI asked for under torchrun: the engine would be a one-rank MPI world.
    assert not gloo_init.engine_spans_launch(_Core(True), {**TORCHRUN,
                                                           "HOROVOD_CONTROLLER": "mpi"})[0]


def test_without_torchruns_agent_rank_0_serves_the_store_and_torch_joins_it(monkeypatch):
    import datetime
    import socket

    from torch.distributed import TCPStore

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    # prepare() sets both in os.environ; setenv first makes monkeypatch restore their absence
    # (a bare delenv of an unset variable records nothing, and the next tests would see them).
    for name in ("TORCHELASTIC_USE_AGENT_STORE", "TORCHELASTIC_RESTART_COUNT"):
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)
    envs = [{"RANK": str(r), "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1",
             "MASTER_PORT": str(port), "HOROVOD_GLOO_TIMEOUT_SECONDS": "10"} for r in (0, 1)]
    processes = [gloo_init._GlooProcess(), gloo_init._GlooProcess()]
    # Rank 0 binds MASTER_PORT first, as it would start its server.
    results = _ranks(port, envs, processes, stagger=0.5)
    assert all(isinstance(r, dict) for r in results), results
    assert processes[0].server is not None and processes[1].server is None
    # A later init_process_group connects as a client to rank 0's server, not binding the port.
    assert os.environ["TORCHELASTIC_USE_AGENT_STORE"] == "True"
    assert os.environ["TORCHELASTIC_RESTART_COUNT"] == "0"
    torch_client = TCPStore("127.0.0.1", port, is_master=False,
                            timeout=datetime.timedelta(seconds=5))
    torch_client.set("from torch", b"1")
    assert processes[0].server.get("from torch") == b"1"


def test_later_inits_share_the_store_connection_until_it_fails():
    # Note [One store connection per process] (hvdcompat/gloo_init.py).
    server, port = serve("127.0.0.1", 0, 10)
    envs = [{**TORCHRUN, "RANK": str(r), "LOCAL_RANK": str(r), "WORLD_SIZE": "2",
             "LOCAL_WORLD_SIZE": "2", "GROUP_WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1",
             "MASTER_PORT": str(port),
             "HOROVOD_GLOO_TIMEOUT_SECONDS": "10"} for r in (0, 1)]
    processes = [gloo_init._GlooProcess(), gloo_init._GlooProcess()]

    def inits():
        results = _ranks(port, envs, processes)
        assert all(isinstance(r, dict) for r in results), results
        return [r["store"] for r in results]

    first, second = inits(), inits()
    for a, b in zip(first, second):
        assert b._store is a._store and b.prefix != a.prefix
    second[0].set("k", b"0")  # the new prefix's keys, on the shared connection
    assert second[1].get("k") == b"0"
    with pytest.raises(StoreError, match="timed out"):
        second[0].wait(["never set"], 0.2)
    third = inits()
    assert third[0]._store is not first[0]._store  # a connection that failed is not reused
    assert third[1]._store is first[1]._store
    del server


def test_the_interface_is_horovods_else_torchs_gloo_socket_ifname():
    launch = rendezvous.gloo_launch({**TORCHRUN, "GLOO_SOCKET_IFNAME": "eth2,eth3"})
    assert launch.iface == "eth2"
    launch = rendezvous.gloo_launch({**TORCHRUN, **GLOO_RUN, "GLOO_SOCKET_IFNAME": "eth2"})
    assert launch.iface == "eth1"
    assert rendezvous.gloo_launch(TORCHRUN).iface == ""


def test_gloo_binds_to_the_host_names_address_unless_it_is_loopback(monkeypatch):
    addresses = {"node1": "10.0.0.5", "lo-node": "127.0.1.1", "10.0.0.1": "10.0.0.1",
                 "127.0.0.1": "127.0.0.1"}
    monkeypatch.setattr(gloo_init, "_ipv4", addresses.get)
    remote = rendezvous.gloo_launch(TORCHRUN)  # the store at 10.0.0.1
    assert gloo_init.bind_address(remote, hostname="node1") == ""  # the name's own address
    # A job on this machine (the store on loopback) and a named interface keep the name.
    local = rendezvous.gloo_launch({**TORCHRUN, "MASTER_ADDR": "127.0.0.1"})
    assert gloo_init.bind_address(local, hostname="lo-node") == ""
    named = rendezvous.gloo_launch({**TORCHRUN, "GLOO_SOCKET_IFNAME": "eth0"})
    assert gloo_init.bind_address(named, hostname="lo-node") == ""
    # A loopback name with the store elsewhere: the address routed toward the store, which
    # is never a loopback one (tests/cluster/test_ddp_across_hosts.py runs it across hosts).
    found = gloo_init.bind_address(remote, hostname="lo-node")
    assert not found.startswith("127."), found
