"""The training API's checks that run before any communication (no hvd.init here)."""

import itertools

import pytest
import torch
import torch.nn as nn

import hvdcompat as hvd


def test_duplicate_and_missing_names_are_reported_before_init():
    assert not hvd.is_initialized()
    c1, c2 = nn.Conv2d(1, 2, 3), nn.Conv2d(2, 3, 3)
    opt = torch.optim.SGD(itertools.chain(c1.parameters(), c2.parameters()), lr=0.1)
    with pytest.raises(ValueError, match="Found duplicates: bias, weight.*merge_named_parameters"):
        hvd.DistributedOptimizer(opt, named_parameters=itertools.chain(c1.named_parameters(),
                                                                       c2.named_parameters()))
    with pytest.raises(ValueError, match=r"2 parameter\(s\) have no name"):
        hvd.DistributedOptimizer(opt, named_parameters=c1.named_parameters())
    with pytest.raises(ValueError, match="not been initialized"):
        hvd.DistributedOptimizer(opt, named_parameters=hvd.merge_named_parameters(c1, c2))


def test_names_from_an_optimizer_built_with_named_parameters():
    model = nn.Linear(2, 2)
    opt = torch.optim.SGD(model.named_parameters(), lr=0.1)
    if "param_names" not in opt.param_groups[0]:
        pytest.skip("this torch does not keep parameter names in param_groups")
    missing = nn.Linear(2, 1)
    opt.add_param_group({"params": list(missing.named_parameters())})
    with pytest.raises(ValueError, match=r"param_groups\[1\]\['params'\]\[0\] \(named 'weight' "
                                         r"in the optimizer\): shape \[1, 2\]"):
        hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())


@pytest.mark.parametrize("compression,wire", [(hvd.Compression.fp16, torch.float16),
                                              (hvd.Compression.bf16, torch.bfloat16)])
def test_compression_casts_floats_only_and_round_trips(compression, wire):
    for dtype in (torch.float32, torch.float64):
        t = torch.ones(5, 5, 5, dtype=dtype)
        sent, ctx = compression.compress(t)
        assert sent.dtype == wire
        back = compression.decompress(sent, ctx)
        assert back.dtype == dtype and torch.equal(back, t)
    for dtype in (torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64):
        t = torch.ones(5, dtype=dtype)
        sent, ctx = compression.compress(t)
        assert sent.dtype == dtype and compression.decompress(sent, ctx).dtype == dtype
    t = torch.ones(3)
    assert hvd.Compression.none.compress(t)[0] is t


def test_horovod_module_layout():
    import hvdcompat.functions
    import hvdcompat.mpi_ops
    import hvdcompat.optimizer
    import hvdcompat.sync_batch_norm

    assert hvdcompat.mpi_ops.sparse_allreduce_async is hvd.sparse_allreduce_async
    assert hvdcompat.optimizer.DistributedOptimizer is hvd.DistributedOptimizer
    assert hvdcompat.sync_batch_norm.SyncBatchNorm is hvd.SyncBatchNorm
    for name in ("broadcast_parameters", "broadcast_optimizer_state", "broadcast_object",
                 "allgather_object", "merge_named_parameters", "merge_state_dicts"):
        assert getattr(hvdcompat.functions, name) is getattr(hvd, name)
        assert name in hvd.__all__
    assert issubclass(hvd.SyncBatchNorm, torch.nn.modules.batchnorm._BatchNorm)
