"""``hvdcompatrun --gloo``: start the ranks without MPI, meeting through a store the launcher serves.

    hvdcompatrun --gloo -np 4 python train.py
    hvdcompatrun --gloo -np 8 -H node1:4,node2:4 python train.py

The launcher serves a ``torch.distributed.TCPStore`` (hvdcompat/store.py),
starts every rank itself (a local subprocess, or ``ssh`` for another host;
hvdcompat/runner/gloo_workers.py) under the rank supervisor that reports how
it ended, and gives each rank
Horovod's Gloo-mode variables (:func:`rank_environment`). The environment
forwarding (hvdcompat/runner/environment.py) and the exit report
(hvdcompat/runner/exit_report.py) are the MPI launch's. When a rank fails,
the others get :data:`FAILURE_GRACE_SECONDS` to report the lost peer
themselves, then are stopped; the launcher exits with the first failure's
code and one line naming that rank.
"""

import os
import re
import secrets
import shlex
import socket
import sys
from dataclasses import dataclass, field
from typing import Dict, List

from hvdcompat.runner import environment as _environment
from hvdcompat.runner import exit_report as _exit_report
from hvdcompat.runner import hosts as _hosts
from hvdcompat.runner import rank_supervisor as _supervisor
from hvdcompat.runner.errors import LaunchError
from hvdcompat.runner.gloo_workers import WorkerPool

__all__ = ["add_gloo_arguments", "check_gloo_args", "RankSpec", "place_ranks",
           "rank_environment", "rank_command", "store_address", "WorkerStarter", "run_gloo",
           "failure_line", "FAILURE_GRACE_SECONDS"]

# After the first rank fails, how long the others may take to notice and end
# on their own (printing which peer they lost) before they are stopped.
FAILURE_GRACE_SECONDS = 10

_SSH_OPTIONS = ["-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=no"]


def add_gloo_arguments(parser):
    """horovodrun's controller flags and the Gloo launch's own."""
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--gloo", action="store_true",
                       help="run on the Gloo controller: hvdcompatrun starts the ranks itself "
                            "(ssh for other hosts) and serves their rendezvous store; no "
                            "mpirun is needed")
    which.add_argument("--mpi", action="store_true",
                       help="run on MPI through mpirun (the default)")
    g = parser.add_argument_group("Gloo launch (--gloo)")
    g.add_argument("--gloo-timeout-seconds", type=float, metavar="S", default=None,
                   help="how long ranks wait for each other and for the store at init "
                        "(default 30, Horovod's)")
    g.add_argument("--output-filename", metavar="DIR",
                   help="write each rank's output to DIR/rank.N/stdout and stderr as well")
    g.add_argument("--start-timeout", type=float, metavar="S", default=None,
                   help="seconds ssh may take to reach a host (default 30; "
                        "HOROVOD_START_TIMEOUT)")


def check_gloo_args(args):
    """Raises LaunchError for flags that mean nothing with --gloo, or Gloo flags without it."""
    if not args.gloo:
        for flag, value in (("--output-filename", args.output_filename),
                            ("--start-timeout", args.start_timeout),
                            ("--gloo-timeout-seconds", args.gloo_timeout_seconds)):
            if value is not None:
                raise LaunchError(f"hvdcompatrun: {flag} applies to the Gloo launch; add --gloo "
                                  "(under mpirun, pass Open MPI's own flags with --mpi-args)")
        return
    if args.mpi_args:
        raise LaunchError("hvdcompatrun --gloo starts no mpirun, so --mpi-args has nothing to "
                          "go to; drop one of them")
    if args.fault_tolerant:
        raise LaunchError("hvdcompatrun: --fault-tolerant is Open MPI's ULFM; with --gloo a "
                          "lost rank already fails the survivors with an error naming it")
    for flag, value in (("--gloo-timeout-seconds", args.gloo_timeout_seconds),
                        ("--start-timeout", args.start_timeout)):
        if value is not None and not value > 0:
            raise LaunchError(f"hvdcompatrun: {flag} must be a positive number of seconds, "
                              f"got {value:g}")


@dataclass
class RankSpec:
    """Where one rank runs and what Horovod calls its place."""

    rank: int
    host: str
    local_rank: int
    local_size: int
    cross_rank: int
    cross_size: int
    local: bool = True
    env: Dict[str, str] = field(default_factory=dict)
    argv: List[str] = field(default_factory=list)


