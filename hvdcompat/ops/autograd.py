"""Differentiable collectives: the functional forms users call in models.

Backward rules follow Horovod: allreduce -> allreduce of the gradient with the
same op and scaling; allgather -> averaged gradient, narrowed to this rank's
rows; broadcast -> averaged gradient on the root, zero elsewhere; alltoall ->
alltoall back with the received splits; reducescatter -> allgather.
"""

import torch

from hvdcompat.basics import Average, Sum, _core
from hvdcompat.ops.collectives import (
    _set_rank_size, allgather_async, alltoall_async, allreduce_async, broadcast_async,
    reducescatter_async,
)
from hvdcompat.ops.compression import Compression
from hvdcompat.ops.grouped import (
    grouped_allgather_async, grouped_allreduce_async, grouped_reducescatter_async,
)
from hvdcompat.ops.handles import synchronize
from hvdcompat.process_sets import global_process_set

__all__ = [
    "allreduce", "grouped_allreduce", "allgather", "grouped_allgather", "broadcast", "alltoall",
    "reducescatter", "grouped_reducescatter",
]


def _tracked(tensors):
    """Whether autograd records an op on `tensors`: only then is the Function's cost paid."""
    return torch.is_grad_enabled() and any(
        isinstance(t, torch.Tensor) and t.requires_grad for t in tensors)


class HorovodAllreduce(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, average, name, op, prescale_factor, postscale_factor, process_set):
        ctx.average, ctx.op = average, op
        ctx.prescale_factor, ctx.postscale_factor = prescale_factor, postscale_factor
        ctx.process_set = process_set
        return synchronize(allreduce_async(tensor, average, name, op, prescale_factor,
                                           postscale_factor, process_set))

    @staticmethod
    def backward(ctx, grad_output):
        grad = allreduce(grad_output.contiguous(), average=ctx.average, op=ctx.op,
                         prescale_factor=ctx.prescale_factor,
                         postscale_factor=ctx.postscale_factor, process_set=ctx.process_set)
        return grad, None, None, None, None, None, None


def allreduce(tensor, average=None, name=None, compression=Compression.none, op=None,
              prescale_factor=1.0, postscale_factor=1.0, process_set=global_process_set):
    """Reduces `tensor` over the process set and returns the result (differentiable).

    Every rank must call it with the same name (or, unnamed, in the same
    order), dtype and shape. The input is not modified.

    Args:
        tensor: the tensor to reduce.
        average: deprecated; use ``op``.
        name: a name unique among this rank's in-flight ops.
        compression: e.g. ``hvd.Compression.fp16`` to halve the bytes sent.
        op: hvd.Average (default), hvd.Sum, hvd.Min, hvd.Max or hvd.Product.
        prescale_factor: multiplies each rank's input before the reduction.
        postscale_factor: multiplies the result.
        process_set: ranks to reduce over (default: all).

    Returns:
        A new tensor with the reduced values.

    Raises:
        HorovodInternalError: ranks disagreed (dtype, shape, op, ...) or the
            job failed; the message names the ranks.
        ValueError / TypeError: invalid input on this rank.
    """
    compressed, cctx = compression.compress(tensor)
    if _tracked((compressed,)):
        reduced = HorovodAllreduce.apply(compressed, average, name, op, prescale_factor,
                                         postscale_factor, process_set)
    else:
        reduced = synchronize(allreduce_async(compressed, average, name, op, prescale_factor,
                                              postscale_factor, process_set))
    return compression.decompress(reduced, cctx)


class HorovodGroupedAllreduce(torch.autograd.Function):
    @staticmethod
    def forward(ctx, average, name, op, prescale_factor, postscale_factor, process_set, *tensors):
        ctx.average, ctx.op = average, op
        ctx.prescale_factor, ctx.postscale_factor = prescale_factor, postscale_factor
        ctx.process_set = process_set
        return synchronize(grouped_allreduce_async(list(tensors), average, name, op,
                                                   prescale_factor, postscale_factor,
                                                   process_set))

    @staticmethod
    def backward(ctx, *grad_outputs):
        grads = grouped_allreduce([g.contiguous() for g in grad_outputs], average=ctx.average,
                                  op=ctx.op, prescale_factor=ctx.prescale_factor,
                                  postscale_factor=ctx.postscale_factor,
                                  process_set=ctx.process_set)
        return (None, None, None, None, None, None, *grads)


