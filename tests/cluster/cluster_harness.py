"""Launches jobs across the test hosts of a HostCluster, under a hard timeout.

The launcher (mpirun or hvdcompatrun) runs on the first test host, as a user
runs it on the first node of a cluster; the other hosts are reached through
the ssh stand-in. A timeout dumps every rank's Python stacks (SIGUSR1; the
test hosts share this machine's process table) before killing the job.
"""

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

from harness import REPO, LaunchResult, mpi_env, mpirun

__all__ = ["host_list", "run_mpirun", "run_hvdcompatrun", "run_on_each_host",
           "run_pytest_across_hosts", "PARALLEL_SELECTION"]

# What ranks need from the launching environment; mpirun forwards it with -x
# (a remote rank starts from a clean environment, as under ssh).
_RANK_ENV = ("PATH", "PYTHONPATH", "LD_LIBRARY_PATH", "PYTHONUNBUFFERED", "PYTHONFAULTHANDLER",
             "HVDCOMPAT_TEST_PIDDIR", "PYTEST_DISABLE_PLUGIN_AUTOLOAD")


def host_list(cluster, layout):
    """``-H`` value for `layout` (ranks per host, in host order)."""
    return ",".join(f"{cluster.names[i]}:{n}" for i, n in enumerate(layout))


def _dump_then_kill_ranks(piddir):
    """Every rank registered in `piddir` dumps its stacks (SIGUSR1), then is killed."""
    for sig, pause in ((signal.SIGUSR1, 3), (signal.SIGKILL, 0)):
        for name in os.listdir(piddir):
            try:
                os.kill(int(name), sig)
            except (ValueError, ProcessLookupError, PermissionError):
                pass
        time.sleep(pause)


def _run(cluster, cmd, timeout, env, piddir):
    start = time.monotonic()
    proc = subprocess.Popen(cluster.on_host(0, cmd), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, env=env, cwd=REPO, start_new_session=True,
                            text=True, errors="replace")
    chunks = []
    reader = threading.Thread(target=lambda: chunks.extend(iter(proc.stdout.readline, "")),
                              daemon=True)
    reader.start()
    timed_out = False
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        timed_out = True
        _dump_then_kill_ranks(piddir)
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()
    # Daemons left on a host that was cut off keep the output pipe open.
    reader.join(timeout=5)
    if reader.is_alive():
        cluster.kill_processes()
        reader.join(timeout=10)
    return LaunchResult(proc.returncode, "".join(chunks), time.monotonic() - start, timed_out,
                        " ".join(cmd))


def _finish(result, check, what, timeout):
    if check and (result.timed_out or result.returncode != 0):
        reason = (f"timed out after {timeout} s (stacks of every rank dumped above)"
                  if result.timed_out else f"exited with code {result.returncode}")
        raise AssertionError(f"{what} across test hosts {reason}.\ncommand: {result.command}\n"
                             f"----- output -----\n{result.output}")
    return result


def run_mpirun(cluster, layout, argv, timeout, env=None, mpi_args=(), npernode=None,
               check=True, what=None):
    """Runs `argv` under plain mpirun on the hosts of `layout` (e.g. ``[2, 1]``)."""
    piddir = tempfile.mkdtemp(prefix="hvd-pids-")
    try:
        full_env = mpi_env(env)
        full_env["HVDCOMPAT_TEST_PIDDIR"] = piddir
        names = sorted(set(_RANK_ENV) | set(env or ()))
        cmd = [mpirun(), "-np", str(sum(layout)), "-H", host_list(cluster, layout),
               "--bind-to", "none", "--output", "tag", *cluster.mpi_args()]
        if npernode:
            cmd += ["-npernode", str(npernode)]
        for name in names:
            if name in full_env:
                cmd += ["-x", name]
        cmd += [*mpi_args, *argv]
        result = _run(cluster, cmd, timeout, full_env, piddir)
    finally:
        shutil.rmtree(piddir, ignore_errors=True)
    return _finish(result, check, what or " ".join(argv), timeout)


def run_hvdcompatrun(cluster, args, timeout, env=None, check=True):
    """Runs ``hvdcompatrun ARGS`` on the first test host."""
    piddir = tempfile.mkdtemp(prefix="hvd-pids-")
    try:
        full_env = mpi_env(env)
        full_env["HVDCOMPAT_TEST_PIDDIR"] = piddir
        cmd = [sys.executable, "-m", "hvdcompat.runner.launch", *args]
        result = _run(cluster, cmd, timeout, full_env, piddir)
    finally:
        shutil.rmtree(piddir, ignore_errors=True)
    return _finish(result, check, "hvdcompatrun " + " ".join(args), timeout)


