"""``hvdcompat.run``: run a function on every rank of a job, collect what it returns.

Horovod's ``horovod.run`` with the same parameters. The job is launched by
hvdcompatrun's own code: the parameters become hvdcompatrun options (with
horovodrun's names), parsed by its parser and turned into the mpirun line by
:func:`hvdcompat.runner.launch.plan_launch`, so a job started here is launched
exactly as ``hvdcompatrun -np N -H ... python -m hvdcompat.run_task`` would
be. Every rank then fetches the pickled function from this process over the
channel of Note [Run channel] (``hvdcompat/run_channel.py``), runs it and
sends back its return value or its exception.
"""

import os
import re
import shlex
import socket
import subprocess
import sys
import threading
import time
import warnings

import cloudpickle

from hvdcompat import run_channel
from hvdcompat.exceptions import HorovodInternalError

__all__ = ["run", "RankFailedError", "ELASTIC_PARAMETERS", "DEFAULT_START_TIMEOUT_S"]

# Horovod's default; HOROVOD_START_TIMEOUT overrides it, as in Horovod.
DEFAULT_START_TIMEOUT_S = 30.0
# After a rank has reported an exception mpirun ends the job by itself; this
# bounds the wait in case it does not.
_AFTER_FAILURE_GRACE_S = 30.0
# mpirun forwards SIGTERM to the ranks; past this it is killed.
_TERMINATE_GRACE_S = 10.0
# Reports already sent when mpirun exits may still be in the listener threads.
_DRAIN_S = 5.0

# Parameters that only an elastic job uses (Horovod: any of them makes the job elastic); the
# last two are hvdcompat's, for hvdcompatrun's flags of the same names.
ELASTIC_PARAMETERS = ("min_num_proc", "max_num_proc", "slots", "reset_limit", "cooldown_range",
                      "host_discovery_script", "elastic_timeout")

# run() parameters that map to an hvdcompatrun option, by horovodrun's spellings.
_OPTION_SPELLINGS = {
    "ssh_port": ("--ssh-port", "-p"),
    "ssh_identity_file": ("--ssh-identity-file", "-i"),
    "network_interface": ("--network-interfaces", "--network-interface"),
}
# What to pass through mpi_args instead while hvdcompatrun lacks an option (Open MPI 5).
_MPI_ARGS_HINT = {
    "ssh_port": "mpi_args='--prtemca plm_ssh_args \"-p PORT\"'",
    "ssh_identity_file": "mpi_args='--prtemca plm_ssh_args \"-i FILE\"'",
    "network_interface": "mpi_args='--mca btl_tcp_if_include IFACE'",
}


class RankFailedError(HorovodInternalError):
    """The function raised on a rank of a :func:`run` job.

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


class _Job:
    """What the ranks reported.

    :meth:`handle` runs in the listener's threads (one per rank); the driver
    thread reads through :meth:`snapshot`. Every field is guarded by the lock.
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
        except run_channel.ChannelError:
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
        except run_channel.ChannelError as e:
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


def _deprecated(old, new, value, current, default):
    warnings.warn(f"hvdcompat.run: {old}= is deprecated, use {new}= instead",
                  DeprecationWarning, stacklevel=3)
    return value if current == default else current


def _elastic_options(settings, hosts, hostfile):
    """hvdcompatrun's elastic flag tokens for run()'s elastic parameters.

    Raises:
        ValueError: a value of the wrong kind, or parameters that exclude each other.
    """
    tokens = []
    for param, flag in (("min_num_proc", "--min-np"), ("max_num_proc", "--max-np"),
                        ("slots", "--slots-per-host"), ("reset_limit", "--reset-limit"),
                        ("elastic_timeout", "--elastic-timeout")):
        value = settings.get(param)
        if value is None:
            continue
        low = 0 if param in ("reset_limit", "elastic_timeout") else 1
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ValueError(f"hvdcompat.run: {param} must be a whole number >= {low}, got "
                             f"{value!r}")
        tokens.append(f"{flag}={value}")
    cooldown = settings.get("cooldown_range")
    if cooldown is not None:
        try:
            low, high = cooldown
        except (TypeError, ValueError):
            low = high = None
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in (low, high)) \
                or not 0 <= low <= high:
            raise ValueError(f"hvdcompat.run: cooldown_range must be a pair (MIN, MAX) of whole "
                             f"seconds with 0 <= MIN <= MAX, got {cooldown!r}")
        tokens += ["--blacklist-cooldown-range", str(low), str(high)]
    script = settings.get("host_discovery_script")
    if script is not None:
        if hosts is not None or hostfile is not None:
            raise ValueError("hvdcompat.run: host_discovery_script replaces hosts/hostfile "
                             "(the script's output is the host list); give one of them")
        tokens.append(f"--host-discovery-script={os.fspath(script)}")
    return tokens


