"""Asynchronous and in-place collectives (the non-differentiable layer).

Every rank of the process set must call each collective with the same name
(or, unnamed, in the same order), a matching dtype and a compatible shape;
an op completes when every member has submitted it. ``root_rank`` is always a
global rank. The differentiable functional forms live in ``ops.autograd``.
"""

import operator
import warnings

import torch

from hvdcompat import _gpu, _session
from hvdcompat.basics import Adasum, Average, Max, Min, Product, Sum, _core
from hvdcompat.ops import _tensor
from hvdcompat.ops.handles import _enqueue, synchronize
from hvdcompat.process_sets import global_process_set

__all__ = [
    "handle_average_backwards_compatibility",
    "allreduce_async", "allreduce_async_", "allreduce_",
    "allgather_async", "broadcast_async", "broadcast_async_", "broadcast_",
    "alltoall_async", "reducescatter_async", "join", "barrier",
]

# The core's sizes are int64 (splits arrive as int64_t).
_INT64_MIN, _INT64_MAX = -2**63, 2**63 - 1

_VALID_OPS = (Average, Sum, Adasum, Min, Max, Product)


def handle_average_backwards_compatibility(op, average):
    """Resolves the deprecated ``average=`` argument into a reduce op.

    Args:
        op: the op asked for, or None.
        average: Horovod's deprecated flag: True means ``hvd.Average``, False
            ``hvd.Sum``; None when not given.

    Returns:
        The reduce op: ``op``, else the one ``average`` names, else ``hvd.Average``.

    Raises:
        ValueError: both ``op`` and ``average`` were given.
    """
    if op is not None:
        if average is not None:
            raise ValueError("The op parameter supersedes average. Please provide only one of "
                             "them.")
        return op
    if average is not None:
        warnings.warn("Parameter `average` has been replaced with `op` and will be removed in "
                      "v1.0", DeprecationWarning)
        return Average if average else Sum
    return Average


def _set_rank_size(process_set, op, name=None):
    """(this rank's index, size) in `process_set`.

    The core raises ValueError (the same as enqueue's) when the set is not
    registered or this rank is not a member.
    """
    pid = process_set.process_set_id
    return tuple(_core.process_set_member(-1 if pid is None else pid, op, name or ""))


def _check_reduce_op(op, op_name, name, tensors, process_set=None):
    if op not in _VALID_OPS:
        raise ValueError(f"{op_name} '{name}': unknown reduce op {op!r}; use hvd.Average, hvd.Sum, "
                         "hvd.Adasum, hvd.Min, hvd.Max or hvd.Product")
    # What the op may reduce (Adasum's process set and dtypes, bool with Min
    # or Max only) is the core's rule (Runtime::CheckReduction), which
    # enqueue runs. A group of several dtypes runs as one op per dtype: the
    # core checks every part first, so a refused part leaves none in flight.
    for t in tensors:
        _tensor.require_tensor(t, op_name, name)
    dtypes = {t.dtype: t for t in tensors}
    if len(dtypes) > 1:
        pid = -1 if process_set is None or process_set.process_set_id is None \
            else process_set.process_set_id
        label = op_name if name is None else f"{op_name}.{name}"
        for t in dtypes.values():
            _core.check_reduction(op_name, label, pid, _core.ReduceOp(op),
                                  _tensor.dtype_code(t, op_name, name))


def _describe_all(tensors, op_name, name):
    descs = []
    for t in tensors:
        code, dev = _tensor.check_tensor(t, op_name, name)
        descs.append(_tensor.describe(t, code, dev))
    return descs


def _allreduce_async(tensors, outputs, name, op, prescale_factor, postscale_factor, process_set,
                     prefix, finish):
    op_name = prefix
    _check_reduce_op(op, op_name, name, tensors)
    ins = _describe_all(tensors, op_name, name)
    outs = ins if outputs is tensors else _describe_all(outputs, op_name, name)
    return _enqueue("allreduce", prefix, name, process_set.process_set_id, ins, outs, finish,
                    (tuple(tensors), tuple(outputs)), reduce_op=op, prescale=prescale_factor,
                    postscale=postscale_factor)


