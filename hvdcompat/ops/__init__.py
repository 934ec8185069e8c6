"""Collective operations on torch tensors, one module per concern."""

from hvdcompat.ops.autograd import *  # noqa: F401,F403
from hvdcompat.ops.autograd import __all__ as _autograd_all
from hvdcompat.ops.collectives import *  # noqa: F401,F403
from hvdcompat.ops.collectives import __all__ as _collectives_all
from hvdcompat.ops.compression import *  # noqa: F401,F403
from hvdcompat.ops.compression import __all__ as _compression_all
from hvdcompat.ops.grouped import *  # noqa: F401,F403
from hvdcompat.ops.grouped import __all__ as _grouped_all
from hvdcompat.ops.handles import *  # noqa: F401,F403
from hvdcompat.ops.handles import __all__ as _handles_all
from hvdcompat.ops.sparse import *  # noqa: F401,F403
from hvdcompat.ops.sparse import __all__ as _sparse_all

__all__ = (list(_autograd_all) + list(_collectives_all) + list(_compression_all)
           + list(_grouped_all) + list(_handles_all) + list(_sparse_all))
