"""Allreduce on hvdcompat's Gloo controller vs torch.distributed's gloo vs hvdcompat's MPI
controller, one job:

    hvdcompatrun -np 2 python examples/gloo_allreduce_benchmark.py
    mpirun --allow-run-as-root -np 3 python examples/gloo_allreduce_benchmark.py --iters 20

The ranks first meet through a torch TCPStore (rank 0 hosts it on --port)
and keep a torch gloo process group on it for the whole job. Each round
starts the engine on its Gloo controller (no MPI) through the same store and
times, row by row, hvdcompat and torch's gloo on the same float32 buffers
(one row's two peers back to back); then restarts the engine on its MPI
controller (the launcher's MPI) and times the same rows. Rows: a synchronous
in-place sum (hvd.allreduce_ / dist.all_reduce) per size, and the ResNet-50
gradient set (161 tensors, 25,557,032 floats): every tensor submitted
asynchronously, then all waited for (hvdcompat fuses them; torch's gloo runs
one all_reduce per tensor). Each timed call starts after a barrier. Prints,
per row, the median over the rounds of each round's median, the algorithm
bandwidth, each peer's time relative to torch's gloo, rank 0's CPU time per
call (all its threads: what a call costs a machine that is busy anyway),
and the load average at the start and the end.
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

# The ResNet-50 shapes live with the other benchmarks' helpers (scripts/benchmark_helpers).
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "scripts"))
from benchmark_helpers.bench_common import resnet50_shapes  # noqa: E402

SIZES = {"4KiB": 4 << 10, "64KiB": 64 << 10, "1MiB": 1 << 20, "16MiB": 16 << 20,
         "64MiB": 64 << 20}
RESNET = "ResNet-50"


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


def engine_set(tensors, tag):
    def run():
        handles = [hvd.allreduce_async_(t, op=hvd.Sum, name=f"{tag}.{i}")
                   for i, t in enumerate(tensors)]
        for h in handles:
            hvd.synchronize(h)
    return run


def gloo_set(tensors):
    def run():
        works = [dist.all_reduce(t, async_op=True) for t in tensors]
        for w in works:
            w.wait()
    return run


def check_sums(run_on, tensors, rank, size, who):
    """Every element (rank + 1) must sum to size * (size + 1) / 2 on every rank."""
    for t in tensors:
        t.fill_(rank + 1)
    run_on(tensors)
    want = size * (size + 1) / 2
    for i, t in enumerate(tensors):
        if not torch.equal(t, torch.full_like(t, want)):
            sys.exit(f"rank {rank}: {who}'s allreduce of tensor {i} gave {t.flatten()[:4].tolist()}"
                     f"..., expected {want}")
        t.zero_()


def timed(fn, iters, barrier, cpu):
    """Median seconds of `fn`; appends this process's CPU seconds per call (every thread,
    user + system, barriers excluded) to `cpu`."""
    fn()  # warm-up (connections, first allocation, negotiation)
    out = []
    used = 0.0
    for _ in range(iters):
        barrier()
        before = os.times()
        start = time.perf_counter()
        fn()
        out.append(time.perf_counter() - start)
        after = os.times()
        used += after.user + after.system - before.user - before.system
    cpu.append(used / iters)
    return statistics.median(out)


def load():
    return "{:.1f} {:.1f} {:.1f}".format(*os.getloadavg())


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--iters", type=int, default=20, help="timed calls per row and round")
    p.add_argument("--rounds", type=int, default=3,
                   help="rounds (Gloo controller and torch gloo, then the MPI controller)")
    p.add_argument("--port", type=int, default=29517)
    p.add_argument("--host", default="127.0.0.1", help="address rank 0's store listens on")
    p.add_argument("--sizes", default="4KiB,16MiB,64MiB", help=f"of {','.join(SIZES)}")
    p.add_argument("--no-resnet", action="store_true", help="leave out the ResNet-50 set row")
    args = p.parse_args()
    rank, size = launch_rank_size()
    start_load = load()
    rows = [(name, [torch.zeros(SIZES[name] // 4)]) for name in args.sizes.split(",") if name]
    if not args.no_resnet:
        rows.append((RESNET, [torch.zeros(s) for s in resnet50_shapes()]))
    tcp = dist.TCPStore(args.host, args.port, size, rank == 0,
                        timeout=datetime.timedelta(seconds=60))
    dist.init_process_group("gloo", store=dist.PrefixStore("torch/", tcp), rank=rank,
                            world_size=size)
    times = {peer: {name: [] for name, _ in rows} for peer in ("gloo_ctl", "torch", "mpi_ctl")}
    cpu = {peer: {name: [] for name, _ in rows} for peer in ("gloo_ctl", "torch", "mpi_ctl")}
    for r in range(args.rounds):
        # Our Gloo controller (what hvd.init() starts under torchrun/--gloo)
        _core.init(_core.InitOptions(controller="gloo", store=Store(tcp, f"hvdcompat/{r}/"),
                                     rank=rank, size=size, gloo_hostname=args.host))
        _ps._after_init(_ps._parse_init_argument(None, None), _session.begin())
        assert _core.gloo_enabled()
        if r == 0:
            check_sums(lambda ts: engine_set(ts, "check.gloo")(), rows[-1][1], rank, size,
                       "the Gloo controller")
            check_sums(lambda ts: gloo_set(ts)(), rows[-1][1], rank, size, "torch gloo")
        for name, tensors in rows:
            times["gloo_ctl"][name].append(timed(engine_set(tensors, f"g.{name}"), args.iters,
                                                 dist.barrier, cpu["gloo_ctl"][name]))
            times["torch"][name].append(timed(gloo_set(tensors), args.iters, dist.barrier,
                                              cpu["torch"][name]))
        hvd.shutdown()
        # Our MPI controller, same rows
        hvd.init()
        assert _core.mpi_enabled()
        if r == 0:
            check_sums(lambda ts: engine_set(ts, "check.mpi")(), rows[-1][1], rank, size,
                       "the MPI controller")
        for name, tensors in rows:
            times["mpi_ctl"][name].append(timed(engine_set(tensors, f"m.{name}"), args.iters,
                                                hvd.barrier, cpu["mpi_ctl"][name]))
        hvd.shutdown()
    dist.barrier()
    dist.destroy_process_group()
    if rank == 0:
        print(f"\nallreduce (sum, float32, in place), {size} ranks, {args.rounds} rounds of "
              f"{args.iters} calls per row and peer (median of the rounds' medians); "
              f"load average {start_load} at the start, {load()} at the end")
        print("| size | hvdcompat Gloo controller | torch.distributed gloo | hvdcompat MPI "
              "controller | Gloo ctl / torch gloo | MPI ctl / torch gloo |")
        print("|---|---|---|---|---|---|")
        for name, tensors in rows:
            nbytes = sum(t.numel() * 4 for t in tensors)
            o, g, m = (statistics.median(times[peer][name])
                       for peer in ("gloo_ctl", "torch", "mpi_ctl"))

            def cell(sec):
                return f"{sec * 1e3:.3f} ms ({nbytes / sec / 1e9:.2f} GB/s)"

            print(f"| {name} | {cell(o)} | {cell(g)} | {cell(m)} | {o / g:.2f}x | {m / g:.2f}x |")
        if not args.no_resnet:
            print(f"{RESNET}: 161 tensors, 25,557,032 floats, all submitted, then all waited for "
                  "(hvdcompat fuses them; torch gloo: one all_reduce each)")
        print("\nCPU time per call on rank 0 (every thread, user + system; ms, mean over the "
              "rounds; 10 ms clock ticks):")
        print("| size | hvdcompat Gloo controller | torch.distributed gloo | hvdcompat MPI "
              "controller |")
        print("|---|---|---|---|")
        for name, _ in rows:
            cells = [f"{statistics.mean(cpu[peer][name]) * 1e3:.1f}"
                     for peer in ("gloo_ctl", "torch", "mpi_ctl")]
            print(f"| {name} | " + " | ".join(cells) + " |")
        print("sums checked on every rank: Gloo controller, torch gloo, MPI controller")


if __name__ == "__main__":
    main()