def place_ranks(hosts, np):
    """RankSpecs of `np` ranks over `hosts` by slot, in host order (``--map-by slot``).

    Horovod's topology: local ranks count within a host; the cross rank of a
    rank is the index of its host among the hosts that have a rank at the same
    local rank, and the cross size is how many such hosts there are.
    """
    hosts = hosts or [_hosts.Host("localhost", np)]
    if np > _hosts.total_slots(hosts):
        listed = ",".join(f"{h.name}:{h.slots}" for h in hosts)
        raise LaunchError(f"hvdcompatrun: -np {np} asks for more ranks than the hosts have "
                          f"slots ({_hosts.total_slots(hosts)} in {listed}); lower -np or raise "
                          "the slots")
    placement = _exit_report.expected_placement(hosts, np)
    order = [h.name for h in hosts if h.name in placement]
    specs = []
    for host in order:
        ranks = placement[host]
        for local_rank, rank in enumerate(ranks):
            peers = [h for h in order if len(placement[h]) > local_rank]
            specs.append(RankSpec(rank=rank, host=host, local_rank=local_rank,
                                  local_size=len(ranks), cross_rank=peers.index(host),
                                  cross_size=len(peers), local=_hosts.is_local_host(host)))
    return sorted(specs, key=lambda s: s.rank)


def _interface_names(nics):
    return [n for n in nics if "/" not in n]


def _interface_address(name):
    """IPv4 address of the interface `name`, or None."""
    import fcntl
    import struct

    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            packed = fcntl.ioctl(s.fileno(), 0x8915,  # SIOCGIFADDR
                                 struct.pack("256s", name.encode()[:15]))
        return socket.inet_ntoa(packed[20:24])
    except OSError:
        return None


def store_address(specs, nics):
    """The address the ranks reach the launcher's store at.

    Every rank here: loopback. Otherwise the address of the first of
    `nics` that is an interface name, else the one this host's routing table
    uses toward the first remote host.
    """
    remote = [s.host for s in specs if not s.local]
    if not remote:
        return "127.0.0.1"
    for name in _interface_names(nics):
        addr = _interface_address(name)
        if addr:
            return addr
        raise LaunchError(f"hvdcompatrun: --network-interfaces {name}: no IPv4 address on "
                          "that interface here; name an interface of this host")
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect((remote[0], 9))  # UDP connect sends nothing; it only picks the route
            return s.getsockname()[0]
    except OSError as e:
        raise LaunchError(f"hvdcompatrun: no route from this host to {remote[0]} ({e.strerror}); "
                          "check the host name, or pass --network-interfaces") from None


# What an MPI launcher sets per rank (see Note [Environment left out]).
_MPI_LAUNCHER = re.compile(r"OMPI_(?!MCA_).*|PMIX_.*|PRTE_.*|PMI_.*|HYDRA_.*|MV2_COMM_WORLD_.*")


def _without_mpi_launcher(environ):
    """`environ` less an MPI launcher's own variables: a copy inherited from a launcher that
    ran under mpirun would make a rank think mpirun started it."""
    return {k: v for k, v in environ.items() if not _MPI_LAUNCHER.fullmatch(k)}


def rank_environment(spec, environ, store_host, store_port, timeout_s, nics, np, master=None):
    """The variables rank `spec` starts with: the launch's environment and Horovod's Gloo mode.

    `master` ((address, port) for a job on this machine only) also fills the
    env:// variables a DDP script reads, where unset.
    """
    env = _without_mpi_launcher(environ) if spec.local else \
        {k: environ[k] for k in _environment.forwarded_names(environ)}
    env.update({
        "HOROVOD_GLOO_RENDEZVOUS_ADDR": store_host,
        "HOROVOD_GLOO_RENDEZVOUS_PORT": str(store_port),
        "HOROVOD_CONTROLLER": "gloo", "HOROVOD_CPU_OPERATIONS": "gloo",
        "HOROVOD_GLOO_TIMEOUT_SECONDS": f"{timeout_s:g}",
        "HOROVOD_RANK": str(spec.rank), "HOROVOD_SIZE": str(np),
        "HOROVOD_LOCAL_RANK": str(spec.local_rank), "HOROVOD_LOCAL_SIZE": str(spec.local_size),
        "HOROVOD_CROSS_RANK": str(spec.cross_rank), "HOROVOD_CROSS_SIZE": str(spec.cross_size),
        "HOROVOD_HOSTNAME": spec.host,
    })
    names = _interface_names(nics)
    if names:
        env["HOROVOD_GLOO_IFACE"] = names[0]
        env.setdefault("NCCL_SOCKET_IFNAME", ",".join(names))
    # The launch decided the controller; a leftover spelling must not send the rank to MPI.
    env.pop("HVDCOMPAT_CONTROLLER", None)
    if master is not None:
        # What env:// initialisation and DDP scripts read, as under the MPI launch.
        for name, value in (("RANK", spec.rank), ("WORLD_SIZE", np),
                            ("LOCAL_RANK", spec.local_rank), ("LOCAL_WORLD_SIZE", spec.local_size),
                            ("MASTER_ADDR", master[0]), ("MASTER_PORT", master[1])):
            env.setdefault(name, str(value))
    return env


