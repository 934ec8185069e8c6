"""Handles of asynchronous ops: enqueue, poll, synchronize, and op naming."""

from hvdcompat.basics import _NOT_INITIALIZED, _core, _on_init, _on_shutdown
from hvdcompat.exceptions import HorovodInternalError

__all__ = ["poll", "synchronize"]

_STATUS = _core.STATUS

# handle -> _Pending. Holds every tensor the core reads or writes until the op
# completes (the core keeps raw pointers).
_handle_map = {}
# process set id -> number of unnamed ops enqueued on it (names them).
_noname_counts = {}


class _Pending:
    __slots__ = ("keep", "finish")

    def __init__(self, keep, finish):
        self.keep = keep
        self.finish = finish


def _reset():
    _handle_map.clear()
    _noname_counts.clear()


_on_init.append(_reset)
_on_shutdown.append(_reset)


def _full_name(prefix, name, process_set_id):
    if name is None:
        k = _noname_counts.get(process_set_id, 0)
        return f"{prefix}.noname.{k}", True
    return f"{prefix}.{name}", False


def _enqueue(op, prefix, name, process_set_id, inputs, outputs, finish, keep, *,
             reduce_op=1, root=-1, prescale=1.0, postscale=1.0, splits=()):
    """Hands one op to the core; returns its handle.

    `inputs`/`outputs` are core buffer tuples; `keep` holds the tensors they
    point into; `finish(outs, received_splits, join_rank)` builds the result.
    """
    if not _core.is_initialized():
        raise ValueError(_NOT_INITIALIZED)
    if process_set_id is None:
        # A ProcessSet never registered, or removed (remove_process_set clears its id).
        raise ValueError(f"{op.capitalize()} '{prefix if name is None else name}': Process set "
                         "provided does not exist, or has not been registered. Register it "
                         "with hvd.add_process_set or hvd.init(process_sets=...).")
    full, auto = _full_name(prefix, name, process_set_id)
    handle = _core.enqueue(_core.OPS[op], full, auto, process_set_id, reduce_op, root,
                           float(prescale), float(postscale), inputs, outputs, list(splits))
    if auto:
        _noname_counts[process_set_id] = _noname_counts.get(process_set_id, 0) + 1
    _handle_map[handle] = _Pending(keep, finish)
    return handle


def _raise(code, message):
    if code == _STATUS["invalid_argument"]:
        raise ValueError(message)
    raise HorovodInternalError(message)


def poll(handle):
    """Whether the op behind `handle` has finished (never blocks).

    Raises:
        ValueError: the handle is unknown or was already synchronized.
    """
    if handle not in _handle_map:
        raise ValueError(f"Handle {handle} was not created or has been cleared.")
    return _core.poll(handle)


def synchronize(handle):
    """Waits for the op behind `handle` and returns its output.

    Returns None for handles that are unknown (already synchronized, or from
    before the last init/shutdown).

    Raises:
        HorovodInternalError: the op failed (ranks disagreed on it, a rank was
            lost or shut down, or communication failed); the message says why.
        ValueError: the op was invalid on this rank.
    """
    pending = _handle_map.get(handle)
    if pending is None:
        return None
    try:
        code, message, outs, splits, join_rank = _core.wait(handle)
    finally:
        _handle_map.pop(handle, None)
    if code != _STATUS["ok"]:
        _raise(code, message)
    return pending.finish(outs, splits, join_rank)
