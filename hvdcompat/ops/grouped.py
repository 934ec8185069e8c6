"""Grouped collectives: a list of tensors negotiated and fused as one unit.

Every rank must pass lists of the same length, dtype and (per op) shapes.
"""

import torch

from hvdcompat.basics import Average
from hvdcompat.ops import _tensor
from hvdcompat.ops.collectives import (
    _allreduce_async, _check_reduce_op, _check_reducescatter, _describe_all,
    _reducescatter_shape, _set_rank_size, handle_average_backwards_compatibility,
)
from hvdcompat.ops.handles import _composite, _enqueue, synchronize
from hvdcompat.process_sets import global_process_set

__all__ = [
    "grouped_allreduce_async", "grouped_allreduce_async_", "grouped_allreduce_",
    "grouped_allgather_async", "grouped_reducescatter_async",
]


def _as_list(tensors, op):
    tensors = list(tensors)
    if not tensors:
        raise ValueError(f"{op}: the list of tensors is empty; pass at least one tensor")
    return tensors


def _per_dtype(tensors, name, launch):
    """Runs `launch(tensors, name)` once per dtype when the list mixes dtypes.

    The engine fuses one dtype per collective, so a mixed group becomes one
    grouped op per dtype (in order of first appearance, named
    ``<name>.part<k>``) behind a single handle whose result keeps the
    original order.
    """
    parts = {}
    for i, t in enumerate(tensors):
        parts.setdefault(getattr(t, "dtype", None), []).append(i)
    if len(parts) == 1:
        return launch(tensors, name)
    indices = list(parts.values())
    handles = [launch([tensors[i] for i in idx], None if name is None else f"{name}.part{k}")
               for k, idx in enumerate(indices)]

    def assemble(results):
        out = [None] * len(tensors)
        for idx, res in zip(indices, results):
            for i, r in zip(idx, res):
                out[i] = r
        return tuple(out)

    return _composite(handles, assemble)


def grouped_allreduce_async(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                            postscale_factor=1.0, process_set=global_process_set):
    """Starts one fused allreduce of every tensor in `tensors`; inputs are not modified.

    Args:
        tensors: a list of tensors; they are negotiated and fused as one unit.
        average: deprecated; use ``op``.
        name: a name unique among this rank's ops in flight; unnamed ops are
            named from a counter, so ranks must then call them in the same order.
        op: ``hvd.Average`` (default), ``hvd.Sum``, ``hvd.Adasum``, ``hvd.Min``,
            ``hvd.Max`` or ``hvd.Product``.
        prescale_factor: multiplies each rank's input before the reduction.
        postscale_factor: multiplies the result.
        process_set: the ranks taking part (default: every rank).

    Returns:
        A handle for :func:`poll` and :func:`synchronize`, which returns
        a tuple of new tensors with the reduced values.

    Raises:
        ValueError: invalid input on this rank (not a member of the process
            set, a name already in flight, ...); nothing was started.
        TypeError: a dtype the op does not support.
        HorovodInternalError: from :func:`synchronize`, when the ranks disagreed
            or the job failed.
    """
    op = handle_average_backwards_compatibility(op, average)
    tensors = _as_list(tensors, "grouped_allreduce")
    # Before any per-dtype part is launched, so a bad tensor leaves none in flight.
    _check_reduce_op(op, "grouped_allreduce", name, tensors, process_set)

    def launch(ts, nm):
        outputs = [_tensor.empty_like_contiguous(t, op="grouped_allreduce", name=nm) for t in ts]
        return _allreduce_async(ts, outputs, nm, op, prescale_factor, postscale_factor,
                                process_set, "grouped_allreduce",
                                lambda o, s, j: tuple(outputs))

    return _per_dtype(tensors, name, launch)


def grouped_allreduce_async_(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                             postscale_factor=1.0, process_set=global_process_set):
    """In-place :func:`grouped_allreduce_async`: results are written into the inputs.

    Args:
        tensors: a list of tensors; they are negotiated and fused as one unit.
        average: deprecated; use ``op``.
        name: a name unique among this rank's ops in flight; unnamed ops are
            named from a counter, so ranks must then call them in the same order.
        op: ``hvd.Average`` (default), ``hvd.Sum``, ``hvd.Adasum``, ``hvd.Min``,
            ``hvd.Max`` or ``hvd.Product``.
        prescale_factor: multiplies each rank's input before the reduction.
        postscale_factor: multiplies the result.
        process_set: the ranks taking part (default: every rank).

    Returns:
        A handle for :func:`poll` and :func:`synchronize`, which returns
        the input tensors as a tuple.

    Raises:
        ValueError: invalid input on this rank (not a member of the process
            set, a name already in flight, ...); nothing was started.
        TypeError: a dtype the op does not support.
        HorovodInternalError: from :func:`synchronize`, when the ranks disagreed
            or the job failed.
    """
    op = handle_average_backwards_compatibility(op, average)
    tensors = _as_list(tensors, "grouped_allreduce")
    _check_reduce_op(op, "grouped_allreduce", name, tensors, process_set)

    def launch(ts, nm):
        return _allreduce_async(ts, ts, nm, op, prescale_factor, postscale_factor, process_set,
                                "grouped_allreduce", lambda o, s, j: tuple(ts))

    return _per_dtype(tensors, name, launch)