def allreduce_async(tensor, average=None, name=None, op=None, prescale_factor=1.0,
                    postscale_factor=1.0, process_set=global_process_set):
    """Starts reducing `tensor` across the process set; the input is not modified.

    Every rank must call it with the same name (or, unnamed, in the same
    order), dtype and shape.

    Args:
        tensor: a contiguous CPU (or CUDA) tensor.
        average: deprecated; use ``op``.
        name: a name unique among this rank's in-flight ops. A name is in
            flight until its handle has been synchronized (or :func:`poll`
            returned True), even if the op itself already finished.
        op: hvd.Average (default), hvd.Sum, hvd.Adasum, hvd.Min, hvd.Max or
            hvd.Product. hvd.Adasum (floating dtypes, global process set only)
            combines ranks pairwise in a binary tree of rank order (see
            docs/adasum.md).
        prescale_factor: multiplies each rank's input before the reduction.
        postscale_factor: multiplies the result.
        process_set: ranks to reduce over (default: all).

    Returns:
        A handle for :func:`poll` / :func:`synchronize` (which returns the result).

    Raises:
        ValueError: bad input (non-contiguous, duplicate in-flight name, not a
            member of the process set, ...); nothing is enqueued.
        TypeError: unsupported dtype (for hvd.Adasum: anything but float16,
            bfloat16, float32 and float64).
    """
    op = handle_average_backwards_compatibility(op, average)
    output = _tensor.empty_like_contiguous(tensor, op="allreduce", name=name)
    return _allreduce_async([tensor], [output], name, op, prescale_factor, postscale_factor,
                            process_set, "allreduce", lambda outs, s, j: output)


def allreduce_async_(tensor, average=None, name=None, op=None, prescale_factor=1.0,
                     postscale_factor=1.0, process_set=global_process_set):
    """In-place :func:`allreduce_async`: the result is written into `tensor`.

    Args:
        tensor: the tensor (contiguous, on the CPU or a CUDA device).
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
        `tensor` holding the result.

    Raises:
        ValueError: invalid input on this rank (not a member of the process
            set, a name already in flight, ...); nothing was started.
        TypeError: a dtype the op does not support.
        HorovodInternalError: from :func:`synchronize`, when the ranks disagreed
            or the job failed.
    """
    op = handle_average_backwards_compatibility(op, average)
    tensors = [tensor]
    return _allreduce_async(tensors, tensors, name, op, prescale_factor, postscale_factor,
                            process_set, "allreduce", lambda outs, s, j: tensor)


def allreduce_(tensor, average=None, name=None, op=None, prescale_factor=1.0,
               postscale_factor=1.0, process_set=global_process_set):
    """In-place allreduce.

    Args:
        tensor: the tensor (contiguous, on the CPU or a CUDA device).
        average: deprecated; use ``op``.
        name: a name unique among this rank's ops in flight; unnamed ops are
            named from a counter, so ranks must then call them in the same order.
        op: ``hvd.Average`` (default), ``hvd.Sum``, ``hvd.Adasum``, ``hvd.Min``,
            ``hvd.Max`` or ``hvd.Product``.
        prescale_factor: multiplies each rank's input before the reduction.
        postscale_factor: multiplies the result.
        process_set: the ranks taking part (default: every rank).

    Returns:
        `tensor`, holding the result.

    Raises:
        HorovodInternalError: the ranks disagreed (dtype, shape, op, ...) or
            the job failed; the message names the tensor and the ranks.
        ValueError: invalid input on this rank (not a member of the process
            set, a name already in flight, ...); nothing was started.
        TypeError: a dtype the op does not support.
    """
    return synchronize(allreduce_async_(tensor, average, name, op, prescale_factor,
                                        postscale_factor, process_set))


def _gather_finish(outs, splits, join_rank):
    return torch.from_dlpack(outs[0])


