"""broadcast_parameters, broadcast_optimizer_state, objects, and the multi-model merge helpers."""

import os
import tempfile

os.environ.setdefault("HOROVOD_DYNAMIC_PROCESS_SETS", "1")  # read at hvd.init()

import pytest  # noqa: E402
import torch  # noqa: E402
import torch.nn as nn  # noqa: E402

import hvdcompat as hvd  # noqa: E402
from training_utils import global_batch, mlp, mse, my_rows  # noqa: E402


def rank_model(seed_base=100):
    """A model whose initial weights differ on every rank, with integer buffers too."""
    torch.manual_seed(seed_base + hvd.rank())
    return nn.Sequential(nn.Linear(8, 6), nn.BatchNorm1d(6), nn.Linear(6, 4))


def test_broadcast_parameters_from_every_root():
    n = hvd.size()
    for root in range(n):
        model = rank_model()
        model.train()
        for _ in range(hvd.rank() + 1):   # num_batches_tracked differs per rank
            model(torch.randn(5, 8))
        torch.manual_seed(100 + root)
        expected = nn.Sequential(nn.Linear(8, 6), nn.BatchNorm1d(6), nn.Linear(6, 4))
        hvd.broadcast_parameters(model.state_dict(), root_rank=root)
        for (k, got), (_, want) in zip(model.state_dict().items(),
                                       expected.state_dict().items()):
            if k.endswith("num_batches_tracked"):
                assert got.item() == root + 1
            elif "running" not in k:
                assert torch.equal(got, want), k


def test_broadcast_parameters_lists_and_strided_tensors():
    r = hvd.rank()
    a = torch.full((3, 4), float(r))
    b = torch.full((4, 3), float(r)).t()          # not contiguous
    c = torch.full((2,), float(r))
    hvd.broadcast_parameters([("a", a), ("b", b)], root_rank=0)
    hvd.broadcast_parameters([c], root_rank=hvd.size() - 1)
    assert torch.equal(a, torch.zeros(3, 4)) and torch.equal(b, torch.zeros(3, 4))
    assert torch.equal(c, torch.full((2,), float(hvd.size() - 1)))
    with pytest.raises(ValueError, match="invalid params of type"):
        hvd.broadcast_parameters(nn.Linear(2, 2).named_parameters(), root_rank=0)
    with pytest.raises(ValueError, match="'x' is a int"):
        hvd.broadcast_parameters({"x": 3}, root_rank=0)


def test_broadcast_parameters_on_a_process_set():
    r, n = hvd.rank(), hvd.size()
    odds = hvd.add_process_set(list(range(1, n, 2)))
    t = torch.full((4,), float(r))
    if r % 2 == 1:
        hvd.broadcast_parameters({"t": t}, root_rank=1, process_set=odds)
        assert torch.equal(t, torch.ones(4))
    else:
        with pytest.raises(ValueError, match="not a member"):
            hvd.broadcast_parameters({"t": t}, root_rank=1, process_set=odds)
        assert torch.equal(t, torch.full((4,), float(r)))
    hvd.remove_process_set(odds)


OPTIMIZERS = {
    "sgd_momentum": (torch.optim.SGD, dict(lr=0.2, momentum=0.9, nesterov=True, weight_decay=0.1),
                     dict(lr=0.5, momentum=0.5, nesterov=False, weight_decay=0.0)),
    "adam": (torch.optim.Adam, dict(lr=0.01, betas=(0.8, 0.95), amsgrad=True),
             dict(lr=0.1, betas=(0.5, 0.6), amsgrad=False)),
    "adamw": (torch.optim.AdamW, dict(lr=0.02, betas=(0.85, 0.99), weight_decay=0.05),
              dict(lr=0.3, betas=(0.1, 0.2), weight_decay=0.5)),
    "rmsprop": (torch.optim.RMSprop, dict(lr=0.01, alpha=0.9, momentum=0.5, centered=True),
                dict(lr=0.2, alpha=0.5, momentum=0.0, centered=False)),
    "adagrad": (torch.optim.Adagrad, dict(lr=0.05, lr_decay=0.01, initial_accumulator_value=0.1),
                dict(lr=0.5, lr_decay=0.0, initial_accumulator_value=0.0)),
}


def _train_root_copy(cls, options, steps):
    """What rank 0 trains; every rank can rebuild it from the seed to know the expected state."""
    model = mlp(30)
    opt = cls(model.parameters(), **options)
    for step in range(steps):
        x, y = global_batch(step, 1, salt=11)
        opt.zero_grad()
        mse(model(x), y).backward()
        opt.step()
    return model, opt


