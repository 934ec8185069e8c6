"""One job of :func:`hvdcompat.run`, as both of its launch paths start and watch it.

The mpirun line that starts every rank's :mod:`hvdcompat.runner.run_task`
(:func:`plan`), what the ranks report over the channel of Note [Run channel]
(:class:`Job`), waiting for mpirun (:func:`collect`, :func:`stop`), and the
errors those reports become (:class:`RankFailedError`, :func:`failure_error`,
:func:`describe_missing`). :mod:`hvdcompat.runner.run_func` launches the job with
one mpirun, :mod:`hvdcompat.runner.elastic.run_func` under hvdcompatrun's elastic driver.
"""

import os
import re
import subprocess
import sys
import threading
import time

import cloudpickle

from hvdcompat.runner.common import channel
from hvdcompat.exceptions import HorovodInternalError
from hvdcompat.runner import mpi_session as _mpi_session

__all__ = ["RankFailedError", "Job", "plan", "collect", "stop", "describe_missing",
           "failure_error"]

# After a rank has reported an exception mpirun ends the job by itself; this
# bounds the wait in case it does not.
_AFTER_FAILURE_GRACE_S = 30.0
# mpirun forwards SIGTERM to the ranks; past this it is killed.
_TERMINATE_GRACE_S = 10.0
# Reports already sent when mpirun exits may still be in the listener threads.
_DRAIN_S = 5.0


class RankFailedError(HorovodInternalError):
    """The function raised on a rank of a :func:`hvdcompat.run` job.

    The exception raised on the rank is this error's ``__cause__`` when it
    could be sent back; its type name, message and traceback are always in
    the message and in the attributes.

    Attributes:
        rank: the rank whose function raised (the first to report).
        exception_type: the class name of the rank's exception.
        remote_traceback: the traceback printed on that rank.
        failed_ranks: every rank that reported an exception.
    """

    def __init__(self, message, rank, exception_type, remote_traceback, failed_ranks):
        super().__init__(message)
        self.rank = rank
        self.exception_type = exception_type
        self.remote_traceback = remote_traceback
        self.failed_ranks = failed_ranks


class Job:
    """What the ranks reported.

    :meth:`handle` runs in the listener's threads (one per rank); the driver
    thread reads through :meth:`snapshot`, :meth:`settled` and :meth:`drain`.
    Every field is guarded by the lock.
    """

    def __init__(self, num_proc, payload):
        self.num_proc = num_proc  # set before the launch starts the ranks
        self._payload = payload
        self._lock = threading.Lock()
        self._hosts = {}      # rank -> host it runs on
        self._results = {}    # rank -> its result report (pickled "value", "final" place)
        self._failures = []   # error reports, in arrival order
        self._lost = {}       # rank -> why its connection ended without a report
        self._problems = []   # peers that did not behave like ranks of this job

    def handle(self, conn):
        try:
            hello = conn.recv()
        except channel.ChannelError:
            return
        rank = hello.get("rank") if isinstance(hello, dict) else None
        with self._lock:
            if not isinstance(rank, int) or not 0 <= rank < self.num_proc:
                self._problems.append(f"a rank announced itself as {rank!r}, outside 0.."
                                      f"{self.num_proc - 1}")
                return
            if rank in self._hosts:
                self._problems.append(f"rank {rank} connected twice (from {self._hosts[rank]} "
                                      f"and {hello.get('host')})")
                return
            self._hosts[rank] = hello.get("host", "?")
        try:
            conn.send_bytes(self._payload)
            report = conn.recv()
        except channel.ChannelError as e:
            with self._lock:
                self._lost[rank] = str(e)
            return
        with self._lock:
            if report.get("kind") == "result":
                self._results[rank] = report
            else:
                self._failures.append(report)

    def snapshot(self):
        """(hosts, results, failures, lost, problems), copied under the lock."""
        with self._lock:
            return (dict(self._hosts), dict(self._results), list(self._failures),
                    dict(self._lost), list(self._problems))

    def settled(self):
        """Whether every rank that connected has reported or dropped."""
        with self._lock:
            done = set(self._results) | set(self._lost) | {f["rank"] for f in self._failures}
            return set(self._hosts) <= done

    def drain(self):
        """Waits, a few seconds at most, until :meth:`settled` (after mpirun has exited)."""
        deadline = time.monotonic() + _DRAIN_S
        while not self.settled() and time.monotonic() < deadline:
            time.sleep(0.05)


