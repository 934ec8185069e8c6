"""Ending an mpirun for good: SIGKILL, and the session directory it leaves.

Note [Session directory of a killed mpirun]
Open MPI 5's mpirun keeps a session directory, ``<base>/ompi.<pid of mpirun>``,
holding PMIx's rendezvous files (``pmix.<host>.tool``, ``pmix.<host>.tool.<pid>``).
It removes the directory when it ends on its own or on a signal it can catch;
SIGKILL leaves it behind. A later mpirun that is given the same pid (pid_max is
32768 on many machines and in most containers, so pids come round within
hours on a busy node) finds the rendezvous file already there, and the PMIx
5.0 server refuses to start before any rank runs: "The PMIx server's listener
thread failed to start. We cannot continue." Nothing on the command line says
why, and the job that fails may be anyone's.

So an mpirun that hvdcompatrun (or ``hvdcompat.run``) has to SIGKILL has its
session directory removed while it is still a zombie: until it is reaped its
pid cannot be given to another process, so the directory removed is certainly
its own. Then it is reaped. The base is where Open MPI puts it: the
``prte_tmpdir_base`` setting (``--prtemca``/``PRTE_MCA_prte_tmpdir_base``),
else ``TMPDIR``, ``TEMP`` or ``TMP``, else ``/tmp``. MPICH's launcher keeps no
such directory; nothing is removed there.

Directories other launches left (a job killed with ``kill -9``, an
out-of-memory kill) are removed before each launch, by the rule later PMIx
releases apply to their own rendezvous files: the directory is this user's,
it is an Open MPI session directory (its pid-named rendezvous file is there),
and the process it is named after no longer runs.
"""

import os
import re
import shutil
import signal
import stat
import subprocess
import time

_TMPDIR_SETTING = "prte_tmpdir_base"
# Directories Open MPI 5's launcher (ompi) and its daemons (prted) name by pid.
SESSION_DIR = re.compile(r"^(ompi|prted)\.(\d+)$")


def session_base(cmd=(), env=None):
    """The directory under which the mpirun of `cmd`, run with `env`, keeps its session directory."""
    env = os.environ if env is None else env
    cmd = list(cmd)
    for i, arg in enumerate(cmd[:-2]):
        if arg in ("--prtemca", "--mca", "-mca") and cmd[i + 1] == _TMPDIR_SETTING:
            return cmd[i + 2]
    for name in ("PRTE_MCA_" + _TMPDIR_SETTING, "TMPDIR", "TEMP", "TMP"):
        if env.get(name):
            return env[name]
    return "/tmp"


def remove_session_dir(base, pid):
    """Removes ``<base>/ompi.<pid>`` if it is there; True when something was removed.

    Call it only while `pid` cannot belong to another mpirun (its process is a
    zombie not yet reaped, or known gone with no launch since).
    """
    path = os.path.join(base, f"ompi.{pid}")
    if not _own_directory(path):
        return False
    shutil.rmtree(path, ignore_errors=True)
    return not os.path.exists(path)


def _own_directory(path):
    """True for a directory (not a link to one) that belongs to this user."""
    try:
        st = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid()


def is_running(pid):
    """Whether a process `pid` exists (of any user)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        pass
    return True


def remove_stale(base):
    """Removes the session directories under `base` of mpiruns that no longer run; returns them."""
    removed = []
    try:
        names = os.listdir(base)
    except OSError:
        return removed
    for name in names:
        found = SESSION_DIR.match(name)
        if not found or found.group(1) != "ompi":
            continue
        pid = int(found.group(2))
        path = os.path.join(base, name)
        try:
            if not _own_directory(path) or is_running(pid):
                continue
            if not any(n.startswith("pmix.") and n.endswith(f".tool.{pid}")
                       for n in os.listdir(path)):
                continue
        except OSError:
            continue
        shutil.rmtree(path, ignore_errors=True)
        if not os.path.exists(path):
            removed.append(path)
    return removed


def _wait_exited_unreaped(pid, timeout):
    """Waits up to `timeout` s for `pid` to exit, leaving it unreaped; True once it has."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            if os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT | os.WNOHANG) is not None:
                return True
        except ChildProcessError:  # already reaped by someone else
            return False
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.02)


def kill(proc, base, timeout=5.0):
    """SIGKILLs mpirun `proc` (a Popen), removes the session directory it leaves, reaps it.

    Returns its exit status as ``Popen.wait`` gives it.
    """
    if proc.poll() is not None:
        return proc.returncode
    try:
        proc.send_signal(signal.SIGKILL)
    except ProcessLookupError:
        pass
    # Only while the pid is still held (a zombie) is the directory surely this mpirun's.
    if _wait_exited_unreaped(proc.pid, timeout):
        remove_session_dir(base, proc.pid)
    return proc.wait()


def stop(proc, base, grace):
    """Ends mpirun `proc` (a Popen): SIGTERM, which it forwards to the ranks, then after
    `grace` s :func:`kill`. Returns its exit status as ``Popen.wait`` gives it."""
    if proc.poll() is not None:
        return proc.returncode
    try:
        proc.send_signal(signal.SIGTERM)
        return proc.wait(timeout=grace)
    except ProcessLookupError:
        return proc.wait()
    except subprocess.TimeoutExpired:
        return kill(proc, base)
