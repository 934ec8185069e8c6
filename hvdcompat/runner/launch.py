"""hvdcompatrun: launch a training script on N ranks through mpirun, or with --gloo without it.

    hvdcompatrun -np 4 python train.py
    hvdcompatrun -np 16 -H node1:8,node2:8 python train.py
    hvdcompatrun -np 16 --hostfile hosts.txt --fusion-threshold-mb 64 python train.py
    hvdcompatrun --gloo -np 4 python train.py
    hvdcompatrun --check-build

It builds the matching ``mpirun`` line (binding off, environment forwarded,
root and oversubscription handled), runs it, forwards SIGINT/SIGTERM to it and
exits with its exit code. ``--verbose`` prints the line first, so it can be
copied into a batch script that calls ``mpirun`` directly. With ``--gloo`` it
starts the ranks itself and serves their rendezvous store
(hvdcompat/runner/gloo_run.py).
"""

import argparse
import os
import re
import secrets
import shlex
import shutil
import signal
import subprocess
import sys
import time

from hvdcompat.runner.elastic import discovery as _discovery
from hvdcompat.runner.elastic import flags as _elastic
from hvdcompat.runner.elastic.gloo_driver import GlooElasticDriver
from hvdcompat.runner.elastic.mpi_driver import MpiElasticDriver
from hvdcompat.runner.errors import EXIT_USAGE, LaunchError
from hvdcompat.runner import exit_report as _exit_report
from hvdcompat.runner import gloo_run as _gloo_run
from hvdcompat.runner import hosts as _hosts
from hvdcompat.runner import mpirun_command as _mpirun
from hvdcompat.runner import mpi_session as _mpi_session
from hvdcompat.common import ports as _ports
from hvdcompat.runner import rank_supervisor as _supervisor
from hvdcompat.runner import tuning as _tuning

__all__ = ["main", "LaunchError", "build_parser", "split_command", "check_command",
           "plan_launch"]


_EPILOG = """\
examples:
  hvdcompatrun -np 2 python examples/pytorch_mnist.py
  hvdcompatrun -np 16 -H node1:8,node2:8 python train.py
  hvdcompatrun -np 16 --hostfile hosts.txt --mpi-args="--mca btl_tcp_if_include eth0" python train.py
  hvdcompatrun --check-build

Every option must come before the command; everything from the command on is
passed to it unchanged. The environment reaches every rank, also on other
hosts, except what describes this host or login session (HOSTNAME, PWD, HOME,
USER, SSH_*, DISPLAY, TERM, XDG_*, ...) and the MPI launcher's own variables.
"""


def _version():
    from hvdcompat._version import __version__

    return __version__


def build_parser():
    """The argument parser (options only; the command is split off first)."""
    parser = argparse.ArgumentParser(
        prog="hvdcompatrun", allow_abbrev=False,
        description="Run a command on N ranks with hvdcompat, through mpirun.",
        epilog=_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-v", "--version", action="version",
                        version=f"hvdcompatrun {_version()}")
    parser.add_argument("-np", "--num-proc", dest="num_proc", type=int, metavar="N",
                        help="number of ranks (default with -H/--hostfile: all their slots)")
    parser.add_argument("-cb", "--check-build", action="store_true",
                        help="print the frameworks, controllers and tensor operations this "
                             "build supports, then exit (launches nothing)")
    parser.add_argument("--verbose", action="store_true",
                        help="print the mpirun command before running it")
    where = parser.add_mutually_exclusive_group()
    where.add_argument("-H", "--hosts", metavar="HOST:SLOTS,...",
                       help="hosts and their slots, e.g. node1:8,node2:8 (default: this "
                            "machine only)")
    where.add_argument("-hostfile", "--hostfile", metavar="FILE",
                       help="file of 'HOST slots=N' lines (# comments and blank lines allowed)")
    parser.add_argument("--mpi-args", metavar="ARGS", default="",
                        help="extra mpirun arguments, one quoted string, e.g. "
                             "--mpi-args=\"--map-by ppr:4:node\"")
    parser.add_argument("--fault-tolerant", action="store_true",
                        help="Open MPI 5 only: add '" + " ".join(_mpirun.FAULT_TOLERANT_ARGS)
                             + "' so a failed rank is reported to the survivors instead of "
                               "killing the job; traffic then uses TCP only (slower within "
                               "a node)")
    parser.add_argument("-p", "--ssh-port", type=int, metavar="PORT",
                        help="port of the remote hosts' ssh daemons")
    parser.add_argument("-i", "--ssh-identity-file", metavar="FILE",
                        help="private key ssh logs in to the remote hosts with")
    parser.add_argument("--network-interfaces", metavar="NICS",
                        help="comma-separated interfaces (e.g. eth0,ib0) or subnets "
                             "(198.18.0.0/24) that MPI's and NCCL's traffic may use")
    parser.add_argument("--skip-command-check", action="store_true",
                        help="do not check that the command and script exist here (for a "
                             "script that exists only on the remote hosts)")
    _gloo_run.add_gloo_arguments(parser)
    _tuning.add_tuning_arguments(parser)
    _elastic.add_elastic_arguments(parser)
    return parser


