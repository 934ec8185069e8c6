"""Horovod's ``horovod.torch.compression`` module layout."""

from hvdcompat.ops.compression import *  # noqa: F401,F403
from hvdcompat.ops.compression import __all__  # noqa: F401
