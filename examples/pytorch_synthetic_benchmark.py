"""Synthetic training benchmark: images (or samples) per second, per rank and in total.

    hvdcompatrun -np 2 python examples/pytorch_synthetic_benchmark.py
    mpirun -np 2 python examples/pytorch_synthetic_benchmark.py          # the same, plain MPI
    python examples/pytorch_synthetic_benchmark.py --no-hvd              # one-process baseline
    hvdcompatrun -np 2 python examples/pytorch_synthetic_benchmark.py --baseline-img-sec 41.5
    mpirun -np 2 python examples/pytorch_synthetic_benchmark.py --mpi4py-first

Every rank trains the chosen model on one fixed random batch (no data loading,
so the numbers measure compute plus gradient exchange). Spreads are
mean ± 1.96·std over the timed iterations. Give the --no-hvd result as
--baseline-img-sec to get the scaling efficiency: total / (ranks × baseline).
The models are built in (no torchvision): a ResNet-style CNN, an MLP with
large layers (communication-heavy) and a small transformer encoder.
--mpi4py-first starts MPI from mpi4py before hvdcompat is imported, so the
two import orders can be compared.
"""

import argparse
import math
import os
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

if "--mpi4py-first" in sys.argv:
    from mpi4py import MPI  # noqa: F401  (initialises MPI before hvdcompat is imported)

import hvdcompat as hvd


# ----------------------------------------------------------------------------- models

class BasicBlock(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.shortcut = nn.Sequential()
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False),
                                          nn.BatchNorm2d(cout))

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + self.shortcut(x))


class SmallResNet(nn.Module):
    """ResNet-18's shape at a quarter of its width: four stages of two blocks."""

    def __init__(self, num_classes=1000, width=16):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, width, 3, 1, 1, bias=False), nn.BatchNorm2d(width),
                                  nn.ReLU())
        layers, cin = [], width
        for i, mult in enumerate((1, 2, 4, 8)):
            cout = width * mult
            layers += [BasicBlock(cin, cout, 1 if i == 0 else 2), BasicBlock(cout, cout, 1)]
            cin = cout
        self.layers = nn.Sequential(*layers)
        self.fc = nn.Linear(cin, num_classes)

    def forward(self, x):
        x = self.layers(self.stem(x))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


class MLP(nn.Module):
    def __init__(self, in_features, num_classes=1000, hidden=2048):
        super().__init__()
        self.net = nn.Sequential(nn.Flatten(), nn.Linear(in_features, hidden), nn.ReLU(),
                                 nn.Linear(hidden, hidden), nn.ReLU(),
                                 nn.Linear(hidden, num_classes))

    def forward(self, x):
        return self.net(x)


