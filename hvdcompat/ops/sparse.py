"""Allreduce of sparse COO tensors, done as two allgathers (indices and values).

Ranks may hold different numbers of non-zeros; concatenating every rank's
entries gives an uncoalesced tensor whose coalesced form is the sum.
"""

import torch

from hvdcompat.basics import Average, Sum
from hvdcompat.ops.collectives import _set_rank_size, allgather_async
from hvdcompat.ops.handles import synchronize
from hvdcompat.process_sets import global_process_set

__all__ = ["sparse_allreduce_async"]


class _SparseAllreduceHandle:
    """Calling it waits for both allgathers and returns the reduced sparse tensor.

    The result is built once; calling again returns the same tensor.
    """

    def __init__(self, values_handle, indices_handle, shape, divisor):
        self._values_handle = values_handle
        self._indices_handle = indices_handle
        self._shape = shape
        self._divisor = divisor
        self._result = None

    def __call__(self):
        if self._result is None:
            values = synchronize(self._values_handle)
            indices = synchronize(self._indices_handle)
            if self._divisor != 1:
                if values.dtype.is_floating_point or values.dtype.is_complex:
                    values = values / self._divisor
                else:
                    # Integer Average truncates toward zero, like the dense allreduce.
                    values = torch.div(values, self._divisor, rounding_mode="trunc")
            # Indices come from other ranks: check them rather than trust them.
            self._result = torch.sparse_coo_tensor(indices.t(), values, self._shape,
                                                   dtype=values.dtype, device=values.device,
                                                   check_invariants=True)
        return self._result


def sparse_allreduce_async(tensor, name, op, process_set=global_process_set):
    """Starts reducing a sparse COO tensor across the process set.

    Every rank's indices and values are allgathered (dimension 0 = its number
    of non-zeros, which may differ between ranks); the result is the
    uncoalesced concatenation, i.e. the sum once coalesced, divided by the set
    size for ``hvd.Average``. Every rank must call it with the same name and a
    tensor of the same shape and dtype.

    Args:
        tensor: a sparse COO tensor (``tensor.is_sparse``).
        name: base name; the allgathers are named ``<name>.indices`` and
            ``<name>.values``.
        op: ``hvd.Average`` or ``hvd.Sum``.
        process_set: ranks to reduce over (default: all).

    Returns:
        A callable; calling it waits for the result and returns the reduced
        sparse tensor (same shape as `tensor`).

    Raises:
        ValueError: `tensor` is not sparse, `op` is not Average or Sum, or
            this rank is not a member of `process_set`.
    """
    if not isinstance(tensor, torch.Tensor) or not tensor.is_sparse:
        got = tensor.layout if isinstance(tensor, torch.Tensor) else type(tensor).__name__
        raise ValueError(f"sparse_allreduce_async '{name}': expected a sparse COO tensor, got "
                         f"{got}. Use hvd.allreduce_async for dense tensors.")
    if op not in (Average, Sum):
        raise ValueError(f"sparse_allreduce_async '{name}': only op=hvd.Average or hvd.Sum can be "
                         f"computed by gathering sparse entries (got op={op!r}). Convert to dense "
                         "and use hvd.allreduce for other reductions.")
    _, set_size = _set_rank_size(process_set, "sparse_allreduce_async", name)
    # (sparse_dim, nnz) -> (nnz, sparse_dim) so the allgather concatenates entries.
    indices = tensor._indices().t().contiguous()
    values = tensor._values().contiguous()
    values_name = None if name is None else f"{name}.values"
    indices_name = None if name is None else f"{name}.indices"
    values_handle = allgather_async(values, name=values_name, process_set=process_set)
    indices_handle = allgather_async(indices, name=indices_name, process_set=process_set)
    divisor = set_size if op == Average else 1
    return _SparseAllreduceHandle(values_handle, indices_handle, tensor.shape, divisor)
