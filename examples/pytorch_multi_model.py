"""Two models, one DistributedOptimizer: an encoder and a decoder trained together.

    mpirun --allow-run-as-root -np 2 python examples/pytorch_multi_model.py --epochs 5

A Horovod script migrated to hvdcompat, step by step (the import is the only
change a Horovod script needs; merge_named_parameters / merge_state_dicts
replace merging the models' parameters by hand):

1. ``import hvdcompat as hvd`` and ``hvd.init()``;
2. one device per process (``torch.cuda.set_device(hvd.local_rank())`` on GPUs);
3. learning rate scaled by ``hvd.size()``;
4. both models' parameters in one optimizer, wrapped by
   ``hvd.DistributedOptimizer`` with ``hvd.merge_named_parameters(encoder, decoder)``;
5. rank 0 resumes from its checkpoint (``map_location='cpu'``), then everyone
   starts from rank 0's state: ``broadcast_parameters(merge_state_dicts(...))``
   and ``broadcast_optimizer_state``;
6. each rank reads its shard of the data through ``DistributedSampler``;
7. only rank 0 logs and writes checkpoints.

Run it again with the same ``--checkpoint-dir`` and it resumes where it stopped.
"""

import argparse
import os

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

import hvdcompat as hvd


class Encoder(nn.Module):
    def __init__(self, d_in, d_code):
        super().__init__()
        self.fc1 = nn.Linear(d_in, 64)
        self.fc2 = nn.Linear(64, d_code)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


class Decoder(nn.Module):
    def __init__(self, d_code, d_out):
        super().__init__()
        self.fc1 = nn.Linear(d_code, 64)   # the same parameter names as Encoder's
        self.fc2 = nn.Linear(64, d_out)

    def forward(self, z):
        return self.fc2(torch.relu(self.fc1(z)))


def make_dataset(samples, d_in, d_code):
    """Data on a low-dimensional subspace, so a narrow code can reconstruct it."""
    g = torch.Generator().manual_seed(1234)    # the same dataset on every rank
    basis = torch.randn(d_code, d_in, generator=g)
    codes = torch.randn(samples, d_code, generator=g)
    x = codes @ basis + 0.05 * torch.randn(samples, d_in, generator=g)
    return TensorDataset(x)


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=0.005, help="per-rank learning rate")
    parser.add_argument("--samples", type=int, default=2048)
    parser.add_argument("--checkpoint-dir", default="./checkpoints")
    parser.add_argument("--fp16-allreduce", action="store_true",
                        help="send gradients as float16")
    return parser.parse_args()


def main():
    args = parse_args()
    hvd.init()
    if torch.cuda.is_available():
        torch.cuda.set_device(hvd.local_rank())
        device = torch.device("cuda", hvd.local_rank())
    else:
        device = torch.device("cpu")
    torch.manual_seed(42)

    d_in, d_code = 32, 4
    encoder, decoder = Encoder(d_in, d_code).to(device), Decoder(d_code, d_in).to(device)
    params = list(encoder.parameters()) + list(decoder.parameters())
    optimizer = torch.optim.SGD(params, lr=args.lr * hvd.size(), momentum=0.9)
    optimizer = hvd.DistributedOptimizer(
        optimizer, named_parameters=hvd.merge_named_parameters(encoder, decoder),
        compression=hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none)

    path = os.path.join(args.checkpoint_dir, "checkpoint.pt")
    start_epoch = 0
    if hvd.rank() == 0 and os.path.exists(path):
        checkpoint = torch.load(path, map_location="cpu")
        encoder.load_state_dict(checkpoint["encoder"])
        decoder.load_state_dict(checkpoint["decoder"])
        optimizer.load_state_dict(checkpoint["optimizer"])
        start_epoch = checkpoint["epoch"] + 1
        print(f"resumed from {path} at epoch {start_epoch}", flush=True)
    start_epoch = hvd.broadcast_object(start_epoch, root_rank=0, name="start_epoch")
    hvd.broadcast_parameters(hvd.merge_state_dicts(encoder, decoder), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)

    dataset = make_dataset(args.samples, d_in, d_code)
    sampler = DistributedSampler(dataset, num_replicas=hvd.size(), rank=hvd.rank(), seed=0)
    loader = DataLoader(dataset, batch_size=args.batch_size, sampler=sampler)

    for epoch in range(start_epoch, args.epochs):
        sampler.set_epoch(epoch)
        encoder.train()
        decoder.train()
        total, batches = 0.0, 0
        for (x,) in loader:
            x = x.to(device)
            optimizer.zero_grad()
            loss = F.mse_loss(decoder(encoder(x)), x)
            loss.backward()
            optimizer.step()
            total += loss.item()
            batches += 1
        epoch_loss = hvd.allreduce(torch.tensor(total / max(batches, 1)),
                                   name="epoch_loss").item()
        if hvd.rank() == 0:
            print(f"epoch {epoch} loss {epoch_loss:.5f}", flush=True)
            os.makedirs(args.checkpoint_dir, exist_ok=True)
            state = {"epoch": epoch, "encoder": encoder.state_dict(),
                     "decoder": decoder.state_dict(), "optimizer": optimizer.state_dict()}
            torch.save(state, path + ".tmp")
            os.replace(path + ".tmp", path)    # never leave a half-written checkpoint
    if hvd.rank() == 0:
        print("done", flush=True)


if __name__ == "__main__":
    main()