class SmallTransformer(nn.Module):
    """A 2-layer encoder over token sequences, mean-pooled into a classifier."""

    def __init__(self, vocab=8000, d_model=128, heads=4, layers=2, seq_len=64, num_classes=10):
        super().__init__()
        self.embed = nn.Embedding(vocab, d_model)
        self.pos = nn.Parameter(torch.zeros(1, seq_len, d_model))
        layer = nn.TransformerEncoderLayer(d_model, heads, 4 * d_model, dropout=0.1,
                                           batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(d_model, num_classes)

    def forward(self, tokens):
        x = self.encoder(self.embed(tokens) + self.pos[:, :tokens.shape[1]])
        return self.head(x.mean(dim=1))


def build(args):
    """(model, inputs, targets, unit) for the chosen model."""
    n = args.batch_size
    if args.model == "resnet":
        model = SmallResNet()
        data = torch.randn(n, 3, args.image_size, args.image_size)
        target = torch.randint(0, 1000, (n,))
        unit = "img"
    elif args.model == "mlp":
        model = MLP(3 * args.image_size * args.image_size)
        data = torch.randn(n, 3, args.image_size, args.image_size)
        target = torch.randint(0, 1000, (n,))
        unit = "img"
    else:
        model = SmallTransformer(seq_len=args.seq_len)
        data = torch.randint(0, 8000, (n, args.seq_len))
        target = torch.randint(0, 10, (n,))
        unit = "samples"
    return model, data, target, unit


# ----------------------------------------------------------------------------- helpers

def mean_conf(values):
    """(mean, 1.96 * population std): the spread Horovod's benchmark reports."""
    m = sum(values) / len(values)
    return m, 1.96 * math.sqrt(sum((v - m) ** 2 for v in values) / len(values))


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", choices=("resnet", "mlp", "transformer"), default="resnet")
    p.add_argument("--batch-size", type=int, default=32, help="per rank")
    p.add_argument("--image-size", type=int, default=32, help="resnet/mlp input is 3xSxS")
    p.add_argument("--seq-len", type=int, default=64, help="transformer tokens per sample")
    p.add_argument("--num-warmup-batches", type=int, default=5)
    p.add_argument("--num-batches-per-iter", type=int, default=5)
    p.add_argument("--num-iters", type=int, default=10)
    p.add_argument("--fp16-allreduce", action="store_true",
                   help="compress gradients to fp16 for the allreduce")
    p.add_argument("--no-cuda", action="store_true", help="stay on CPU even with a GPU")
    p.add_argument("--no-hvd", action="store_true",
                   help="one process, no hvdcompat: the baseline for scaling efficiency")
    p.add_argument("--baseline-img-sec", type=float, default=None,
                   help="the --no-hvd result, to print the scaling efficiency")
    p.add_argument("--threads", type=int, default=0,
                   help="torch CPU threads per rank (default: cores / ranks on this node)")
    p.add_argument("--mpi4py-first", action="store_true",
                   help="start MPI from mpi4py before importing hvdcompat")
    return p.parse_args()


def main():
    args = parse_args()
    distributed = not args.no_hvd
    if distributed:
        hvd.init()
    rank = hvd.rank() if distributed else 0
    size = hvd.size() if distributed else 1
    local_rank = hvd.local_rank() if distributed else 0
    local_size = hvd.local_size() if distributed else 1

    def log(msg):
        if rank == 0:
            print(msg, flush=True)

    cuda = torch.cuda.is_available() and not args.no_cuda
    if cuda:
        torch.cuda.set_device(local_rank)
    else:
        # Ranks on one node share its cores; oversubscribed threads make every rank slower.
        torch.set_num_threads(args.threads or max(1, (os.cpu_count() or 1) // local_size))
    device = torch.device("cuda" if cuda else "cpu")

    torch.manual_seed(1234)
    model, data, target, unit = build(args)
    model, data, target = model.to(device), data.to(device), target.to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01 * size, momentum=0.9)
    if distributed:
        compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none
        optimizer = hvd.DistributedOptimizer(optimizer,
                                             named_parameters=model.named_parameters(),
                                             compression=compression)
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        hvd.broadcast_optimizer_state(optimizer, root_rank=0)

    def train_batch():
        optimizer.zero_grad()
        loss = F.cross_entropy(model(data), target)
        loss.backward()
        optimizer.step()

    def sync():
        if cuda:
            torch.cuda.synchronize()

    params = sum(p.numel() for p in model.parameters())
    log(f"Model: {args.model} ({params / 1e6:.2f} M parameters)")
    log(f"Batch size: {args.batch_size} per rank")
    log(f"Ranks: {size} ({'CUDA' if cuda else 'CPU'}"
        + (f", {torch.get_num_threads()} threads each" if not cuda else "") + ")"
        + (f", fp16 allreduce" if args.fp16_allreduce else ""))
    if distributed:
        log(f"MPI started by: {'mpi4py, before hvdcompat' if args.mpi4py_first else 'hvdcompat'}")
    log(f"Running warm-up ({args.num_warmup_batches} batches)...")
    for i in range(args.num_warmup_batches):
        t0 = time.perf_counter()
        train_batch()
        sync()
        log(f"  warm-up batch {i + 1}/{args.num_warmup_batches}: "
            f"{time.perf_counter() - t0:.2f} s")

    log(f"Running benchmark ({args.num_iters} iterations of {args.num_batches_per_iter} "
        "batches)...")
    rates = []
    for it in range(args.num_iters):
        t0 = time.perf_counter()
        for _ in range(args.num_batches_per_iter):
            train_batch()
        sync()
        rate = args.batch_size * args.num_batches_per_iter / (time.perf_counter() - t0)
        rates.append(rate)
        log(f"Iter #{it}: {rate:.1f} {unit}/sec per rank")

    if not distributed:
        mean, conf = mean_conf(rates)
        print(f"{unit.capitalize()}/sec (one process, no hvdcompat): {mean:.1f} +-{conf:.1f}")
        print(f"Pass --baseline-img-sec {mean:.1f} to a distributed run to see its scaling "
              "efficiency.")
        return

    # Every rank's per-iteration rates; iterations line up across ranks because each
    # one ends with the same allreduces.
    all_rates = hvd.allgather(torch.tensor([rates], dtype=torch.float64),
                              name="benchmark.rates").tolist()
    totals = [sum(r[i] for r in all_rates) for i in range(len(rates))]
    if rank == 0:
        print(f"\n| rank | {unit}/sec (mean ± 1.96·std) |")
        print("|---:|---:|")
        for r, values in enumerate(all_rates):
            m, c = mean_conf(values)
            print(f"| {r} | {m:.1f} ± {c:.1f} |")
        per_rank, per_rank_conf = mean_conf([v for values in all_rates for v in values])
        total, total_conf = mean_conf(totals)
        print(f"\n{unit.capitalize()}/sec per rank: {per_rank:.1f} +-{per_rank_conf:.1f}")
        print(f"Total {unit}/sec on {size} rank(s): {total:.1f} +-{total_conf:.1f}")
        if args.baseline_img_sec:
            eff = total / (size * args.baseline_img_sec)
            print(f"Scaling efficiency vs one process ({args.baseline_img_sec:.1f} {unit}/sec): "
                  f"{100 * eff:.0f}%")
    hvd.shutdown()


if __name__ == "__main__":
    main()
