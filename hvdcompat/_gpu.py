"""Whether CUDA tensors can run through hvdcompat on this machine, and how.

The core loads the CUDA runtime and NCCL with ``dlopen`` the first time they
are asked for (nothing at import). This module hands it the places PyTorch's
CUDA wheels install them (``site-packages/nvidia/{cuda_runtime,nccl}/lib``,
CUDA 13's ``site-packages/nvidia/cu13/lib``, ``torch/lib``) before that first load; ``HVDCOMPAT_CUDART_LIB`` /
``HVDCOMPAT_NCCL_LIB`` override the search, and a copy ``import torch``
already loaded is preferred over all of these.
"""

import functools
import glob
import importlib.util
import os

from hvdcompat import _session
from hvdcompat._ext import _core

__all__ = ["nccl_version", "cuda_available", "unavailable_reason", "library_info",
           "current_stream"]

def _package_dirs(name):
    """Directories of an installed (namespace) package, without importing it."""
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return []
    if spec is None:
        return []
    return list(spec.submodule_search_locations or [])


def _candidates(components, pattern):
    found = []
    for component in components:
        for d in _package_dirs("nvidia." + component):
            found += sorted(glob.glob(os.path.join(d, "lib", pattern)), reverse=True)
    for d in _package_dirs("torch"):
        found += sorted(glob.glob(os.path.join(d, "lib", pattern)), reverse=True)
    return found


@functools.cache
def _give_search_paths():
    """Once per process (the core ignores paths given after its first load)."""
    # Older torch wheels bundle copies under hashed names (libcudart-<hash>.so.11.0).
    # CUDA 12 runtime wheels install nvidia/cuda_runtime/lib/libcudart.so.12,
    # CUDA 13 ones nvidia/cu13/lib/libcudart.so.13; NCCL stays in nvidia/nccl/lib.
    _core.set_gpu_search_paths(_candidates(("cuda_runtime", "cu13"), "libcudart*.so*"),
                               _candidates(("nccl",), "libnccl*.so*"))


def library_info():
    """What the core found: paths, versions and, for a missing library, why.

    Returns:
        dict with ``cuda_loaded``, ``cuda_path``, ``cuda_runtime_version``,
        ``cuda_error``, ``nccl_loaded``, ``nccl_path``, ``nccl_version``,
        ``nccl_version_string`` and ``nccl_error``.
    """
    _give_search_paths()
    return _core.gpu_info()


def nccl_version():
    """NCCL version code the core loaded (e.g. 21805 for 2.18.5), or 0."""
    return library_info()["nccl_version"]


def _gpu_operations_mpi():
    """Whether CUDA tensors go through host memory (HOROVOD_GPU_OPERATIONS=MPI, or GLOO)."""
    if _core.is_initialized():
        return _core.config()["gpu_operations"] == "MPI"
    return _core.setting("GPU_OPERATIONS") in ("MPI", "GLOO")


def unavailable_reason():
    """Why CUDA tensors cannot run here ('' when they can).

    NCCL is needed unless ``HOROVOD_GPU_OPERATIONS=MPI`` (or ``GLOO``); the CUDA
    runtime and a visible device always are. While initialised, the answer is
    kept by the session (every op on a CUDA tensor asks).
    """
    session = _session.get()
    if session is not None and session.gpu_unavailable_reason is not None:
        return session.gpu_unavailable_reason
    reason = _reason(_gpu_operations_mpi())
    if session is not None:
        session.gpu_unavailable_reason = reason
    return reason


@functools.cache
def _reason(gpu_operations_mpi):
    """The core's answer; it does not change once the libraries were looked for."""
    _give_search_paths()
    return _core.gpu_unavailable_reason(gpu_operations_mpi)


def cuda_available():
    """Whether the core can run collectives on CUDA tensors on this machine."""
    return not unavailable_reason()


def current_stream(device):
    """The raw handle of torch's current CUDA stream on `device` (an index)."""
    import torch

    return torch.cuda.current_stream(device).cuda_stream
