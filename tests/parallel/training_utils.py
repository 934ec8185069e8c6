"""Shared pieces of the training tests: deterministic models, data and a reference run.

The reference is one process training on the concatenation of every rank's
batch, which is what data-parallel training with averaged gradients must
reproduce when every rank holds an equal share.
"""

import torch
import torch.nn as nn
import torch.nn.functional as F

import hvdcompat as hvd

D_IN, HIDDEN, D_OUT = 8, 16, 4
PER_RANK = 6


def mlp(seed, d_in=D_IN, hidden=HIDDEN, d_out=D_OUT):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(d_in, hidden), nn.Tanh(), nn.Linear(hidden, d_out))


def global_batch(step, n_ranks, per_rank=PER_RANK, d_in=D_IN, d_out=D_OUT, salt=0):
    """The batch of every rank at `step`, concatenated in rank order (same on every rank)."""
    g = torch.Generator().manual_seed(10_000 * salt + step)
    x = torch.randn(n_ranks * per_rank, d_in, generator=g)
    y = torch.randn(n_ranks * per_rank, d_out, generator=g)
    return x, y


def my_rows(t, index, per_rank=PER_RANK):
    return t[index * per_rank:(index + 1) * per_rank]


def mse(out, y):
    return F.mse_loss(out, y)


def flat_params(*models):
    return torch.cat([p.detach().reshape(-1) for m in models for p in m.parameters()])


def max_abs_diff(a, b):
    return (a - b).abs().max().item()


def assert_same_on_every_rank(t, name, process_set=hvd.global_process_set):
    """Every member of the set holds exactly the same values."""
    lo = hvd.allreduce(t.detach().clone(), op=hvd.Min, name=f"{name}.min",
                       process_set=process_set)
    hi = hvd.allreduce(t.detach().clone(), op=hvd.Max, name=f"{name}.max",
                       process_set=process_set)
    assert torch.equal(lo, hi), f"{name} differs between ranks: max spread {(hi - lo).abs().max()}"


def report(label, value):
    if hvd.rank() == 0:
        print(f"\nMEASURED {label} on {hvd.size()} ranks: {value:.3e}", flush=True)