def allgather_async(tensor, name=None, process_set=global_process_set):
    """Starts concatenating every rank's `tensor` along dimension 0.

    Dimension 0 may differ between ranks; the other dimensions must match;
    a 0-dim tensor is refused (reshape it to [1]).

    Args:
        tensor: the tensor (contiguous, on the CPU or a CUDA device).
        name: a name unique among this rank's ops in flight; unnamed ops are
            named from a counter, so ranks must then call them in the same order.
        process_set: the ranks taking part (default: every rank).

    Returns:
        A handle for :func:`poll` and :func:`synchronize`, which returns
        a new tensor holding every rank's block, in rank order.

    Raises:
        ValueError: invalid input on this rank (not a member of the process
            set, a name already in flight, ...); nothing was started.
        TypeError: a dtype the op does not support.
        HorovodInternalError: from :func:`synchronize`, when the ranks disagreed
            or the job failed.
    """
    desc = _describe_all([tensor], "allgather", name)
    return _enqueue("allgather", "allgather", name, process_set.process_set_id, desc, [],
                    _gather_finish, (tensor,))


def _check_root(root_rank, op_name, name):
    if isinstance(root_rank, bool) or not isinstance(root_rank, int):
        try:
            root_rank = int(root_rank)
        except (TypeError, ValueError):
            raise ValueError(f"{op_name} '{name}': root_rank must be an int, got "
                             f"{root_rank!r}") from None
    if not -2**31 <= root_rank < 2**31:
        raise ValueError(f"{op_name} '{name}': root_rank {root_rank} is outside any job's ranks; "
                         "pass the global rank of the process that holds the data")
    return root_rank  # the core checks it is a member of the process set


def _broadcast_async(tensor, output, root_rank, name, process_set, finish):
    root_rank = _check_root(root_rank, "broadcast", name)
    ins = _describe_all([tensor], "broadcast", name)
    outs = ins if output is tensor else _describe_all([output], "broadcast", name)
    return _enqueue("broadcast", "broadcast", name, process_set.process_set_id, ins, outs, finish,
                    (tensor, output), root=root_rank)


def broadcast_async(tensor, root_rank, name=None, process_set=global_process_set):
    """Starts broadcasting `tensor` from global rank `root_rank`; the input is not modified.

    Args:
        tensor: the tensor (contiguous, on the CPU or a CUDA device).
        root_rank: the global rank whose tensor every rank receives.
        name: a name unique among this rank's ops in flight; unnamed ops are
            named from a counter, so ranks must then call them in the same order.
        process_set: the ranks taking part (default: every rank).

    Returns:
        A handle for :func:`poll` and :func:`synchronize`, which returns
        a new tensor holding the root's values.

    Raises:
        ValueError: invalid input on this rank (not a member of the process
            set, a name already in flight, ...); nothing was started.
        TypeError: a dtype the op does not support.
        HorovodInternalError: from :func:`synchronize`, when the ranks disagreed
            or the job failed.
    """
    output = _tensor.empty_like_contiguous(tensor, op="broadcast", name=name)
    return _broadcast_async(tensor, output, root_rank, name, process_set,
                            lambda outs, s, j: output)


def broadcast_async_(tensor, root_rank, name=None, process_set=global_process_set):
    """In-place :func:`broadcast_async`: non-root ranks receive into `tensor`.

    Args:
        tensor: the tensor (contiguous, on the CPU or a CUDA device).
        root_rank: the global rank whose tensor every rank receives.
        name: a name unique among this rank's ops in flight; unnamed ops are
            named from a counter, so ranks must then call them in the same order.
        process_set: the ranks taking part (default: every rank).

    Returns:
        A handle for :func:`poll` and :func:`synchronize`, which returns
        `tensor` holding the root's values.

    Raises:
        ValueError: invalid input on this rank (not a member of the process
            set, a name already in flight, ...); nothing was started.
        TypeError: a dtype the op does not support.
        HorovodInternalError: from :func:`synchronize`, when the ranks disagreed
            or the job failed.
    """
    return _broadcast_async(tensor, tensor, root_rank, name, process_set,
                            lambda outs, s, j: tensor)


