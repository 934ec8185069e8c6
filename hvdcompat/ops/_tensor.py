"""torch tensor <-> core buffer descriptions, and the checks every op runs."""

import torch

from hvdcompat import _gpu
from hvdcompat.basics import _core
from hvdcompat.ops import _pool

__all__ = []

_CODES = {
    torch.uint8: _core.DType.uint8,
    torch.int8: _core.DType.int8,
    torch.int16: _core.DType.int16,
    torch.int32: _core.DType.int32,
    torch.int64: _core.DType.int64,
    torch.float16: _core.DType.float16,
    torch.bfloat16: _core.DType.bfloat16,
    torch.float32: _core.DType.float32,
    torch.float64: _core.DType.float64,
    torch.bool: _core.DType.bool,
}


# A tensor dtype an op does not support: a TypeError, also a ValueError (as in
# Horovod). The core raises it for its own dtype rules (bool, Adasum).
UnsupportedDtypeError = _core.UnsupportedDtypeError


def _label(op, name):
    return f"{op} '{name}'" if name else op


def _where():
    try:
        return f" on rank {_core.rank()}" if _core.is_initialized() else ""
    except Exception:  # noqa: BLE001 - only decorates a message
        return ""


def dtype_code(tensor, op, name=None):
    code = _CODES.get(tensor.dtype)
    if code is None:
        supported = ", ".join(str(d).replace("torch.", "") for d in _CODES)
        raise UnsupportedDtypeError(
            f"{_label(op, name)}{_where()}: Tensor type {tensor.type()} is not supported "
            f"(dtype {tensor.dtype}). Supported dtypes: {supported}. Cast the tensor first.")
    return code


def device_of(tensor, op, name=None):
    dev = tensor.device
    if dev.type == "cpu":
        return -1
    if dev.type == "cuda":
        reason = _gpu.unavailable_reason()
        if reason:
            raise ValueError(
                f"{_label(op, name)}{_where()}: got a CUDA tensor ({dev}), but hvdcompat cannot "
                f"run collectives on CUDA tensors on this machine: {reason}\nMove the tensor to "
                "the CPU, or fix the installation as described above.")
        # The core checks the index against this rank's GPU (bound by its first CUDA op).
        return dev.index if dev.index is not None else torch.cuda.current_device()
    raise ValueError(f"{_label(op, name)}{_where()}: tensors on device type '{dev.type}' are not "
                     "supported; use CPU or CUDA tensors.")


def require_tensor(tensor, op, name=None):
    """TypeError unless `tensor` is a torch.Tensor (checked before anything reads it)."""
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"{_label(op, name)}{_where()}: expected a torch.Tensor, got "
                        f"{type(tensor).__name__}")


def check_tensor(tensor, op, name=None):
    """Validates one input; returns its (dtype code, device)."""
    require_tensor(tensor, op, name)
    code = dtype_code(tensor, op, name)
    if not tensor.is_contiguous():
        raise ValueError(f"{_label(op, name)}{_where()}: Tensor is required to be contiguous. "
                         "Call .contiguous() on it first.")
    if tensor.is_sparse:
        raise ValueError(f"{_label(op, name)}{_where()}: sparse tensors go through "
                         "hvd.sparse_allreduce_async (or DistributedOptimizer's sparse_as_dense).")
    return code, device_of(tensor, op, name)


def describe(tensor, code, device):
    """The `_core.Buffer` the core reads or writes: pointer, dtype code, shape, device.

    The producer's stream of CUDA inputs (torch's current stream on their
    device, which the core waits on before reading) goes with the op
    (`_core.EnqueueArgs.stream`, see ops/handles.py).
    """
    return _core.Buffer(tensor.data_ptr(), code, tuple(tensor.shape), device)


def empty_like_contiguous(tensor, shape=None, op="collective", name=None):
    """A new output for an out-of-place op: from the output pool on the host (Note [Output pool])."""
    require_tensor(tensor, op, name)
    shape = tensor.shape if shape is None else shape
    if tensor.device.type == "cpu":
        pool = _pool.current()
        out = pool.empty(shape, tensor.dtype) if pool is not None else None
        if out is not None:
            return out
    return torch.empty(shape, dtype=tensor.dtype, device=tensor.device)

