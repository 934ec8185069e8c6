"""SyncBatchNorm over the ranks equals BatchNorm over the concatenated batch."""

import os

os.environ.setdefault("HOROVOD_DYNAMIC_PROCESS_SETS", "1")  # read at hvd.init()

import pytest  # noqa: E402
import torch  # noqa: E402
import torch.nn as nn  # noqa: E402

import hvdcompat as hvd  # noqa: E402
from training_utils import report  # noqa: E402

BATCH_NORMS = {2: nn.BatchNorm1d, 3: nn.BatchNorm1d, 4: nn.BatchNorm2d, 5: nn.BatchNorm3d}


def rows_of(rank, sizes):
    start = sum(sizes[:rank])
    return slice(start, start + sizes[rank])


@pytest.mark.parametrize("shape,uneven,dtype", [
    ((4, 5), False, torch.float64), ((3, 4, 6), True, torch.float64),
    ((2, 3, 4, 5), False, torch.float32), ((2, 3, 2, 3, 2), True, torch.float64),
])
def test_matches_batch_norm_over_the_concatenated_batch(shape, uneven, dtype):
    r, n = hvd.rank(), hvd.size()
    sizes = [shape[0] + (k if uneven else 0) for k in range(n)]
    channels = shape[1]
    g = torch.Generator().manual_seed(7)
    full = torch.randn(sum(sizes), *shape[1:], generator=g, dtype=dtype) * 3 + 1
    grad_out = torch.randn(full.shape, generator=g, dtype=dtype)
    weight = torch.rand(channels, generator=g, dtype=dtype) + 0.5
    bias = torch.randn(channels, generator=g, dtype=dtype)

    sync = hvd.SyncBatchNorm(channels, momentum=0.3).to(dtype)
    ref = BATCH_NORMS[len(shape)](channels, momentum=0.3).to(dtype)
    with torch.no_grad():
        for m in (sync, ref):
            m.weight.copy_(weight)
            m.bias.copy_(bias)

    mine = full[rows_of(r, sizes)].clone().requires_grad_()
    whole = full.clone().requires_grad_()
    for _ in range(2):   # two steps: running statistics accumulate
        out = sync(mine)
        want = ref(whole)
        mine.grad = whole.grad = None
        sync.zero_grad()
        ref.zero_grad()
        out.backward(grad_out[rows_of(r, sizes)])
        want.backward(grad_out)

    tol = dict(atol=1e-5, rtol=1e-4) if dtype == torch.float32 else dict(atol=1e-10, rtol=1e-9)
    torch.testing.assert_close(out, want[rows_of(r, sizes)], **tol)
    torch.testing.assert_close(mine.grad, whole.grad[rows_of(r, sizes)], **tol)
    torch.testing.assert_close(sync.running_mean, ref.running_mean, **tol)
    torch.testing.assert_close(sync.running_var, ref.running_var, **tol)
    assert sync.num_batches_tracked.item() == 2
    # Weight and bias gradients are per rank; their sum is the full-batch gradient.
    for name in ("weight", "bias"):
        local = getattr(sync, name).grad
        total = hvd.allreduce(local, op=hvd.Sum, name=f"sbn.{name}")
        torch.testing.assert_close(total, getattr(ref, name).grad, **tol)
    report(f"SyncBatchNorm {list(shape)} {dtype} max|input grad - reference|",
           (mine.grad - whole.grad[rows_of(r, sizes)]).abs().max().item())

    sync.eval()
    ref.eval()
    torch.testing.assert_close(sync(mine.detach()), ref(whole.detach())[rows_of(r, sizes)], **tol)


def test_empty_batch_on_one_rank_and_no_running_stats():
    r, n = hvd.rank(), hvd.size()
    sizes = [0 if k == 0 else 3 for k in range(n)]
    g = torch.Generator().manual_seed(8)
    full = torch.randn(sum(sizes), 4, generator=g, dtype=torch.float64)
    grad_out = torch.randn(full.shape, generator=g, dtype=torch.float64)
    sync = hvd.SyncBatchNorm(4, affine=False, track_running_stats=False).double()
    ref = nn.BatchNorm1d(4, affine=False, track_running_stats=False).double()
    mine = full[rows_of(r, sizes)].clone().requires_grad_()
    whole = full.clone().requires_grad_()
    out, want = sync(mine), ref(whole)
    out.backward(grad_out[rows_of(r, sizes)])
    want.backward(grad_out)
    torch.testing.assert_close(out, want[rows_of(r, sizes)])
    torch.testing.assert_close(mine.grad, whole.grad[rows_of(r, sizes)])


def test_process_set_and_input_checks():
    r, n = hvd.rank(), hvd.size()
    evens = hvd.add_process_set(list(range(0, n, 2)))
    members = list(range(0, n, 2))
    g = torch.Generator().manual_seed(9)
    full = torch.randn(2 * n, 3, generator=g, dtype=torch.float64)
    if r % 2 == 0:
        sync = hvd.SyncBatchNorm(3, process_set=evens).double()
        out = sync(full[2 * r:2 * r + 2])
        whole = torch.cat([full[2 * k:2 * k + 2] for k in members])
        want = nn.BatchNorm1d(3).double()(whole)
        torch.testing.assert_close(out, want[2 * members.index(r):2 * members.index(r) + 2])
    with pytest.raises(ValueError, match=r"expected at least 2D input \(got 1D input\)"):
        hvd.SyncBatchNorm(3)(torch.randn(3))
    hvd.remove_process_set(evens)
