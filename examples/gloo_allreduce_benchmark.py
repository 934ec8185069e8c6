"""Allreduce on hvdcompat's Gloo controller vs torch.distributed's gloo vs hvdcompat's MPI
controller, one job:

    hvdcompatrun -np 2 python examples/gloo_allreduce_benchmark.py
    mpirun --allow-run-as-root -np 3 python examples/gloo_allreduce_benchmark.py --iters 20

The ranks first meet through a torch TCPStore (rank 0 hosts it on --port)
and start the engine on its Gloo controller (no MPI) next to a torch gloo
process group on the same store; both reduce the same float32 buffers of
each size in alternating rounds. Then the engine is restarted on its MPI
controller (the launcher's MPI) and times the same sizes. Prints, per size,
the median time of a synchronous in-place sum allreduce (hvd.allreduce_ /
dist.all_reduce) over --iters, the algorithm bandwidth, and each peer's
time relative to torch's gloo.
"""

import argparse
import datetime
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist

import hvdcompat as hvd
from hvdcompat import _core, _session
from hvdcompat import process_sets as _ps

SIZES = {"4KiB": 4 << 10, "1MiB": 1 << 20, "16MiB": 16 << 20, "64MiB": 64 << 20}


def launch_rank_size():
    for r, s in (("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"), ("PMI_RANK", "PMI_SIZE"),
                 ("HOROVOD_RANK", "HOROVOD_SIZE")):
        if r in os.environ:
            return int(os.environ[r]), int(os.environ[s])
    sys.exit("run under hvdcompatrun or mpirun: the MPI controller's rows need an MPI launch")


class Store:
    """The engine's store protocol over a torch store, under our own prefix."""

    def __init__(self, store, prefix):
        self.store, self.prefix = store, prefix

    def set(self, key, value):
        self.store.set(self.prefix + key, value)

    def get(self, key):
        return self.store.get(self.prefix + key)

    def add(self, key, amount):
        return self.store.add(self.prefix + key, amount)

    def wait(self, keys, timeout_s):
        self.store.wait([self.prefix + k for k in keys], datetime.timedelta(seconds=timeout_s))

    def __str__(self):
        return "the benchmark's TCPStore"


def check_sum(reduce_, rank, size, who):
    """One sum of (rank + 1) per element must give size * (size + 1) / 2 everywhere."""
    t = torch.full((1000,), float(rank + 1))
    reduce_(t)
    want = size * (size + 1) / 2
    if not torch.equal(t, torch.full_like(t, want)):
        sys.exit(f"rank {rank}: {who}'s allreduce gave {t[:4].tolist()}..., expected {want}")


def timed(fn, iters):
    fn()  # warm-up (connections, first allocation)
    out = []
    for _ in range(iters):
        start = time.perf_counter()
        fn()
        out.append(time.perf_counter() - start)
    return statistics.median(out)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--iters", type=int, default=30)
    p.add_argument("--rounds", type=int, default=3, help="alternating rounds of the Gloo peers")
    p.add_argument("--port", type=int, default=29517)
    p.add_argument("--host", default="127.0.0.1", help="address rank 0's store listens on")
    p.add_argument("--sizes", default="4KiB,16MiB,64MiB", help=f"of {','.join(SIZES)}")
    args = p.parse_args()
    rank, size = launch_rank_size()
    sizes = [(name, SIZES[name]) for name in args.sizes.split(",")]
    tcp = dist.TCPStore(args.host, args.port, size, rank == 0,
                        timeout=datetime.timedelta(seconds=60))
    # Our Gloo controller (what hvd.init() starts under torchrun/--gloo)
    _core.init(_core.InitOptions(controller="gloo", store=Store(tcp, "hvdcompat/"), rank=rank,
                                 size=size, gloo_hostname=args.host))
    _ps._after_init(_ps._parse_init_argument(None, None), _session.begin())
    assert _core.gloo_enabled()
    dist.init_process_group("gloo", store=dist.PrefixStore("torch/", tcp), rank=rank,
                            world_size=size)
    check_sum(lambda t: hvd.allreduce_(t, op=hvd.Sum, name="check.gloo"), rank, size,
              "the Gloo controller")
    check_sum(dist.all_reduce, rank, size, "torch gloo")
    bufs = {name: torch.ones(nbytes // 4) for name, nbytes in sizes}
    ours, torch_gloo = {}, {}
    for _ in range(args.rounds):
        for name, _n in sizes:
            t = bufs[name]
            ours.setdefault(name, []).append(
                timed(lambda: hvd.allreduce_(t, op=hvd.Sum, name=f"b.{name}"), args.iters))
            torch_gloo.setdefault(name, []).append(timed(lambda: dist.all_reduce(t), args.iters))
    dist.destroy_process_group()
    hvd.shutdown()
    # Our MPI controller, same sizes
    hvd.init()
    assert _core.mpi_enabled()
    check_sum(lambda t: hvd.allreduce_(t, op=hvd.Sum, name="check.mpi"), rank, size,
              "the MPI controller")
    mpi = {}
    for name, _n in sizes:
        t = bufs[name]
        mpi[name] = timed(lambda: hvd.allreduce_(t, op=hvd.Sum, name=f"m.{name}"), args.iters)
    hvd.shutdown()
    if rank == 0:
        print(f"\nallreduce (sum, float32, in place), {size} ranks, median of {args.iters} "
              f"(Gloo peers: median of {args.rounds} alternating rounds)")
        print(f"| size | hvdcompat Gloo controller | torch.distributed gloo | hvdcompat MPI "
              f"controller | Gloo ctl / torch gloo | MPI ctl / torch gloo |")
        print("|---|---|---|---|---|---|")
        for name, nbytes in sizes:
            o = statistics.median(ours[name])
            g = statistics.median(torch_gloo[name])
            m = mpi[name]

            def cell(sec):
                return f"{sec * 1e3:.3f} ms ({nbytes / sec / 1e9:.2f} GB/s)"

            print(f"| {name} | {cell(o)} | {cell(g)} | {cell(m)} | {o / g:.2f}x | {m / g:.2f}x |")
        print("sums checked on every rank: Gloo controller, torch gloo, MPI controller")


if __name__ == "__main__":
    main()