def split_command(parser, argv):
    """Splits ``argv`` into (option tokens, command).

    The command starts at the first token that is neither an option nor an
    option's value (or after ``--``). An option's value is taken as is even
    when it starts with ``-``, so ``--mpi-args "--map-by slot"`` works.
    """
    options, i = [], 0
    while i < len(argv):
        token = argv[i]
        if token == "--":
            return options, argv[i + 1:]
        if not token.startswith("-") or token == "-":
            return options, argv[i:]
        name, eq, _ = token.partition("=")
        action = parser._option_string_actions.get(name)
        if action is None or action.nargs == 0 or eq or i + 1 == len(argv):
            options.append(token)  # argparse reports unknown options and missing values
            i += 1
        elif isinstance(action.nargs, int) and action.nargs > 1:  # e.g. MIN MAX
            options += argv[i:i + 1 + action.nargs]
            i += 1 + action.nargs
        else:
            options.append(f"{name}={argv[i + 1]}")
            i += 2
    return options, []


_PYTHON = re.compile(r"^(python|pypy)[0-9.]*$")
SUPERVISOR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "rank_supervisor.py")


def _python_script(args):
    """The script a ``python ...`` command runs, or None (``-m``, ``-c``, stdin)."""
    i = 0
    while i < len(args):
        a = args[i]
        if a in ("-m", "-c", "-") or (a.startswith(("-m", "-c")) and len(a) > 2):
            return None
        if a in ("-W", "-X"):
            i += 2
            continue
        if a.startswith("-"):
            i += 1
            continue
        return a
    return None


def check_command(command, env, cwd):
    """Checks that the command's executable (and Python script) exist here.

    Raises:
        LaunchError: naming what is missing and where it was looked for.
    """
    exe = command[0]
    hint = ("; if it exists only on the remote hosts, pass --skip-command-check")
    if os.sep in exe:
        path = os.path.join(cwd, exe)
        if not (os.path.isfile(path) and os.access(path, os.X_OK)):
            what = "is not executable" if os.path.isfile(path) else "does not exist"
            raise LaunchError(f"hvdcompatrun: command {exe!r} {what} (looked in {cwd}){hint}")
    elif shutil.which(exe, path=env.get("PATH", "")) is None:
        raise LaunchError(f"hvdcompatrun: command {exe!r} was not found on PATH{hint}")
    if _PYTHON.match(os.path.basename(exe)):
        script = _python_script(command[1:])
        if script is not None and not os.path.isfile(os.path.join(cwd, script)):
            raise LaunchError(
                f"hvdcompatrun: script {script!r} does not exist (looked in {cwd}); check the "
                f"path{hint}")


def _resolve_executable(command, env):
    """``command`` with a bare executable name replaced by its path on our PATH.

    Launchers may put their own directory first on the ranks' PATH (pyenv's
    shims do; so does Open MPI's --prefix), and a bare ``python`` would then
    start another interpreter, without this environment's packages. The
    absolute path makes every rank run what ``python`` means in this shell.
    """
    exe = command[0]
    if os.sep in exe:
        return list(command)
    found = shutil.which(exe, path=env.get("PATH", ""))
    return [os.path.abspath(found) if found else exe] + list(command[1:])


def _hosts_from(args):
    try:
        if args.hosts:
            return _hosts.parse_hosts_arg(args.hosts)
        if args.hostfile:
            return _hosts.parse_hostfile(args.hostfile)
    except _hosts.HostListError as e:
        raise LaunchError(f"hvdcompatrun: {e}") from None
    return []