def broadcast_(tensor, root_rank, name=None, process_set=global_process_set):
    """In-place broadcast from global rank `root_rank`.

    Args:
        tensor: the tensor (contiguous, on the CPU or a CUDA device).
        root_rank: the global rank whose tensor every rank receives.
        name: a name unique among this rank's ops in flight; unnamed ops are
            named from a counter, so ranks must then call them in the same order.
        process_set: the ranks taking part (default: every rank).

    Returns:
        `tensor`, holding the root's values.

    Raises:
        HorovodInternalError: the ranks disagreed (dtype, shape, op, ...) or
            the job failed; the message names the tensor and the ranks.
        ValueError: invalid input on this rank (not a member of the process
            set, a name already in flight, ...); nothing was started.
        TypeError: a dtype the op does not support.
    """
    return synchronize(broadcast_async_(tensor, root_rank, name, process_set))


def _splits_list(splits, name):
    """The core's split lists: [] (equal splits) or [rows per rank].

    The core checks them against the process set and the tensor.
    """
    if splits is None:
        return []
    if isinstance(splits, torch.Tensor):
        if splits.dim() != 1:
            raise ValueError(f"alltoall '{name}': alltoall expects a 1D splits tensor (got "
                             f"{splits.dim()}D)")
        if splits.dtype != torch.int32:
            raise ValueError(f"alltoall '{name}': alltoall expects splits to contain 32-bit "
                             f"integer elements (got {splits.dtype})")
        values = [int(v) for v in splits.cpu().tolist()]
    else:
        values = []
        for v in splits:
            try:
                values.append(operator.index(v))
            except TypeError:
                raise TypeError(f"alltoall '{name}': splits entry {v!r} is not an integer; "
                                "pass the number of rows sent to each rank as ints") from None
    for v in values:
        if not _INT64_MIN <= v <= _INT64_MAX:
            raise ValueError(f"alltoall '{name}': splits entry {v} does not fit in a 64-bit "
                             "integer; each entry is a number of rows of the tensor")
    return [values]


def alltoall_async(tensor, splits=None, name=None, process_set=global_process_set):
    """Starts an all-to-all exchange of rows of dimension 0.

    Rank i sends rows ``[sum(splits[:j]), sum(splits[:j+1]))`` to rank j;
    the dimensions after the first must match on every rank.

    Args:
        tensor: the tensor (contiguous, on the CPU or a CUDA device).
        splits: rows of dimension 0 sent to each rank of the set (a list or a 1-D
            int32 tensor); None splits dimension 0 equally.
        name: a name unique among this rank's ops in flight; unnamed ops are
            named from a counter, so ranks must then call them in the same order.
        process_set: the ranks taking part (default: every rank).

    Returns:
        A handle for :func:`poll` and :func:`synchronize`, which returns
        ``(output, received_splits)``.

    Raises:
        ValueError: invalid input on this rank (not a member of the process
            set, a name already in flight, ...); nothing was started.
        TypeError: a dtype the op does not support.
        HorovodInternalError: from :func:`synchronize`, when the ranks disagreed
            or the job failed.
    """
    _tensor.require_tensor(tensor, "alltoall", name)
    split_lists = _splits_list(splits, name)
    desc = _describe_all([tensor], "alltoall", name)
    if isinstance(splits, torch.Tensor):
        make_recv = lambda v: torch.tensor(v, dtype=splits.dtype).to(splits.device)  # noqa: E731
    else:
        make_recv = lambda v: torch.tensor(v, dtype=torch.int32)  # noqa: E731

    def finish(outs, received, join_rank):
        return torch.from_dlpack(outs[0]), make_recv(received[0])

    return _enqueue("alltoall", "alltoall", name, process_set.process_set_id, desc, [], finish,
                    (tensor,), splits=split_lists)


def _reducescatter_shape(tensor, set_rank, set_size):
    rows = _core.reducescatter_rows(tensor.shape[0], set_size, set_rank)
    return (rows,) + tuple(tensor.shape[1:])


