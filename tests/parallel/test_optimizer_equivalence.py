"""DistributedOptimizer reproduces single-process training on the concatenated batch."""

import pytest
import torch
import torch.nn as nn

import hvdcompat as hvd
from training_utils import (
    assert_same_on_every_rank, flat_params, global_batch, max_abs_diff, mlp, mse, my_rows,
    report,
)

STEPS = 5
LR, MOMENTUM = 0.1, 0.9


def sgd(params):
    return torch.optim.SGD(params, lr=LR, momentum=MOMENTUM)


def reference_run(models, steps, passes=1, salt=0, forward=None):
    """One process over the concatenated batches; gradients of the mean loss per pass."""
    n = hvd.size()
    opt = sgd([p for m in models for p in m.parameters()])
    for step in range(steps):
        opt.zero_grad()
        for k in range(passes):
            x, y = global_batch(step * passes + k, n, salt=salt)
            forward(models, x, y).backward()
        opt.step()
    return flat_params(*models)


def distributed_run(models, opt, steps, passes=1, salt=0, forward=None):
    r, n = hvd.rank(), hvd.size()
    for step in range(steps):
        opt.zero_grad()
        for k in range(passes):
            x, y = global_batch(step * passes + k, n, salt=salt)
            forward(models, my_rows(x, r), my_rows(y, r)).backward()
        opt.step()
    return flat_params(*models)


def one_model_forward(models, x, y):
    return mse(models[0](x), y)


def test_single_model_matches_concatenated_batch():
    model, ref = mlp(1), mlp(1)
    opt = hvd.DistributedOptimizer(sgd(model.parameters()),
                                   named_parameters=model.named_parameters())
    got = distributed_run([model], opt, STEPS, forward=one_model_forward)
    want = reference_run([ref], STEPS, forward=one_model_forward)
    diff = max_abs_diff(got, want)
    report("single model max|param - reference|", diff)
    assert diff < 1e-5
    assert_same_on_every_rank(got, "single_model_params")


class Encoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 5)

    def forward(self, x):
        return torch.tanh(self.fc(x))


class Decoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(5, 4)   # same parameter names as Encoder: fc.weight, fc.bias

    def forward(self, z):
        return self.fc(z)


def encoder_decoder(seed):
    torch.manual_seed(seed)
    return Encoder(), Decoder()


def two_model_forward(models, x, y):
    enc, dec = models
    return mse(dec(enc(x)), y)


def test_two_models_merged_match_concatenated_batch():
    enc, dec = encoder_decoder(2)
    ref = encoder_decoder(2)
    opt = hvd.DistributedOptimizer(sgd(list(enc.parameters()) + list(dec.parameters())),
                                   named_parameters=hvd.merge_named_parameters(enc, dec))
    assert sorted(opt._parameter_names.values()) == [
        "model0.fc.bias", "model0.fc.weight", "model1.fc.bias", "model1.fc.weight"]
    got = distributed_run([enc, dec], opt, STEPS, salt=1, forward=two_model_forward)
    want = reference_run(list(ref), STEPS, salt=1, forward=two_model_forward)
    diff = max_abs_diff(got, want)
    report("two merged models max|param - reference|", diff)
    assert diff < 1e-5


def test_backward_passes_per_step_two_matches():
    model, ref = mlp(3), mlp(3)
    opt = hvd.DistributedOptimizer(sgd(model.parameters()),
                                   named_parameters=model.named_parameters(),
                                   backward_passes_per_step=2)
    got = distributed_run([model], opt, STEPS, passes=2, salt=2, forward=one_model_forward)
    want = reference_run([ref], STEPS, passes=2, salt=2, forward=one_model_forward)
    diff = max_abs_diff(got, want)
    report("backward_passes_per_step=2 max|param - reference|", diff)
    assert diff < 1e-5


@pytest.mark.parametrize("kwargs", [dict(gradient_predivide_factor=2.0), dict(groups=2),
                                    dict(num_groups=3), dict(groups="explicit")],
                         ids=["predivide", "groups2", "num_groups3", "groups_list"])
