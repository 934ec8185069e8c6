"""DistributedOptimizer: the API around the math (errors, synchronization, names, process sets)."""

import gc
import itertools
import os
import weakref
import warnings

os.environ.setdefault("HOROVOD_DYNAMIC_PROCESS_SETS", "1")  # read at hvd.init()

import pytest  # noqa: E402
import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import hvdcompat as hvd  # noqa: E402
from training_utils import (  # noqa: E402
    assert_same_on_every_rank, flat_params, global_batch, mlp, mse, my_rows,
)


def sgd(params, **kw):
    return torch.optim.SGD(params, lr=kw.pop("lr", 0.1), **kw)


def test_result_is_an_instance_of_the_wrapped_class_and_state_dict_round_trips():
    model = mlp(10)
    base = torch.optim.Adam(model.parameters(), lr=0.01, betas=(0.8, 0.9))
    opt = hvd.DistributedOptimizer(base, named_parameters=model.named_parameters())
    assert isinstance(opt, torch.optim.Adam) and type(opt).__name__ == "Adam"
    assert type(opt).__bases__ == (torch.optim.Adam,)   # as Horovod: the user's class only
    assert opt.param_groups[0] is base.param_groups[0]
    assert opt.defaults["betas"] == (0.8, 0.9)
    x, y = global_batch(0, hvd.size())
    mse(model(my_rows(x, hvd.rank())), my_rows(y, hvd.rank())).backward()
    opt.step()
    sd = opt.state_dict()
    fresh = hvd.DistributedOptimizer(torch.optim.Adam(model.parameters(), lr=0.5),
                                     named_parameters=model.named_parameters())
    fresh.load_state_dict(sd)
    assert fresh.param_groups[0]["lr"] == 0.01
    for p in model.parameters():
        assert torch.equal(fresh.state[p]["exp_avg"], opt.state[p]["exp_avg"])


def test_state_loaded_before_wrapping_is_kept():
    model = mlp(11)
    base = sgd(model.parameters(), momentum=0.9)
    for p in model.parameters():
        base.state[p]["momentum_buffer"] = torch.ones_like(p)
    opt = hvd.DistributedOptimizer(base, named_parameters=model.named_parameters())
    assert all(torch.equal(opt.state[p]["momentum_buffer"], torch.ones_like(p))
               for p in model.parameters())


def test_auto_names_are_positional_and_equal_on_every_rank():
    model = mlp(12)
    groups = [{"params": list(model[0].parameters())},
              {"params": list(model[2].parameters()), "lr": 0.01}]
    opt = hvd.DistributedOptimizer(sgd(groups))
    names = sorted(opt._parameter_names.values())
    assert names == ["allreduce.noname.0.0", "allreduce.noname.0.1", "allreduce.noname.1.0",
                     "allreduce.noname.1.1"]
    assert all(other == names for other in hvd.allgather_object(names))


def test_missing_named_parameter_is_listed_with_a_hint():
    model = mlp(13)
    named = list(model.named_parameters())[:1]
    with pytest.raises(ValueError) as info:
        hvd.DistributedOptimizer(sgd(model.parameters()), named_parameters=named)
    msg = str(info.value)
    assert "named_parameters was specified, but one or more model parameters were not named" in msg
    assert "3 parameter(s) have no name" in msg
    assert "param_groups[0]['params'][1]: shape [16]" in msg
    assert "param_groups[0]['params'][2]: shape [4, 16]" in msg
    assert "hvd.merge_named_parameters(model1, model2" in msg


def test_second_model_forgotten_is_reported():
    enc, dec = mlp(14), mlp(15, 4, 3, 2)
    opt = sgd(list(enc.parameters()) + list(dec.parameters()))
    with pytest.raises(ValueError, match=r"4 parameter\(s\) have no name.*\n.*"
                                         r"param_groups\[0\]\['params'\]\[4\]: shape \[3, 4\]"):
        hvd.DistributedOptimizer(opt, named_parameters=enc.named_parameters())
    opt = hvd.DistributedOptimizer(opt, named_parameters=hvd.merge_named_parameters(enc, dec))
    assert len(opt._parameter_names) == 8


def test_duplicate_names_raise():
    c1, c2 = nn.Conv2d(1, 2, 3), nn.Conv2d(2, 3, 3)
    opt = sgd(itertools.chain(c1.parameters(), c2.parameters()))
    with pytest.raises(ValueError, match="Parameter names in named_parameters must be unique. "
                                         "Found duplicates: bias, weight"):
        hvd.DistributedOptimizer(opt, named_parameters=itertools.chain(c1.named_parameters(),
                                                                       c2.named_parameters()))