def grouped_allreduce_(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                       postscale_factor=1.0, process_set=global_process_set):
    """In-place grouped allreduce.

    Args:
        tensors: a list of tensors; they are negotiated and fused as one unit.
        average: deprecated; use ``op``.
        name: a name unique among this rank's ops in flight; unnamed ops are
            named from a counter, so ranks must then call them in the same order.
        op: ``hvd.Average`` (default), ``hvd.Sum``, ``hvd.Adasum``, ``hvd.Min``,
            ``hvd.Max`` or ``hvd.Product``.
        prescale_factor: multiplies each rank's input before the reduction.
        postscale_factor: multiplies the result.
        process_set: the ranks taking part (default: every rank).

    Returns:
        The input tensors, holding the results, as a tuple.

    Raises:
        HorovodInternalError: the ranks disagreed (dtype, shape, op, ...) or
            the job failed; the message names the tensor and the ranks.
        ValueError: invalid input on this rank (not a member of the process
            set, a name already in flight, ...); nothing was started.
        TypeError: a dtype the op does not support.
    """
    return synchronize(grouped_allreduce_async_(tensors, average, name, op, prescale_factor,
                                                postscale_factor, process_set))


def grouped_allgather_async(tensors, name=None, process_set=global_process_set):
    """Starts one fused allgather of every tensor of the list.

    Args:
        tensors: a list of tensors; they are negotiated and fused as one unit.
        name: a name unique among this rank's ops in flight; unnamed ops are
            named from a counter, so ranks must then call them in the same order.
        process_set: the ranks taking part (default: every rank).

    Returns:
        A handle for :func:`poll` and :func:`synchronize`, which returns
        a tuple of new tensors, each every rank's blocks in rank order.

    Raises:
        ValueError: invalid input on this rank (not a member of the process
            set, a name already in flight, ...); nothing was started.
        TypeError: a dtype the op does not support.
        HorovodInternalError: from :func:`synchronize`, when the ranks disagreed
            or the job failed.
    """
    tensors = _as_list(tensors, "grouped_allgather")

    def launch(ts, nm):
        descs = _describe_all(ts, "grouped_allgather", nm)
        return _enqueue("allgather", "grouped_allgather", nm, process_set.process_set_id, descs,
                        [], lambda outs, s, j: tuple(torch.from_dlpack(o) for o in outs),
                        tuple(ts))

    return _per_dtype(tensors, name, launch)


def grouped_reducescatter_async(tensors, name=None, op=Average, process_set=global_process_set,
                                prescale_factor=1.0, postscale_factor=1.0):
    """Starts one fused reducescatter of every tensor of the list.

    Rank r of the set receives rows of dimension 0: with
    ``q, m = divmod(dim0, size)``, ranks below m get q + 1 rows, the others q,
    in rank order. Shapes must be identical on every rank.

    Args:
        tensors: a list of tensors; they are negotiated and fused as one unit.
        name: a name unique among this rank's ops in flight; unnamed ops are
            named from a counter, so ranks must then call them in the same order.
        op: ``hvd.Average`` (default), ``hvd.Sum``, ``hvd.Min``, ``hvd.Max`` or
            ``hvd.Product``.
        process_set: the ranks taking part (default: every rank).
        prescale_factor: multiplies each rank's input before the reduction.
        postscale_factor: multiplies the result.

    Returns:
        A handle for :func:`poll` and :func:`synchronize`, which returns
        a tuple of new tensors, this rank's rows of each.

    Raises:
        ValueError: invalid input on this rank (not a member of the process
            set, a name already in flight, ...); nothing was started.
        TypeError: a dtype the op does not support.
        HorovodInternalError: from :func:`synchronize`, when the ranks disagreed
            or the job failed.
    """
    tensors = _as_list(tensors, "grouped_reducescatter")
    _check_reducescatter(tensors, op, name)
    _check_reduce_op(op, "grouped_reducescatter", name, tensors, process_set)
    set_rank, set_size = _set_rank_size(process_set, "grouped_reducescatter", name)

    def launch(ts, nm):
        outputs = [_tensor.empty_like_contiguous(t, _reducescatter_shape(t, set_rank, set_size))
                   for t in ts]
        ins = _describe_all(ts, "grouped_reducescatter", nm)
        outs = _describe_all(outputs, "grouped_reducescatter", nm)
        return _enqueue("reducescatter", "grouped_reducescatter", nm,
                        process_set.process_set_id, ins, outs, lambda o, s, j: tuple(outputs),
                        (tuple(ts), tuple(outputs)), reduce_op=op, prescale=prescale_factor,
                        postscale=postscale_factor)

    return _per_dtype(tensors, name, launch)
