"""Test hosts on one machine: network + UTS namespaces joined by a bridge.

A :class:`HostCluster` creates N hosts, each a network namespace with its own
hostname (set per command through ``unshare --uts``), a veth pair into a
bridge in the machine's own namespace, an address in a /24 of the RFC 2544
benchmarking range 198.18.0.0/15 (never a private range), a name in
/etc/hosts, and no name server (a lookup /etc/hosts cannot answer fails at
once, instead of after the resolver's timeout). Open MPI reaches them through
an ssh stand-in script (``--prtemca plm_ssh_agent``) that runs the remote
command inside the host's namespace with a clean environment, as a real
``ssh host cmd`` does.

Note [Test host cleanup]: everything created is recorded in a state file
under :data:`STATE_DIR`, held under an exclusive ``flock`` for the cluster's
lifetime. :meth:`HostCluster.down` runs on a normal exit, on an exception
(context manager), at interpreter exit (atexit) and on SIGTERM/SIGHUP; a
process killed outright leaves its state file unlocked, and the next cluster
that starts (any process) removes what it lists. Names carry a per-instance
prefix and each instance takes its own /24, so concurrent clusters on one
machine never collide.

Usable as a library (tests, benchmarks) and as a command::

    python tests/cluster/testhosts.py --hosts 2 -- hvdcompatrun --hostfile hosts.txt ...
"""

import argparse
import atexit
import fcntl
import json
import os
import re
import shlex
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time

__all__ = ["HostCluster", "ClusterUnavailable", "unavailable_reason", "STATE_DIR",
           "sweep_stale", "leftovers"]

STATE_DIR = "/run/hvdcompat-testhosts"
HOSTS_FILE = "/etc/hosts"
_MARK = "# hvdcompat-testhosts "
# Third octets of 198.18.0.0/15 as (second octet, third octet).
_SUBNETS = [(18, i) for i in range(256)] + [(19, i) for i in range(256)]


class ClusterUnavailable(RuntimeError):
    """The machine cannot host test hosts (not root, no namespaces, no tools)."""


def _run(argv, check=True, input=None, timeout=30):
    proc = subprocess.run(argv, capture_output=True, text=True, input=input, timeout=timeout)
    if check and proc.returncode != 0:
        raise RuntimeError(f"{shlex.join(argv)} failed ({proc.returncode}): "
                           f"{proc.stderr.strip() or proc.stdout.strip()}")
    return proc


def unavailable_reason():
    """Why test hosts cannot be made here, or None when they can."""
    if os.geteuid() != 0:
        return "test hosts need root (network namespaces, a bridge, /etc/hosts); run as root"
    for tool in ("ip", "unshare"):
        if shutil.which(tool) is None:
            return f"test hosts need the '{tool}' command (iproute2 / util-linux)"
    probe = f"hvprobe{os.getpid()}"
    try:
        made = _run(["ip", "netns", "add", probe], check=False)
        if made.returncode != 0:
            return f"network namespaces are not available here: {made.stderr.strip()}"
        uts = _run(["ip", "netns", "exec", probe, "unshare", "--uts", "true"], check=False)
        if uts.returncode != 0:
            return f"UTS namespaces are not available here: {uts.stderr.strip()}"
    finally:
        _run(["ip", "netns", "del", probe], check=False)
    return None


def _name_servers(path="/etc/resolv.conf"):
    """The name servers of `path` that are not loopback addresses (as host routes)."""
    found = []
    try:
        with open(path, encoding="utf-8") as f:
            for line in f:
                words = line.split()
                if len(words) >= 2 and words[0] == "nameserver":
                    addr = words[1].split("%")[0]
                    if ":" in addr and addr != "::1":
                        found.append(addr + "/128")
                    elif re.fullmatch(r"\d+\.\d+\.\d+\.\d+", addr) and \
                            not addr.startswith("127."):
                        found.append(addr + "/32")
    except OSError:
        pass
    return found


def _lock_state_dir():
    os.makedirs(STATE_DIR, exist_ok=True)
    fd = os.open(os.path.join(STATE_DIR, ".lock"), os.O_CREAT | os.O_RDWR, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)
    return fd