def _start_timeout(start_timeout):
    if start_timeout is not None:
        value, where = start_timeout, "start_timeout"
    elif os.environ.get("HOROVOD_START_TIMEOUT"):
        value, where = os.environ["HOROVOD_START_TIMEOUT"], "HOROVOD_START_TIMEOUT"
    else:
        return DEFAULT_START_TIMEOUT_S
    try:
        value = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"hvdcompat.run: {where}={value!r} is not a number of seconds") from None
    if value <= 0:
        raise ValueError(f"hvdcompat.run: {where} must be positive, got {value:g}")
    return value


def _host_list(hosts, hostfile):
    from hvdcompat.runner import hosts as _hosts

    try:
        if hosts:
            return _hosts.parse_hosts_arg(hosts)
        if hostfile:
            return _hosts.parse_hostfile(hostfile)
    except _hosts.HostListError as e:
        raise ValueError(f"hvdcompat.run: {e}") from None
    return []


def _discovered_hosts(options):
    """The hosts the discovery script offers now (for the addresses the ranks call back on)."""
    from hvdcompat.runner import elastic as _elastic
    from hvdcompat.runner import hosts as _hosts

    try:
        return _elastic.discover(options.host_discovery_script, options.slots_per_host)
    except _hosts.HostListError as e:
        raise ValueError(f"hvdcompat.run: {e}") from None


def _driver_addresses(host_list):
    """(address to listen on, addresses the ranks try) for this host list."""
    from hvdcompat.runner.hosts import all_local, is_local_host

    if all_local(host_list):
        return "127.0.0.1", ["127.0.0.1"]
    found = []
    for host in host_list:
        if not is_local_host(host.name):
            address = run_channel.route_address(host.name)
            if address and address not in found:
                found.append(address)
    found.append(socket.getfqdn())
    return "0.0.0.0", found


def _launcher_options(parser, num_proc, hosts, hostfile, mpi_args, verbose, extra):
    """hvdcompatrun option tokens for run()'s parameters (ValueError for one it lacks)."""
    tokens = ["-np", str(num_proc)] if num_proc is not None else []
    if hosts:
        tokens += ["-H", hosts]
    if hostfile:
        tokens += ["--hostfile", os.fspath(hostfile)]
    if mpi_args:
        tokens.append(f"--mpi-args={mpi_args}")
    if verbose:
        tokens.append("--verbose")
    for param, value in extra.items():
        spelling = next((s for s in _OPTION_SPELLINGS[param]
                         if s in parser._option_string_actions), None)
        if spelling is None:
            raise ValueError(
                f"hvdcompat.run({param}={value!r}): hvdcompatrun has no "
                f"{_OPTION_SPELLINGS[param][0]} option in this version; pass the MPI flags "
                f"through mpi_args instead, e.g. {_MPI_ARGS_HINT[param]}")
        tokens.append(f"{spelling}={value}")
    return tokens


def _launcher_parser():
    """hvdcompatrun's parser, raising ValueError where it would exit the process."""
    from hvdcompat.runner import launch

    parser = launch.build_parser()

    def refuse(message):
        raise ValueError(f"hvdcompat.run: {message}")

    parser.error = refuse
    return parser


def _rank_pythonpath(environ):
    """PYTHONPATH for the ranks: this hvdcompat and the caller's script directory first."""
    import site

    entries = environ.get("PYTHONPATH", "").split(os.pathsep) if environ.get("PYTHONPATH") else []
    wanted = []
    # This module sits at the package's top level: its directory's parent holds the package.
    package_root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
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


def _stop(proc):
    if proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(_TERMINATE_GRACE_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


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


def _describe_missing(num_proc, hosts, results, lost, problems, code, failed_ranks=()):
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


def _failure_error(report, failures, num_proc, hosts, results, lost, problems, code):
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
               + _describe_missing(num_proc, hosts, results, lost, problems, code, failed))
    error = RankFailedError(message, rank, report["type"], report["traceback"], failed)
    cause = None
    if report.get("exception") is not None:
        try:
            cause = cloudpickle.loads(report["exception"])
        except Exception:  # its class may exist only on the rank; the text says enough
            cause = None
    return error, cause