@pytest.mark.parametrize("kwargs,exc,text", [
    (dict(backward_passes_per_step=0), ValueError, "backward_passes_per_step must be > 0"),
    (dict(op=hvd.Sum, gradient_predivide_factor=2.0), ValueError,
     "gradient_predivide_factor not supported with op != Average"),
    (dict(groups=-1), ValueError, "groups should be a non-negative integer"),
    (dict(groups=[[1.0]]), ValueError, "groups must consist of torch.Tensor."),
    (dict(named_parameters=[["w", None]]), ValueError, "should be a sequence of tuples"),
])
def test_bad_arguments(kwargs, exc, text):
    model = mlp(16)
    with pytest.raises(exc, match=text):
        hvd.DistributedOptimizer(sgd(model.parameters()), **kwargs)


def test_double_wrapping_refused_also_for_adasum():
    model = mlp(17)
    for op in (hvd.Average, hvd.Adasum):
        opt = hvd.DistributedOptimizer(sgd(model.parameters()), op=op)
        assert isinstance(opt, torch.optim.SGD)
        with pytest.raises(ValueError, match="already a DistributedOptimizer"):
            hvd.DistributedOptimizer(opt)


def _heads(seed):
    torch.manual_seed(seed)
    return nn.ModuleDict(dict(trunk=nn.Linear(8, 6), a=nn.Linear(6, 4), b=nn.Linear(6, 4)))


def _head_loss(modules, k, x, y):
    """Rank 0's loss uses head a, every other rank's uses head b."""
    head = modules["a"] if k == 0 else modules["b"]
    return mse(head(modules["trunk"](my_rows(x, k))), my_rows(y, k))


def test_unused_parameters_contribute_zeros_and_nobody_hangs():
    r, n = hvd.rank(), hvd.size()
    modules = _heads(18)
    opt = hvd.DistributedOptimizer(sgd(modules.parameters()),
                                   named_parameters=modules.named_parameters())
    x, y = global_batch(0, n)
    _head_loss(modules, r, x, y).backward()
    opt.synchronize()
    # Expected: the mean over ranks of each rank's local gradient, zero where unused.
    ref = _heads(18)
    expected = {name: torch.zeros_like(p) for name, p in ref.named_parameters()}
    for k in range(n):
        ref.zero_grad()
        _head_loss(ref, k, x, y).backward()
        for name, p in ref.named_parameters():
            if p.grad is not None:
                expected[name] += p.grad / n
    for name, p in modules.named_parameters():
        torch.testing.assert_close(p.grad, expected[name])
    with opt.skip_synchronize():
        opt.step()
    assert_same_on_every_rank(flat_params(modules), "unused_params")


def test_too_many_backward_passes_is_a_clear_error():
    model = mlp(19)
    opt = hvd.DistributedOptimizer(sgd(model.parameters()),
                                   named_parameters=model.named_parameters())
    x, y = global_batch(0, hvd.size())
    mse(model(x), y).backward()
    with pytest.raises(AssertionError, match="more than backward_passes_per_step times"):
        mse(model(x), y).backward()
    opt.synchronize()
    opt.zero_grad()
    mse(model(x), y).backward()
    opt.step()


def test_zero_grad_with_pending_work_waits_instead_of_asserting():
    r, n = hvd.rank(), hvd.size()
    model, ref = mlp(20), mlp(20)
    opt = hvd.DistributedOptimizer(sgd(model.parameters(), momentum=0.9),
                                   named_parameters=model.named_parameters())
    ref_opt = sgd(ref.parameters(), momentum=0.9)
    x, y = global_batch(0, n, salt=7)
    mse(model(my_rows(x, r)), my_rows(y, r)).backward()   # allreduces now in flight
    assert opt._handles
    opt.zero_grad()                                       # Horovod asserts here
    assert not opt._handles and all(p.grad is None for p in model.parameters())
    for step in (1, 2):
        x, y = global_batch(step, n, salt=7)
        opt.zero_grad()
        mse(model(my_rows(x, r)), my_rows(y, r)).backward()
        opt.step()
        ref_opt.zero_grad()
        mse(ref(x), y).backward()
        ref_opt.step()
    assert (flat_params(model) - flat_params(ref)).abs().max() < 1e-5