def rank_command(spec, command, supervisor, cwd, ssh_port=None, ssh_identity_file=None,
                 start_timeout=30):
    """The argv that starts rank `spec`: the supervisor here, or ssh running it on the host.

    On another host the remote shell first reads one line from its standard
    input, the launch's report secret (:func:`run_gloo` writes it there), so
    that no command line on either host shows it (Note [Report channel] in
    hvdcompat/runner/rank_supervisor.py).
    """
    argv = [command[0], supervisor] + list(command) if _is_python(command[0]) else \
        [sys.executable, supervisor] + list(command)
    if spec.local:
        return argv
    token = _supervisor.TOKEN_ENV
    remote = f"IFS= read -r {token} && export {token} && " \
        "cd " + shlex.quote(cwd) + " && exec env " + " ".join(
        shlex.quote(f"{k}={v}") for k, v in sorted(spec.env.items())) + " " + shlex.join(argv)
    ssh = ["ssh"] + _SSH_OPTIONS + ["-o", f"ConnectTimeout={max(1, int(start_timeout))}"]
    if ssh_port:
        ssh += ["-p", str(ssh_port)]
    if ssh_identity_file:
        ssh += ["-i", ssh_identity_file]
    return ssh + [spec.host, remote]


def _is_python(exe):
    return bool(re.match(r"^(python|pypy)[0-9.]*$", os.path.basename(exe)))


class WorkerStarter:
    """What starting one worker of a ``--gloo`` launch takes: its command, environment, store.

    Args:
        command, environ, nics, ssh: from the launcher's plan (see :func:`run_gloo`).
        supervisor: path of rank_supervisor.py.
        store_port, timeout_s, start_timeout: the store's port, the Gloo timeout,
            ssh's connect timeout.
        store_host: the store's address for every worker, or None to pick it per
            worker (:func:`store_address` of that worker alone: loopback here, the
            route toward its host elsewhere), as an elastic job that may grow does.
        verbose: print each worker's command.
    """

    def __init__(self, command, environ, nics, ssh, supervisor, store_port, timeout_s,
                 start_timeout, store_host=None, verbose=False):
        self.command, self.environ, self.nics, self.ssh = command, environ, nics, ssh
        self.supervisor, self.store_port, self.timeout_s = supervisor, store_port, timeout_s
        self.start_timeout, self.store_host, self.verbose = start_timeout, store_host, verbose
        self.cwd = os.getcwd()

    def start(self, pool, spec, np, master=None, extra_env=None, joining=False, without=()):
        """Starts the worker of `spec` in `pool` (a WorkerPool); returns its Worker.

        Args:
            np: the world size the launch gives it (HOROVOD_SIZE).
            master: see :func:`rank_environment`.
            extra_env: variables added last (an added host's worker: its join name).
            joining: it joins a running elastic job.
            without: variables left out (a joining worker's place comes from the job).

        Raises:
            OSError: it could not be started.
        """
        host = self.store_host or store_address([spec], self.nics)
        spec.env = rank_environment(spec, self.environ, host, self.store_port, self.timeout_s,
                                    self.nics, np, master)
        spec.env.update(extra_env or {})
        for name in without:
            spec.env.pop(name, None)
        if spec.local:
            spec.env[_supervisor.TOKEN_ENV] = pool.token
        spec.argv = rank_command(spec, self.command, self.supervisor, self.cwd,
                                 self.ssh["ssh_port"], self.ssh["ssh_identity_file"],
                                 self.start_timeout)
        if self.verbose:
            print(f"hvdcompatrun: {'worker' if joining else 'rank'} {spec.rank} on {spec.host}: "
                  f"{shlex.join(spec.argv)}", flush=True)
        return pool.start(spec.rank, spec.host, spec.argv, spec.env, spec.local, joining)