def _plan(options, port, addresses, secret, timeout, executable, output_filename, extra_env=None):
    """The mpirun argv and environment that start every rank's run_task."""
    from hvdcompat.runner import launch

    command = [executable or sys.executable, "-m", "hvdcompat.run_task",
               "--driver", f"{','.join(addresses)}:{port}", "--start-timeout", f"{timeout:g}"]
    if _alias_active():
        command.append("--horovod-alias")
    environ = dict(os.environ)
    environ.update(extra_env or {})
    environ[run_channel.SECRET_ENV] = secret.hex()
    environ["PYTHONPATH"] = _rank_pythonpath(environ)
    try:
        cmd, env = launch.plan_launch(options, command, environ=environ)
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


def _collect(proc, job, num_proc, start_timeout, elastic=False):
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
            _stop(proc)
            return None
        if len(hosts) < num_proc and now > start_deadline and not failures:
            _stop(proc)
            missing = [r for r in range(num_proc) if r not in hosts]
            raise HorovodInternalError(
                f"hvdcompat.run: ranks {missing} of {num_proc} did not start within "
                f"{start_timeout:g} s (start_timeout); the job was stopped. On a busy machine "
                "or a slow file system raise start_timeout (or HOROVOD_START_TIMEOUT); the "
                "ranks' output, if any, is above.")


def _elastic_values(results, failures, num_proc, hosts_of, lost, problems, code):
    """The final world's return values, by its ranks (raises when it did not finish)."""
    places = {rank: report.get("final") for rank, report in results.items()}
    if results and all(p is None for p in places.values()) and len(results) == num_proc:
        places = {rank: (rank, num_proc) for rank in results}  # no reset was ever needed
    sizes = {p[1] for p in places.values() if p is not None}
    final_ranks = sorted(p[0] for p in places.values() if p is not None)
    if len(sizes) == 1 and None not in places.values() and \
            final_ranks == list(range(sizes.pop())):
        by_final = {places[rank][0]: report for rank, report in results.items()}
        return [by_final[r] for r in range(len(by_final))]
    if failures:
        error, cause = _failure_error(failures[0], failures, num_proc, hosts_of, results, lost,
                                      problems, code)
        raise error from cause
    described = ", ".join(f"rank {rank} as {p[0]} of {p[1]}" if p else f"rank {rank} (not in a "
                          "running job when it returned)" for rank, p in sorted(places.items()))
    raise HorovodInternalError(
        f"hvdcompat.run: the elastic job ended without a complete final world: "
        f"{len(results)} of {num_proc} started rank(s) returned ({described or 'none'}); the "
        "ranks' output is above.\n"
        + _describe_missing(num_proc, hosts_of, results, lost, problems, code))


def _launch_elastic(options, listener, job, secret, timeout, addresses, executable,
                    output_filename, verbose):
    """Runs the job under hvdcompatrun's elastic driver; returns mpirun's exit code."""
    from hvdcompat.runner.elastic import ElasticDriver

    codes = []

    def plan(extra_env, hosts=None):
        if hosts is not None:
            from hvdcompat.runner.errors import LaunchError

            # Growth restarts every worker from the last commit, which would call
            # `func` again in new processes whose values this call cannot pair
            # with the first launch's.
            raise LaunchError(
                "hvdcompat.run: hosts were added to the elastic job, and growing restarts every "
                "worker, which hvdcompat.run does not support; run the training script under "
                "hvdcompatrun's elastic flags (--host-discovery-script, --min-np, --max-np) to "
                "let a job grow, or give hvdcompat.run a discovery script that only removes hosts.")
        return _plan(options, listener.port, addresses, secret, timeout, executable,
                     output_filename, extra_env)

    def launch_ranks(cmd, env, placement=None, np_ranks=0, abort=None, summarize=None):
        job.num_proc = options.planned_np
        listener.start()
        proc = subprocess.Popen(cmd, env=env)
        stop_watch = threading.Event()

        def watch():
            # The driver's verdict (too few slots past the timeout, the reset
            # limit, every host blacklisted) ends the job.
            while not stop_watch.wait(0.5):
                if abort is not None and abort():
                    _stop(proc)
                    return

        watcher = threading.Thread(target=watch, name="hvdcompat-run-abort", daemon=True)
        watcher.start()
        try:
            codes.append(_collect(proc, job, job.num_proc, timeout, elastic=True))
            deadline = time.monotonic() + _DRAIN_S
            while not job.settled() and time.monotonic() < deadline:
                time.sleep(0.05)
        finally:
            stop_watch.set()
            _stop(proc)
        return 1 if codes[-1] is None else codes[-1]

    options.verbose = bool(verbose)  # the driver prints the mpirun line
    ElasticDriver.launch(options, plan, launch_ranks)
    return codes[-1] if codes else None


