"""sparse_allreduce_async: sparse COO tensors reduced by gathering their entries."""

import os

os.environ.setdefault("HOROVOD_DYNAMIC_PROCESS_SETS", "1")  # read at hvd.init()

import pytest  # noqa: E402
import torch  # noqa: E402

import hvdcompat as hvd  # noqa: E402


def sparse_of(rank, shape, sparse_dim, salt=0):
    """A random sparse tensor whose number of non-zeros depends on the rank (may be 0)."""
    g = torch.Generator().manual_seed(100 * salt + rank)
    nnz = (rank * 3 + salt) % 7
    indices = torch.stack([torch.randint(0, shape[d], (nnz,), generator=g)
                           for d in range(sparse_dim)])
    values = torch.randn((nnz,) + tuple(shape[sparse_dim:]), generator=g, dtype=torch.float64)
    return torch.sparse_coo_tensor(indices, values, shape, check_invariants=True)


@pytest.mark.parametrize("op", [hvd.Average, hvd.Sum])
@pytest.mark.parametrize("shape,sparse_dim", [((6, 5), 2), ((9, 3), 1), ((4, 3, 2), 2)])
def test_equals_the_dense_reduction(op, shape, sparse_dim):
    r, n = hvd.rank(), hvd.size()
    handles = [hvd.sparse_allreduce_async(sparse_of(r, shape, sparse_dim, salt=i),
                                          name=f"sparse.{i}", op=op) for i in range(4)]
    for i, handle in enumerate(handles):
        got = handle()
        assert got.is_sparse and got.shape == shape
        want = sum(sparse_of(s, shape, sparse_dim, salt=i).to_dense() for s in range(n))
        if op == hvd.Average:
            want = want / n
        torch.testing.assert_close(got.to_dense(), want, atol=1e-12, rtol=1e-12)
        assert handle() is got                       # calling again returns the same result
        assert hvd.synchronize(handle) is None       # as Horovod: not an int handle


def test_every_rank_empty():
    empty = torch.sparse_coo_tensor(torch.zeros(2, 0, dtype=torch.int64), torch.zeros(0),
                                    (3, 3), check_invariants=True)
    got = hvd.sparse_allreduce_async(empty, name="sparse.empty", op=hvd.Average)()
    assert got.shape == (3, 3) and got._nnz() == 0


def test_process_set_and_argument_errors():
    r, n = hvd.rank(), hvd.size()
    odds = hvd.add_process_set(list(range(1, n, 2)))
    if r % 2 == 1:
        got = hvd.sparse_allreduce_async(sparse_of(r, (5, 4), 2), name="sparse.odd",
                                         op=hvd.Sum, process_set=odds)()
        want = sum(sparse_of(s, (5, 4), 2).to_dense() for s in range(1, n, 2))
        torch.testing.assert_close(got.to_dense(), want)
    else:
        with pytest.raises(ValueError, match="not a member"):
            hvd.sparse_allreduce_async(sparse_of(r, (5, 4), 2), name="sparse.odd", op=hvd.Sum,
                                       process_set=odds)
    hvd.remove_process_set(odds)
    with pytest.raises(ValueError, match="expected a sparse COO tensor"):
        hvd.sparse_allreduce_async(torch.ones(3), name="sparse.dense", op=hvd.Sum)
    with pytest.raises(ValueError, match="only op=hvd.Average or hvd.Sum"):
        hvd.sparse_allreduce_async(sparse_of(r, (5, 4), 2), name="sparse.max", op=hvd.Max)
