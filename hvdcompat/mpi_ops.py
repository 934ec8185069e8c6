"""Horovod's ``horovod.torch.mpi_ops`` module layout, for code that imports from it.

Everything here is defined elsewhere in hvdcompat; this module only gathers it.
"""

from hvdcompat import _session
from hvdcompat.basics import *  # noqa: F401,F403
from hvdcompat.basics import __all__ as _basics_all
from hvdcompat.basics import is_homogeneous  # noqa: F401
from hvdcompat.exceptions import HorovodInternalError  # noqa: F401
from hvdcompat.ops import *  # noqa: F401,F403
from hvdcompat.ops import __all__ as _ops_all
from hvdcompat.process_sets import (  # noqa: F401
    ProcessSet, add_process_set, global_process_set, remove_process_set,
)

__all__ = (list(_basics_all) + list(_ops_all)
           + ["HorovodInternalError", "ProcessSet", "add_process_set", "global_process_set",
              "remove_process_set"])


def __getattr__(name):
    # Horovod's module-level handle table: here the running session's
    # (Note [One owner of Python state] in hvdcompat/_session.py).
    if name == "_handle_map":
        session = _session.get()
        return session.handles if session is not None else {}
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
