"""DDP training throughput: gloo vs the hvdcompat backend vs gloo + hvdcompat's hook.

Any launcher works; the script itself is an ordinary env:// DDP script:

    torchrun --standalone --nproc_per_node=2 examples/pytorch_ddp_benchmark.py
    python -m torch.distributed.launch --nproc_per_node=2 --nnodes=1 --node_rank=0 \
        --master_addr=localhost --master_port=6006 examples/pytorch_ddp_benchmark.py
    mpirun --allow-run-as-root -np 2 python examples/pytorch_ddp_benchmark.py   # flag: as root

In one job it trains the same synthetic model (an MLP on random data) with
DistributedDataParallel in each configuration and prints steps/s on rank 0:

* ``gloo``: plain DDP on the gloo process group (the baseline);
* ``hvdcompat backend``: DDP on ``dist.new_group(backend="hvdcompat")``
  (needs an MPI launcher, or the Gloo controller under torchrun; skipped
  otherwise);
* ``gloo + accelerate [compression]``: DDP on gloo with the hook that
  ``import hvdcompat.ddp.accelerate`` installs (engine route under mpirun,
  and under torchrun with the Gloo controller; else the process-group route);
* with ``--ceiling``, each rank training its own copy with no gradient
  exchange at all: what any exchange can at best reach.

The configurations take turns a few steps at a time (--rounds of --iters
steps each), so load from other jobs falls on all of them alike; the median
over the rounds is reported, with rank 0's CPU time per step (all threads)
and the load average at the start and the end.
"""

import argparse
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

import hvdcompat.ddp  # registers the backend; under mpirun fills RANK, MASTER_ADDR, ...
from hvdcompat.ddp import hooks


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--warmup", type=int, default=5,
                   help="untimed steps per configuration, before the first round")
    p.add_argument("--iters", type=int, default=5, help="timed steps per configuration and round")
    p.add_argument("--rounds", type=int, default=12,
                   help="configurations take turns this many times, a few steps each; the "
                        "median over the rounds is reported (evens out load from other jobs)")
    p.add_argument("--batch-size", type=int, default=32, help="samples per rank per step")
    p.add_argument("--hidden", type=int, default=1024, help="width of the MLP")
    p.add_argument("--layers", type=int, default=6, help="hidden layers of the MLP")
    p.add_argument("--ceiling", action="store_true",
                   help="also train each rank's own copy with no gradient exchange (the same "
                        "model, batch and threads; what any exchange can at best reach)")
    p.add_argument("--compression", default="none,fp16",
                   help="comma-separated compressions to run with the accelerate hook "
                        "(none, fp16, bf16)")
    # torch.distributed.launch without --use_env passes the local rank as an argument.
    p.add_argument("--local-rank", "--local_rank", type=int, default=None, help=argparse.SUPPRESS)
    return p.parse_args()


def _load():
    return "{:.1f} {:.1f} {:.1f}".format(*os.getloadavg())


def launcher():
    if hvdcompat.ddp.bootstrap.launched_by_mpi():
        return "MPI launcher"
    if hvdcompat.ddp.bootstrap.launched_by_torch():
        return "torchrun / torch.distributed.launch"
    return "no launcher"


def build_model(args):
    torch.manual_seed(0)  # every rank and every configuration starts from the same weights
    layers = [nn.Linear(args.hidden, args.hidden), nn.ReLU()]
    for _ in range(args.layers - 1):
        layers += [nn.Linear(args.hidden, args.hidden), nn.ReLU()]
    layers.append(nn.Linear(args.hidden, 10))
    return nn.Sequential(*layers)


