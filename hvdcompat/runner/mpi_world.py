"""Where this process sits in its MPI job, as the MPI launcher told it.

One list of the launchers' variables for everything that needs the rank (or
the size, local rank and local size) before or without MPI: the rank
supervisor, ``hvd.run``'s ranks, the elastic marks at exit, the DDP
bootstrap. Open MPI's mpirun sets ``OMPI_COMM_WORLD_*``, any PMIx launcher
(prterun, srun with PMIx) ``PMIX_RANK``, MPICH's Hydra (and Intel MPI,
MVAPICH with Hydra) ``PMI_RANK``/``PMI_SIZE`` and ``MPI_LOCALRANKID``/
``MPI_LOCALNRANKS``.

This module imports nothing but the standard library: the rank supervisor
runs it as a plain module beside itself, without importing the package
(which would import torch in every supervisor).
"""

import os

__all__ = ["RANK", "SIZE", "LOCAL_RANK", "LOCAL_SIZE", "LAUNCH_VARIABLES", "read",
           "world_rank", "launch_rank", "launched_by_mpi"]

RANK = ("OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK")
SIZE = ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE")
LOCAL_RANK = ("OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID")
LOCAL_SIZE = ("OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS")

# Any of these in the environment: an MPI launcher started this process
# (MVAPICH's mpirun_rsh sets MV2_COMM_WORLD_SIZE rather than PMI_SIZE).
LAUNCH_VARIABLES = RANK + SIZE + ("MV2_COMM_WORLD_SIZE",)


def read(names, environ=None):
    """The first of `names` set to a whole number in `environ` (default os.environ).

    Args:
        names: variable names, in order of preference (e.g. :data:`RANK`).
        environ: the environment to read (default ``os.environ``).

    Returns:
        int, or None when none of them holds a whole number.
    """
    environ = os.environ if environ is None else environ
    for name in names:
        value = environ.get(name, "").strip()
        if value.isdigit():
            return int(value)
    return None


def world_rank(environ=None):
    """This process's rank in the MPI world the launcher started, or None."""
    return read(RANK, environ)


def launch_rank(environ=None):
    """This process's number in its launch, or None.

    Its MPI world rank; under ``hvdcompatrun --gloo``, which starts the ranks
    itself, ``HOROVOD_RANK`` (a worker started with the job) or
    ``HVDCOMPAT_ELASTIC_JOIN`` (a worker added to an elastic job, its number).
    The rank supervisor and the elastic marks at exit key their files by it.
    """
    return read(RANK + ("HOROVOD_RANK", "HVDCOMPAT_ELASTIC_JOIN"), environ)


def launched_by_mpi(environ=None):
    """Whether an MPI launcher (mpirun, hvdcompatrun, mpiexec, srun with PMIx...) started this process."""
    environ = os.environ if environ is None else environ
    return any(name in environ for name in LAUNCH_VARIABLES)