def grouped_allreduce(tensors, average=None, name=None, compression=Compression.none, op=None,
                      prescale_factor=1.0, postscale_factor=1.0, process_set=global_process_set):
    """Reduces every tensor of the list in one fused operation (differentiable).

    The whole list is negotiated as one unit, so it completes together.

    Args:
        tensors: a list of tensors; they are negotiated and fused as one unit.
        average: deprecated; use ``op``.
        name: a name unique among this rank's ops in flight; unnamed ops are
            named from a counter, so ranks must then call them in the same order.
        compression: ``hvd.Compression.none`` (default), ``.fp16`` or ``.bf16``: the
            dtype on the wire.
        op: ``hvd.Average`` (default), ``hvd.Sum``, ``hvd.Adasum``, ``hvd.Min``,
            ``hvd.Max`` or ``hvd.Product``.
        prescale_factor: multiplies each rank's input before the reduction.
        postscale_factor: multiplies the result.
        process_set: the ranks taking part (default: every rank).

    Returns:
        A list of new tensors with the reduced values, in the order given.

    Raises:
        HorovodInternalError: the ranks disagreed (dtype, shape, op, ...) or
            the job failed; the message names the tensor and the ranks.
        ValueError: invalid input on this rank (not a member of the process
            set, a name already in flight, ...); nothing was started.
        TypeError: a dtype the op does not support.
    """
    pairs = [compression.compress(t) for t in tensors]
    sent = [p[0] for p in pairs]
    if _tracked(sent):
        reduced = HorovodGroupedAllreduce.apply(average, name, op, prescale_factor,
                                                postscale_factor, process_set, *sent)
    else:
        reduced = synchronize(grouped_allreduce_async(sent, average, name, op, prescale_factor,
                                                      postscale_factor, process_set))
    return [compression.decompress(t, p[1]) for t, p in zip(reduced, pairs)]


def _narrow_to_own_rows(grads, dims, process_set):
    """This rank's rows of each gathered gradient (offsets from every rank's dim 0)."""
    set_rank, _ = _set_rank_size(process_set, "allgather")
    rows = synchronize(allgather_async(torch.tensor([dims], dtype=torch.int64),
                                       process_set=process_set))
    return [g.narrow(0, int(rows[:set_rank, i].sum().item()), dims[i])
            for i, g in enumerate(grads)]


class HorovodAllgather(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, name, process_set):
        ctx.dim = tensor.shape[0]
        ctx.process_set = process_set
        return synchronize(allgather_async(tensor, name, process_set))

    @staticmethod
    def backward(ctx, grad_output):
        reduced = allreduce(grad_output.contiguous(), op=Average, process_set=ctx.process_set)
        return _narrow_to_own_rows([reduced], [ctx.dim], ctx.process_set)[0], None, None


def allgather(tensor, name=None, process_set=global_process_set):
    """Concatenates every rank's `tensor` along dimension 0 (differentiable).

    Dimension 0 may differ between ranks; the other dimensions must match.
    The gradient is this rank's rows of the allreduced gradient.

    Args:
        tensor: the tensor (contiguous, on the CPU or a CUDA device).
        name: a name unique among this rank's ops in flight; unnamed ops are
            named from a counter, so ranks must then call them in the same order.
        process_set: the ranks taking part (default: every rank).

    Returns:
        A new tensor holding every rank's block, in rank order.

    Raises:
        HorovodInternalError: the ranks disagreed (dtype, shape, op, ...) or
            the job failed; the message names the tensor and the ranks.
        ValueError: invalid input on this rank (not a member of the process
            set, a name already in flight, ...); nothing was started.
        TypeError: a dtype the op does not support.
    """
    if _tracked((tensor,)):
        return HorovodAllgather.apply(tensor, name, process_set)
    return synchronize(allgather_async(tensor, name, process_set))


class HorovodGroupedAllgather(torch.autograd.Function):
    @staticmethod
    def forward(ctx, name, process_set, *tensors):
        ctx.dims = [t.shape[0] for t in tensors]
        ctx.process_set = process_set
        return synchronize(grouped_allgather_async(list(tensors), name, process_set))

    @staticmethod
    def backward(ctx, *grad_outputs):
        reduced = synchronize(grouped_allreduce_async([g.contiguous() for g in grad_outputs],
                                                      op=Average, process_set=ctx.process_set))
        return (None, None, *_narrow_to_own_rows(list(reduced), ctx.dims, ctx.process_set))