def _task(port, addresses, secret, timeout, executable, extra_env=None):
    """Every rank's run_task command and the environment it starts in."""
    command = [executable or sys.executable, "-m", "hvdcompat.runner.run_task",
               "--driver", f"{','.join(addresses)}:{port}", "--start-timeout", f"{timeout:g}"]
    if _alias_active():
        command.append("--horovod-alias")
    environ = dict(os.environ)
    environ.update(extra_env or {})
    environ[channel.SECRET_ENV] = secret.hex()
    environ["PYTHONPATH"] = _rank_pythonpath(environ)
    return command, environ


def plan_gloo(tokens, port, addresses, secret, timeout, executable, output_filename):
    """The ``hvdcompatrun --gloo`` argv (``tokens``: its options) and environment that start
    every rank's run_task on the Gloo controller; per-rank output files go to
    ``output_filename/rank.N/``."""
    command, environ = _task(port, addresses, secret, timeout, executable)
    cmd = [sys.executable, "-m", "hvdcompat.runner.launch", *tokens]
    if output_filename is not None:
        cmd += ["--output-filename", os.fspath(output_filename)]
    return cmd + command, environ


def plan(options, port, addresses, secret, timeout, executable, output_filename, extra_env=None):
    """The mpirun argv and environment that start every rank's run_task."""
    from hvdcompat.runner import launch

    command, environ = _task(port, addresses, secret, timeout, executable, extra_env)
    try:
        cmd, env = launch.plan_launch(options, command, environ=environ, relayed=False)
    except launch.LaunchError as e:
        raise ValueError(f"hvdcompat.run could not launch the job: {e} (num_proc, hosts and "
                         "hostfile are hvdcompatrun's -np, -H and --hostfile; min_num_proc, "
                         "max_num_proc, slots, reset_limit, cooldown_range, "
                         "host_discovery_script and elastic_timeout are its --min-np, --max-np, "
                         "--slots-per-host, --reset-limit, --blacklist-cooldown-range, "
                         "--host-discovery-script and --elastic-timeout)") from None
    if output_filename is not None:
        # mpirun's own flags end where the rank command starts (behind the
        # launcher's rank supervisor, when it wraps the command).
        start = len(cmd) - len(command)
        if start >= 2 and cmd[start - 1] == launch.SUPERVISOR:
            start -= 2
        cmd = cmd[:start] + _output_filename_args(cmd[0], output_filename) + cmd[start:]
    return cmd, env


def _rank_pythonpath(environ):
    """PYTHONPATH for the ranks: this hvdcompat and the caller's script directory first."""
    import site

    entries = environ.get("PYTHONPATH", "").split(os.pathsep) if environ.get("PYTHONPATH") else []
    wanted = []
    # This module is hvdcompat/runner/run_job.py: three levels up is the directory holding the
    # package.
    package_root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    if package_root not in site.getsitepackages():
        wanted.append(package_root)
    # Functions from modules beside the script are pickled by reference; the
    # ranks import them as the script itself would.
    if sys.path and sys.path[0] and os.path.isdir(sys.path[0]):
        wanted.append(os.path.abspath(sys.path[0]))
    return os.pathsep.join([p for p in wanted if p not in entries] + entries)


def _alias_active():
    """Whether `import horovod` means hvdcompat here (then it must on the ranks too)."""
    if getattr(sys.modules.get("horovod"), "__hvdcompat_alias__", False):
        return True
    alias = sys.modules.get("hvdcompat.horovod_alias")
    return alias is not None and alias.is_active()


