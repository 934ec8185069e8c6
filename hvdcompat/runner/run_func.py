"""``hvdcompat.run``: run a function on every rank of a job, collect what it returns.

Horovod's ``horovod.run`` with the same parameters. The job is launched by
hvdcompatrun's own code: the parameters become hvdcompatrun options (with
horovodrun's names), parsed by its parser and turned into the mpirun line by
:func:`hvdcompat.runner.launch.plan_launch`, so a job started here is launched
exactly as ``hvdcompatrun -np N -H ... python -m hvdcompat.runner.run_task`` would
be. Every rank then fetches the pickled function from this process over the
channel of Note [Run channel] (``hvdcompat/runner/common/channel.py``), runs it and
sends back its return value or its exception.

This module turns the parameters into hvdcompatrun's options and launches a
plain job with one mpirun; an elastic job (any of :data:`ELASTIC_PARAMETERS`)
is launched by :mod:`hvdcompat.runner.elastic.run_func`. How a job is started, watched
and its reports turned into errors is :mod:`hvdcompat.runner.run_job`, for both.
"""

import argparse
import os
import shlex
import subprocess
import warnings
from typing import NamedTuple

import cloudpickle

from hvdcompat._ext import _core
from hvdcompat.exceptions import HorovodInternalError
from hvdcompat.runner import run_job
from hvdcompat.runner import mpi_session as _mpi_session
from hvdcompat.runner.common import channel
from hvdcompat.runner.elastic import run_func as elastic_run
from hvdcompat.runner.elastic.run_func import ELASTIC_PARAMETERS
from hvdcompat.runner.run_job import RankFailedError

__all__ = ["run", "RankFailedError", "ELASTIC_PARAMETERS"]


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


def _deprecated(old, new, value, current, default):
    warnings.warn(f"hvdcompat.run: {old}= is deprecated, use {new}= instead",
                  DeprecationWarning, stacklevel=3)
    return value if current == default else current


def _start_timeout(start_timeout):
    if start_timeout is None:
        # HVDCOMPAT_/HOROVOD_START_TIMEOUT, else Horovod's 30 s (the core's knob table).
        value, where = _core.setting("START_TIMEOUT"), "START_TIMEOUT"
    else:
        value, where = start_timeout, "start_timeout"
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


def _driver_addresses(host_list, network_interface=None):
    """The addresses the driver listens on, which are those the ranks call back on.

    Only these are bound, never every interface (0.0.0.0): loopback when
    every host is this machine; else the addresses of ``network_interface``
    (names or CIDR subnets, comma-separated, as hvdcompatrun's
    ``--network-interfaces``) when given, or this machine's address on the
    route to each remote host.
    """
    from hvdcompat.runner.hosts import all_local, is_local_host

    if all_local(host_list):
        return ["127.0.0.1"]
    if network_interface:
        found = channel.interface_addresses(network_interface.split(","))
        if not found:
            raise ValueError(f"hvdcompat.run(network_interface={network_interface!r}): no IPv4 "
                             "address of this machine is on that interface; name one that "
                             "holds the address the ranks' hosts reach this machine at")
        return found
    found, unrouted = [], []
    for host in host_list:
        if not is_local_host(host.name):
            address = channel.route_address(host.name)
            if address is None:
                unrouted.append(host.name)
            elif address not in found:
                found.append(address)
    if unrouted:
        raise ValueError(f"hvdcompat.run: no route from this machine to host(s) {unrouted} "
                         "(their names do not resolve here), so there is no address to listen "
                         "on for their ranks; pass network_interface= naming this machine's "
                         "interface towards them, or list the hosts by names or addresses that "
                         "resolve here")
    return found


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


def _launch(options, listener, job, secret, timeout, addresses, executable, output_filename,
            verbose):
    """Runs the job with one mpirun (or ``hvdcompatrun --gloo``); returns its exit code (None
    when it had to be stopped)."""
    if options.gloo:
        cmd, env = run_job.plan_gloo(options.run_tokens, listener.port, addresses, secret,
                                     timeout, executable, output_filename)
    else:
        cmd, env = run_job.plan(options, listener.port, addresses, secret, timeout, executable,
                                output_filename)
    if verbose:
        print("hvdcompat.run: " + shlex.join(cmd), flush=True)
    listener.start()
    # Note [Session directory of a killed mpirun]
    _mpi_session.remove_stale(_mpi_session.session_base(cmd, env))
    proc = subprocess.Popen(cmd, env=env)
    try:
        code = run_job.collect(proc, job, job.num_proc, timeout)
        job.drain()
    finally:
        run_job.stop(proc)
    return code


def _rank_reports(results, failures, num_proc, hosts_of, lost, problems, code):
    """Every rank's result report, by rank (raises when one failed or is missing)."""
    if failures:
        error, cause = run_job.failure_error(failures[0], failures, num_proc, hosts_of, results,
                                             lost, problems, code)
        raise error from cause
    if len(results) < num_proc or code != 0 or problems:
        raise HorovodInternalError(
            f"hvdcompat.run: the job ended with {len(results)} of {num_proc} results; the "
            "ranks' output is above.\n"
            + run_job.describe_missing(num_proc, hosts_of, results, lost, problems, code))
    return [results[rank] for rank in range(num_proc)]


class _Plan(NamedTuple):
    """A checked ``run()`` call, ready to launch."""
    options: argparse.Namespace  # hvdcompatrun's options, as its parser made them
    payload: bytes  # the pickled (func, args, kwargs)
    num_proc: int  # 0: an elastic job whose discovery decides
    elastic: bool
    timeout: float  # seconds every rank has to start and connect back
    addresses: list  # where the driver listens for the ranks


