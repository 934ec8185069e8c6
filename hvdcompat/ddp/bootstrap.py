"""Environment for ``env://`` initialisation, derived from the MPI world.

``torch.distributed.init_process_group()`` with the default ``env://`` method
reads RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT (and scripts often read
LOCAL_RANK / LOCAL_WORLD_SIZE). ``torchrun`` sets them; ``mpirun`` does not.
When this process was started by an MPI launcher, :func:`bootstrap_env`
starts hvdcompat's engine (``hvd.init()``), takes rank and topology from it,
and has rank 0 pick its address and a free TCP port and broadcast them, so an
unmodified DDP script runs under ``mpirun``. Variables that are already set
are never overwritten.
"""

import os
import socket

import torch

from hvdcompat.rendezvous import launched_by_mpi, launched_by_torch
from hvdcompat.common.ports import free_port

__all__ = ["ENV_VARS", "launched_by_mpi", "launched_by_torch", "bootstrap_env"]

# What env:// initialisation and DDP scripts read, in the order we fill them.
ENV_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")

_ADDR_BYTES = 256


def _missing(environ):
    return [v for v in ENV_VARS if not environ.get(v)]


def _reachable_address(everyone_local):
    """An address of this host that the other ranks can connect to."""
    if everyone_local:
        return "127.0.0.1"
    host = socket.gethostname()
    try:
        addr = socket.gethostbyname(host)
    except OSError:
        addr = host
    if not addr.startswith("127."):
        return addr
    # The hostname maps to loopback (common in /etc/hosts): ask the routing
    # table which interface reaches the outside. UDP connect sends nothing.
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect(("10.255.255.255", 1))
            return s.getsockname()[0]
    except OSError:
        return host


def _broadcast_rendezvous(hvd, addr, port):
    """Rank 0's (address, port), received on every rank over the engine."""
    buf = torch.zeros(_ADDR_BYTES + 1, dtype=torch.int64)
    if hvd.rank() == 0:
        raw = addr.encode()
        if len(raw) > _ADDR_BYTES:
            raise ValueError(f"hvdcompat.ddp bootstrap: rank 0's address {addr!r} is longer than "
                             f"{_ADDR_BYTES} bytes; set MASTER_ADDR yourself.")
        buf[:len(raw)] = torch.tensor(list(raw), dtype=torch.int64)
        buf[-1] = port
    hvd.broadcast_(buf, root_rank=0, name="hvdcompat.ddp.bootstrap")
    raw = bytes(int(b) for b in buf[:-1].tolist() if b)
    return raw.decode(), int(buf[-1])


def bootstrap_env(environ=None):
    """Fills the env:// variables from the MPI world; returns the names it set.

    Does nothing (and starts nothing) unless an MPI launcher started this
    process and one of :data:`ENV_VARS` is missing. Otherwise it is collective:
    every rank of the MPI job must call it (importing :mod:`hvdcompat.ddp`
    does), because it starts hvdcompat's engine with ``hvd.init()`` (default
    settings; call ``hvd.init(...)`` yourself first if you need other
    arguments) and broadcasts rank 0's address and a free port.

    Args:
        environ: the mapping to fill (default ``os.environ``).

    Returns:
        The list of variable names that were set.
    """
    environ = os.environ if environ is None else environ
    if not launched_by_mpi(environ) or not _missing(environ):
        return []
    import hvdcompat as hvd

    hvd.init()
    # Collective regardless of which variables are missing on this rank, so
    # ranks with different environments cannot diverge.
    addr, port = _broadcast_rendezvous(
        hvd, _reachable_address(hvd.local_size() == hvd.size()) if hvd.rank() == 0 else "",
        free_port() if hvd.rank() == 0 else 0)
    values = {"RANK": hvd.rank(), "WORLD_SIZE": hvd.size(), "LOCAL_RANK": hvd.local_rank(),
              "LOCAL_WORLD_SIZE": hvd.local_size(), "MASTER_ADDR": addr, "MASTER_PORT": port}
    filled = []
    for name in ENV_VARS:
        if not environ.get(name):
            environ[name] = str(values[name])
            filled.append(name)
    return filled
