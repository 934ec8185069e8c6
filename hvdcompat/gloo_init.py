"""``hvd.init()`` without an MPI launcher: the store, the ranks' agreement, the engine's options.

:func:`prepare` runs before the core starts. When this process has a
rendezvous store (torchrun, ``torch.distributed.launch``, ``hvdcompatrun
--gloo``), every rank first checks in through it with its controller and
world size (Note [Init agreement over the store]); then the Gloo controller
gets the store and the launch's rank and topology through ``InitOptions``.
"""

import json
import socket
import sys

from hvdcompat import rendezvous as _rdzv
from hvdcompat import store as _store

__all__ = ["NO_GLOO", "prepare", "gloo_built", "engine_spans_launch", "bind_address",
           "joined_running_job"]

NO_GLOO = ("this build has no Gloo controller (hvdcompatrun --check-build shows '[ ] Gloo'), so "
           "hvd.init() cannot run without an MPI launcher. Launch with hvdcompatrun or mpirun, "
           "or install a build with Gloo")


class _GlooProcess:
    """What this process keeps across inits on the Gloo controller."""

    def __init__(self):
        self.inits = 0      # Gloo inits so far: each uses fresh keys in the store
        self.server = None  # the store rank 0 serves when no launcher agent does
        self.joined = False  # the first init joined a running elastic job
        self.client = None   # the last store client, reused by the next init (below)


_process = _GlooProcess()


def gloo_built(core):
    """Whether the loaded core has the Gloo controller."""
    probe = getattr(core, "gloo_built", None)
    return bool(probe()) if probe is not None else False