def _rendezvous_env(env, hosts):
    """MASTER_ADDR/PORT for DDP-style scripts when every rank runs here."""
    if not _hosts.all_local(hosts):
        return {}
    port = env.get("MASTER_PORT")
    if port:
        try:
            _ports.check_port_free(int(port))
        except ValueError:
            raise LaunchError(f"hvdcompatrun: MASTER_PORT={port!r} is not a port number") \
                from None
        except _ports.PortInUse as e:
            raise LaunchError(str(e)) from None
        return {}
    return {"MASTER_ADDR": env.get("MASTER_ADDR", "127.0.0.1"),
            "MASTER_PORT": str(_ports.free_port())}


def _build_compiler():
    try:
        from hvdcompat._ext import _core

        return _core.build_info().get("mpi_compiler")
    except Exception:  # a broken core must not hide the launcher's own message
        return None


def _ssh_and_interfaces(args):
    """LaunchSpec fields of -p/--ssh-port, -i/--ssh-identity-file, --network-interfaces."""
    port = getattr(args, "ssh_port", None)
    if port is not None and not 0 < port < 65536:
        raise LaunchError(f"hvdcompatrun: --ssh-port must be in 1..65535, got {port}")
    identity = getattr(args, "ssh_identity_file", None)
    if identity and not os.path.isfile(identity):
        raise LaunchError(f"hvdcompatrun: --ssh-identity-file {identity!r} does not exist")
    nics = [n.strip() for n in (getattr(args, "network_interfaces", None) or "").split(",")
            if n.strip()]
    return {"ssh_port": port, "ssh_identity_file": identity and os.path.abspath(identity),
            "network_interfaces": nics}


def plan_launch(args, command, environ=None, cwd=None, hosts=None, relayed=True):
    """The mpirun argv and environment for parsed ``args`` and ``command``.

    `hosts` (an elastic relaunch's host list, in order) replaces -H/--hostfile
    and discovery; the launch then takes all their slots up to --max-np.
    `relayed`: the output goes through :func:`run`'s relay, so the rank
    supervisors get a fresh report secret (Note [Report channel]).

    Raises:
        LaunchError: with the reason and the fix.
    """
    environ = dict(os.environ if environ is None else environ)
    cwd = cwd or os.getcwd()
    if not command:
        raise LaunchError("hvdcompatrun: no command given; for example: "
                          "hvdcompatrun -np 2 python train.py")
    relaunch = hosts is not None
    hosts = list(hosts) if relaunch else _hosts_from(args)
    np = min(_hosts.total_slots(hosts), args.max_np or sys.maxsize) if relaunch \
        else args.num_proc
    elastic = _elastic.elastic_requested(args)
    if elastic and not relaunch:
        try:
            _elastic.check_elastic_args(args, np)
            if args.host_discovery_script:
                hosts = _discovery.wait_for_hosts(args)
                args.discovered_hosts = hosts  # the elastic driver's first view
                if np is None:
                    np = min(_hosts.total_slots(hosts), args.max_np or sys.maxsize)
        except (ValueError, _hosts.HostListError) as e:
            raise LaunchError(f"hvdcompatrun: {e}" if not str(e).startswith("hvdcompatrun")
                              else str(e)) from None
    if np is None:
        if not hosts:
            raise LaunchError("hvdcompatrun: -np N is required (or -H/--hostfile, to use all "
                              "their slots)")
        np = _hosts.total_slots(hosts)
    if np < 1:
        raise LaunchError(f"hvdcompatrun: -np must be at least 1, got {np}")
    args.planned_np = np
    if not args.skip_command_check:
        check_command(command, environ, cwd)
    command = _resolve_executable(command, environ)
    env = environ
    env.update(_tuning.tuning_environment(args))
    # Progress lines of the ranks appear as they are printed, not at exit.
    env.setdefault("PYTHONUNBUFFERED", "1")
    env.pop(_supervisor.TOKEN_ENV, None)
    env.update(_rendezvous_env(env, hosts))
    try:
        mpirun = _mpirun.find_mpirun(env, _build_compiler(), sys.executable)
    except _mpirun.MpirunNotFound as e:
        raise LaunchError(str(e)) from None
    try:
        mpi_args = shlex.split(args.mpi_args or "")
    except ValueError as e:
        raise LaunchError(f"hvdcompatrun: --mpi-args {args.mpi_args!r}: {e}") from None
    spec = _mpirun.LaunchSpec(
        np=np, command=list(command), hosts=hosts, env=env, mpi_args=mpi_args,
        fault_tolerant=args.fault_tolerant or elastic, as_root=hasattr(os, "geteuid") and os.geteuid() == 0,
        local_cores=_mpirun.physical_cores(), flavor=_mpirun.mpi_flavor(mpirun),
        **_ssh_and_interfaces(args))
    if spec.flavor == "openmpi":
        # Every rank runs under the supervisor that reports how it ended
        # (Note [First failed rank] in rank_supervisor.py).
        spec.command = [command[0], SUPERVISOR] + spec.command \
            if _PYTHON.match(os.path.basename(command[0])) else \
            [sys.executable, SUPERVISOR] + spec.command
        if relayed:  # spec.env is env: the secret is forwarded by name
            env[_supervisor.TOKEN_ENV] = secrets.token_hex(16)
    try:
        return _mpirun.build_command(mpirun, spec), env
    except ValueError as e:
        raise LaunchError(str(e)) from None


