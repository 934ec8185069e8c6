"""Lifecycle and topology: init, shutdown, the elastic reset, rank and size queries."""

import atexit
import os
import sys
import threading
import time

from hvdcompat import _session
from hvdcompat import gloo_init as _gloo
from hvdcompat import process_sets as _ps
from hvdcompat._ext import Adasum, Average, Max, Min, Product, Sum, _core  # noqa: F401
from hvdcompat.exceptions import HorovodInternalError
from hvdcompat.capabilities import (  # noqa: F401 (hvd.basics keeps Horovod's names)
    build_info, ccl_built, cuda_built, ddl_built, gloo_built, gloo_enabled, mpi_built,
    mpi_enabled, nccl_built, rocm_built, sycl_built)
from hvdcompat.runner import mpi_world

__all__ = [
    "init", "shutdown", "is_initialized", "size", "rank", "local_size", "local_rank",
    "cross_size", "cross_rank", "is_homogeneous", "mpi_threads_supported", "mpi_enabled",
    "mpi_built", "gloo_enabled", "gloo_built", "nccl_built", "ddl_built", "ccl_built",
    "cuda_built", "rocm_built", "sycl_built", "engine_stats", "reset_engine_stats",
    "build_info", "start_timeline", "stop_timeline", "Average", "Sum", "Adasum", "Min", "Max", "Product",
]

# Serialises init, shutdown, elastic reset and exit (each replaces the session).
_lifecycle_lock = threading.RLock()


class _ProcessExit:
    """How this process ends: facts gathered while it runs, read at interpreter exit.

    They belong to the process, not to a session.
    """

    def __init__(self):
        self.registered = False  # _at_exit is registered with atexit
        self.as_failed_rank = False  # see _exit_as_failed_rank


_exit = _ProcessExit()


def _end_if_mpi4py_would_hang_at_exit():
    """Ends this process where mpi4py's MPI_Finalize at exit would keep the job from ending.

    Under ULFM hvdcompat never finalizes MPI (Note [No MPI_Finalize under
    ULFM], cpp/engine/elastic_reset.h), but MPI that mpi4py initialised is
    finalized by mpi4py at exit, and there that call never returns. Raising
    would not help: the process would still hang at exit after the error. So
    the process ends here, at once, with exit code 1 and a line saying what
    to change.
    """
    mpi4py = sys.modules.get("mpi4py")
    MPI = sys.modules.get("mpi4py.MPI")
    if MPI is None or not MPI.Is_initialized() or MPI.Is_finalized():
        return
    if getattr(getattr(mpi4py, "rc", None), "finalize", None) is False:
        return
    if not _core.fault_tolerance_enabled():
        return
    print(f"hvd.init() on rank {MPI.COMM_WORLD.Get_rank()}: MPI was initialised by mpi4py and "
          "this job runs with ULFM (hvdcompatrun --fault-tolerant or an elastic launch). "
          "mpi4py would call MPI_Finalize at exit, which never returns under ULFM's failure "
          "detector, so the job could not end; this process ends now (exit code 1). Import "
          "mpi4py's MPI after hvd.init() (hvdcompat then leaves MPI unfinalized at exit, as "
          "ULFM allows), or set mpi4py.rc.finalize = False before `from mpi4py import MPI`.",
          file=sys.stderr, flush=True)
    sys.stdout.flush()
    os._exit(1)


def _comm_arguments(comm):
    """(mpi handle or None, rank list, how comm reads, why it is invalid here or "").

    Local: never raises. A rank that raised here would leave its peers
    waiting in hvd.init; the core compares every process's comm first and
    raises on each (Note [Agreeing on init's comm] in
    cpp/transport/mpi_comm_agreement.h).
    """
    if comm is None:
        return None, [], "None", ""
    text = repr(comm)
    text = text if len(text) <= 80 else text[:77] + "..."
    if isinstance(comm, (list, tuple)):
        if not all(isinstance(r, int) and not isinstance(r, bool) for r in comm):
            return None, [], text, "a rank list must contain ints only"
        return None, [int(r) for r in comm], repr([int(r) for r in comm]), ""
    try:
        from mpi4py import MPI
    except ImportError:
        MPI = None
    if MPI is not None and isinstance(comm, MPI.Comm):
        if comm == MPI.COMM_NULL:
            return None, [], "MPI.COMM_NULL", (
                "this process is not part of the communicator (a Split left it out); only its "
                "members call hvd.init with it")
        try:
            _check_same_mpi(MPI, "hvd.init(comm=...)")
        except ValueError as e:
            return None, [], "an mpi4py communicator", str(e)
        return comm.py2f(), [], "an mpi4py communicator", ""
    return None, [], f"{text} (a {type(comm).__name__})", (
        "expected None, a list of ranks or an mpi4py communicator")


