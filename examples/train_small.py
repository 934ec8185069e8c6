"""A small data-parallel training run: every rank trains on its shard, gradients are averaged.

    mpirun --allow-run-as-root -np 2 python examples/train_small.py   # the flag: as root only

Uses only hvdcompat's collectives (broadcast to start from the same weights,
async in-place allreduce of every gradient, a final allreduce of the loss).
"""

import argparse

import torch
import torch.nn as nn

import hvdcompat as hvd


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--lr", type=float, default=0.01)
    args = parser.parse_args()

    hvd.init()
    torch.manual_seed(1234)
    # The same synthetic regression problem on every rank; each rank draws its own batches.
    true_w = torch.randn(32, 1)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 1))
    torch.manual_seed(1000 + hvd.rank())
    for name, p in model.state_dict().items():
        hvd.broadcast_(p, root_rank=0, name=f"init.{name}")
    opt = torch.optim.SGD(model.parameters(), lr=args.lr * hvd.size(), momentum=0.9)

    for step in range(1, args.steps + 1):
        x = torch.randn(args.batch_size, 32)
        y = x @ true_w + 0.01 * torch.randn(args.batch_size, 1)
        opt.zero_grad()
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        handles = [hvd.allreduce_async_(p.grad, name=f"grad.{n}")
                   for n, p in model.named_parameters()]
        for h in handles:
            hvd.synchronize(h)
        opt.step()
        mean_loss = hvd.allreduce(loss.detach(), name="loss").item()
        if hvd.rank() == 0 and (step % 10 == 0 or step == 1):
            print(f"step {step:4d}  loss {mean_loss:.4f}  (ranks: {hvd.size()})", flush=True)

    # Every rank ends with identical weights.
    flat = torch.cat([p.detach().flatten() for p in model.parameters()])
    spread = (hvd.allreduce(flat, op=hvd.Max, name="wmax") - hvd.allreduce(flat, op=hvd.Min,
                                                                          name="wmin")).abs().max()
    if hvd.rank() == 0:
        print(f"done: final loss {mean_loss:.4f}; max weight difference across ranks {spread:.2e}")
    hvd.shutdown()


if __name__ == "__main__":
    main()