def _launch_has_store(environ):
    return not _rdzv.launched_by_mpi(environ) and (
        _rdzv.launched_by_gloo_launcher(environ) or _rdzv.launched_by_torch(environ) or
        all(environ.get(v) for v in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")))


def engine_spans_launch(core, environ):
    """(True, "") when ``hvd.init()`` here starts an engine over all the launch's ranks,
    else (False, why): an MPI launcher started them, or torchrun / hvdcompatrun --gloo
    did and this build has the Gloo controller."""
    if _rdzv.launched_by_mpi(environ):
        return True, ""
    try:
        gloo = _rdzv.controller_choice(environ) == "gloo" and _launch_has_store(environ)
    except ValueError as e:
        return False, str(e)
    if gloo and gloo_built(core):
        return True, ""
    if gloo:
        return False, ("this process was not started by an MPI launcher and " + NO_GLOO +
                       "; hvdcompat's engine cannot span the ranks")
    return False, ("this process was not started by an MPI launcher (nor by torchrun or "
                   "hvdcompatrun --gloo), so hvdcompat's engine cannot span the ranks")


# Note [One store connection per process]: every hvd.init() on the Gloo
# controller (after hvd.shutdown(), or an elastic reset's re-init) used to
# connect to the store anew. torch's client looks up the name of the address
# it connected to (for its messages), and where reverse DNS does not answer,
# that lookup waits for the resolver's timeout: 5 s on some inits of 50 in a
# row on a machine without a DNS server. The connection is kept instead and
# the next init's client shares it under its own key prefix, unless an
# operation on it failed (a connection that timed out may be out of step).
def _open_store(launch, prefix, process):
    """The store client for `launch` (see Note [Store seam] in hvdcompat/store.py)."""
    last = process.client
    if last is not None and not last.failed and (last.host, last.port) == (
            str(launch.store_host), int(launch.store_port)):
        process.client = last.with_prefix(prefix)
        return process.client
    process.client = _connect_store(launch, prefix, process)
    return process.client


def _connect_store(launch, prefix, process):
    if launch.agent_store:
        return _store.TCPStoreClient(launch.store_host, launch.store_port, prefix=prefix,
                                     timeout_s=launch.timeout_s, source=launch.store_source)
    # A launch without torchrun's agent (RANK/WORLD_SIZE/MASTER_* set by hand): the
    # script's own process group owns the store if it started first; else rank 0
    # serves it, and the script's later init_process_group joins it as a client.
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        return _store.TCPStoreClient.over(
            dist.distributed_c10d._get_default_store(), launch.store_host, launch.store_port,
            prefix=prefix, timeout_s=launch.timeout_s, source=launch.store_source)
    import os

    if launch.rank == 0 and process.server is None:
        process.server, _ = _store.serve("0.0.0.0", launch.store_port, launch.timeout_s)
    os.environ["TORCHELASTIC_USE_AGENT_STORE"] = "True"
    os.environ.setdefault("TORCHELASTIC_RESTART_COUNT", "0")
    return _store.TCPStoreClient(launch.store_host, launch.store_port, prefix=prefix,
                                 timeout_s=launch.timeout_s, source=launch.store_source)


# Note [Init agreement over the store]: ranks that disagree on the world size
# or the controller must each fail with one message, not hang. Every rank
# writes agree/hello/<rank> (its controller, world size, host), reads the hellos of
# ranks 0..size-1, and writes its agree/verdict/<rank> ("" or what it found wrong);
# then it reads every verdict and raises the first complaint, so a rank that
# saw nothing wrong still fails with the others. A rank that never arrives is
# a timeout naming the store and the missing ranks.
def _agree(client, launch, controller):
    me = {"rank": launch.rank, "size": launch.size, "controller": controller,
          "host": launch.hostname or socket.gethostname()}
    client.set(f"agree/hello/{launch.rank}", json.dumps(me).encode())
    hellos = _read_all(client, "agree/hello", launch)
    wrong = [h for h in hellos if (h["size"], h["controller"]) != (launch.size, controller)]
    complaint = ""
    if wrong:
        seen = "; ".join(f"rank {h['rank']} on {h['host']}: size {h['size']}, controller "
                         f"{h['controller']}" for h in hellos)
        complaint = (f"the ranks disagree on the world size or the controller ({seen}). Give "
                     "every rank the same launch: the same WORLD_SIZE/-np, and the same "
                     "HOROVOD_CONTROLLER (or none)")
    client.set(f"agree/verdict/{launch.rank}", complaint.encode())
    verdicts = [v for v in _read_all(client, "agree/verdict", launch, decode=False) if v]
    if verdicts:
        raise ValueError(f"hvd.init() on rank {launch.rank}: {verdicts[0].decode()}")


def _read_all(client, what, launch, decode=True):
    keys = [f"{what}/{r}" for r in range(launch.size)]
    try:
        client.wait(keys, launch.timeout_s)
    except _store.StoreError:
        missing = [r for r in range(launch.size) if not _has(client, f"{what}/{r}")]
        raise _store.StoreError(
            f"hvd.init() on rank {launch.rank}: rank(s) {', '.join(map(str, missing))} of "
            f"{launch.size} did not reach hvd.init() within {launch.timeout_s:g} s (store "
            f"{client.address}, from {launch.store_source}). Check their output: they failed "
            "to start, are still starting (raise --gloo-timeout-seconds / "
            "HOROVOD_GLOO_TIMEOUT_SECONDS), or were launched with another world size") from None
    values = [client.get(k) for k in keys]
    return [json.loads(v) for v in values] if decode else values


def _has(client, key):
    try:
        client.wait([key], 0.01)
        return True
    except _store.StoreError:
        return False


def prepare(core, environ, process=None):
    """The Gloo fields of ``InitOptions`` for this init, or None to start on MPI.

    `process` (tests only) stands for another process's :class:`_GlooProcess`.

    Raises:
        ValueError: bad launch variables, ranks that disagree, or MPI chosen
            where no MPI launcher started the ranks.
        RuntimeError: the Gloo controller is needed and this build lacks it
            (:data:`NO_GLOO`); the store cannot be reached (StoreError).
    """
    controller = _rdzv.controller_choice(environ)
    has_store = _launch_has_store(environ)
    if not has_store:
        if controller == "gloo":
            _require_gloo(core)
            raise ValueError("hvd.init(): the Gloo controller was asked for "
                             "(HOROVOD_CONTROLLER=gloo) but no launcher gave this process a "
                             "store: launch with hvdcompatrun --gloo or torchrun, or unset "
                             "HOROVOD_CONTROLLER")
        return None
    launch = _rdzv.gloo_launch(environ)
    if controller == "gloo":
        _require_gloo(core)
    process = _process if process is None else process
    prefix = _store.key_prefix(launch.attempt, process.inits)
    process.inits += 1
    client = _open_store(launch, prefix, process)
    if launch.join:
        if controller != "gloo" or process.inits > 1:
            raise ValueError(
                f"hvd.init() on worker {launch.join}, which hvdcompatrun started to join a "
                "running elastic job: it can only join on the Gloo controller, at its first "
                "hvd.init() (HOROVOD_CONTROLLER is mpi, or hvd.init() ran again after "
                "hvd.shutdown()); leave HOROVOD_CONTROLLER unset and call hvd.init() once")
        # Its rank, size and process sets come from the job's next reset
        # (Note [Growing in place on Gloo] in cpp/engine/gloo_reset.h).
        from hvdcompat.elastic import notifications

        notifications.forget_earlier_removals()
        process.joined = True
        return {"controller": "gloo", "store": client, "gloo_join": launch.join,
                "hostname": launch.hostname, "gloo_iface": launch.iface,
                "gloo_hostname": bind_address(launch), "gloo_timeout_s": launch.timeout_s}
    _agree(client, launch, controller)
    if controller == "mpi":
        if launch.size > 1:
            raise ValueError(
                f"hvd.init() on rank {launch.rank}: HOROVOD_CONTROLLER=mpi, but {launch.launcher} "
                "started this process, not an MPI launcher: MPI cannot join processes that "
                "mpirun did not start. Unset HOROVOD_CONTROLLER (the Gloo controller is the "
                "default here) or launch with hvdcompatrun / mpirun")
        return None
    return {"controller": "gloo", "store": client, "rank": launch.rank, "size": launch.size,
            "local_rank": launch.local_rank, "local_size": launch.local_size,
            "cross_rank": launch.cross_rank, "cross_size": launch.cross_size,
            "hostname": launch.hostname, "gloo_iface": launch.iface,
            "gloo_hostname": bind_address(launch),
            "gloo_timeout_s": launch.timeout_s}


def _ipv4(host):
    try:
        return socket.gethostbyname(host)
    except OSError:
        return None


def bind_address(launch, hostname=None):
    """The address Gloo binds to when no interface is named: "" (the host name's), unless
    that name resolves to a loopback address (``127.0.1.1 node1`` in /etc/hosts is common)
    or to nothing while the store is on another host; then the address this host routes
    toward the store from, which the other hosts reach as well as the store.

    `hostname` (tests) stands for ``socket.gethostname()``.
    """
    if launch.iface:
        return ""
    store = _ipv4(launch.store_host)
    if store is None or store.startswith("127."):
        return ""  # a job on this machine, or the store's own error comes first
    mine = _ipv4(hostname or socket.gethostname())
    if mine is not None and not mine.startswith("127."):
        return ""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect((store, launch.store_port))  # UDP connect sends nothing: the route only
            return s.getsockname()[0]
    except OSError:
        return ""


def joined_running_job():
    """Whether this process's hvd.init() joined a running elastic job (a worker on an added host)."""
    return _process.joined


def _require_gloo(core):
    if not gloo_built(core):
        raise RuntimeError("hvd.init(): " + NO_GLOO)