def _remove_hosts_lines(prefix):
    """Drops our /etc/hosts lines of `prefix` (rewritten in place: /etc/hosts may be a mount)."""
    try:
        with open(HOSTS_FILE, encoding="utf-8") as f:
            lines = f.readlines()
    except OSError:
        return
    keep = [l for l in lines if not l.rstrip("\n").endswith(_MARK + prefix)]
    if len(keep) != len(lines):
        with open(HOSTS_FILE, "w", encoding="utf-8") as f:
            f.writelines(keep)


def _destroy(state):
    """Removes everything `state` lists; never raises (best effort, every item tried)."""
    prefix = state["prefix"]
    for ns in state.get("namespaces", []):
        pids = _run(["ip", "netns", "pids", ns], check=False).stdout.split()
        for pid in pids:
            try:
                os.kill(int(pid), signal.SIGKILL)
            except (ValueError, ProcessLookupError):
                pass
        _run(["ip", "netns", "del", ns], check=False)
    for link in state.get("links", []):
        _run(["ip", "link", "del", link], check=False)
    _remove_hosts_lines(prefix)
    if state.get("tmpdir"):
        shutil.rmtree(state["tmpdir"], ignore_errors=True)


def sweep_stale():
    """Removes what clusters whose process died left behind (see Note [Test host cleanup]).

    Returns:
        the prefixes removed.
    """
    if not os.path.isdir(STATE_DIR):
        return []
    removed = []
    lock = _lock_state_dir()
    try:
        for name in sorted(os.listdir(STATE_DIR)):
            if not name.endswith(".json"):
                continue
            path = os.path.join(STATE_DIR, name)
            fd = os.open(path, os.O_RDWR)
            try:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    continue  # its owner is alive
                try:
                    with open(path, encoding="utf-8") as f:
                        state = json.load(f)
                except (OSError, ValueError):
                    state = None
                if state:
                    _destroy(state)
                    removed.append(state["prefix"])
                os.unlink(path)
            finally:
                os.close(fd)
    finally:
        os.close(lock)
    return removed


def leftovers(prefix):
    """What of cluster `prefix` still exists: namespaces, links, /etc/hosts lines."""
    found = []
    ns = _run(["ip", "netns", "list"], check=False).stdout
    found += [l.split()[0] for l in ns.splitlines() if l.startswith(prefix)]
    links = _run(["ip", "-o", "link", "show"], check=False).stdout
    found += [m for m in re.findall(r"^\d+: ([^:@]+)", links, re.M) if m.startswith(prefix)]
    try:
        with open(HOSTS_FILE, encoding="utf-8") as f:
            found += [l.strip() for l in f if l.rstrip("\n").endswith(_MARK + prefix)]
    except OSError:
        pass
    return found


_AGENT = r'''#!/bin/bash
# ssh stand-in for the test hosts of cluster {prefix}: "ssh [options] HOST [options] COMMAND..."
# runs COMMAND in HOST's namespace, with HOST's hostname and a clean environment.
log={log}
echo "ARGS $*" >> "$log"
# Options may come before the host and after it, as OpenSSH takes them (horovodrun puts
# -p/-o after it); the first word after the host that is not an option starts COMMAND.
host=""
while [ $# -gt 0 ]; do
  case "$1" in
    -p|-i|-l|-o|-F|-J|-E|-c|-b|-e|-m|-L|-R|-D|-W|-S) echo "OPT $1 $2" >> "$log"; shift 2 ;;
    -*) echo "OPT $1" >> "$log"; shift ;;
    *) [ -n "$host" ] && break; host="$1"; shift ;;
  esac
done
case "$host" in
{cases}
  *) echo "ssh: Could not resolve hostname $host: Name or service not known" >&2; exit 255 ;;
esac
echo "HOST $host" >> "$log"
exec ip netns exec "$ns" unshare --uts env -i HOME="$HOME" PATH={path} \
  bash -c "hostname $name; $*"
'''


