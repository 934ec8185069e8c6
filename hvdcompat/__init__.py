"""hvdcompat: Horovod's PyTorch API on a native engine.

    import hvdcompat as hvd      # was: import horovod.torch as hvd
"""

from hvdcompat.basics import *  # noqa: F401,F403
from hvdcompat.basics import __all__ as _basics_all
from hvdcompat.exceptions import HorovodInternalError, HostsUpdatedInterrupt
from hvdcompat.ops import *  # noqa: F401,F403
from hvdcompat.ops import __all__ as _ops_all
from hvdcompat.process_sets import (
    ProcessSet, add_process_set, global_process_set, remove_process_set,
)
from hvdcompat.functions import *  # noqa: F401,F403
from hvdcompat.functions import __all__ as _functions_all
from hvdcompat.optimizer import DistributedOptimizer
from hvdcompat.sync_batch_norm import SyncBatchNorm
from hvdcompat.runner import run  # Horovod's horovod.run (horovod.runner.run)
from hvdcompat import mpi_ops, compression  # noqa: F401  (Horovod's submodule layout)
from hvdcompat import functions, optimizer, sync_batch_norm  # noqa: F401
from hvdcompat import elastic  # noqa: F401  (hvd.elastic, as horovod.torch.elastic)

from hvdcompat._version import __version__  # noqa: F401

__all__ = (list(_basics_all) + list(_ops_all) + list(_functions_all)
           + ["DistributedOptimizer", "SyncBatchNorm", "HorovodInternalError",
              "HostsUpdatedInterrupt", "ProcessSet", "add_process_set", "global_process_set",
              "remove_process_set", "run"])
