"""Handles of asynchronous ops: enqueue, poll, synchronize, and op naming.

The handle table and the name counters belong to the running session
(Note [One owner of Python state] in hvdcompat/_session.py):
``session.handles`` holds every tensor the core reads or writes until the op
completes (the core keeps raw pointers).
"""

from hvdcompat import _gpu, _session
from hvdcompat._ext import _core
from hvdcompat.exceptions import HorovodInternalError

__all__ = ["poll", "synchronize"]


class _Pending:
    __slots__ = ("keep", "finish", "device")

    def __init__(self, keep, finish, device):
        self.keep = keep
        self.finish = finish
        self.device = device  # CUDA device index of the op's tensors, -1 for host


def _composite(handles, assemble):
    """One handle for several enqueued ops; synchronize returns assemble(results)."""
    session = _session.current()
    cid = session.next_composite
    session.next_composite -= 1
    session.composites[cid] = (list(handles), assemble)
    return cid


# Horovod's reduce-op ints (hvd.Sum, ...) -> the core's enum; the core's
# EnqueueArgs holds the default for ops that reduce nothing.
_REDUCE_OPS = {int(v): v for v in _core.ReduceOp.__members__.values()}
_DEFAULT_REDUCE_OP = _core.EnqueueArgs(_core.Op.barrier, "").reduce_op


def _full_name(session, prefix, name, process_set_id):
    if name is None:
        k = session.noname_counts.get(process_set_id, 0) if session is not None else 0
        return f"{prefix}.noname.{k}", True
    return f"{prefix}.{name}", False


def _enqueue(op, prefix, name, process_set_id, inputs, outputs, finish, keep, *,
             reduce_op=None, root=-1, prescale=1.0, postscale=1.0, splits=()):
    """Hands one op to the core; returns its handle.

    `inputs`/`outputs` are `_core.Buffer`s; `keep` holds the tensors they
    point into; `finish(outs, received_splits, join_rank)` builds the result.
    The core checks the engine's rules (initialised, process set and
    membership, root, splits, a name still in flight) and raises ValueError.
    """
    session = _session.get()  # None before init: the core raises its error for that
    if process_set_id is None:
        process_set_id = -1  # never registered, or removed: the core says so
    full, auto = _full_name(session, prefix, name, process_set_id)
    reduce_op = _DEFAULT_REDUCE_OP if reduce_op is None else _REDUCE_OPS[reduce_op]
    device = inputs[0].device if inputs else -1
    # Positional: pybind11 matches keywords by name on every call, which cost
    # about 1.8 us of the op's few (EnqueueArgs' fields, in order: op, name,
    # auto_named, process_set, reduce_op, root, prescale, postscale, inputs,
    # outputs, splits, stream).
    handle = _core.enqueue(_core.EnqueueArgs(
        _core.OPS[op], full, auto, process_set_id, reduce_op, root, prescale, postscale, inputs,
        outputs, splits, _gpu.current_stream(device) if device >= 0 else None))
    if auto:
        session.noname_counts[process_set_id] = session.noname_counts.get(process_set_id, 0) + 1
    session.handles[handle] = _Pending(keep, finish, device)
    return handle


def _raise(code, message):
    if code == _core.Status.invalid_argument:
        raise ValueError(message)
    raise HorovodInternalError(message)


def poll(handle):
    """Whether the op behind `handle` has finished (never blocks).

    A True answer frees the op's name for reuse, as :func:`synchronize` does.

    Args:
        handle: what an ``*_async`` function returned.

    Returns:
        bool: True once the op has finished (successfully or not).

    Raises:
        ValueError: the handle is unknown or was already synchronized.
    """
    session = _session.get()
    if session is not None and handle in session.composites:
        return all(poll(h) for h in session.composites[handle][0])
    pending = session.handles.get(handle) if session is not None else None
    if pending is None:
        raise ValueError(f"Handle {handle} was not created or has been cleared.")
    return _core.poll(handle)  # True also frees the op's name in the core


def synchronize(handle):
    """Waits for the op behind `handle` and returns its output.

    For CUDA tensors the host waits until the device work is done (unless
    ``HOROVOD_ENABLE_ASYNC_COMPLETION=1``), and torch's current stream is
    ordered after it either way, so the output can be used at once.

    Args:
        handle: what an ``*_async`` function returned.

    Returns:
        The op's output (a tensor, a tuple of tensors for grouped ops,
        ``(output, received_splits)`` for alltoall, the last rank to join for
        join); None for handles that are unknown (already synchronized, or from
        before the last init/shutdown).

    Raises:
        HorovodInternalError: the op failed (ranks disagreed on it, a rank was
            lost or shut down, or communication failed); the message says why.
        ValueError: the op was invalid on this rank.
    """
    session = _session.get()
    if session is None:
        return None
    if handle in session.composites:
        handles, assemble = session.composites.pop(handle)
        results, error = [], None
        for h in handles:  # wait for every part, even after a failure
            try:
                results.append(synchronize(h))
            except (HorovodInternalError, ValueError) as e:
                error = error or e
        if error is not None:
            raise error
        return assemble(results)
    pending = session.handles.get(handle)
    if pending is None:
        return None
    # A CUDA op's outputs are ordered before later work on the caller's
    # current stream (and core-allocated outputs are freed in its order).
    stream = _gpu.current_stream(pending.device) if pending.device >= 0 else None
    try:
        result = _core.wait(handle, stream)
    finally:
        session.handles.pop(handle, None)
    if result.status != _core.Status.ok:
        _raise(result.status, result.message)
    return pending.finish(result.outputs, result.received_splits, result.join_last_rank)