def _check_reducescatter(tensors, op, name):
    if op == Adasum:
        # As in Horovod: Adasum is an allreduce-only algorithm.
        raise NotImplementedError(f"reducescatter '{name}': Reducescatter does not support "
                                  "Adasum; use op=hvd.Average or hvd.Sum (or allreduce with "
                                  "op=hvd.Adasum).")
    for t in tensors:
        if isinstance(t, torch.Tensor) and t.dim() == 0:
            raise ValueError(f"reducescatter '{name}': Reducescatter does not support scalar "
                             "inputs; reshape to [1] or use allreduce.")


def reducescatter_async(tensor, name=None, op=Average, process_set=global_process_set,
                        prescale_factor=1.0, postscale_factor=1.0):
    """Starts reducing `tensor` and scattering dimension 0 across the set.

    Rank r of the set receives rows of dimension 0: with
    ``q, m = divmod(dim0, size)``, ranks below m get q + 1 rows, the others q,
    in rank order. Shapes must be identical on every rank.

    Args:
        tensor: the tensor (contiguous, on the CPU or a CUDA device).
        name: a name unique among this rank's ops in flight; unnamed ops are
            named from a counter, so ranks must then call them in the same order.
        op: ``hvd.Average`` (default), ``hvd.Sum``, ``hvd.Min``, ``hvd.Max`` or
            ``hvd.Product``.
        process_set: the ranks taking part (default: every rank).
        prescale_factor: multiplies each rank's input before the reduction.
        postscale_factor: multiplies the result.

    Returns:
        A handle for :func:`poll` and :func:`synchronize`, which returns
        this rank's rows of the reduced tensor.

    Raises:
        ValueError: invalid input on this rank (not a member of the process
            set, a name already in flight, ...); nothing was started.
        TypeError: a dtype the op does not support.
        HorovodInternalError: from :func:`synchronize`, when the ranks disagreed
            or the job failed.
    """
    _check_reducescatter([tensor], op, name)
    _check_reduce_op(op, "reducescatter", name, [tensor])
    set_rank, set_size = _set_rank_size(process_set, "reducescatter", name)
    output = _tensor.empty_like_contiguous(tensor, _reducescatter_shape(tensor, set_rank, set_size))
    ins = _describe_all([tensor], "reducescatter", name)
    outs = _describe_all([output], "reducescatter", name)
    return _enqueue("reducescatter", "reducescatter", name, process_set.process_set_id, ins, outs,
                    lambda o, s, j: output, (tensor, output), reduce_op=op,
                    prescale=prescale_factor, postscale=postscale_factor)


def join(device=-1):
    """Declares that this rank has no more data; blocks until every rank has joined.

    While a rank is joined, allreduces submitted by the other ranks complete
    with the joined rank contributing zeros (Average still divides by the full
    size); other collectives fail while any rank is joined.

    Args:
        device: the CUDA device index on which this rank contributes to GPU
            allreduces after joining (default -1: the device of its first
            GPU collective, or cuda:<local_rank> when it ran none).

    Returns:
        The global rank that joined last (the same on every rank).

    Raises:
        ValueError: hvdcompat is not initialised.
        HorovodInternalError: the job failed while waiting.
    """
    session = _session.current()  # joins and barriers are named by the session's counts
    if device is not None and int(device) >= 0 and _gpu.cuda_available():
        _core.bind_cuda_device(int(device))
    name = f"{session.join_count}"
    handle = _enqueue("join", "join", name, 0, [], [], lambda o, s, j: j, ())
    session.join_count += 1
    return synchronize(handle)


def barrier(process_set=global_process_set):
    """Blocks until every rank of `process_set` has called barrier.

    Pending asynchronous ops do not hold it up.

    Args:
        process_set: the ranks taking part (default: every rank).

    Returns:
        None.

    Raises:
        ValueError: hvdcompat is not initialised, or this rank is not a member
            of `process_set`.
        HorovodInternalError: the job failed while waiting.
    """
    pid = process_set.process_set_id
    session = _session.get()  # None before init: the core's error comes from _enqueue
    k = session.barrier_counts.get(pid, 0) if session is not None else 0
    handle = _enqueue("barrier", "barrier", f"{k}", pid if pid is not None else -1, [], [],
                      lambda o, s, j: None, ())
    session.barrier_counts[pid] = k + 1
    synchronize(handle)
