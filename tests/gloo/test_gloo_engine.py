"""The engine on its Gloo controller, without any launcher: the tests start
the ranks themselves (plain Python processes meeting through a torch
TCPStore) and call the engine directly (tests/gloo/gloo_store.py)."""

import os
import re
import socket
import subprocess
import sys
import time

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_ranks(script, size, args=(), timeout=240, env=None):
    """Starts `size` ranks of `script` (RANK SIZE PORT *args); returns
    [(returncode, output)] by rank. A rank still running after `timeout`
    is killed and fails the test, with every rank's output."""
    port = free_port()
    full_env = dict(os.environ, HOROVOD_DYNAMIC_PROCESS_SETS="1", **(env or {}))
    procs = [subprocess.Popen([sys.executable, os.path.join(HERE, script), str(r), str(size),
                               str(port), *map(str, args)],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              env=full_env)
             for r in range(size)]
    deadline = time.monotonic() + timeout
    results, hung = [], []
    for r, p in enumerate(procs):
        try:
            out, _ = p.communicate(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            out, _ = p.communicate()
            hung.append(r)
        results.append((p.returncode, out))
    if hung:
        pytest.fail(f"ranks {hung} of {size} still ran after {timeout} s:\n" + dump(results))
    return results


def dump(results):
    return "\n".join(f"--- rank {r} (exit {rc}) ---\n{out}" for r, (rc, out) in enumerate(results))


@pytest.mark.parametrize("size", [2, 3])
def test_every_collective_and_dtype(size):
    results = run_ranks("gloo_collectives.py", size)
    for r, (rc, out) in enumerate(results):
        assert rc == 0 and f"rank {r}/{size}: gloo collectives OK" in out, dump(results)


def test_missing_rank_is_named_within_the_timeout():
    # Two ranks announced, one started: the one that came names the other.
    results = run_ranks("gloo_bad_init.py", 1, args=("missing",), timeout=120)
    rc, out = results[0]
    assert rc == 0, dump(results)
    assert "ranks [1] of 2 did not join the rendezvous at TCPStore at 127.0.0.1:" in out, out
    assert "HOROVOD_CONTROLLER=gloo" in out, out


def test_ranks_disagreeing_on_size_fail_on_every_rank():
    results = run_ranks("gloo_bad_init.py", 2, args=("sizes",), timeout=120)
    for rc, out in results:
        assert rc == 0, dump(results)
    assert "ranks [1] joined the rendezvous at TCPStore" in results[0][1], dump(results)
    assert "with world size 3, this rank with 2" in results[0][1], dump(results)
    assert "did not join the rendezvous" in results[1][1], dump(results)


def test_failing_store_is_named():
    results = run_ranks("gloo_bad_init.py", 1, args=("broken",), timeout=120)
    rc, out = results[0]
    assert rc == 0, dump(results)
    assert "could not write to the rendezvous store (BrokenStore at 198.18.0.1:29500)" in out, out
    assert "ConnectionRefusedError: no route" in out, out


def test_shutdown_ends_a_wait_on_a_stopped_peer():
    # Before Gloo's waits were abortable, hvd.shutdown() waited on the stopped peer forever.
    results = run_ranks("gloo_stopped_peer.py", 2, timeout=120)
    (rc0, out0), (rc1, _) = results
    assert rc0 == 0, dump(results)
    assert rc1 == -9, dump(results)  # stopped until rank 0 killed it
    assert "the pending op: HorovodInternalError" in out0, out0
    # No word of MPI_Finalize at exit: the Gloo controller never starts MPI.
    assert "MPI_Finalize" not in out0, out0


@pytest.mark.parametrize("size", [2, 3])
def test_stall_inspector_names_the_ranks_and_shuts_down(size):
    results = run_ranks("gloo_stall.py", size, timeout=120,
                        env={"HOROVOD_STALL_CHECK_TIME_SECONDS": "1",
                             "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS": "4"})
    others = ", ".join(str(r) for r in range(size - 1))
    stopped = []  # the ranks that stopped with the stall explanation
    for r, (rc, out) in enumerate(results):
        assert rc == 0 and f"rank {r}/{size}: stall shutdown:" in out, dump(results)
        line = out.split(f"rank {r}/{size}: stall shutdown:")[1].splitlines()[0]
        if "(HOROVOD_STALL_SHUTDOWN_TIME_SECONDS=4)" in line:
            stopped.append(r)
    assert stopped, dump(results)
    for r, (_, out) in enumerate(results):
        line = out.split(f"rank {r}/{size}: stall shutdown:")[1].splitlines()[0]
        # The others name one of the ranks that stopped.
        named = re.findall(r"rank\(s\) ([\d, ]+) on host", line)
        assert r in stopped or any(int(n) in stopped for n in ",".join(named).split(",") if n), \
            dump(results)
    # Rank 0 (the coordinator) names who submitted each tensor and who did not.
    warning = results[0][1]
    assert ("allreduce 'allreduce.stall.a' waiting" in warning
            and f"submitted by rank(s) {others}; not submitted by rank(s) {size - 1}"
            in warning), dump(results)
    assert ("allreduce 'allreduce.stall.b' waiting" in warning
            and f"submitted by rank(s) {size - 1}; not submitted by rank(s) {others}"
            in warning), dump(results)
