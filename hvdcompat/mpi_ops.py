"""Horovod's ``horovod.torch.mpi_ops`` module layout, for code that imports from it.

Everything here is defined elsewhere in hvdcompat; this module only gathers it.
"""

from hvdcompat.basics import *  # noqa: F401,F403
from hvdcompat.basics import __all__ as _basics_all
from hvdcompat.basics import is_homogeneous  # noqa: F401
from hvdcompat.exceptions import HorovodInternalError  # noqa: F401
from hvdcompat.ops import *  # noqa: F401,F403
from hvdcompat.ops import __all__ as _ops_all
from hvdcompat.ops.handles import _handle_map  # noqa: F401
from hvdcompat.process_sets import (  # noqa: F401
    ProcessSet, add_process_set, global_process_set, remove_process_set,
)

__all__ = (list(_basics_all) + list(_ops_all)
           + ["HorovodInternalError", "ProcessSet", "add_process_set", "global_process_set",
              "remove_process_set"])