def _library_name(version):
    """First line of an MPI library version string, e.g. 'MPICH Version: 5.0.2'."""
    # mpi4py's string may keep the C string's terminating NUL.
    text = version.replace("\0", " ").strip()
    return " ".join(text.splitlines()[0].split()) if text else "?"


def _check_same_mpi(MPI, what):
    """Raises ValueError when mpi4py runs on another MPI library than the core.

    A communicator handle only means something to the library that made it;
    with two MPIs in one process the job would hang or crash instead.
    """
    theirs = _library_name(MPI.Get_library_version())
    ours = _library_name(_core.build_info()["mpi_library"])
    if theirs != ours:
        raise ValueError(
            f"{what}: mpi4py runs on '{theirs}' but hvdcompat was built against '{ours}'. "
            "Build mpi4py against the same MPI (MPICC=<that MPI's mpicc> pip install "
            "--no-binary mpi4py mpi4py) or rebuild hvdcompat with MPICC pointing at mpi4py's "
            "MPI.")


def init(comm=None, process_sets=None):
    """Starts hvdcompat on this rank. Collective: every rank must call it.

    Args:
        comm: ``None`` for all ranks of the launch, a list of global ranks to
            run on a subset, or an mpi4py communicator (duplicated; user
            traffic on it never mixes with ours).
        process_sets: ``None``, a list of :class:`ProcessSet` to register
            now (ids 1, 2, ... in list order, on every rank), or ``"dynamic"``
            to allow :func:`add_process_set` / :func:`remove_process_set`
            later (also enabled by ``HOROVOD_DYNAMIC_PROCESS_SETS=1``). A set
            built from an mpi4py communicator may differ per rank (e.g. a
            ``Split`` by parity): every rank's group is registered, and the
            object stands for the caller's own group.

    Calling ``init`` again while initialised does nothing; after
    :func:`shutdown` it starts a fresh runtime. Environment knobs
    (``HOROVOD_*`` / ``HVDCOMPAT_*``) are read here.

    Returns:
        None.

    Raises:
        ValueError: ``comm`` is invalid on some process or differs between
            the processes that would form the job (they compare it first, so
            each of them raises, naming who passed what); or
            ``process_sets`` is invalid on some rank
            or differs between ranks. The ranks compare their
            ``process_sets`` before registering any, so then every rank
            raises the same error, naming the ranks at fault; nothing is
            initialised and ``init`` may be called again.
    """
    with _lifecycle_lock:
        if _core.is_initialized():
            return
        _end_if_mpi4py_would_hang_at_exit()
        # Note [Controller choice] (hvdcompat/rendezvous.py).
        gloo = _gloo.prepare(_core, os.environ)
        if gloo is not None and comm is not None and not isinstance(comm, (list, tuple)):
            raise ValueError("hvd.init(comm=<mpi4py communicator>): this job runs on the Gloo "
                             "controller: every launched rank joins (use hvd.add_process_set for "
                             "a subset), or launch with hvdcompatrun / mpirun to run on MPI")
        handle, ranks, comm_text, comm_refused = _comm_arguments(comm)
        static_sets = _ps._parse_init_argument(process_sets, None if comm_refused else comm)
        _core.init(_core.InitOptions(comm_handle=handle, ranks=ranks, comm_text=comm_text,
                                     comm_refused=comm_refused,
                                     requested_sets=static_sets.requested,
                                     refused=static_sets.refused,
                                     dynamic_process_sets=static_sets.dynamic,
                                     **(gloo or {})))
        _ps._after_init(static_sets, _session.begin())
        if not _exit.registered:
            atexit.register(_at_exit)
            _exit.registered = True


