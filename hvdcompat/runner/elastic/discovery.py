"""Which hosts an elastic job may use: the discovery script, or the fixed -H/--hostfile list."""

import subprocess
import time

from hvdcompat.runner import hosts as _hosts
from hvdcompat.runner.elastic.flags import DEFAULT_ELASTIC_TIMEOUT

__all__ = ["static_hosts", "cap", "parse_discovery_output", "discover", "wait_for_hosts"]


def static_hosts(args):
    """The -H/--hostfile hosts ([] for this machine alone)."""
    if getattr(args, "hosts", None):
        return _hosts.parse_hosts_arg(args.hosts)
    if getattr(args, "hostfile", None):
        return _hosts.parse_hostfile(args.hostfile)
    return []


def cap(hosts, max_np):
    """`hosts` cut to at most `max_np` slots in all (None: no cap)."""
    if max_np is None:
        return list(hosts)
    out, left = [], max_np
    for h in hosts:
        if left <= 0:
            break
        out.append(_hosts.Host(h.name, min(h.slots, left)))
        left -= out[-1].slots
    return out


def parse_discovery_output(text, slots_per_host):
    """Hosts from a discovery script's output: ``host[:slots]`` per line, blank lines skipped.

    Raises:
        HostListError: a malformed line.
    """
    pairs = []
    for i, line in enumerate(text.splitlines(), start=1):
        line = line.strip()
        if not line:
            continue
        name, sep, slots = line.rpartition(":")
        if not sep:
            name, slots = line, str(slots_per_host or 1)
        where = f"host discovery output line {i} ({line!r})"
        try:
            n = int(slots)
        except ValueError:
            raise _hosts.HostListError(f"{where}: slots must be a whole number") from None
        if n < 1 or not name:
            raise _hosts.HostListError(f"{where}: expected host[:slots] with slots >= 1")
        _hosts.check_host_name(name, where)
        pairs.append(_hosts.Host(name, n))
    return pairs


def discover(script, slots_per_host, timeout=30):
    """Runs the discovery script once; returns its hosts.

    Raises:
        HostListError: the script failed or printed something unreadable.
    """
    try:
        out = subprocess.run([script], capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise _hosts.HostListError(f"--host-discovery-script {script!r} could not run: {e}") \
            from None
    if out.returncode != 0:
        raise _hosts.HostListError(f"--host-discovery-script {script!r} exited with "
                                   f"{out.returncode}: {out.stderr.strip()[:500]}")
    try:
        return parse_discovery_output(out.stdout, slots_per_host)
    except _hosts.HostListError as e:
        raise _hosts.HostListError(f"--host-discovery-script {script!r}: {e}") from None


def wait_for_hosts(args, clock=time.monotonic, sleep=time.sleep):
    """Hosts from discovery once they hold at least --min-np slots (polled every second).

    Raises:
        HostListError: --elastic-timeout passed first, or discovery failed.
    """
    need = args.min_np or args.num_proc or 1
    timeout = DEFAULT_ELASTIC_TIMEOUT if args.elastic_timeout is None else args.elastic_timeout
    deadline = clock() + timeout
    while True:
        found = discover(args.host_discovery_script, args.slots_per_host)
        if _hosts.total_slots(found) >= need:
            return found
        if clock() >= deadline:
            raise _hosts.HostListError(
                f"host discovery found {_hosts.total_slots(found)} slot(s) "
                f"({', '.join(f'{h.name}:{h.slots}' for h in found) or 'no hosts'}), fewer than "
                f"the {need} needed (--min-np / -np), for --elastic-timeout {timeout} s; add "
                "hosts or lower --min-np")
        sleep(1)