def _validated_plan(func, args, kwargs, num_proc, elastic, hosts, hostfile, start_timeout,
                    use_gloo, use_mpi, mpi_args, verbose, extra):
    """Checks run()'s parameters and turns them into a :class:`_Plan`; launches nothing.

    ``elastic`` holds the elastic parameters given (by name), ``extra`` the ssh and network
    parameters given. Raises the ValueError or TypeError that run() documents.
    """
    if not callable(func):
        raise TypeError(f"hvdcompat.run: func must be callable, got {type(func).__name__}")
    kwargs = {} if kwargs is None else kwargs
    if hosts is not None and hostfile is not None:
        raise ValueError("hvdcompat.run: give hosts or hostfile, not both")
    if use_gloo and use_mpi:
        raise ValueError("hvdcompat.run: use_gloo and use_mpi cannot both be True")
    if use_gloo and elastic:
        raise ValueError("hvdcompat.run(use_gloo=True): hvdcompat.run's elastic jobs ("
                         + ", ".join(elastic) + ") run on MPI only; drop use_gloo or the "
                         "elastic parameters. To train elastically on the Gloo controller, run "
                         "the training script under hvdcompatrun --gloo with the elastic flags")
    if use_gloo and mpi_args:
        raise ValueError("hvdcompat.run(use_gloo=True) starts no mpirun, so mpi_args has "
                         "nothing to go to; drop one of them")
    discovery = elastic.get("host_discovery_script")
    if num_proc is None and not (elastic and (hosts or hostfile or discovery)):
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

    parser = _launcher_parser()
    tokens = (["--gloo"] if use_gloo else []) + _launcher_options(
        parser, num_proc, hosts, hostfile, mpi_args, verbose, extra)
    if elastic:
        tokens += elastic_run.elastic_options(elastic, hosts, hostfile)
    options = parser.parse_args(tokens)
    options.run_tokens = tokens  # what the Gloo launch passes on to hvdcompatrun
    if discovery is not None:
        host_list = elastic_run.discovered_hosts(options)
    else:
        host_list = _host_list(hosts, hostfile)
    addresses = _driver_addresses(host_list, extra.get("network_interface"))
    return _Plan(options, payload, num_proc or 0, bool(elastic), timeout, addresses)


def _launch_plan(plan, executable, output_filename, verbose):
    """Launches a checked plan, waits for the job and returns the ranks' values."""
    job = run_job.Job(plan.num_proc, plan.payload)
    secret = channel.new_secret()
    listener = channel.Listener(plan.addresses, secret, job.handle)
    launch = elastic_run.launch if plan.elastic else _launch
    try:
        code = launch(plan.options, listener, job, secret, plan.timeout, plan.addresses,
                      executable, output_filename, verbose)
    finally:
        listener.stop()

    hosts_of, results, failures, lost, problems = job.snapshot()
    reports_of = elastic_run.final_reports if plan.elastic else _rank_reports
    reports = reports_of(results, failures, job.num_proc, hosts_of, lost, problems, code)
    values = []
    for index, report in enumerate(reports):
        try:
            values.append(cloudpickle.loads(report["value"]))
        except Exception as e:
            raise HorovodInternalError(
                f"hvdcompat.run: the return value of rank {index} cannot be unpickled here "
                f"({type(e).__name__}: {e}); return types importable in this process") from e
    return values


def run(func, args=(), kwargs=None, num_proc=None, min_num_proc=None, max_num_proc=None,
        slots=None, reset_limit=None, cooldown_range=None, hosts=None, hostfile=None,
        start_timeout=None, ssh_port=None, ssh_identity_file=None, disable_cache=None,
        output_filename=None, verbose=None, use_gloo=None, use_mpi=None, mpi_args=None,
        network_interface=None, executable=None, np=None, min_np=None, max_np=None, *,
        host_discovery_script=None, elastic_timeout=None):
    """Runs ``func(*args, **kwargs)`` on every rank of a new job; returns the values.

    The job is launched as hvdcompatrun launches one (through mpirun, with the
    same environment forwarding; with ``use_gloo``, as ``hvdcompatrun --gloo``), and the ranks' output goes to this
    process's stdout and stderr. ``func`` typically calls ``hvd.init()``;
    every rank runs it, so every rank must reach the same collectives.

    Any elastic parameter makes the job elastic, launched as hvdcompatrun's
    elastic flags launch one (fault-tolerant MPI; see docs/elastic.md): a
    rank whose training inside ``hvd.elastic.run`` fails leaves the job and
    the others continue without it. The values returned are then those of
    the final world, indexed by its ranks.

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
            ``DIR/<job>/rank.N/stdout`` with Open MPI 5); with ``use_gloo``,
            ``DIR/rank.N/stdout`` and ``stderr``, the output also reaching
            this process's.
        verbose: print the mpirun command before running it.
        use_gloo: run on the Gloo controller: the ranks are started as
            ``hvdcompatrun --gloo`` starts them (no mpirun; ssh for other
            hosts; see docs/launching-without-mpi.md). Not with the elastic
            parameters or ``mpi_args``.
        use_mpi: accepted (MPI is the default).
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
    elastic = {name: value for name, value in zip(
        ELASTIC_PARAMETERS, (min_num_proc, max_num_proc, slots, reset_limit, cooldown_range,
                             host_discovery_script, elastic_timeout))
        if value is not None}
    extra = {k: v for k, v in (("ssh_port", ssh_port), ("ssh_identity_file", ssh_identity_file),
                               ("network_interface", network_interface)) if v is not None}
    plan = _validated_plan(func, args, kwargs, num_proc, elastic, hosts, hostfile, start_timeout,
                           use_gloo, use_mpi, mpi_args, verbose, extra)
    return _launch_plan(plan, executable, output_filename, verbose)
