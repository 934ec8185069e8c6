"""Which controller ``hvd.init()`` starts, and where a Gloo job's ranks meet.

Note [Controller choice]: ``HVDCOMPAT_CONTROLLER`` / ``HOROVOD_CONTROLLER``
(``mpi`` or ``gloo``; the HVDCOMPAT_ spelling wins; read through the core's knob
table like every setting) decide when set. Otherwise (unset, empty or ``auto``):

- a process an MPI launcher started (mpirun, hvdcompatrun, srun with PMIx,
  Hydra) runs on MPI;
- a process ``hvdcompatrun --gloo`` started (HOROVOD_GLOO_RENDEZVOUS_ADDR set)
  runs on Gloo;
- a process torchrun or ``torch.distributed.launch`` started (TORCHELASTIC_*
  or GROUP_RANK set, or RANK, WORLD_SIZE and MASTER_ADDR without an MPI
  launcher's variables) runs on Gloo;
- anything else (``python train.py``) runs on MPI as a one-rank job.

Gloo binds its connections to HOROVOD_GLOO_IFACE, else the first interface of
torch's GLOO_SOCKET_IFNAME, else the host name's address (or, where that is a
loopback address while the store is elsewhere, the address this host routes
toward the store from; hvdcompat/gloo_init.py).

A Gloo job's place in the world comes from the launch's variables: Horovod's
Gloo-mode ``HOROVOD_RANK``/``SIZE``/``LOCAL_RANK``/``LOCAL_SIZE``/
``CROSS_RANK``/``CROSS_SIZE``/``HOSTNAME`` first (hvdcompatrun --gloo and
horovodrun --gloo set them), then torchrun's ``RANK``/``WORLD_SIZE``/
``LOCAL_RANK``/``LOCAL_WORLD_SIZE``/``GROUP_RANK``/``GROUP_WORLD_SIZE``. The
store (hvdcompat/store.py) is HOROVOD_GLOO_RENDEZVOUS_ADDR:PORT, else
MASTER_ADDR:MASTER_PORT (torchrun's agent store).
"""

import os
from dataclasses import dataclass

from hvdcompat.runner import mpi_world
from hvdcompat.store import DEFAULT_TIMEOUT_SECONDS

__all__ = ["CONTROLLERS", "launched_by_mpi", "launched_by_torch", "launched_by_gloo_launcher",
           "controller_choice", "GlooLaunch", "gloo_launch"]

CONTROLLERS = ("mpi", "gloo")


# torchrun and torch.distributed.launch set these; MPI launchers do not.
_TORCH_LAUNCH_VARS = ("TORCHELASTIC_RUN_ID", "TORCHELASTIC_RESTART_COUNT", "GROUP_RANK")


def launched_by_mpi(environ=None):
    """Whether this process was started by an MPI launcher (mpirun, hvdcompatrun, srun+PMIx...)."""
    return mpi_world.launched_by_mpi(environ)


def launched_by_torch(environ=None):
    """Whether this process was started by torchrun / torch.distributed.launch."""
    environ = os.environ if environ is None else environ
    return any(v in environ for v in _TORCH_LAUNCH_VARS)


def launched_by_gloo_launcher(environ=None):
    """Whether ``hvdcompatrun --gloo`` (or ``horovodrun --gloo``) started this process."""
    environ = os.environ if environ is None else environ
    return bool(environ.get("HOROVOD_GLOO_RENDEZVOUS_ADDR"))


def _env_like_torch(environ):
    return all(environ.get(v) for v in ("RANK", "WORLD_SIZE", "MASTER_ADDR"))


def controller_choice(environ=None):
    """``"mpi"`` or ``"gloo"``: the controller ``hvd.init()`` starts (Note [Controller choice]).

    Raises:
        ValueError: HOROVOD_CONTROLLER / HVDCOMPAT_CONTROLLER names neither.
    """
    from hvdcompat._ext import _core  # the knob table

    environ = os.environ if environ is None else environ
    try:
        explicit = _core.setting("CONTROLLER", environ)
    except ValueError as e:
        raise ValueError(f"hvd.init(): {e}; unset it to choose by the launcher") from None
    if explicit != "auto":
        return explicit
    if launched_by_mpi(environ):
        return "mpi"
    if launched_by_gloo_launcher(environ) or launched_by_torch(environ) or \
            _env_like_torch(environ):
        return "gloo"
    return "mpi"


@dataclass
class GlooLaunch:
    """What a Gloo job's launch says about this rank and the store (-1: not given)."""

    rank: int
    size: int
    local_rank: int = -1
    local_size: int = -1
    cross_rank: int = -1
    cross_size: int = -1
    hostname: str = ""
    iface: str = ""
    store_host: str = ""
    store_port: int = 0
    store_source: str = ""
    timeout_s: float = DEFAULT_TIMEOUT_SECONDS
    attempt: int = 0          # torchrun's restart count: a new attempt uses new keys
    agent_store: bool = True  # the launcher serves the store (else rank 0 must)
    launcher: str = ""        # "hvdcompatrun --gloo" or "torchrun", for messages
    # A worker hvdcompatrun started on a host added to a running elastic job:
    # its name (HVDCOMPAT_ELASTIC_JOIN); rank and size come from the job then.
    join: str = ""