def shutdown():
    """Stops hvdcompat on this rank; ``init`` may be called again afterwards.

    Pending operations fail with :class:`HorovodInternalError`; the other
    ranks learn of the shutdown at their next collective.

    Returns:
        None.

    Never raises: safe to call when not initialised.
    """
    with _lifecycle_lock:
        if not _core.is_initialized():
            return
        _core.shutdown()
        _session.end()


def _elastic_reset():
    """Rebuilds the runtime from the surviving ranks in place (Note [Elastic reset]).

    The one place where a reset happens: the old world's session is dropped
    (handles, name counters, GPU state), the core swaps its runtime, and a
    session for the new world begins, taking over the registered process sets
    with their surviving members' new ranks (Note [One owner of Python state]).

    Returns:
        The survivors' ranks in the old world, in new-rank order.
    """
    with _lifecycle_lock:
        started = time.monotonic()
        old = _session.current()
        _session.end()
        try:
            survivors = _core.elastic_reset()
        except RuntimeError as e:
            raise HorovodInternalError(
                f"elastic reset: rebuilding the job from the surviving ranks failed: {e}. "
                "The job cannot continue; restart it.") from e
        finally:
            # Whatever the core has left running starts from nothing, as after init.
            new = _session.begin(old.process_sets) if _core.is_initialized() else None
        if new is not None:
            new.last_reset_seconds = time.monotonic() - started
        _ps._after_reset(new)
        return survivors


def _leave_elastic_job():
    """This process leaves the elastic job, whose host was removed (Note [Elastic reset on Gloo]).

    On Gloo the others' next reset is told not to wait for it, and it
    returns once they agreed on their world; on MPI their shrink finds out.
    Never raises: the process leaves either way.
    """
    with _lifecycle_lock:
        try:
            _core.elastic_leave()
        except Exception:  # noqa: BLE001 - leaving regardless
            pass


def _exit_as_failed_rank():
    """Makes this process end as a failed rank when it exits (elastic training, ULFM).

    A graceful exit (engine shutdown, MPI_Finalize) would wait for ranks that
    are busy rebuilding the job without this one; ending at once lets them
    see it as lost. Without ULFM the job ends anyway, so nothing changes.
    """
    try:
        # On Gloo the survivors notice a lost rank by its closed sockets. (Asked
        # first: the ULFM question is MPI's, and MPI is not initialised on Gloo.)
        _exit.as_failed_rank = _core.is_initialized() and (
            bool(getattr(_core, "gloo_enabled", bool)()) or _core.fault_tolerance_enabled())
    except Exception:  # noqa: BLE001 - MPI may be gone already; then exit normally
        _exit.as_failed_rank = False


def _mark_final_world():
    """Tells hvdcompatrun's elastic driver that this process ended in the job's current world.

    The driver takes the job's exit code from these processes' own exit
    codes (their rank supervisors record them); see ElasticDriver.verdict.
    """
    directory = _core.setting("ELASTIC_DIR")
    rank = mpi_world.launch_rank()  # the rank supervisor's key for this process
    if not directory or rank is None:
        return
    try:
        with open(os.path.join(directory, f"final.{rank}"), "w") as f:
            f.write(f"{_core.rank()} {_core.size()}\n")
    except OSError:
        pass  # the driver is gone: nobody to tell


def _at_exit():

    if _exit.as_failed_rank:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)
    if _core.is_initialized():
        _mark_final_world()
    # Stop the engine, then finalize MPI if we were the ones to start it and
    # it runs without ULFM (Note [No MPI_Finalize under ULFM]).
    with _lifecycle_lock:
        _core.finalize()
        _session.end()


def is_initialized():
    """Whether :func:`init` has run (and :func:`shutdown` has not since).

    Returns:
        bool.

    Never raises.
    """
    return _core.is_initialized()


def _require_init():
    _session.current()


def size():
    """Number of ranks in the job.

    In an elastic job, the size of the current world.

    Returns:
        int, at least 1.

    Raises:
        ValueError: hvdcompat is not initialised (call :func:`init` first).
    """
    _require_init()
    return _core.size()


def rank():
    """This process's rank in the job.

    Returns:
        int, 0 to ``size() - 1``; in an elastic job, the rank in the current world.

    Raises:
        ValueError: hvdcompat is not initialised (call :func:`init` first).
    """
    _require_init()
    return _core.rank()