def _plan_gloo(args, command):
    """What the Gloo launch shares with the MPI launch: the command's checks, the host list,
    the tuning variables. Returns (command, environ, hosts, np, nics, ssh options)."""
    environ = dict(os.environ)
    cwd = os.getcwd()
    if not command:
        raise LaunchError("hvdcompatrun: no command given; for example: "
                          "hvdcompatrun --gloo -np 2 python train.py")
    hosts = _hosts_from(args)
    np = args.num_proc
    if getattr(args, "host_discovery_script", None):
        try:
            hosts = _discovery.wait_for_hosts(args)
        except _hosts.HostListError as e:
            raise LaunchError(f"hvdcompatrun: {e}") from None
        if np is None:
            np = min(_hosts.total_slots(hosts), args.max_np or sys.maxsize)
    if np is None:
        if not hosts:
            raise LaunchError("hvdcompatrun: -np N is required (or -H/--hostfile, to use all "
                              "their slots)")
        np = _hosts.total_slots(hosts)
    if np < 1:
        raise LaunchError(f"hvdcompatrun: -np must be at least 1, got {np}")
    if not args.skip_command_check:
        check_command(command, environ, cwd)
    command = _resolve_executable(command, environ)
    environ.update(_tuning.tuning_environment(args))
    environ.setdefault("PYTHONUNBUFFERED", "1")
    ssh = _ssh_and_interfaces(args)
    nics = ssh.pop("network_interfaces")
    return command, environ, hosts, np, nics, ssh


def _terminal_sent_it():
    """Whether a Ctrl-C from our terminal also reached mpirun (same process group)."""
    for fd in (0, 1, 2):
        try:
            if os.isatty(fd) and os.tcgetpgrp(fd) == os.getpgrp():
                return True
        except OSError:
            continue
    return False


def placement_of(args, np_ranks):
    """{host: [ranks]} the launch fixes (by slot over -H/--hostfile), or {}."""
    try:
        hosts = _hosts_from(args)
        extra = shlex.split(args.mpi_args or "")
    except (LaunchError, ValueError):
        return {}
    if not hosts or any(a.split("=", 1)[0] in _exit_report.MAPPING_ARGS for a in extra):
        return {}
    return _exit_report.expected_placement(hosts, np_ranks)


def _num_ranks(cmd):
    try:
        return int(cmd[cmd.index("-np") + 1])
    except (ValueError, IndexError):
        return 0


# Once every rank not on a lost host has ended, how long to wait for the lost
# host before stopping mpirun (whose connection to it may take minutes to
# time out).
LOST_HOST_GRACE_SECONDS = 10