def run(func, args=(), kwargs=None, num_proc=None, min_num_proc=None, max_num_proc=None,
        slots=None, reset_limit=None, cooldown_range=None, hosts=None, hostfile=None,
        start_timeout=None, ssh_port=None, ssh_identity_file=None, disable_cache=None,
        output_filename=None, verbose=None, use_gloo=None, use_mpi=None, mpi_args=None,
        network_interface=None, executable=None, np=None, min_np=None, max_np=None, *,
        host_discovery_script=None, elastic_timeout=None):
    """Runs ``func(*args, **kwargs)`` on every rank of a new job; returns the values.

    The job is launched as hvdcompatrun launches one (through mpirun, with the
    same environment forwarding), and the ranks' output goes to this
    process's stdout and stderr. ``func`` typically calls ``hvd.init()``;
    every rank runs it, so every rank must reach the same collectives.

    Any elastic parameter makes the job elastic, launched as hvdcompatrun's
    elastic flags launch one (fault-tolerant MPI; see the README's "Elastic
    training"): a rank whose training inside ``hvd.elastic.run`` fails
    leaves the job and the others continue without it. The values returned
    are then those of the final world, indexed by its ranks.

    Args:
        func: the function; it and ``args``/``kwargs`` must be picklable with
            cloudpickle (functions defined in ``__main__``, lambdas and
            closures are; their module-level globals travel with them).
        args: positional arguments for ``func``.
        kwargs: keyword arguments for ``func``.
        num_proc: number of ranks (hvdcompatrun's ``-np``; default 1, or with
            ``hosts``/``hostfile``/``host_discovery_script`` in an elastic
            job, all their slots up to ``max_num_proc``).
        min_num_proc: elastic: fewest ranks to start with and to continue
            with after a failure (``--min-np``).
        max_num_proc: elastic: most ranks to start (``--max-np``).
        slots: elastic: slots of a discovered host that lists none
            (``--slots-per-host``).
        reset_limit: elastic: stop with an error after this many resets
            (``--reset-limit``).
        cooldown_range: elastic: ``(MIN, MAX)`` seconds a failed host stays
            blacklisted (``--blacklist-cooldown-range``).
        hosts: ``"host1:2,host2:4"`` (``-H``); default this machine.
        hostfile: file of ``HOST slots=N`` lines (``--hostfile``).
        start_timeout: seconds every rank has to start and connect back
            (default ``HOROVOD_START_TIMEOUT``, else 30).
        ssh_port, ssh_identity_file: ssh options for remote hosts
            (hvdcompatrun's ``--ssh-port`` / ``--ssh-identity-file``).
        disable_cache: accepted for Horovod compatibility; hvdcompat keeps
            no cache of launch checks, so it has no effect.
        output_filename: directory for the ranks' output files instead of
            this process's stdout/stderr (Open MPI only, as mpirun writes them:
            ``DIR/<job>/rank.N/stdout`` with Open MPI 5).
        verbose: print the mpirun command before running it.
        use_gloo: must be falsy: hvdcompat has no Gloo controller.
        use_mpi: accepted (MPI is the only controller).
        mpi_args: extra mpirun arguments, one string (``--mpi-args``).
        network_interface: network interfaces for MPI, comma-separated
            (hvdcompatrun's ``--network-interfaces``).
        executable: the Python interpreter the ranks run (default
            ``sys.executable``).
        np, min_np, max_np: deprecated spellings of num_proc, min_num_proc
            and max_num_proc (a DeprecationWarning each).
        host_discovery_script: elastic, an hvdcompat extension: an executable
            printing the hosts, one ``host[:slots]`` per line, instead of
            ``hosts``/``hostfile`` (``--host-discovery-script``).
        elastic_timeout: elastic, an hvdcompat extension: seconds to wait at
            the start for ``min_num_proc`` slots from discovery
            (``--elastic-timeout``, default 600).

    Returns:
        list of the return values, indexed by rank (of the final world, in
        an elastic job).

    Raises:
        RankFailedError: ``func`` raised on a rank (a HorovodInternalError
            naming the rank, with its traceback; the rank's exception is the
            ``__cause__``); in an elastic job, only when the final world did
            not return.
        HorovodInternalError: the job failed otherwise (a rank crashed or
            did not start in time; mpirun failed).
        ValueError: a parameter this launcher cannot honour, or a bad host
            list, or more ranks than the hosts have slots, or elastic
            parameters that contradict each other (e.g. ``min_num_proc``
            above ``num_proc``).
        TypeError: ``func`` is not callable, or it or its arguments cannot
            be pickled.
    """
    if np is not None:
        num_proc = _deprecated("np", "num_proc", np, num_proc, None)
    if min_np is not None:
        min_num_proc = _deprecated("min_np", "min_num_proc", min_np, min_num_proc, None)
    if max_np is not None:
        max_num_proc = _deprecated("max_np", "max_num_proc", max_np, max_num_proc, None)
    if not callable(func):
        raise TypeError(f"hvdcompat.run: func must be callable, got {type(func).__name__}")
    kwargs = {} if kwargs is None else kwargs
    if hosts is not None and hostfile is not None:
        raise ValueError("hvdcompat.run: give hosts or hostfile, not both")
    if use_gloo and use_mpi:
        raise ValueError("hvdcompat.run: use_gloo and use_mpi cannot both be True")
    if use_gloo:
        raise ValueError("hvdcompat.run(use_gloo=True): hvdcompat has no Gloo controller; its "
                         "jobs always run on MPI. Leave use_gloo unset (or pass use_mpi=True).")
    elastic = {name: value for name, value in zip(
        ELASTIC_PARAMETERS, (min_num_proc, max_num_proc, slots, reset_limit, cooldown_range,
                             host_discovery_script, elastic_timeout))
        if value is not None}
    if num_proc is None and not (elastic and (hosts or hostfile or host_discovery_script)):
        num_proc = 1
    if num_proc is not None and (isinstance(num_proc, bool) or not isinstance(num_proc, int)
                                 or num_proc < 1):
        raise ValueError(f"hvdcompat.run: num_proc must be a whole number of ranks >= 1, got "
                         f"{num_proc!r}")
    timeout = _start_timeout(start_timeout)
    try:
        payload = cloudpickle.dumps((func, tuple(args), dict(kwargs)))
    except Exception as e:
        raise TypeError(f"hvdcompat.run: func and its arguments must be picklable with "
                        f"cloudpickle to reach the ranks: {type(e).__name__}: {e}") from e

    extra = {k: v for k, v in (("ssh_port", ssh_port), ("ssh_identity_file", ssh_identity_file),
                               ("network_interface", network_interface)) if v is not None}
    parser = _launcher_parser()
    tokens = _launcher_options(parser, num_proc, hosts, hostfile, mpi_args, verbose, extra)
    if elastic:
        tokens += _elastic_options(elastic, hosts, hostfile)
    options = parser.parse_args(tokens)
    if host_discovery_script is not None:
        host_list = _discovered_hosts(options)
    else:
        host_list = _host_list(hosts, hostfile)
    bind, addresses = _driver_addresses(host_list)

    job = _Job(num_proc or 0, payload)
    secret = run_channel.new_secret()
    listener = run_channel.Listener(bind, secret, job.handle)
    proc = None
    try:
        if elastic:
            code = _launch_elastic(options, listener, job, secret, timeout, addresses,
                                   executable, output_filename, verbose)
        else:
            cmd, env = _plan(options, listener.port, addresses, secret, timeout, executable,
                             output_filename)
            if verbose:
                print("hvdcompat.run: " + shlex.join(cmd), flush=True)
            listener.start()
            proc = subprocess.Popen(cmd, env=env)
            code = _collect(proc, job, num_proc, timeout)
            deadline = time.monotonic() + _DRAIN_S
            while not job.settled() and time.monotonic() < deadline:
                time.sleep(0.05)
    finally:
        if proc is not None:
            _stop(proc)
        listener.stop()

    num_proc = job.num_proc
    hosts_of, results, failures, lost, problems = job.snapshot()
    if elastic:
        reports = _elastic_values(results, failures, num_proc, hosts_of, lost, problems, code)
    else:
        if failures:
            error, cause = _failure_error(failures[0], failures, num_proc, hosts_of, results,
                                          lost, problems, code)
            raise error from cause
        if len(results) < num_proc or code != 0 or problems:
            raise HorovodInternalError(
                f"hvdcompat.run: the job ended with {len(results)} of {num_proc} results; the "
                "ranks' output is above.\n"
                + _describe_missing(num_proc, hosts_of, results, lost, problems, code))
        reports = [results[rank] for rank in range(num_proc)]
    values = []
    for index, report in enumerate(reports):
        try:
            values.append(cloudpickle.loads(report["value"]))
        except Exception as e:
            raise HorovodInternalError(
                f"hvdcompat.run: the return value of rank {index} cannot be unpickled here "
                f"({type(e).__name__}: {e}); return types importable in this process") from e
    return values