def grouped_allgather(tensors, name=None, process_set=global_process_set):
    """Allgathers every tensor of the list in one fused operation (differentiable).

    Args:
        tensors: a list of tensors; they are negotiated and fused as one unit.
        name: a name unique among this rank's ops in flight; unnamed ops are
            named from a counter, so ranks must then call them in the same order.
        process_set: the ranks taking part (default: every rank).

    Returns:
        A tuple of new tensors, one per input, each in rank order.

    Raises:
        HorovodInternalError: the ranks disagreed (dtype, shape, op, ...) or
            the job failed; the message names the tensor and the ranks.
        ValueError: invalid input on this rank (not a member of the process
            set, a name already in flight, ...); nothing was started.
        TypeError: a dtype the op does not support.
    """
    return HorovodGroupedAllgather.apply(name, process_set, *tensors)


class HorovodBroadcast(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, root_rank, name, process_set):
        ctx.root_rank, ctx.process_set = root_rank, process_set
        return synchronize(broadcast_async(tensor, root_rank, name, process_set))

    @staticmethod
    def backward(ctx, grad_output):
        grad = allreduce(grad_output.contiguous(), op=Average, process_set=ctx.process_set)
        if _core.rank() != ctx.root_rank:
            grad = grad * 0
        return grad, None, None, None


def broadcast(tensor, root_rank, name=None, process_set=global_process_set):
    """Returns a copy of global rank `root_rank`'s `tensor` (differentiable).

    The gradient is the allreduced gradient on the root, zero elsewhere.

    Args:
        tensor: the tensor (contiguous, on the CPU or a CUDA device).
        root_rank: the global rank whose tensor every rank receives.
        name: a name unique among this rank's ops in flight; unnamed ops are
            named from a counter, so ranks must then call them in the same order.
        process_set: the ranks taking part (default: every rank).

    Returns:
        A new tensor holding the root's values; the input is unchanged.

    Raises:
        HorovodInternalError: the ranks disagreed (dtype, shape, op, ...) or
            the job failed; the message names the tensor and the ranks.
        ValueError: invalid input on this rank (not a member of the process
            set, a name already in flight, ...); nothing was started.
        TypeError: a dtype the op does not support.
    """
    if _tracked((tensor,)):
        return HorovodBroadcast.apply(tensor, root_rank, name, process_set)
    return synchronize(broadcast_async(tensor, root_rank, name, process_set))


class HorovodAlltoall(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, splits, name, process_set):
        ctx.process_set = process_set
        output, received = synchronize(alltoall_async(tensor, splits, name, process_set))
        ctx.recvsplits = received
        ctx.mark_non_differentiable(received)
        return output, received

    @staticmethod
    def backward(ctx, grad_output, grad_received_splits):
        grad, _ = synchronize(alltoall_async(grad_output.contiguous(), ctx.recvsplits,
                                             process_set=ctx.process_set))
        return grad, None, None, None


def alltoall(tensor, splits=None, name=None, process_set=global_process_set):
    """All-to-all exchange of rows of dimension 0 (differentiable).

    Rank i sends rows ``[sum(splits[:j]), sum(splits[:j+1]))`` to rank j.

    Args:
        tensor: the tensor (contiguous, on the CPU or a CUDA device).
        splits: rows of dimension 0 sent to each rank of the set (a list or a 1-D
            int32 tensor); None splits dimension 0 equally.
        name: a name unique among this rank's ops in flight; unnamed ops are
            named from a counter, so ranks must then call them in the same order.
        process_set: the ranks taking part (default: every rank).

    Returns:
        The received tensor when ``splits`` is None, else ``(output,
        received_splits)``.

    Raises:
        HorovodInternalError: the ranks disagreed (dtype, shape, op, ...) or
            the job failed; the message names the tensor and the ranks.
        ValueError: invalid input on this rank (not a member of the process
            set, a name already in flight, ...); nothing was started.
        TypeError: a dtype the op does not support.
    """
    output, received = HorovodAlltoall.apply(tensor, splits, name, process_set)
    return output if splits is None else (output, received)


class HorovodReducescatter(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, name, op, process_set, prescale_factor, postscale_factor):
        ctx.op, ctx.process_set = op, process_set
        ctx.prescale_factor, ctx.postscale_factor = prescale_factor, postscale_factor
        return synchronize(reducescatter_async(tensor, name, op, process_set, prescale_factor,
                                               postscale_factor))

    @staticmethod
    def backward(ctx, grad_output):
        return (_reducescatter_grad(grad_output, ctx), None, None, None, None, None)


