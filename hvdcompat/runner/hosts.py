"""Host lists for hvdcompatrun: ``-H host1:2,host2:2`` and hostfiles.

A hostfile has one host per line, ``HOST slots=N`` (``slots=`` may be
omitted for one slot; Open MPI's ``max_slots=M`` is accepted and ignored).
``#`` starts a comment; blank lines are skipped. A host listed twice gets the
sum of its slots, as Open MPI does.
"""

import re
import socket
from collections import OrderedDict, namedtuple

__all__ = ["Host", "HostListError", "check_host_name", "parse_hosts_arg", "parse_hostfile",
           "total_slots", "is_local_host", "all_local"]

Host = namedtuple("Host", ["name", "slots"])

_HOSTNAME = re.compile(r"^[A-Za-z0-9_.\-\[\]:]+$")


class HostListError(ValueError):
    """A host list or hostfile that hvdcompatrun cannot read."""


def check_host_name(name, where):
    """Raises HostListError unless ``name`` is a host name that is safe on a command line.

    A name reaches mpirun's ``-H`` list (comma-separated) and the argv of the
    ssh that starts each remote daemon, so it may hold only letters, digits
    and ``_ . - [ ] :`` (IPv6 literals), and it may not start with ``-``
    (which ssh would read as an option, e.g. ``-oProxyCommand=...``).

    Args:
        name: the host name.
        where: what the message names (the option and entry, or file and line).
    """
    if not name:
        raise HostListError(f"{where}: the host name is empty; write HOST or HOST:SLOTS")
    if name.startswith("-"):
        raise HostListError(f"{where}: host name {name!r} starts with '-', which ssh and mpirun "
                            "would read as an option; a host name starts with a letter or digit")
    if not _HOSTNAME.match(name):
        raise HostListError(f"{where}: host name {name!r} holds characters a host name cannot "
                            "(only letters, digits and _ . - [ ] : are allowed; no commas or "
                            "spaces)")


def _slots(text, where):
    try:
        n = int(text)
    except ValueError:
        raise HostListError(f"{where}: slots must be a whole number, got {text!r}") from None
    if n < 1:
        raise HostListError(f"{where}: slots must be at least 1, got {n}")
    return n


def _merge(pairs):
    merged = OrderedDict()
    for name, slots in pairs:
        merged[name] = merged.get(name, 0) + slots
    return [Host(name, slots) for name, slots in merged.items()]


def parse_hosts_arg(text):
    """Parses ``-H``'s value, ``host1:2,host2:4`` (a bare ``host`` has 1 slot).

    Args:
        text: the comma-separated host list.

    Returns:
        list of :class:`Host`, in first-seen order.

    Raises:
        HostListError: an empty entry, a bad host name or a bad slot count.
    """
    pairs = []
    for i, item in enumerate(text.split(","), start=1):
        item = item.strip()
        where = f"-H {text!r}, entry {i}"
        if not item:
            raise HostListError(f"{where} is empty; write -H host1:2,host2:2")
        name, sep, slots = item.rpartition(":")
        if not sep:
            name, slots = item, "1"
        if not name:
            raise HostListError(f"{where}: {item!r} is not HOST:SLOTS (e.g. node1:8)")
        check_host_name(name, where)
        pairs.append((name, _slots(slots, where)))
    return _merge(pairs)


def parse_hostfile(path):
    """Reads a hostfile of ``HOST slots=N`` lines.

    Args:
        path: the file to read.

    Returns:
        list of :class:`Host`, in first-seen order.

    Raises:
        HostListError: the file is missing or empty, or a line is malformed;
            the message names the file and the line number.
    """
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read().splitlines()
    except OSError as e:
        raise HostListError(f"hostfile {path}: cannot be read ({e.strerror})") from None
    pairs = []
    for lineno, raw in enumerate(lines, start=1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        where = f"{path}:{lineno}"
        fields = line.split()
        name, options = fields[0], fields[1:]
        if "=" in name and not name.startswith("-"):
            raise HostListError(f"{where}: {raw.strip()!r} does not start with a host name; "
                                "each line must read 'HOST slots=N' (e.g. 'node1 slots=8')")
        check_host_name(name, where)
        slots = 1
        for opt in options:
            key, sep, value = opt.partition("=")
            key = key.replace("-", "_")
            if sep and key == "slots":
                slots = _slots(value, where)
            elif sep and key == "max_slots":
                _slots(value, where)
            else:
                raise HostListError(f"{where}: {opt!r} in {raw.strip()!r} is not understood; "
                                    "each line must read 'HOST slots=N' (e.g. 'node1 slots=8')")
        pairs.append((name, slots))
    if not pairs:
        raise HostListError(f"hostfile {path}: lists no hosts; add lines like 'node1 slots=8'")
    return _merge(pairs)


def total_slots(hosts):
    """Sum of the slots of ``hosts``."""
    return sum(h.slots for h in hosts)


def _local_names():
    names = {"localhost", "127.0.0.1", "::1"}
    try:
        host = socket.gethostname()
        names.update({host, host.split(".", 1)[0], socket.getfqdn()})
    except OSError:
        pass
    return names


def is_local_host(name):
    """Whether ``name`` refers to this machine (by name; no DNS lookups)."""
    return name in _local_names() or name.startswith("127.")


def all_local(hosts):
    """True when there is no host list, or every host in it is this machine."""
    return not hosts or all(is_local_host(h.name) for h in hosts)

