"""Elastic training: ``hvd.elastic`` (Horovod's ``horovod.torch.elastic`` API).

A lost rank becomes :class:`HorovodInternalError`; :func:`run` restores the
last commit and continues with the survivors in place (on MPI through Open
MPI's ULFM, under ``hvdcompatrun --fault-tolerant`` or any elastic flag; on
Gloo through the launcher's store). Hosts that discovery adds join by a
restart from the last commit on MPI, in place on Gloo.
"""

from hvdcompat.elastic.common import HostUpdateResult, ObjectState, State
from hvdcompat.elastic.loop import last_reset_seconds, last_restart, reset, run, run_fn
from hvdcompat.elastic.sampler import ElasticSampler
from hvdcompat.elastic.state import (
    ModelStateHandler, OptimizerStateHandler, SamplerStateHandler, StateHandler, TorchState,
    get_handler_registry, set_handler_registry,
)
from hvdcompat.exceptions import HorovodInternalError, HostsUpdatedInterrupt

__all__ = ["run", "run_fn", "reset", "last_reset_seconds", "last_restart", "State", "ObjectState", "TorchState", "ElasticSampler",
           "StateHandler", "ModelStateHandler", "OptimizerStateHandler", "SamplerStateHandler",
           "get_handler_registry", "set_handler_registry", "HostUpdateResult",
           "HorovodInternalError", "HostsUpdatedInterrupt"]