def run_on_each_host(cluster, commands, timeout, env=None, hostname=None):
    """Runs ``commands[k]`` on test host k, all at once, as a user starts a launcher on
    each machine (``torchrun --node_rank=k`` ...); returns their LaunchResults.

    On a timeout every rank's stacks are dumped (ranks register in
    HVDCOMPAT_TEST_PIDDIR) and every command is killed. `hostname` gives
    every command that host name instead of its host's (see HostCluster.on_host).
    """
    piddir = tempfile.mkdtemp(prefix="hvd-pids-")
    full_env = mpi_env(env)
    full_env["HVDCOMPAT_TEST_PIDDIR"] = piddir
    start = time.monotonic()
    procs, outputs, readers = [], [], []
    try:
        for k, argv in enumerate(commands):
            proc = subprocess.Popen(cluster.on_host(k, argv, hostname=hostname),
                                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                    env=full_env, cwd=REPO, start_new_session=True, text=True,
                                    errors="replace")
            chunks = []
            reader = threading.Thread(target=lambda p=proc, c=chunks: c.extend(
                iter(p.stdout.readline, "")), daemon=True)
            reader.start()
            procs.append(proc)
            outputs.append(chunks)
            readers.append(reader)
        timed_out = False
        for proc in procs:
            try:
                proc.wait(timeout=max(0.1, start + timeout - time.monotonic()))
            except subprocess.TimeoutExpired:
                timed_out = True
                break
        if timed_out:
            _dump_then_kill_ranks(piddir)
    finally:
        for proc in procs:
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            proc.wait()
        shutil.rmtree(piddir, ignore_errors=True)
    for reader in readers:
        reader.join(timeout=10)
    seconds = time.monotonic() - start
    return [LaunchResult(p.returncode, "".join(out), seconds, timed_out, " ".join(argv))
            for p, out, argv in zip(procs, outputs, commands)]


# A representative subset of tests/parallel (every collective, grouped ops,
# process sets, the optimizer, join, errors, topology), sized to the suite's
# time budget; the whole files run on one host in tests/test_parallel.py.
PARALLEL_SELECTION = [
    "tests/parallel/test_topology.py::test_topology_matches_the_launch_layout",
    "tests/parallel/test_topology.py::test_local_and_cross_topology_is_consistent",
    "tests/parallel/test_topology.py::test_local_leaders_reduce_in_their_own_process_set",
    "tests/parallel/test_topology.py::test_ddp_bootstrap_takes_local_rank_and_address_from_the_topology",
    "tests/parallel/test_allreduce.py::test_op_matches_local_reference",
    "tests/parallel/test_allreduce.py::test_many_async_ops_complete_in_any_synchronize_order",
    "tests/parallel/test_network_plan.py::test_auto_plan_follows_the_topology",
    "tests/parallel/test_allgather.py::test_blocks_in_rank_order",
    "tests/parallel/test_broadcast.py::test_out_of_place_from_every_root",
    "tests/parallel/test_alltoall.py::test_explicit_splits_with_zeros",
    "tests/parallel/test_reducescatter.py::test_op_and_row_split",
    "tests/parallel/test_grouped.py::test_groups_may_mix_dtypes_like_horovod",
    "tests/parallel/test_process_sets.py::test_collectives_on_even_and_odd_sets",
    "tests/parallel/test_process_sets.py::test_two_sets_make_progress_concurrently",
    "tests/parallel/test_optimizer_equivalence.py::test_single_model_matches_concatenated_batch",
    "tests/parallel/test_join.py::test_uneven_number_of_steps_then_join",
    "tests/parallel/test_errors.py::test_shape_mismatch_allreduce",
    "tests/parallel/test_errors.py::test_root_mismatch",
]


def run_pytest_across_hosts(cluster, layout, paths, timeout, npernode=None, env=None):
    """Runs pytest node ids `paths` in one job on the hosts of `layout`, with the rank plugin."""
    env = {"PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1",
           "HVDCOMPAT_TEST_LAYOUT": ",".join(map(str, layout)), **(env or {})}
    return run_mpirun(cluster, layout, [sys.executable, "-m", "pytest", "-x", "-q", "-s",
                                        "--color=no", "-p", "no:cacheprovider", "-p",
                                        "rankplugin", *paths],
                      timeout=timeout, env=env, npernode=npernode,
                      what=f"pytest on layout {layout}")