class HostCluster:
    """N test hosts; see the module docstring.

    Attributes:
        prefix: unique name prefix of this instance (namespaces, links, hosts lines).
        names: the hosts' names, resolvable through /etc/hosts.
        subnet: the instance's /24, e.g. ``"198.18.3.0/24"``.
        agent: path of the ssh stand-in (give it to Open MPI as plm_ssh_agent).
        agent_log: file the stand-in appends what it was called with.
        tmpdir: a scratch directory removed with the cluster.

    Not thread-safe; one owner.
    """

    def __init__(self, n, names=None, rate=None, prefix="hv"):
        """Creates the hosts.

        Args:
            n: number of hosts (1-200).
            names: host names (default ``<prefix>-n1`` ...); must not already be
                in /etc/hosts.
            rate: optional tbf rate for every host link (e.g. ``"1gbit"``).
            prefix: start of every name this instance makes (2-5 lowercase
                letters; a unique tag follows it).

        Raises:
            ClusterUnavailable: not root, or namespaces are missing.
            RuntimeError: a setup command failed (everything made is removed).
        """
        reason = unavailable_reason()
        if reason:
            raise ClusterUnavailable(reason)
        if not 1 <= n <= 200:
            raise ValueError(f"HostCluster: n must be in 1..200, got {n}")
        if not re.fullmatch(r"[a-z]{2,5}", prefix):
            raise ValueError(f"HostCluster: prefix must be 2-5 lowercase letters, got {prefix!r}")
        sweep_stale()
        self._state = None
        self._state_fd = None
        self._prev_handlers = {}
        tag = f"{os.getpid():x}{int(time.time() * 1000) % 4096:03x}"[-7:]
        # Interface names hold 15 characters: prefix and tag (10 at most) and "v<i>p" fit.
        self.prefix = prefix + tag[-(10 - len(prefix)):]
        self.names = list(names) if names else [f"{self.prefix}-n{i + 1}" for i in range(n)]
        if len(self.names) != n:
            raise ValueError(f"HostCluster: {n} hosts but {len(self.names)} names")
        with open(HOSTS_FILE, encoding="utf-8") as f:
            taken = {w for line in f for w in line.split("#", 1)[0].split()[1:]}
        if taken & set(self.names):
            raise ValueError(f"HostCluster: {sorted(taken & set(self.names))} already in "
                             f"{HOSTS_FILE}; choose other names")
        self.tmpdir = tempfile.mkdtemp(prefix=f"{self.prefix}-")
        self.agent = os.path.join(self.tmpdir, "ssh")
        self.agent_log = os.path.join(self.tmpdir, "ssh.log")
        self._namespaces = [f"{self.prefix}-n{i + 1}" for i in range(n)]
        self._veths = [f"{self.prefix}v{i + 1}" for i in range(n)]
        self._bridge = f"{self.prefix}br"
        lock = _lock_state_dir()
        try:
            self.subnet_octets = self._free_subnet()
            self._claim()
        finally:
            os.close(lock)
        a, b = self.subnet_octets
        self.subnet = f"198.{a}.{b}.0/24"
        self.gateway = f"198.{a}.{b}.1"
        self.addresses = [f"198.{a}.{b}.{11 + i}" for i in range(n)]
        self._install_handlers()
        try:
            self._build(rate)
        except BaseException:
            self.down()
            raise

    # -- state and cleanup ---------------------------------------------------

    def _free_subnet(self):
        used = set()
        for m in re.finditer(r"inet 198\.(1[89])\.(\d+)\.", _run(["ip", "-o", "addr"]).stdout):
            used.add((int(m.group(1)), int(m.group(2))))
        for name in os.listdir(STATE_DIR):
            if name.endswith(".json"):
                try:
                    with open(os.path.join(STATE_DIR, name), encoding="utf-8") as f:
                        used.add(tuple(json.load(f)["subnet"]))
                except (OSError, ValueError, KeyError):
                    pass
        for octets in _SUBNETS:
            if octets not in used:
                return octets
        raise RuntimeError("HostCluster: every /24 of 198.18.0.0/15 is in use on this machine")

    def _claim(self):
        path = os.path.join(STATE_DIR, f"{self.prefix}.json")
        self._state_path = path
        self._state_fd = os.open(path, os.O_CREAT | os.O_RDWR, 0o600)
        fcntl.flock(self._state_fd, fcntl.LOCK_EX)
        self._state = {"prefix": self.prefix, "pid": os.getpid(), "subnet": self.subnet_octets,
                       "namespaces": [], "links": [], "tmpdir": self.tmpdir}
        self._save()

    def _save(self):
        data = json.dumps(self._state).encode()
        os.ftruncate(self._state_fd, 0)
        os.pwrite(self._state_fd, data, 0)

    def _record(self, kind, name):
        self._state[kind].append(name)
        self._save()

    def _install_handlers(self):
        atexit.register(self.down)
        for sig in (signal.SIGTERM, signal.SIGHUP):
            try:
                self._prev_handlers[sig] = signal.signal(sig, self._on_signal)
            except ValueError:  # not the main thread: atexit and the sweep still cover it
                pass

    def _on_signal(self, signum, frame):
        self.down()
        prev = self._prev_handlers.get(signum)
        if callable(prev):
            prev(signum, frame)
        else:
            # End as the signal would have (down() restored the previous disposition);
            # an exception here could be caught by the code it lands in (a test runner
            # reports it as one failed test and carries on).
            signal.signal(signum, signal.SIG_DFL if prev is None else prev)
            os.kill(os.getpid(), signum)

    def down(self):
        """Removes every namespace, link, /etc/hosts line and file of this cluster.

        Idempotent; safe from signal handlers and atexit.
        """
        if self._state is None:
            return
        state, self._state = self._state, None
        _destroy(state)
        try:
            os.unlink(self._state_path)
        except OSError:
            pass
        os.close(self._state_fd)
        for sig, prev in self._prev_handlers.items():
            try:
                signal.signal(sig, prev)
            except (ValueError, TypeError):
                pass
        self._prev_handlers = {}
        try:
            atexit.unregister(self.down)
        except Exception:  # noqa: BLE001 - interpreter shutting down
            pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.down()

    # -- building ------------------------------------------------------------

    def _build(self, rate):
        a, b = self.subnet_octets
        _run(["ip", "link", "add", self._bridge, "type", "bridge"])
        self._record("links", self._bridge)
        _run(["ip", "addr", "add", f"{self.gateway}/24", "dev", self._bridge])
        _run(["ip", "link", "set", self._bridge, "up"])
        for ns, veth, addr in zip(self._namespaces, self._veths, self.addresses):
            _run(["ip", "netns", "add", ns])
            self._record("namespaces", ns)
            _run(["ip", "link", "add", veth, "type", "veth", "peer", "name", veth + "p"])
            self._record("links", veth)
            _run(["ip", "link", "set", veth + "p", "netns", ns])
            _run(["ip", "-n", ns, "link", "set", veth + "p", "name", "eth0"])
            _run(["ip", "-n", ns, "addr", "add", f"{addr}/24", "dev", "eth0"])
            _run(["ip", "-n", ns, "link", "set", "eth0", "up"])
            _run(["ip", "-n", ns, "link", "set", "lo", "up"])
            _run(["ip", "-n", ns, "route", "add", "default", "via", self.gateway])
            for server in _name_servers():
                # No name server answers inside a host: a lookup of an address that is
                # not in /etc/hosts fails at once, as where the DNS answers, instead of
                # after the resolver's timeout (torch's store looks up each client).
                _run(["ip", "-n", ns, "route", "add", "unreachable", server], check=False)
            _run(["ip", "link", "set", veth, "master", self._bridge])
            _run(["ip", "link", "set", veth, "up"])
        lines = "".join(f"{addr} {name} {_MARK}{self.prefix}\n"
                        for addr, name in zip(self.addresses, self.names))
        with open(HOSTS_FILE, "a", encoding="utf-8") as f:
            f.write(lines)
        self._write_agent()
        if rate:
            self.limit(rate)

    def _write_agent(self):
        cases = "\n".join(f"  {name}|{addr}) ns={ns}; name={name} ;;"
                          for name, addr, ns in zip(self.names, self.addresses, self._namespaces))
        text = _AGENT.format(prefix=self.prefix, log=shlex.quote(self.agent_log), cases=cases,
                             path=shlex.quote(os.environ.get("PATH", "/usr/bin:/bin")))
        with open(self.agent, "w", encoding="utf-8") as f:
            f.write(text)
        os.chmod(self.agent, stat.S_IRWXU)
        open(self.agent_log, "w").close()

    # -- using ---------------------------------------------------------------

    def host_index(self, host):
        return self.names.index(host) if not isinstance(host, int) else host

    def namespace(self, host):
        return self._namespaces[self.host_index(host)]

    def veth(self, host):
        """The machine-side end of `host`'s link (limit or cut it here)."""
        return self._veths[self.host_index(host)]

    def kill_processes(self):
        """SIGKILLs every process running in the hosts' namespaces (a cut-off host's daemons)."""
        for ns in self._namespaces:
            for pid in _run(["ip", "netns", "pids", ns], check=False).stdout.split():
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except (ValueError, ProcessLookupError):
                    pass

    def limit(self, rate):
        """Rate-limits every host link to `rate` (tbf) in both directions; None removes it."""
        for i, veth in enumerate(self._veths):
            for dev, netns in ((veth, None), ("eth0", self._namespaces[i])):
                pre = ["ip", "netns", "exec", netns] if netns else []
                _run(pre + ["tc", "qdisc", "del", "dev", dev, "root"], check=False)
                if rate:
                    _run(pre + ["tc", "qdisc", "add", "dev", dev, "root", "tbf", "rate", rate,
                                "burst", "256kb", "latency", "50ms"])

    def cut(self, host):
        """Takes `host`'s link down: it drops off the network (its processes keep running)."""
        _run(["ip", "link", "set", self.veth(host), "down"])

    def restore(self, host):
        _run(["ip", "link", "set", self.veth(host), "up"])

    def mpi_args(self):
        """mpirun arguments that launch through the stand-in over this cluster's subnet."""
        return ["--prtemca", "plm_ssh_agent", self.agent,
                "--prtemca", "oob_tcp_if_include", self.subnet,
                "--mca", "btl_tcp_if_include", self.subnet]

    def write_hostfile(self, slots, path=None):
        """Writes ``HOST slots=N`` lines (one per host; `slots` an int or a list)."""
        slots = slots if isinstance(slots, (list, tuple)) else [slots] * len(self.names)
        path = path or os.path.join(self.tmpdir, "hostfile")
        with open(path, "w", encoding="utf-8") as f:
            for name, s in zip(self.names, slots):
                f.write(f"{name} slots={s}\n")
        return path

    def on_host(self, host, argv, hostname=None):
        """``argv`` wrapped to run on `host` (its namespace and hostname), environment kept.

        `hostname` gives the command another host name than the host's own (e.g. one that
        resolves to a loopback address, as ``127.0.1.1 node1`` lines in /etc/hosts make it).
        """
        name = hostname or self.names[self.host_index(host)]
        return ["ip", "netns", "exec", self.namespace(host), "unshare", "--uts", "sh", "-c",
                f'hostname {shlex.quote(name)} && exec "$@"', "sh", *argv]

    def agent_calls(self):
        """Lines the stand-in logged (``ARGS ...``, ``OPT -p 22``, ``HOST name``)."""
        with open(self.agent_log, encoding="utf-8") as f:
            return f.read().splitlines()