def _int(environ, name, *, required, low=None, below=None):
    text = environ.get(name, "").strip()
    if not text:
        if required:
            raise ValueError(f"hvd.init() on the Gloo controller: {name} is not set; the "
                             "launcher must give every rank its rank and the world size "
                             "(use hvdcompatrun --gloo or torchrun)")
        return -1
    try:
        value = int(text)
    except ValueError:
        raise ValueError(f"hvd.init() on the Gloo controller: {name}={text!r} is not a whole "
                         "number") from None
    if (low is not None and value < low) or (below is not None and value >= below):
        bound = f"0..{below - 1}" if below is not None else f"at least {low}"
        raise ValueError(f"hvd.init() on the Gloo controller: {name}={value} must be {bound}")
    return value


def _timeout(environ):
    from hvdcompat._ext import _core  # the knob table

    try:
        value = _core.setting("GLOO_TIMEOUT_SECONDS", environ)
    except ValueError as e:
        raise ValueError(f"hvd.init() on the Gloo controller: {e}") from None
    if not value > 0:
        raise ValueError("hvd.init() on the Gloo controller: HOROVOD_GLOO_TIMEOUT_SECONDS (or "
                         f"HVDCOMPAT_GLOO_TIMEOUT_SECONDS) is {value:g}: give a positive number "
                         "of seconds (the default is 30)")
    return value


def _interface(environ):
    """The network interface for Gloo's connections: Horovod's HOROVOD_GLOO_IFACE, else the
    first of torch's GLOO_SOCKET_IFNAME (what a torchrun user already sets for torch's own
    gloo backend), else "" (bind to the host name's address, see gloo_init.bind_address)."""
    iface = environ.get("HOROVOD_GLOO_IFACE", "").strip()
    if iface:
        return iface
    return environ.get("GLOO_SOCKET_IFNAME", "").split(",")[0].strip()


def _join(environ):
    from hvdcompat._ext import _core  # the knob table

    return _core.setting("ELASTIC_JOIN", environ).strip()


def gloo_launch(environ=None):
    """This rank's :class:`GlooLaunch`, from the launch's variables.

    Raises:
        ValueError: a variable is missing or out of range; the message names it.
    """
    environ = os.environ if environ is None else environ
    timeout = _timeout(environ)
    iface = _interface(environ)
    if launched_by_gloo_launcher(environ):
        join = _join(environ)
        if join:
            # Note [Growing in place on Gloo] (cpp/engine/gloo_reset.h).
            return GlooLaunch(
                rank=-1, size=-1, hostname=environ.get("HOROVOD_HOSTNAME", "").strip(),
                iface=iface, store_host=environ["HOROVOD_GLOO_RENDEZVOUS_ADDR"].strip(),
                store_port=_int(environ, "HOROVOD_GLOO_RENDEZVOUS_PORT", required=True, low=1,
                                below=65536),
                store_source="HOROVOD_GLOO_RENDEZVOUS_ADDR:HOROVOD_GLOO_RENDEZVOUS_PORT",
                timeout_s=timeout, launcher="hvdcompatrun --gloo", join=join)
        size = _int(environ, "HOROVOD_SIZE", required=True, low=1)
        local_size = _int(environ, "HOROVOD_LOCAL_SIZE", required=False, low=1)
        cross_size = _int(environ, "HOROVOD_CROSS_SIZE", required=False, low=1)
        return GlooLaunch(
            rank=_int(environ, "HOROVOD_RANK", required=True, below=size), size=size,
            local_rank=_int(environ, "HOROVOD_LOCAL_RANK", required=False,
                            below=local_size if local_size > 0 else None, low=0),
            local_size=local_size,
            cross_rank=_int(environ, "HOROVOD_CROSS_RANK", required=False,
                            below=cross_size if cross_size > 0 else None, low=0),
            cross_size=cross_size,
            hostname=environ.get("HOROVOD_HOSTNAME", "").strip(), iface=iface,
            store_host=environ["HOROVOD_GLOO_RENDEZVOUS_ADDR"].strip(),
            store_port=_int(environ, "HOROVOD_GLOO_RENDEZVOUS_PORT", required=True, low=1,
                            below=65536),
            store_source="HOROVOD_GLOO_RENDEZVOUS_ADDR:HOROVOD_GLOO_RENDEZVOUS_PORT",
            timeout_s=timeout, launcher="hvdcompatrun --gloo")
    size = _int(environ, "WORLD_SIZE", required=True, low=1)
    local_size = _int(environ, "LOCAL_WORLD_SIZE", required=False, low=1)
    nodes = _int(environ, "GROUP_WORLD_SIZE", required=False, low=1)
    if not environ.get("MASTER_ADDR", "").strip():
        raise ValueError("hvd.init() on the Gloo controller: MASTER_ADDR is not set; launch "
                         "with torchrun (which sets it) or hvdcompatrun --gloo")
    restart = environ.get("TORCHELASTIC_RESTART_COUNT", "0").strip()
    return GlooLaunch(
        rank=_int(environ, "RANK", required=True, below=size), size=size,
        local_rank=_int(environ, "LOCAL_RANK", required=False, low=0,
                        below=local_size if local_size > 0 else None),
        local_size=local_size,
        # torchrun starts the same number of ranks on every node: node index and count.
        cross_rank=_int(environ, "GROUP_RANK", required=False, low=0,
                        below=nodes if nodes > 0 else None),
        cross_size=nodes,
        hostname=environ.get("HOROVOD_HOSTNAME", "").strip(), iface=iface,
        store_host=environ["MASTER_ADDR"].strip(),
        store_port=_int(environ, "MASTER_PORT", required=True, low=1, below=65536),
        store_source="MASTER_ADDR:MASTER_PORT", timeout_s=timeout,
        attempt=int(restart) if restart.isdigit() else 0,
        agent_store=environ.get("TORCHELASTIC_USE_AGENT_STORE", "").strip() == "True",
        launcher="torchrun" if launched_by_torch(environ) else "the env:// variables")