def test_variants_match_concatenated_batch(kwargs):
    model, ref = mlp(4), mlp(4)
    if kwargs.get("groups") == "explicit":
        kwargs = dict(groups=[[model[0].weight, model[2].weight], [model[0].bias]])
    with pytest.warns(DeprecationWarning) if "num_groups" in kwargs else _nothing():
        opt = hvd.DistributedOptimizer(sgd(model.parameters()),
                                       named_parameters=model.named_parameters(), **kwargs)
    got = distributed_run([model], opt, 3, salt=3, forward=one_model_forward)
    want = reference_run([ref], 3, salt=3, forward=one_model_forward)
    assert max_abs_diff(got, want) < 1e-5


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def test_sum_op_adds_gradients():
    r, n = hvd.rank(), hvd.size()
    w = nn.Parameter(torch.zeros(3))
    opt = hvd.DistributedOptimizer(torch.optim.SGD([w], lr=1.0), named_parameters=[("w", w)],
                                   op=hvd.Sum)
    (w * (r + 1)).sum().backward()
    opt.synchronize()
    expected = n * (n + 1) / 2
    assert torch.equal(w.grad, torch.full((3,), expected))
    with opt.skip_synchronize():
        opt.step()
    assert torch.equal(w.detach(), torch.full((3,), -expected))


@pytest.mark.parametrize("name,compression,tol", [("none", hvd.Compression.none, 1e-5),
                                                   ("fp16", hvd.Compression.fp16, 2e-3),
                                                   ("bf16", hvd.Compression.bf16, 2e-2)])
def test_compression_matches_within_wire_precision(name, compression, tol):
    model, ref = mlp(5), mlp(5)
    opt = hvd.DistributedOptimizer(sgd(model.parameters()),
                                   named_parameters=model.named_parameters(),
                                   compression=compression)
    got = distributed_run([model], opt, 3, salt=4, forward=one_model_forward)
    want = reference_run([ref], 3, salt=4, forward=one_model_forward)
    diff = max_abs_diff(got, want)
    report(f"compression={name} max|param - reference|", diff)
    assert diff < tol
    assert all(p.grad.dtype == torch.float32 for p in model.parameters())
    assert_same_on_every_rank(got, f"compressed_{name}")


def test_two_optimizers_with_equal_names_never_collide():
    """GAN style: generator and discriminator share parameter names and backward passes."""
    r, n = hvd.rank(), hvd.size()
    gen, disc = mlp(6, 4, 8, 8), mlp(7, 8, 8, 1)
    ref_gen, ref_disc = mlp(6, 4, 8, 8), mlp(7, 8, 8, 1)
    opt_g = hvd.DistributedOptimizer(sgd(gen.parameters()),
                                     named_parameters=gen.named_parameters())
    opt_d = hvd.DistributedOptimizer(sgd(disc.parameters()),
                                     named_parameters=disc.named_parameters())
    assert set(opt_g._parameter_names.values()) == set(opt_d._parameter_names.values())
    ref_g, ref_d = sgd(ref_gen.parameters()), sgd(ref_disc.parameters())

    def losses(g, d, z, real):
        fake = g(z)
        d_loss = (d(fake.detach()) - d(real)).mean()
        g_loss = -d(fake).mean()   # backward reaches both models' parameters
        return d_loss, g_loss

    for step in range(3):
        gz = torch.Generator().manual_seed(500 + step)
        z, real = torch.randn(n * 4, 4, generator=gz), torch.randn(n * 4, 8, generator=gz)
        d_loss, g_loss = losses(gen, disc, z[r * 4:(r + 1) * 4], real[r * 4:(r + 1) * 4])
        opt_d.zero_grad()
        opt_g.zero_grad()
        (d_loss + g_loss).backward()   # both optimizers' hooks fire in one backward
        opt_d.step()
        opt_g.step()
        rd_loss, rg_loss = losses(ref_gen, ref_disc, z, real)
        ref_d.zero_grad()
        ref_g.zero_grad()
        (rd_loss + rg_loss).backward()
        ref_d.step()
        ref_g.step()
    diff = max_abs_diff(flat_params(gen, disc), flat_params(ref_gen, ref_disc))
    report("two optimizers (GAN) max|param - reference|", diff)
    assert diff < 1e-5