def main(argv=None):
    """Command line: bring up test hosts, run a command on the first one, tear down."""
    parser = argparse.ArgumentParser(
        description="Run COMMAND on the first of N test hosts (namespaces on this machine). "
                    "{hostfile}, {hosts} and {mpi_args} in COMMAND are replaced.")
    parser.add_argument("--hosts", type=int, default=2)
    parser.add_argument("--slots", type=int, default=2)
    parser.add_argument("--names", help="comma-separated host names (default: unique ones)")
    parser.add_argument("--rate", help="tbf rate for every host link, e.g. 1gbit")
    parser.add_argument("--hostfile", help="write the hostfile here (default: a scratch file)")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    # Ctrl-C (SIGINT) stops the command and tears the hosts down, also when this
    # process started with SIGINT ignored (a shell's background job, which is how
    # test runs are often started): Python then installs no handler of its own,
    # and the command would run to its end.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        cluster = HostCluster(args.hosts, names=args.names.split(",") if args.names else None,
                              rate=args.rate)
    except ClusterUnavailable as e:
        print(f"testhosts: {e}", file=sys.stderr)
        return 2
    with cluster:
        hostfile = cluster.write_hostfile(args.slots, args.hostfile)
        subs = {"{hostfile}": hostfile,
                "{hosts}": ",".join(f"{n}:{args.slots}" for n in cluster.names),
                "{mpi_args}": shlex.join(cluster.mpi_args())}
        print(f"testhosts: {', '.join(cluster.names)} on {cluster.subnet}; hostfile {hostfile}",
              flush=True)
        if not command:
            return 0
        for k, v in subs.items():
            command = [c.replace(k, v) for c in command]
        proc = subprocess.Popen(cluster.on_host(0, command))
        try:
            return proc.wait()
        except KeyboardInterrupt:
            proc.send_signal(signal.SIGINT)
            return proc.wait()


if __name__ == "__main__":
    sys.exit(main())
