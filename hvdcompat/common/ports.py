"""The rendezvous port for DDP-style scripts launched by hvdcompatrun.

hvdcompat's own traffic goes through MPI and needs no port of ours. Scripts
that also call ``torch.distributed.init_process_group`` (env:// init) need
MASTER_ADDR/MASTER_PORT: on a single machine hvdcompatrun picks a free port
when none is set, and when one is set and already taken it says by which
process instead of letting the job die in the rendezvous.
"""

import os
import socket

__all__ = ["PortInUse", "free_port", "port_owner", "check_port_free"]


class PortInUse(RuntimeError):
    """MASTER_PORT is already taken on this machine."""


def free_port():
    """A TCP port that nothing listens on right now (the kernel picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def _listening_inodes(port):
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table, encoding="ascii") as f:
                next(f, None)
                for line in f:
                    fields = line.split()
                    if len(fields) < 10:
                        continue
                    local, state, inode = fields[1], fields[3], fields[9]
                    # state 0A is LISTEN.
                    if state == "0A" and int(local.rsplit(":", 1)[1], 16) == port:
                        inodes.add(inode)
        except OSError:
            continue
    return inodes


def port_owner(port):
    """``"pid N (command line)"`` of the process listening on ``port``, or None.

    Reads /proc; processes of other users may be invisible (then None).
    """
    inodes = _listening_inodes(port)
    if not inodes:
        return None
    wanted = {f"socket:[{i}]" for i in inodes}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        fd_dir = f"/proc/{pid}/fd"
        try:
            fds = os.listdir(fd_dir)
        except OSError:
            continue
        for fd in fds:
            try:
                if os.readlink(os.path.join(fd_dir, fd)) in wanted:
                    with open(f"/proc/{pid}/cmdline", "rb") as f:
                        cmd = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
                    return f"pid {pid} ({cmd[:120]})"
            except OSError:
                continue
    return None


def check_port_free(port):
    """Raises :class:`PortInUse` naming the owner when ``port`` is taken here."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        # Sockets in TIME_WAIT do not stop a new listener; only a live one does.
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("", port))
            return
        except OSError:
            pass
    owner = port_owner(port) or "a process this user cannot see"
    raise PortInUse(
        f"hvdcompatrun: MASTER_PORT={port} is already in use on this machine, by {owner}. "
        "Stop that process, choose another port (export MASTER_PORT=...), or unset "
        "MASTER_PORT and hvdcompatrun picks a free one.")