def _output_filename_args(mpirun, directory):
    """Open MPI's flag for per-rank output files under ``directory`` (Horovod delegates to it)."""
    try:
        out = subprocess.run([mpirun, "--version"], capture_output=True, text=True, timeout=30,
                             errors="replace")
        text = out.stdout + out.stderr
    except (OSError, subprocess.SubprocessError) as e:
        text = str(e)
    found = re.search(r"Open MPI\)?\s+v?(\d+)\.", text)
    if found is None:
        raise ValueError(f"hvdcompat.run(output_filename={directory!r}): only Open MPI's mpirun "
                         f"writes per-rank output files here; {mpirun} is not Open MPI "
                         "(leave output_filename out and redirect the output yourself)")
    directory = os.path.abspath(os.fspath(directory))
    # Open MPI 5: DIR/<job>/rank.N/stdout; Open MPI 4: DIR/1/rank.N/stdout.
    if int(found.group(1)) >= 5:
        return ["--output", f"dir={directory}"]
    return ["--output-filename", directory]


def collect(proc, job, num_proc, start_timeout, elastic=False):
    """Waits for the job; returns mpirun's exit code (None when it had to be stopped).

    In an elastic job a rank's exception does not end the job (the others
    continue without it), so nothing is stopped after one.
    """
    start_deadline = time.monotonic() + start_timeout
    failed_at = None
    while True:
        try:
            return proc.wait(0.1)
        except subprocess.TimeoutExpired:
            pass
        hosts, _, failures, _, _ = job.snapshot()
        now = time.monotonic()
        if failures and failed_at is None and not elastic:
            failed_at = now
        if failed_at is not None and now - failed_at > _AFTER_FAILURE_GRACE_S:
            stop(proc)
            return None
        if len(hosts) < num_proc and now > start_deadline and not failures:
            stop(proc)
            missing = [r for r in range(num_proc) if r not in hosts]
            raise HorovodInternalError(
                f"hvdcompat.run: ranks {missing} of {num_proc} did not start within "
                f"{start_timeout:g} s (start_timeout); the job was stopped. On a busy machine "
                "or a slow file system raise start_timeout (or HOROVOD_START_TIMEOUT); the "
                "ranks' output, if any, is above.")


def stop(proc):
    """Ends mpirun if it still runs: SIGTERM (which it forwards to the ranks), then SIGKILL."""
    # Note [Session directory of a killed mpirun]
    _mpi_session.stop(proc, _mpi_session.session_base(proc.args), _TERMINATE_GRACE_S)


def describe_missing(num_proc, hosts, results, lost, problems, code, failed_ranks=()):
    """Lines saying what became of each rank that returned nothing, and of mpirun."""
    lines = []
    for rank in range(num_proc):
        if rank in results or rank in failed_ranks:
            continue
        if rank in lost:
            lines.append(f"  rank {rank} on {hosts[rank]}: its connection ended without a "
                         f"result ({lost[rank]}); it was killed or crashed")
        elif rank in hosts:
            lines.append(f"  rank {rank} on {hosts[rank]}: started but sent no result")
        else:
            lines.append(f"  rank {rank}: never connected")
    lines += [f"  {p}" for p in problems]
    lines.append(f"  mpirun exit code: {code}" if code is not None else "  mpirun was stopped")
    return "\n".join(lines)


def failure_error(report, failures, num_proc, hosts, results, lost, problems, code):
    """(RankFailedError for ``report``, the rank's own exception or None) to raise from."""
    rank = report["rank"]
    failed = sorted(f["rank"] for f in failures)
    others = [r for r in failed if r != rank]
    message = (f"hvdcompat.run: the function raised {report['type']}: {report['message']} on "
               f"rank {rank} of {num_proc} (host {hosts.get(rank, '?')})"
               + (f"; ranks {others} raised too" if others else "")
               + f".\n----- traceback on rank {rank} -----\n{report['traceback'].rstrip()}\n"
               + "----- the other ranks -----\n"
               + "".join(f"  rank {f['rank']} on {hosts.get(f['rank'], '?')}: raised "
                         f"{f['type']}: {f['message']}\n" for f in failures if f is not report)
               + describe_missing(num_proc, hosts, results, lost, problems, code, failed))
    error = RankFailedError(message, rank, report["type"], report["traceback"], failed)
    cause = None
    if report.get("exception") is not None:
        try:
            cause = cloudpickle.loads(report["exception"])
        except Exception:  # its class may exist only on the rank; the text says enough
            cause = None
    return error, cause

