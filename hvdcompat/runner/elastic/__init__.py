"""The elastic side of the launchers (Horovod's ``horovod.runner.elastic``): :mod:`.driver`
is hvdcompatrun's elastic driver (discovery, the rank set, restarts, the final world),
:mod:`.run_func` launches ``hvdcompat.run``'s elastic jobs under it. The training side,
``hvd.elastic``, is :mod:`hvdcompat.elastic`."""
