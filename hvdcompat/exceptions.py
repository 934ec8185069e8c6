"""Exceptions raised by hvdcompat (same names and bases as Horovod's)."""

__all__ = ["HorovodInternalError", "HostsUpdatedInterrupt"]


class HorovodInternalError(RuntimeError):
    """A collective failed because of the job, not the caller.

    Raised when ranks disagree about an operation (dtype, shape, root, ...),
    when a rank was lost or shut down, or when the communication library
    reports an error. The message names the operation, the tensor and the
    ranks involved. Elastic training catches it to restore state.
    """


class HostsUpdatedInterrupt(RuntimeError):
    """The set of hosts changed; elastic training resynchronises.

    Args:
        skip_sync: whether the state sync after the reset may be skipped.
    """

    def __init__(self, skip_sync=False):
        super().__init__("hosts updated")
        self.skip_sync = skip_sync