def local_size():
    """Number of ranks on this node (the ranks that share memory with this one).

    Returns:
        int, at least 1.

    Raises:
        ValueError: hvdcompat is not initialised (call :func:`init` first).
    """
    _require_init()
    return _core.local_size()


def local_rank():
    """This process's rank among the ranks of its node; pin your GPU with it.

    Returns:
        int, 0 to ``local_size() - 1``.

    Raises:
        ValueError: hvdcompat is not initialised (call :func:`init` first).
    """
    _require_init()
    return _core.local_rank()


def cross_size():
    """Number of nodes that have a rank with this rank's local rank.

    Returns:
        int, at least 1.

    Raises:
        ValueError: hvdcompat is not initialised (call :func:`init` first).
    """
    _require_init()
    return _core.cross_size()


def cross_rank():
    """This node's index among the nodes that have a rank with this rank's local rank.

    Returns:
        int, 0 to ``cross_size() - 1``.

    Raises:
        ValueError: hvdcompat is not initialised (call :func:`init` first).
    """
    _require_init()
    return _core.cross_rank()


def is_homogeneous():
    """Whether every node runs the same number of ranks.

    Returns:
        bool.

    Raises:
        ValueError: hvdcompat is not initialised (call :func:`init` first).
    """
    _require_init()
    return _core.is_homogeneous()


def mpi_threads_supported():
    """Whether MPI was initialised with ``MPI_THREAD_MULTIPLE``.

    Returns:
        bool.

    Raises:
        ValueError: hvdcompat is not initialised (call :func:`init` first).
    """
    _require_init()
    return _core.mpi_threads_supported()


def start_timeline(file_path, mark_cycles=False):
    """Starts writing a Chrome-trace timeline to `file_path` (rank 0 writes it).

    Requires ``HOROVOD_TIMELINE=DYNAMIC`` in the environment at :func:`init`.
    The file is a complete JSON array after every flush (about every 100 ms),
    so it can be opened while the job runs and survives an abrupt end; load it
    in chrome://tracing or https://ui.perfetto.dev.

    Args:
        file_path: where to write (truncated).
        mark_cycles: also mark every negotiation cycle.

    Returns:
        None.

    Raises:
        ValueError: hvdcompat is not initialised, or ``HOROVOD_TIMELINE`` was
            not ``DYNAMIC`` at :func:`init`; the message says which.
    """
    _require_init()
    _core.start_timeline(str(file_path), bool(mark_cycles))


def stop_timeline():
    """Stops the timeline started by :func:`start_timeline` and closes the file.

    Returns:
        None.

    Raises:
        ValueError: hvdcompat is not initialised (call :func:`init` first).
    """
    _require_init()
    _core.stop_timeline()


def engine_stats():
    """Counters of the running engine (summed over process sets).

    Returns:
        dict with ``cycles``, ``slow_path_cycles``, ``cache_hits``,
        ``cache_misses``, ``collectives`` (after fusion), ``tensors``,
        ``fused_collectives``, ``fused_tensors``, ``bytes``, ``errors``,
        ``hierarchical_allreduces`` / ``hierarchical_allgathers`` (MPI calls
        on host tensors that ran node-aware), the negotiation's own cost
        (``negotiation_ns``: time inside negotiation cycles; ``flag_bytes``:
        bytes of the cycle words combined; on set rank 0
        ``coordinator_in_bytes`` / ``coordinator_out_bytes``: request lists
        gathered and responses broadcast, ``coordinator_ns``: time deciding;
        see docs/scaling.md); and the settings in effect,
        which ``HOROVOD_AUTOTUNE=1`` changes while it searches:
        ``fusion_threshold_bytes``, ``cycle_time_ms``, ``fusion_chunk_bytes``,
        ``max_call_bytes``, ``hierarchical_allreduce``, ``autotune_active``
        (the search is running) and ``autotune_changes`` (how many times it
        changed them; kept by :func:`reset_engine_stats`).

    Raises:
        ValueError: hvdcompat is not initialised (call :func:`init` first).
    """
    _require_init()
    return _core.engine_stats()


def reset_engine_stats():
    """Zeroes the counters returned by :func:`engine_stats`.

    Returns:
        None.

    Raises:
        ValueError: hvdcompat is not initialised (call :func:`init` first).
    """
    _require_init()
    _core.reset_engine_stats()