def run(cmd, env, placement=None, np_ranks=0, abort=None, summarize=None):
    """Runs ``cmd``, forwarding SIGINT/SIGTERM; returns its exit code.

    A rank killed by signal S (mpirun itself dying of S) gives 128 + S, as a
    shell reports it. When the job fails, one line names the rank that failed
    first, its host and how it ended (or the host Open MPI lost contact with).

    Args:
        abort: polled every second; when it returns True the job is stopped.
        summarize: called at the end; False skips the failure summary (an
            elastic restart, where every rank leaves on purpose).
    """
    # Note [Session directory of a killed mpirun]
    session_base = _mpi_session.session_base(cmd, env)
    _mpi_session.remove_stale(session_base)
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    relay = _exit_report.OutputRelay([(proc.stdout, sys.stdout.fileno()),
                                      (proc.stderr, sys.stderr.fileno())],
                                     # No secret (no supervisors, e.g. MPICH): one nobody
                                     # holds, so no line passes for a report.
                                     token=env.get(_supervisor.TOKEN_ENV) or secrets.token_hex(16))

    def forward(signum, _frame):
        # A terminal's Ctrl-C already went to mpirun, which shares our process
        # group; a second SIGINT would make it skip its orderly teardown.
        if signum == signal.SIGINT and _terminal_sent_it():
            return
        try:
            proc.send_signal(signum)
        except ProcessLookupError:
            pass

    previous = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        done_since = None
        while True:
            try:
                code = proc.wait(timeout=1)
                break
            except subprocess.TimeoutExpired:
                pass
            if abort is not None and abort():
                code = _mpi_session.stop(proc, session_base, grace=5)
                break
            if not relay.survivors_done(np_ranks, placement):
                done_since = None
            elif done_since is None:
                done_since = time.monotonic()
            elif time.monotonic() - done_since > LOST_HOST_GRACE_SECONDS:
                code = _mpi_session.stop(proc, session_base, grace=5)
                break
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
    # Daemons of a host that dropped off may hold the pipes open: bounded wait.
    relay.join(timeout=5)
    code = 128 - code if code < 0 else code
    if code == 0:
        # Open MPI may end 0 after losing a host, or under --fault-tolerant
        # once the survivors exit cleanly; a lost rank still fails the job.
        code = (_exit_report.first_failure_code(relay.reports, relay.mpi_aborted)
                or (1 if relay.lost_hosts else 0))
    line = _exit_report.summary(code, relay.reports, relay.lost_hosts, placement,
                                relay.mpi_aborted)
    if line and (summarize is None or summarize()):
        sys.stdout.flush()
        # Open MPI's last message may end without a newline.
        lead = "\n" if relay.line_open.get(sys.stderr.fileno()) else ""
        print(lead + line, file=sys.stderr, flush=True)
    return code


def _run_gloo_elastic(args, command):
    """``hvdcompatrun --gloo`` with elastic flags: lost ranks shrink the job in place, hosts
    that discovery adds get workers that join it in place."""
    try:
        _elastic.check_elastic_args(args, args.num_proc)
    except ValueError as e:
        raise LaunchError(str(e)) from None
    with GlooElasticDriver(args) as driver:
        return _gloo_run.run_gloo(args, command, _plan_gloo, SUPERVISOR, driver=driver)


def main(argv=None):
    """Entry point of the ``hvdcompatrun`` console script; returns the exit code."""
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser()
    options, command = split_command(parser, argv)
    args = parser.parse_args(options)
    if args.check_build:
        from hvdcompat.runner.check_build import check_build_report

        sys.stdout.write(check_build_report())
        return 0
    try:
        _gloo_run.check_gloo_args(args)
        if args.gloo:
            if _elastic.elastic_requested(args):
                return _run_gloo_elastic(args, command)
            return _gloo_run.run_gloo(args, command, _plan_gloo, SUPERVISOR)
    except LaunchError as e:
        print(e, file=sys.stderr)
        return EXIT_USAGE
    if not _elastic.elastic_requested(args):
        try:
            cmd, env = plan_launch(args, command)
        except LaunchError as e:
            print(e, file=sys.stderr)
            return EXIT_USAGE
        if args.verbose:
            print("hvdcompatrun: " + shlex.join(cmd), flush=True)
        np_ranks = _num_ranks(cmd)
        return run(cmd, env, placement_of(args, np_ranks), np_ranks)
    return MpiElasticDriver.launch(args, lambda extra, hosts=None: plan_launch(
        args, command, environ={**os.environ, **extra}, hosts=hosts), run)


if __name__ == "__main__":
    sys.exit(main())
