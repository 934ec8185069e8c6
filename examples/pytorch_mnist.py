"""MNIST-shaped training on generated data: a Horovod script, with one changed import.

    hvdcompatrun -np 2 python examples/pytorch_mnist.py
    mpirun --allow-run-as-root -np 2 python examples/pytorch_mnist.py   # the flag: as root only

The data set is generated (28x28 grey images of ten noisy class patterns), so
nothing is downloaded and every rank builds the same set from the same seed;
a DistributedSampler gives each rank its own shard. Rank 0 alone logs and
writes a checkpoint after every epoch; a rerun with the same --checkpoint-dir
resumes from the last one (rank 0 loads it with map_location='cpu', which
keeps every rank from piling onto GPU 0, and the state is then broadcast).
"""

import argparse
import glob
import os
import re

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler

import hvdcompat as hvd  # was: import horovod.torch as hvd


class GeneratedDigits(Dataset):
    """Ten smooth random 28x28 patterns, one per class, plus per-image noise."""

    def __init__(self, size, seed, noise=0.8):
        g = torch.Generator().manual_seed(1000)  # the same patterns for train and test
        coarse = torch.rand(10, 1, 7, 7, generator=g)
        patterns = F.interpolate(coarse, size=(28, 28), mode="bilinear", align_corners=False)
        g.manual_seed(seed)
        self.targets = torch.randint(0, 10, (size,), generator=g)
        images = patterns[self.targets] + noise * torch.randn(size, 1, 28, 28, generator=g)
        self.images = (images - images.mean()) / images.std()

    def __len__(self):
        return len(self.targets)

    def __getitem__(self, i):
        return self.images[i], self.targets[i]


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 10, kernel_size=5)
        self.conv2 = nn.Conv2d(10, 20, kernel_size=5)
        self.conv2_drop = nn.Dropout2d()
        self.fc1 = nn.Linear(320, 50)
        self.fc2 = nn.Linear(50, 10)

    def forward(self, x):
        x = F.relu(F.max_pool2d(self.conv1(x), 2))
        x = F.relu(F.max_pool2d(self.conv2_drop(self.conv2(x)), 2))
        x = F.dropout(F.relu(self.fc1(x.flatten(1))), training=self.training)
        return F.log_softmax(self.fc2(x), dim=1)


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch-size", type=int, default=64, help="per rank")
    p.add_argument("--test-batch-size", type=int, default=1000)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--lr", type=float, default=0.01, help="for one rank; scaled by the size")
    p.add_argument("--momentum", type=float, default=0.5)
    p.add_argument("--train-size", type=int, default=6000)
    p.add_argument("--test-size", type=int, default=1000)
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--log-interval", type=int, default=10, help="batches between log lines")
    p.add_argument("--checkpoint-dir", default="./checkpoints-mnist")
    p.add_argument("--fp16-allreduce", action="store_true")
    p.add_argument("--no-cuda", action="store_true")
    return p.parse_args()


def metric_average(value, name):
    """The mean of a scalar over all ranks (every rank must call it)."""
    return hvd.allreduce(torch.tensor(float(value)), name=name).item()


def last_checkpoint(directory):
    """(epoch, path) of the newest checkpoint in ``directory``, or (0, None)."""
    found = []
    for path in glob.glob(os.path.join(directory, "checkpoint-*.pt")):
        m = re.search(r"checkpoint-(\d+)\.pt$", path)
        if m:
            found.append((int(m.group(1)), path))
    return max(found) if found else (0, None)