def run_gloo(args, command, plan_common, supervisor, driver=None):
    """Runs the job of ``hvdcompatrun --gloo``; returns its exit code.

    Args:
        plan_common: callable(args, command) -> (command, environ, hosts, np, nics, ssh)
            from the launcher (command checks, tuning variables, host lists).
        supervisor: path of rank_supervisor.py.
        driver: the elastic driver (hvdcompat/runner/elastic/gloo_driver.py) of a
            launch with elastic flags: its variables go to every worker, a lost
            rank does not stop the others (they shrink the job in place, Note
            [Elastic reset on Gloo] in cpp/engine/gloo_reset.h), hosts that
            discovery adds get workers that join in place, and the exit code is
            its verdict.
    """
    from hvdcompat import store as _store

    command, environ, hosts, np, nics, ssh = plan_common(args, command)
    if driver is not None:
        environ = {**environ, **driver.environment()}
    from hvdcompat._ext import _core

    # The flags, else the knobs in the launch's environment (the core's knob table).
    timeout_s = args.gloo_timeout_seconds or _core.setting("GLOO_TIMEOUT_SECONDS", environ)
    start_timeout = args.start_timeout or _core.setting("START_TIMEOUT", environ)
    specs = place_ranks(hosts, np)
    # An elastic job may get workers on other hosts later: each is told the
    # store's address as its own host reaches it.
    spans = driver is not None and driver.may_add_hosts(hosts)
    host = None if spans else store_address(specs, nics)
    try:
        # (torch's store listens on every interface whatever it is given:
        # docs/security.md.)
        server, port = _store.serve("127.0.0.1" if host == "127.0.0.1" else "0.0.0.0", 0,
                                    timeout_s)
    except _store.StoreError as e:
        raise LaunchError(f"hvdcompatrun --gloo: {e}") from None
    starter = WorkerStarter(command, environ, nics, ssh, supervisor, port, timeout_s,
                            start_timeout, store_host=host, verbose=args.verbose)
    master = None
    if all(spec.local for spec in specs):
        from hvdcompat.common.ports import free_port

        master = (environ.get("MASTER_ADDR", "127.0.0.1"), environ.get("MASTER_PORT") or free_port())
    if args.verbose:
        print(f"hvdcompatrun: rendezvous store at {host or 'this host'}:{port}", flush=True)
    # The supervisors' report secret (Note [Report channel]).
    pool = WorkerPool(secrets.token_hex(16), args.output_filename)
    try:
        for spec in specs:
            starter.start(pool, spec, np, master,
                          extra_env=driver.worker_environment(spec.host) if driver else None)
    except OSError as e:
        pool.stop(pool.running())
        raise LaunchError(f"hvdcompatrun --gloo: cannot start rank {len(pool.workers)}: {e}") \
            from None
    placement = {}
    for spec in specs:
        placement.setdefault(spec.host, []).append(spec.rank)

    def survivors_done():
        # Every rank off the hosts the engines reported lost has ended.
        return pool.relay.survivors_done(np, placement, _lost_hosts(pool.relay, specs))

    if driver is not None:
        # The driver's view of the store: the keys of the workers' first hvd.init().
        store = _store.TCPStoreClient.over(server, host or "127.0.0.1", port,
                                           prefix=_store.key_prefix(0, 0), timeout_s=timeout_s,
                                           source="hvdcompatrun's own store")
        # (The driver stops what still runs once the final world finished.)
        code = driver.verdict(driver.run(pool, starter, specs, store, hosts), started=np)
        line = driver.failure_line(code) if code else None
    else:
        code = pool.wait(stop_on_failure=True, grace=FAILURE_GRACE_SECONDS,
                         survivors_done=survivors_done)
        # The supervisors' reports say which rank failed first (and how); a rank
        # whose engine reported a lost peer failed because of it.
        relay = pool.relay
        code = _exit_report.first_failure_code(relay.reports, relay.lost_reporters) or code
        code, line = failure_line(code, relay, specs)
    del server
    if line:
        sys.stdout.flush()
        print(line, file=sys.stderr, flush=True)
    return code


def failure_line(code, relay, specs):
    """(the job's exit code, the line naming its failure or None) from what `relay` saw.

    The first rank that failed of its own accord is named; when every failed
    rank failed after its engine lost peers (or none failed), the host the
    engines reported lost is, and the job fails even if its ranks exited 0.
    """
    placement = {}
    for spec in specs:
        placement.setdefault(spec.host, []).append(spec.rank)
    lost = _lost_hosts(relay, specs)
    code = code or (1 if lost else 0)
    own = [r for r in relay.reports if r.get("status") != 0 and
           r.get("rank") not in relay.lost_reporters]
    if lost and not own:
        return code, _exit_report.summary(code, [], lost, placement)
    return code, _exit_report.summary(code, relay.reports, [], None, relay.lost_reporters)


def _lost_hosts(relay, specs):
    """The hosts the ranks' engines reported lost. Where both sides of a network split
    reported the other, the side of this machine's ranks (the launcher's) is believed."""
    hosts = relay.lost_hosts
    here = {spec.rank for spec in specs if spec.local}
    seen_from_here = [h for h in hosts if relay.lost_named_by.get(h, set()) & here]
    return seen_from_here or hosts