class Trainer:
    """One configuration: a DDP model, its optimizer and this rank's fixed batch."""

    def __init__(self, model, args):
        self.model = model
        self.opt = torch.optim.SGD(model.parameters(), lr=0.01)
        gen = torch.Generator().manual_seed(1000 + dist.get_rank())
        self.x = torch.randn(args.batch_size, args.hidden, generator=gen)
        self.y = torch.randint(0, 10, (args.batch_size,), generator=gen)
        self.loss_fn = nn.CrossEntropyLoss()

    def step(self):
        self.opt.zero_grad()
        self.loss_fn(self.model(self.x), self.y).backward()
        self.opt.step()

    def warm_up(self, steps):
        for _ in range(steps):
            self.step()

    def steps_per_second(self, iters):
        dist.barrier()
        start = time.perf_counter()
        for _ in range(iters):
            self.step()
        dist.barrier()
        # The slowest rank sets the job's pace.
        t = torch.tensor([time.perf_counter() - start], dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return iters / t.item()


def main():
    args = parse_args()
    dist.init_process_group("gloo")
    rank, size = dist.get_rank(), dist.get_world_size()
    torch.set_num_threads(max(1, int(os.environ.get("OMP_NUM_THREADS", "1"))))

    # (label, make) where make() returns (DDP model, how its gradients travel).
    configs = [("gloo", lambda: (DDP(build_model(args)), "gloo"))]
    if hvdcompat.ddp.backend_available():
        hv_group = dist.new_group(backend="hvdcompat")
        configs.append(("hvdcompat backend",
                        lambda: (DDP(build_model(args), process_group=hv_group), "engine")))
    for comp in [c.strip() for c in args.compression.split(",") if c.strip()]:
        def make(comp=comp):
            model = DDP(build_model(args))
            # What `import hvdcompat.ddp.accelerate` installs, with this compression.
            return model, hooks.register(model, compression=comp).route
        configs.append((f"gloo + accelerate ({comp})", make))

    def log(msg):
        # Rank 0 only, flushed: a launcher may buffer the ranks' pipes.
        if rank == 0:
            print(msg, flush=True)

    params = sum(p.numel() for p in build_model(args).parameters())
    log(f"DDP benchmark: {size} ranks ({launcher()}), MLP {args.layers}x{args.hidden} "
        f"({params / 1e6:.1f} M parameters, {params * 4 / 2**20:.0f} MiB of gradients), "
        f"batch {args.batch_size}/rank; {args.warmup} warm-up steps, then {args.rounds} rounds "
        f"of {args.iters} timed steps per configuration in turn, median over the rounds shown; "
        f"load average {_load()}")
    if not hvdcompat.ddp.backend_available():
        log("hvdcompat backend: skipped (needs an MPI launcher: mpirun / hvdcompatrun, or a "
            "build with the Gloo controller)")

    if args.ceiling:
        configs.append(("no exchange (ceiling)", lambda: (build_model(args), "none")))
    log(f"Setting up {len(configs)} configurations: "
        + ", ".join(label for label, _ in configs))
    trainers = []
    for label, make in configs:
        model, route = make()
        trainers.append((label, route, Trainer(model, args)))
        trainers[-1][2].warm_up(args.warmup)
    samples = {label: [] for label, _, _ in trainers}
    cpu = {label: 0.0 for label, _, _ in trainers}  # this rank's CPU seconds, every thread
    for r in range(args.rounds):
        rates = []
        for label, _, trainer in trainers:
            before = os.times()
            sps = trainer.steps_per_second(args.iters)
            after = os.times()
            cpu[label] += after.user + after.system - before.user - before.system
            samples[label].append(sps)
            rates.append(f"{label} {sps:.2f}")
        log(f"  round {r + 1}/{args.rounds} (steps/s): " + ", ".join(rates))
    results = [(label, route, statistics.median(samples[label])) for label, route, _ in trainers]

    if rank == 0:
        base = results[0][2]
        print(f"{'configuration':<28} {'route':<14} {'steps/s':>9} {'samples/s':>10} "
              f"{'vs gloo':>8} {'CPU ms/step':>12}")
        for label, route, sps in results:
            per_step = cpu[label] / (args.rounds * args.iters) * 1e3
            print(f"{label:<28} {route:<14} {sps:>9.2f} {sps * args.batch_size * size:>10.1f} "
                  f"{sps / base:>7.2f}x {per_step:>12.1f}")
        print("(CPU ms/step: rank 0's process, every thread, user + system, barriers included)")
        print(f"load average at the end: {_load()}")
        sys.stdout.flush()
    # Tear down together: a rank destroying its gloo group while a peer is
    # still printing was seen to abort ("terminate called without an active
    # exception") under torch.distributed.launch.
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
