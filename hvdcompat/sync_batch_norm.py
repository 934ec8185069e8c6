"""Batch normalization whose statistics span the whole process set (CPU and GPU).

Forward: each rank computes its per-channel count, mean and (biased)
variance; one allgather shares them; every rank combines them into the
global mean and variance (the parallel-variance formula, so ranks may hold
different batch sizes, even empty ones). Backward: one Sum-allreduce of the
per-channel ``sum(dy)`` and ``sum(dy * (x - mean))`` gives the global terms
of the input gradient. Weight and bias gradients stay local, as in Horovod:
DistributedOptimizer averages them with the other gradients.
"""

import torch
import torch.nn.functional as F
from torch.nn.modules.batchnorm import _BatchNorm

from hvdcompat.ops.collectives import allgather_async, allreduce_async_
from hvdcompat.basics import Sum
from hvdcompat.ops.handles import synchronize
from hvdcompat.process_sets import global_process_set

__all__ = ["SyncBatchNorm"]


def _compute_dtype(x):
    # Statistics of half-precision inputs are accumulated in float32, as torch does.
    return torch.float64 if x.dtype == torch.float64 else torch.float32


def _channel_view(t, ndim):
    return t.view([1, -1] + [1] * (ndim - 2))


class _SyncBatchNormFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, running_mean, running_var, eps, momentum, process_set):
        dtype = _compute_dtype(x)
        xc = x.to(dtype)
        channels = x.shape[1]
        dims = [0] + list(range(2, x.dim()))
        count = x.numel() // channels if channels else 0
        if count > 0:
            mean = xc.mean(dim=dims)
            var = xc.var(dim=dims, unbiased=False)
        else:
            mean = xc.new_zeros(channels)
            var = xc.new_zeros(channels)
        local = torch.cat([xc.new_tensor([float(count)]), mean, var]).unsqueeze(0)
        gathered = synchronize(allgather_async(local.contiguous(),
                                               name=f"sync_batch_norm.stats.{channels}",
                                               process_set=process_set))
        counts = gathered[:, :1]
        means, vars_ = gathered[:, 1:1 + channels], gathered[:, 1 + channels:]
        total = counts.sum()
        if total <= 0:
            raise ValueError("SyncBatchNorm: every rank's batch is empty; there are no values to "
                             "normalize over.")
        g_mean = (counts * means).sum(0) / total
        g_var = (counts * (vars_ + (means - g_mean) ** 2)).sum(0) / total
        invstd = torch.rsqrt(g_var + eps)

        if running_mean is not None:
            with torch.no_grad():
                running_mean.mul_(1 - momentum).add_(g_mean.to(running_mean.dtype),
                                                     alpha=momentum)
                unbiased = g_var * (total / (total - 1)) if total > 1 else g_var
                running_var.mul_(1 - momentum).add_(unbiased.to(running_var.dtype),
                                                    alpha=momentum)

        xhat = (xc - _channel_view(g_mean, x.dim())) * _channel_view(invstd, x.dim())
        out = xhat
        if weight is not None:
            out = out * _channel_view(weight.to(dtype), x.dim())
        if bias is not None:
            out = out + _channel_view(bias.to(dtype), x.dim())
        ctx.save_for_backward(xhat, weight, invstd, total)
        ctx.process_set = process_set
        ctx.has_bias = bias is not None
        ctx.input_dtype = x.dtype
        return out.to(x.dtype)

    @staticmethod
    def backward(ctx, grad_out):
        xhat, weight, invstd, total = ctx.saved_tensors
        dims = [0] + list(range(2, xhat.dim()))
        channels = xhat.shape[1]
        dy = grad_out.to(xhat.dtype)
        sum_dy = dy.sum(dim=dims)
        sum_dy_xhat = (dy * xhat).sum(dim=dims)

        grad_input = grad_weight = grad_bias = None
        if ctx.needs_input_grad[1]:
            grad_weight = sum_dy_xhat.to(weight.dtype)
        if ctx.needs_input_grad[2]:
            grad_bias = sum_dy.to(weight.dtype if weight is not None else ctx.input_dtype)
        if ctx.needs_input_grad[0]:
            both = torch.cat([sum_dy, sum_dy_xhat]).contiguous()
            synchronize(allreduce_async_(both, name=f"sync_batch_norm.grads.{channels}", op=Sum,
                                         process_set=ctx.process_set))
            g_sum_dy, g_sum_dy_xhat = both[:channels], both[channels:]
            scale = invstd if weight is None else invstd * weight.to(xhat.dtype)
            nd = xhat.dim()
            grad_input = _channel_view(scale, nd) * (
                dy - _channel_view(g_sum_dy / total, nd)
                - xhat * _channel_view(g_sum_dy_xhat / total, nd))
            grad_input = grad_input.to(ctx.input_dtype)
        return grad_input, grad_weight, grad_bias, None, None, None, None, None


class SyncBatchNorm(_BatchNorm):
    """Batch normalization over the inputs of every rank of the process set.

    A drop-in for ``torch.nn.BatchNorm1d/2d/3d`` (any input of shape
    ``(N, C, ...)``) on CPU or GPU. In training (and whenever running
    statistics are not tracked) the mean and variance are those of the
    concatenation of every rank's batch, and the running statistics are
    updated with them, so every rank holds the same running statistics.
    Every rank of the set must call forward and backward together.

    Args:
        num_features: number of channels C.
        eps: added to the variance for numerical stability.
        momentum: running-statistics update factor (None: cumulative average).
        affine: learn a per-channel weight and bias.
        track_running_stats: keep running mean and variance for eval mode.
        process_set: the ranks whose batches are normalized together
            (ours; Horovod always uses every rank).
    """

    def __init__(self, num_features, eps=1e-5, momentum=0.1, affine=True,
                 track_running_stats=True, process_set=global_process_set):
        super().__init__(num_features, eps, momentum, affine, track_running_stats)
        self.process_set = process_set

    def _check_input_dim(self, input):
        if input.dim() < 2:
            raise ValueError(f"expected at least 2D input (got {input.dim()}D input)")

    def forward(self, input):
        self._check_input_dim(input)
        if input.shape[1] != self.num_features:
            raise ValueError(f"SyncBatchNorm: expected {self.num_features} channels (dim 1), got "
                             f"input of shape {list(input.shape)}")
        factor = 0.0
        if self.training and self.track_running_stats:
            self.num_batches_tracked.add_(1)
            factor = (1.0 / float(self.num_batches_tracked) if self.momentum is None
                      else self.momentum)
        if not self.training and self.track_running_stats:
            return F.batch_norm(input, self.running_mean, self.running_var, self.weight,
                                self.bias, False, 0.0, self.eps)
        if self.process_set.size() == 1:
            return F.batch_norm(input, self.running_mean, self.running_var, self.weight,
                                self.bias, True, factor, self.eps)
        running_mean = self.running_mean if self.track_running_stats else None
        running_var = self.running_var if self.track_running_stats else None
        return _SyncBatchNormFunction.apply(input, self.weight, self.bias, running_mean,
                                            running_var, self.eps, factor, self.process_set)