def _scaled_grad(grad, ctx):
    g = grad.contiguous().clone()
    if ctx.op == Sum:
        g *= _set_rank_size(ctx.process_set, "reducescatter")[1]
    if ctx.prescale_factor != 1.0:
        g *= ctx.prescale_factor
    if ctx.postscale_factor != 1.0:
        g *= ctx.postscale_factor
    return g


def _reducescatter_grad(grad, ctx):
    return synchronize(allgather_async(_scaled_grad(grad, ctx), process_set=ctx.process_set))


def reducescatter(tensor, name=None, compression=Compression.none, op=Average,
                  process_set=global_process_set, prescale_factor=1.0, postscale_factor=1.0):
    """Reduces `tensor` over the set and returns this rank's rows (differentiable).

    Rank r of the set receives rows of dimension 0: with
    ``q, m = divmod(dim0, size)``, ranks below m get q + 1 rows, the others q,
    in rank order. Shapes must be identical on every rank.

    Args:
        tensor: the tensor (contiguous, on the CPU or a CUDA device).
        name: a name unique among this rank's ops in flight; unnamed ops are
            named from a counter, so ranks must then call them in the same order.
        compression: ``hvd.Compression.none`` (default), ``.fp16`` or ``.bf16``: the
            dtype on the wire.
        op: ``hvd.Average`` (default), ``hvd.Sum``, ``hvd.Min``, ``hvd.Max`` or
            ``hvd.Product``.
        process_set: the ranks taking part (default: every rank).
        prescale_factor: multiplies each rank's input before the reduction.
        postscale_factor: multiplies the result.

    Returns:
        A new tensor with this rank's rows of the reduced tensor.

    Raises:
        HorovodInternalError: the ranks disagreed (dtype, shape, op, ...) or
            the job failed; the message names the tensor and the ranks.
        ValueError: invalid input on this rank (not a member of the process
            set, a name already in flight, ...); nothing was started.
        TypeError: a dtype the op does not support.
    """
    compressed, cctx = compression.compress(tensor)
    out = HorovodReducescatter.apply(compressed, name, op, process_set, prescale_factor,
                                     postscale_factor)
    return compression.decompress(out, cctx)


class HorovodGroupedReducescatter(torch.autograd.Function):
    @staticmethod
    def forward(ctx, name, op, process_set, prescale_factor, postscale_factor, *tensors):
        ctx.op, ctx.process_set = op, process_set
        ctx.prescale_factor, ctx.postscale_factor = prescale_factor, postscale_factor
        return synchronize(grouped_reducescatter_async(list(tensors), name, op, process_set,
                                                       prescale_factor, postscale_factor))

    @staticmethod
    def backward(ctx, *grad_outputs):
        grads = synchronize(grouped_allgather_async([_scaled_grad(g, ctx) for g in grad_outputs],
                                                    process_set=ctx.process_set))
        return (None, None, None, None, None, *grads)


def grouped_reducescatter(tensors, name=None, compression=Compression.none, op=Average,
                          process_set=global_process_set, prescale_factor=1.0,
                          postscale_factor=1.0):
    """Reducescatters every tensor of the list in one fused operation (differentiable).

    Rank r of the set receives rows of dimension 0: with
    ``q, m = divmod(dim0, size)``, ranks below m get q + 1 rows, the others q,
    in rank order. Shapes must be identical on every rank.

    Args:
        tensors: a list of tensors; they are negotiated and fused as one unit.
        name: a name unique among this rank's ops in flight; unnamed ops are
            named from a counter, so ranks must then call them in the same order.
        compression: ``hvd.Compression.none`` (default), ``.fp16`` or ``.bf16``: the
            dtype on the wire.
        op: ``hvd.Average`` (default), ``hvd.Sum``, ``hvd.Min``, ``hvd.Max`` or
            ``hvd.Product``.
        process_set: the ranks taking part (default: every rank).
        prescale_factor: multiplies each rank's input before the reduction.
        postscale_factor: multiplies the result.

    Returns:
        A list of new tensors, this rank's rows of each reduced tensor.

    Raises:
        HorovodInternalError: the ranks disagreed (dtype, shape, op, ...) or
            the job failed; the message names the tensor and the ranks.
        ValueError: invalid input on this rank (not a member of the process
            set, a name already in flight, ...); nothing was started.
        TypeError: a dtype the op does not support.
    """
    pairs = [compression.compress(t) for t in tensors]
    outs = HorovodGroupedReducescatter.apply(name, op, process_set, prescale_factor,
                                             postscale_factor, *[p[0] for p in pairs])
    return [compression.decompress(t, p[1]) for t, p in zip(outs, pairs)]
