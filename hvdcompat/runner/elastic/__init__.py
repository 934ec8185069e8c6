"""The elastic side of the launchers (Horovod's ``horovod.runner.elastic``): :mod:`.flags`
(hvdcompatrun's elastic flags), :mod:`.discovery` (the hosts), :mod:`.driver` (what both
launches' drivers share: discovery, blacklist, notices, the final world), :mod:`.mpi_driver`
(beside mpirun; growth by a restart), :mod:`.gloo_driver` (``--gloo``: workers that join in
place); :mod:`.run_func` launches ``hvdcompat.run``'s elastic jobs under the MPI driver. The training side,
``hvd.elastic``, is :mod:`hvdcompat.elastic`."""
