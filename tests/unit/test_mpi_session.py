"""An mpirun that has to be SIGKILLed leaves no session directory behind.

Note [Session directory of a killed mpirun] in hvdcompat/runner/mpi_session.py:
a directory left as ``<base>/ompi.<pid>`` makes a later mpirun given that pid
fail before any rank runs.
"""

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from harness import flavor, mpi_env, mpirun
from hvdcompat.runner import mpi_session, run_job

# Plays an mpirun that ignores SIGTERM: makes its session directory, says so, sleeps.
_STUBBORN = textwrap.dedent("""
    import os, signal, sys, time
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    d = os.path.join(sys.argv[1], "ompi.%d" % os.getpid())
    os.makedirs(d)
    open(os.path.join(d, "pmix.host.tool.%d" % os.getpid()), "w").close()
    print("ready", flush=True)
    time.sleep(120)
""")


def _stubborn(base):
    proc = subprocess.Popen([sys.executable, "-c", _STUBBORN, str(base)],
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready"
    return proc


def test_session_base_follows_open_mpis_order():
    assert mpi_session.session_base([], {}) == "/tmp"
    assert mpi_session.session_base([], {"TMP": "/c", "TEMP": "/b"}) == "/b"
    env = {"TMPDIR": "/a", "TEMP": "/b", "PRTE_MCA_prte_tmpdir_base": "/p"}
    assert mpi_session.session_base([], env) == "/p"
    cmd = ["mpirun", "--prtemca", "prte_tmpdir_base", "/q", "-np", "2", "x"]
    assert mpi_session.session_base(cmd, env) == "/q"


def test_the_launchers_stop_removes_the_directory_of_an_mpirun_it_had_to_kill(tmp_path):
    other = tmp_path / "ompi.1"  # another mpirun's, not ours to remove
    other.mkdir()
    proc = _stubborn(tmp_path)
    mine = tmp_path / f"ompi.{proc.pid}"
    assert mine.is_dir()
    start = time.monotonic()
    code = mpi_session.stop(proc, str(tmp_path), grace=5)  # as hvdcompatrun stops it
    assert code == -signal.SIGKILL
    assert not mine.exists() and other.is_dir()
    assert time.monotonic() - start < 15


def test_hvdcompat_run_stop_removes_it_too(tmp_path, monkeypatch):
    monkeypatch.setattr(run_job, "_TERMINATE_GRACE_S", 0.5)
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    proc = _stubborn(tmp_path)
    run_job.stop(proc)
    assert proc.returncode == -signal.SIGKILL
    assert not (tmp_path / f"ompi.{proc.pid}").exists()


def test_an_mpirun_that_ended_by_itself_is_left_alone(tmp_path):
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    (tmp_path / f"ompi.{proc.pid}").mkdir()
    assert mpi_session.kill(proc, str(tmp_path)) == 0
    assert (tmp_path / f"ompi.{proc.pid}").is_dir()


def _kill_group(pgid):
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _real_mpirun(base):
    env = mpi_env({"TMPDIR": str(base)})
    cmd = [mpirun(), "-np", "1", "sleep", "60"]
    proc = subprocess.Popen(cmd, env=env, start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    session = base / f"ompi.{proc.pid}"
    deadline = time.monotonic() + 60
    while not (session / f"pmix.{os.uname().nodename}.tool.{proc.pid}").exists():
        assert proc.poll() is None and time.monotonic() < deadline, "mpirun did not start"
        time.sleep(0.1)
    return proc, cmd, env, session


@pytest.mark.skipif(flavor() != "openmpi", reason="Open MPI's launcher keeps the directory")
def test_open_mpis_own_mpirun_killed_leaves_it_and_ours_removes_it(tmp_path):
    # Open MPI's mpirun, killed plainly, leaves its session directory ...
    proc, _, _, session = _real_mpirun(tmp_path)
    try:
        proc.kill()
        proc.wait()
        assert session.is_dir()
    finally:
        _kill_group(proc.pid)  # its rank
    # ... and killed through mpi_session, does not.
    proc, cmd, env, session = _real_mpirun(tmp_path)
    try:
        assert mpi_session.kill(proc, mpi_session.session_base(cmd, env)) == -signal.SIGKILL
        assert not session.exists()
    finally:
        _kill_group(proc.pid)


def _ended_pid():
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def _left_dir(base, pid, rendezvous=True):
    path = base / f"ompi.{pid}"
    path.mkdir()
    if rendezvous:
        (path / f"pmix.somehost.tool.{pid}").write_text("uri\n")
    return path


def test_before_a_launch_only_directories_of_mpiruns_gone_are_removed(tmp_path):
    gone = _left_dir(tmp_path, _ended_pid())
    alive = _left_dir(tmp_path, os.getpid())           # its process runs
    not_open_mpis = _left_dir(tmp_path, _ended_pid(), rendezvous=False)
    daemon = tmp_path / f"prted.{_ended_pid()}"         # a daemon's: not the launcher's to judge
    daemon.mkdir()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    linked = _ended_pid()
    target = _left_dir(elsewhere, linked)
    link = tmp_path / f"ompi.{linked}"                 # a link is never followed
    link.symlink_to(target)
    assert mpi_session.remove_stale(str(tmp_path)) == [str(gone)]
    assert not gone.exists()
    assert alive.is_dir() and not_open_mpis.is_dir() and daemon.is_dir()
    assert link.is_symlink() and (target / f"pmix.somehost.tool.{linked}").exists()


def test_hvdcompatrun_clears_a_left_directory_and_runs(tmp_path):
    gone = _left_dir(tmp_path, _ended_pid())
    out = subprocess.run([sys.executable, "-m", "hvdcompat.runner.launch", "-np", "1",
                          sys.executable, "-c", "print('ran')"],
                         env=mpi_env({"TMPDIR": str(tmp_path)}), capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0 and "ran" in out.stdout, out.stdout + out.stderr
    assert not gone.exists()
