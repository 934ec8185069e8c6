"""What this build and machine can do: Horovod's ``*_built`` and ``*_enabled`` queries.

None of them needs a running engine and none raises: before :func:`hvd.init
<hvdcompat.init>` the controller queries answer for the launch this process is
in (Note [Controller choice] in hvdcompat/rendezvous.py).
"""

import os

from hvdcompat import _gpu
from hvdcompat import gloo_init as _gloo
from hvdcompat import rendezvous as _rdzv
from hvdcompat._ext import _core

__all__ = ["mpi_enabled", "mpi_built", "gloo_enabled", "gloo_built", "nccl_built", "cuda_built",
           "ddl_built", "ccl_built", "rocm_built", "sycl_built", "build_info"]


def _runs_on(controller, probe_name, core_without_probe):
    # The running core's answer (`core_without_probe` for a core that predates
    # the probe), else the choice init would make; a bad setting answers False.
    if _core.is_initialized():
        probe = getattr(_core, probe_name, None)
        return bool(probe()) if probe is not None else core_without_probe
    try:
        return _rdzv.controller_choice(os.environ) == controller
    except ValueError:
        return False


def mpi_enabled():
    """Whether MPI is the controller: False while a job runs on the Gloo controller.

    Before :func:`init`, whether ``init`` would start on MPI here (Note
    [Controller choice] in hvdcompat/rendezvous.py).

    Returns:
        bool.

    Never raises: an unusable controller setting answers False.
    """
    return _runs_on("mpi", "mpi_enabled", True)


def mpi_built():
    """Whether hvdcompat was built against MPI.

    Returns:
        bool: always True.

    Never raises.
    """
    return True


def gloo_enabled():
    """Whether this job runs on the Gloo controller (before init: whether it would).

    Returns:
        bool.

    Never raises: an unusable controller setting answers False.
    """
    return gloo_built() and _runs_on("gloo", "gloo_enabled", False)


def gloo_built():
    """Whether this build has the Gloo controller (for launches without MPI).

    Returns:
        bool.

    Never raises.
    """
    return _gloo.gloo_built(_core)


def nccl_built():
    """The version code of the NCCL the core loaded (e.g. 21805 for 2.18.5).

    hvdcompat has no build-time GPU switch: NCCL is loaded at run time (from
    PyTorch's CUDA wheels, or ``HVDCOMPAT_NCCL_LIB``), so this answers for
    this machine.

    Returns:
        int, 0 when no NCCL loads here.

    Never raises.
    """
    return _gpu.nccl_version()


def cuda_built():
    """Whether CUDA tensors can run through hvdcompat on this machine.

    True when the CUDA runtime loads, a device is visible and NCCL loads (or,
    with ``HOROVOD_GPU_OPERATIONS=MPI`` or ``GLOO``, without NCCL).

    Returns:
        bool.

    Never raises.
    """
    return _gpu.cuda_available()


def ddl_built():
    """Whether hvdcompat was built with IBM DDL.

    Returns:
        bool: always False.

    Never raises.
    """
    return False


def ccl_built():
    """Whether hvdcompat was built with oneCCL.

    Returns:
        bool: always False.

    Never raises.
    """
    return False


def rocm_built():
    """Whether hvdcompat was built for ROCm.

    Returns:
        bool: always False.

    Never raises.
    """
    return False


def sycl_built():
    """Whether hvdcompat was built for SYCL.

    Returns:
        bool: always False.

    Never raises.
    """
    return False


def build_info():
    """What this build was compiled against.

    Returns:
        dict describing the MPI library the core linked, the compiler wrapper and
        where that MPI came from (what ``hvdcompatrun --check-build`` prints).

    Never raises.
    """
    return _core.build_info()