def test_zero_grad_with_partial_accumulation_resets_the_count():
    """A pass before zero_grad() is forgotten: the next allreduce waits for 2 fresh passes."""
    r, n = hvd.rank(), hvd.size()
    model, ref = mlp(21), mlp(21)
    opt = hvd.DistributedOptimizer(sgd(model.parameters()),
                                   named_parameters=model.named_parameters(),
                                   backward_passes_per_step=2)
    x, y = global_batch(0, n, salt=5)
    mse(model(my_rows(x, r)), my_rows(y, r)).backward()
    assert not opt._handles                               # 1 of 2 passes: nothing sent yet
    opt.zero_grad()
    assert all(p.grad is None for p in model.parameters())
    assert set(opt._allreduce_delay.values()) == {2}
    batches = [global_batch(step, n, salt=5) for step in (1, 2)]
    for i, (x, y) in enumerate(batches):
        mse(model(my_rows(x, r)), my_rows(y, r)).backward()
        # The count restarted at 2: the first fresh pass sends nothing, the second sends all.
        assert len(opt._handles) == (0 if i == 0 else len(list(model.parameters()))), i
    opt.step()
    # Reference: one SGD step on the sum over the 2 fresh passes of the mean over ranks of
    # each rank's gradient (Horovod sums accumulated passes; the pass before zero_grad is gone).
    ref.zero_grad()
    for x, y in batches:
        sum(mse(ref(my_rows(x, k)), my_rows(y, k)) for k in range(n)).div(n).backward()
    with torch.no_grad():
        for p in ref.parameters():
            p -= 0.1 * p.grad
    assert (flat_params(model) - flat_params(ref)).abs().max() < 1e-5


def test_synchronize_then_step_warns_exactly_once():
    model = mlp(22)
    opt = hvd.DistributedOptimizer(sgd(model.parameters()),
                                   named_parameters=model.named_parameters())
    x, y = global_batch(0, hvd.size())
    mse(model(x), y).backward()
    opt.synchronize()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        opt.step()
    texts = [str(w.message) for w in caught]
    assert len(texts) == 1 and "optimizer.step() called without optimizer.skip_synchronize()" \
        in texts[0]


def test_gradient_clipping_between_synchronize_and_step():
    r = hvd.rank()
    model = mlp(23)
    opt = hvd.DistributedOptimizer(sgd(model.parameters()),
                                   named_parameters=model.named_parameters())
    x, y = global_batch(0, hvd.size())
    (100 * mse(model(my_rows(x, r)), my_rows(y, r))).backward()
    opt.synchronize()
    before = torch.cat([p.grad.reshape(-1) for p in model.parameters()]).norm()
    nn.utils.clip_grad_norm_(model.parameters(), 0.1)
    after = torch.cat([p.grad.reshape(-1) for p in model.parameters()]).norm()
    assert after < before and after <= 0.1 + 1e-6
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with opt.skip_synchronize():
            opt.step()
    assert_same_on_every_rank(flat_params(model), "clipped_params")


def test_later_optimizers_prefix_their_operation_names():
    a, b = mlp(24), mlp(24)
    opt_a = hvd.DistributedOptimizer(sgd(a.parameters()), named_parameters=a.named_parameters())
    opt_b = hvd.DistributedOptimizer(sgd(b.parameters()), named_parameters=b.named_parameters())
    # Horovod's names stay in _parameter_names; only the wire names differ.
    assert opt_a._parameter_names[a[0].weight] == opt_b._parameter_names[b[0].weight] == "0.weight"
    assert opt_a._engine_name(a[0].weight) != opt_b._engine_name(b[0].weight)
    assert opt_b._engine_name(b[0].weight).endswith(".0.weight")


def test_dropped_optimizer_stops_reducing():
    """A dropped optimizer's hooks stay on the parameters but send nothing: the new one's
    allreduces are the only ones, and the training matches the full-batch reference."""
    r, n = hvd.rank(), hvd.size()
    model, ref = mlp(25), mlp(25)
    opt = hvd.DistributedOptimizer(sgd(model.parameters()),
                                   named_parameters=model.named_parameters())
    dropped = weakref.ref(opt)
    del opt
    gc.collect()
    assert dropped() is None
    opt = hvd.DistributedOptimizer(sgd(model.parameters()),
                                   named_parameters=model.named_parameters())
    cls = type(opt)
    launches = []
    real_launch = cls._launch

    def counting_launch(self, p):
        launches.append(self)
        return real_launch(self, p)

    cls._launch = counting_launch
    ref_opt = sgd(ref.parameters())
    try:
        for step in range(2):
            x, y = global_batch(step, n, salt=11)
            opt.zero_grad()
            mse(model(my_rows(x, r)), my_rows(y, r)).backward()
            opt.step()
            ref_opt.zero_grad()
            mse(ref(x), y).backward()
            ref_opt.step()
    finally:
        cls._launch = real_launch
    n_params = len(list(model.parameters()))
    assert len(launches) == 2 * n_params and all(o is opt for o in launches), len(launches)
    assert (flat_params(model) - flat_params(ref)).abs().max() < 1e-5
    assert_same_on_every_rank(flat_params(model), "after_dropped_optimizer")