def _assert_same_optimizer(opt, expected, params, expected_params):
    for group, want in zip(opt.param_groups, expected.param_groups):
        for key, value in want.items():
            if key == "params":
                continue
            assert type(group[key]) is type(value), key
            assert group[key] == value, key
    for p, q in zip(params, expected_params):
        want, got = expected.state.get(q, {}), opt.state.get(p, {})
        assert sorted(got) == sorted(want)
        for key, value in want.items():
            if isinstance(value, torch.Tensor):
                assert torch.equal(got[key], value), key
            else:
                assert type(got[key]) is type(value) and got[key] == value, key


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_broadcast_optimizer_state_gives_everyone_the_roots_state(name):
    cls, root_options, other_options = OPTIMIZERS[name]
    expected_model, expected = _train_root_copy(cls, root_options, steps=2)
    if hvd.rank() == 0:
        model, base = _train_root_copy(cls, root_options, steps=2)
    else:
        model = mlp(31 + hvd.rank())
        base = cls(model.parameters(), **other_options)
    opt = hvd.DistributedOptimizer(base, named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    _assert_same_optimizer(opt, expected, list(model.parameters()),
                           list(expected_model.parameters()))
    # Training continues in lockstep (the option types work in the update).
    x, y = global_batch(5, hvd.size(), salt=12)
    opt.zero_grad()
    mse(model(my_rows(x, hvd.rank())), my_rows(y, hvd.rank())).backward()
    opt.step()
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    assert all(torch.equal(flat, other) for other in hvd.allgather_object(flat))


def test_broadcast_optimizer_state_of_fresh_optimizers_only_syncs_options():
    """No state anywhere: options are synced, no phantom step moves weights or counters."""
    torch.manual_seed(40)
    frozen = nn.Parameter(torch.tensor([1, 3], dtype=torch.int32), requires_grad=False)
    weight = nn.Parameter(torch.rand(4))
    before = weight.detach().clone()
    lr = 0.001 if hvd.rank() == 0 else 0.5
    opt = torch.optim.AdamW([frozen, weight], lr=lr, weight_decay=0.5)
    opt = hvd.DistributedOptimizer(opt, named_parameters=[("frozen", frozen), ("w", weight)])
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    assert opt.param_groups[0]["lr"] == 0.001
    assert len(opt.state) == 0
    assert torch.equal(weight.detach(), before)
    assert frozen.grad is None                      # as Horovod: no grad for frozen params
    assert torch.equal(weight.grad, torch.zeros(4))  # and zeros for trainable ones


def test_broadcast_optimizer_state_refuses_lbfgs():
    opt = torch.optim.LBFGS(mlp(41).parameters())
    with pytest.raises(ValueError, match="cannot broadcast torch.optim.LBFGS state"):
        hvd.broadcast_optimizer_state(opt, root_rank=0)


def test_checkpoint_from_rank_0_restores_every_rank():
    r, n = hvd.rank(), hvd.size()
    torch.manual_seed(50)
    model = mlp(50)
    opt = hvd.DistributedOptimizer(torch.optim.Adam(model.parameters(), lr=0.01,
                                                    betas=(0.8, 0.9)),
                                   named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    for step in range(3):
        x, y = global_batch(step, n, salt=13)
        opt.zero_grad()
        mse(model(my_rows(x, r)), my_rows(y, r)).backward()
        opt.step()
    tmpdir = hvd.broadcast_object(tempfile.mkdtemp(prefix="hvd-ckpt-") if r == 0 else None,
                                  root_rank=0)
    path = os.path.join(tmpdir, "checkpoint.pt")
    if r == 0:
        torch.save({"model": model.state_dict(), "optimizer": opt.state_dict()}, path)
    hvd.barrier()

    # Resume: fresh objects, deliberately different on every rank.
    model = mlp(60 + r)
    opt = hvd.DistributedOptimizer(torch.optim.Adam(model.parameters(), lr=0.5 + r),
                                   named_parameters=model.named_parameters())
    if r == 0:
        checkpoint = torch.load(path, map_location="cpu")
        model.load_state_dict(checkpoint["model"])
        opt.load_state_dict(checkpoint["optimizer"])
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(opt, root_rank=0)

    saved = torch.load(path, map_location="cpu")       # every rank checks against the file
    for k, v in model.state_dict().items():
        assert torch.equal(v, saved["model"][k]), k
    sd = opt.state_dict()
    assert sd["param_groups"][0]["lr"] == 0.01
    assert sd["param_groups"][0]["betas"] == (0.8, 0.9)
    assert isinstance(sd["param_groups"][0]["betas"], tuple)
    assert sorted(sd["state"]) == sorted(saved["optimizer"]["state"])
    for pid, st in saved["optimizer"]["state"].items():
        for key, value in st.items():
            assert torch.equal(sd["state"][pid][key], value), (pid, key)
    hvd.barrier()
    if r == 0:
        os.remove(path)
        os.rmdir(tmpdir)


def test_broadcast_object_any_type_and_size():
    r = hvd.rank()
    big = {"blob": bytes(range(256)) * 4096, "nested": [1, (2.5, "x")], "fn": lambda v: v + 1}
    got = hvd.broadcast_object(big if r == 0 else None, root_rank=0)
    assert got["blob"] == big["blob"] and got["nested"] == [1, (2.5, "x")]
    assert got["fn"](1) == 2
    root = hvd.size() - 1
    assert hvd.broadcast_object(f"from {r}", root_rank=root, name="str") == f"from {root}"


def test_allgather_object_in_rank_order_and_on_process_sets():
    r, n = hvd.rank(), hvd.size()
    objs = hvd.allgather_object({"rank": r, **({"extra": [r]} if r == 1 else {})})
    assert [o["rank"] for o in objs] == list(range(n))
    if n > 1:
        assert objs[1]["extra"] == [1]
    mixed = hvd.allgather_object(None if r % 2 else r * 10)
    assert mixed == [None if k % 2 else k * 10 for k in range(n)]
    evens = hvd.add_process_set(list(range(0, n, 2)))
    if r % 2 == 0:
        assert hvd.allgather_object(r, process_set=evens) == list(range(0, n, 2))
    hvd.remove_process_set(evens)


class Tied(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(5, 3)
        self.out = nn.Linear(3, 5, bias=False)
        self.out.weight = self.embed.weight


def test_merge_named_parameters_prefixes_and_sharing():
    a, b = nn.Linear(2, 3), nn.Linear(3, 1)
    merged = hvd.merge_named_parameters(a, b)
    assert [n for n, _ in merged] == ["model0.weight", "model0.bias", "model1.weight",
                                      "model1.bias"]
    assert merged[0][1] is a.weight
    named = hvd.merge_named_parameters(a.named_parameters(), b, prefixes=["enc", "dec."])
    assert [n for n, _ in named][::2] == ["enc.weight", "dec.weight"]
    shared = nn.Linear(2, 2)
    m1, m2 = nn.Sequential(shared, nn.Linear(2, 1)), nn.Sequential(shared, nn.Linear(2, 1))
    merged = hvd.merge_named_parameters([m1, m2])
    assert [n for n, _ in merged] == ["model0.0.weight", "model0.0.bias", "model0.1.weight",
                                      "model0.1.bias", "model1.1.weight", "model1.1.bias"]
    with pytest.raises(ValueError, match=r"duplicate names after prefixing: 'bias' "
                                         r"\(from models 0, 1\); 'weight'"):
        hvd.merge_named_parameters(a, b, prefixes=["", ""])
    with pytest.raises(ValueError, match="one string per model"):
        hvd.merge_named_parameters(a, b, prefixes=["x"])
    with pytest.raises(ValueError, match="yielded"):
        hvd.merge_named_parameters([a.weight])


def test_merge_state_dicts_broadcasts_both_models():
    r = hvd.rank()
    torch.manual_seed(70 + r)
    enc, dec, tied = nn.Linear(3, 3), nn.Linear(3, 3), Tied()   # same keys in enc and dec
    merged = hvd.merge_state_dicts(enc, dec.state_dict(), tied)
    assert sorted(merged) == ["model0.bias", "model0.weight", "model1.bias", "model1.weight",
                              "model2.embed.weight"]
    hvd.broadcast_parameters(merged, root_rank=0)
    torch.manual_seed(70)
    want_enc, want_dec, want_tied = nn.Linear(3, 3), nn.Linear(3, 3), Tied()
    assert torch.equal(enc.weight, want_enc.weight) and torch.equal(dec.bias, want_dec.bias)
    assert torch.equal(tied.out.weight, want_tied.embed.weight)
    with pytest.raises(ValueError, match="duplicate names"):
        hvd.merge_state_dicts(enc, dec, prefixes=["m", "m."])