def main():
    args = parse_args()
    hvd.init()
    torch.manual_seed(args.seed)
    cuda = torch.cuda.is_available() and not args.no_cuda
    if cuda:
        torch.cuda.set_device(hvd.local_rank())  # one GPU per rank
        torch.cuda.manual_seed(args.seed)
    else:
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // hvd.local_size()))
    device = torch.device("cuda" if cuda else "cpu")

    def log(msg):
        if hvd.rank() == 0:
            print(msg, flush=True)

    train_set = GeneratedDigits(args.train_size, seed=args.seed)
    test_set = GeneratedDigits(args.test_size, seed=args.seed + 1)
    train_sampler = DistributedSampler(train_set, num_replicas=hvd.size(), rank=hvd.rank())
    test_sampler = DistributedSampler(test_set, num_replicas=hvd.size(), rank=hvd.rank(),
                                      shuffle=False)
    train_loader = DataLoader(train_set, batch_size=args.batch_size, sampler=train_sampler)
    test_loader = DataLoader(test_set, batch_size=args.test_batch_size, sampler=test_sampler)

    model = Net().to(device)
    # More ranks means a larger effective batch: scale the learning rate with it.
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr * hvd.size(),
                                momentum=args.momentum)
    compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                         compression=compression)

    # Rank 0 decides where to resume; the others learn it from the broadcast.
    resume_epoch, path = last_checkpoint(args.checkpoint_dir) if hvd.rank() == 0 else (0, None)
    resume_epoch = int(hvd.broadcast(torch.tensor(resume_epoch), root_rank=0,
                                     name="resume_epoch").item())
    if resume_epoch > 0 and hvd.rank() == 0:
        state = torch.load(path, map_location="cpu")
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        log(f"Resuming from {path} (epoch {resume_epoch} done)")
    # Everyone starts from rank 0's weights and optimizer state.
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)

    log(f"Training on {hvd.size()} rank(s): {len(train_set)} generated images, "
        f"{len(train_loader)} batches of {args.batch_size} per rank per epoch")
    first_loss = None
    for epoch in range(resume_epoch + 1, args.epochs + 1):
        model.train()
        train_sampler.set_epoch(epoch)  # a different shuffle every epoch, the same on all ranks
        running, seen = 0.0, 0
        for batch, (data, target) in enumerate(train_loader):
            data, target = data.to(device), target.to(device)
            optimizer.zero_grad()
            loss = F.nll_loss(model(data), target)
            loss.backward()
            optimizer.step()
            running += loss.item() * len(data)
            seen += len(data)
            if batch % args.log_interval == 0:
                log(f"Train epoch {epoch} [{batch * len(data) * hvd.size():5d}/"
                    f"{len(train_set)} ({100.0 * batch / len(train_loader):3.0f}%)]  "
                    f"loss {loss.item():.4f}")
        train_loss = metric_average(running / max(seen, 1), "train_loss")
        if first_loss is None:
            first_loss = train_loss

        model.eval()
        test_loss, correct, count = 0.0, 0, 0
        with torch.no_grad():
            for data, target in test_loader:
                data, target = data.to(device), target.to(device)
                output = model(data)
                test_loss += F.nll_loss(output, target, reduction="sum").item()
                correct += (output.argmax(dim=1) == target).sum().item()
                count += len(data)
        test_loss = metric_average(test_loss / max(count, 1), "test_loss")
        accuracy = metric_average(correct / max(count, 1), "test_accuracy")
        log(f"Epoch {epoch}: train loss {train_loss:.4f}, test loss {test_loss:.4f}, "
            f"test accuracy {100 * accuracy:.1f}%")

        if hvd.rank() == 0:
            os.makedirs(args.checkpoint_dir, exist_ok=True)
            path = os.path.join(args.checkpoint_dir, f"checkpoint-{epoch}.pt")
            torch.save({"epoch": epoch, "model": model.state_dict(),
                        "optimizer": optimizer.state_dict()}, path)
            log(f"Saved {path}")

    if first_loss is None:
        log(f"Nothing to do: the checkpoints in {args.checkpoint_dir} already cover "
            f"{args.epochs} epoch(s). To train further, raise --epochs; to start fresh, "
            f"delete {args.checkpoint_dir} or pass another --checkpoint-dir.")
    else:
        log(f"Done: train loss went from {first_loss:.4f} (first epoch run) to "
            f"{train_loss:.4f} (epoch {args.epochs}).")
    hvd.shutdown()


if __name__ == "__main__":
    main()