def test_process_set_members_average_and_others_train_locally():
    r, n = hvd.rank(), hvd.size()
    evens = hvd.add_process_set(list(range(0, n, 2)))
    model = mlp(26)
    opt = hvd.DistributedOptimizer(sgd(model.parameters()),
                                   named_parameters=model.named_parameters(), process_set=evens)
    x, y = global_batch(0, n, salt=9)
    local_ref = mlp(26)
    ref_opt = sgd(local_ref.parameters())
    if r % 2 == 0:
        members = list(range(0, n, 2))
        rows = torch.cat([my_rows(x, k) for k in members]), torch.cat([my_rows(y, k)
                                                                        for k in members])
    else:
        rows = my_rows(x, r), my_rows(y, r)
    opt.zero_grad()
    mse(model(my_rows(x, r)), my_rows(y, r)).backward()
    opt.step()
    ref_opt.zero_grad()
    mse(local_ref(rows[0]), rows[1]).backward()
    ref_opt.step()
    assert (flat_params(model) - flat_params(local_ref)).abs().max() < 1e-5
    if r % 2 == 0:
        assert_same_on_every_rank(flat_params(model), "even_params", process_set=evens)
    hvd.remove_process_set(evens)


def test_sparse_embedding_gradients_both_ways():
    """nn.Embedding(sparse=True): allgather path and sparse_as_dense; lengths differ by rank."""
    r, n = hvd.rank(), hvd.size()
    for sparse_as_dense in (False, True):
        torch.manual_seed(27)
        emb, ref = nn.Embedding(10, 3, sparse=True), nn.Embedding(10, 3, sparse=True)
        ref.load_state_dict(emb.state_dict())
        opt = hvd.DistributedOptimizer(torch.optim.SparseAdam(emb.parameters(), lr=0.1),
                                       named_parameters=emb.named_parameters(),
                                       sparse_as_dense=sparse_as_dense)
        ref_opt = torch.optim.SparseAdam(ref.parameters(), lr=0.1)
        for step in range(3):
            g = torch.Generator().manual_seed(40 + step)
            ids = [torch.randint(0, 10, (k + 2,), generator=g) for k in range(n)]
            opt.zero_grad()
            emb(ids[r]).pow(2).sum().backward()
            assert emb.weight.grad.is_sparse
            opt.step()
            assert emb.weight.grad.is_sparse
            ref_opt.zero_grad()
            (sum(ref(i).pow(2).sum() for i in ids) / n).backward()
            ref_opt.step()
        assert (emb.weight - ref.weight).abs().max() < 1e-5, sparse_as_dense
        assert_same_on_every_rank(emb.weight.detach(), f"embedding_{sparse_as_dense}")


def test_a_reused_process_set_id_does_not_shift_operation_names():
    """Names count optimizers per member-rank set, so an id recycled for other ranks is safe."""
    r, n = hvd.rank(), hvd.size()

    def one_step(ps):
        model = mlp(28)
        opt = hvd.DistributedOptimizer(sgd(model.parameters()),
                                       named_parameters=model.named_parameters(), process_set=ps)
        x, y = global_batch(0, n)
        opt.zero_grad()
        mse(model(my_rows(x, r)), my_rows(y, r)).backward()
        opt.step()
        return opt

    first = hvd.add_process_set(list(range(0, n - 1)))
    first_id = first.process_set_id
    one_step(first)
    hvd.remove_process_set(first)
    second = hvd.add_process_set(list(range(1, n)))
    assert second.process_set_id == first_id
    opt = one_step(second)
    if r >= 1 and n > 2:
        assert opt._name_prefix == ""
    hvd.remove_process_set(second)


def test_super_step_is_the_wrapped_classes_unsynchronized_step():
    """Horovod idiom: super(type(opt), opt).step() steps locally without communicating."""
    r = hvd.rank()
    w = nn.Parameter(torch.zeros(2))
    opt = hvd.DistributedOptimizer(torch.optim.SGD([w], lr=1.0), named_parameters=[("w", w)])
    w.grad = torch.full((2,), float(r + 1))
    super(type(opt), opt).step()
    assert torch.equal(w.detach(), torch.full((2,), -float(r + 1)))
