"""Allreduce benchmark: hvdcompat vs raw MPI (mpi4py) vs torch.distributed (gloo), one job.

    hvdcompatrun -np 2 python examples/allreduce_benchmark.py
    mpirun --allow-run-as-root -np 2 python examples/allreduce_benchmark.py \
        --sizes 4KiB,64MiB --iters 20

Prints, for float32 buffers of each size, the median time of a synchronous
allreduce (sum) and its algorithm bandwidth (bytes / time), then the
ResNet-50 gradient set (161 tensors, 25,557,032 floats) submitted
asynchronously and synchronized, against per-tensor raw MPI and gloo.
Every peer runs in the same job on the same buffers; medians over --iters.
"""

import argparse
import os
import socket
import statistics
import sys
import threading
import time

import torch

import hvdcompat as hvd

try:
    from mpi4py import MPI
except ImportError:  # the table then has no raw MPI column
    MPI = None


def parse_size(text):
    units = {"KIB": 1 << 10, "MIB": 1 << 20, "GIB": 1 << 30, "B": 1}
    t = text.strip().upper()
    for u, f in units.items():
        if t.endswith(u):
            return int(float(t[: -len(u)]) * f)
    return int(t)


def human(n):
    for unit, f in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= f:
            return f"{n / f:g} {unit}"
    return f"{n} B"


def resnet50_shapes():
    """Parameter shapes of torchvision's ResNet-50 (161 tensors, 25,557,032 floats)."""
    shapes = [(64, 3, 7, 7), (64,), (64,)]
    inplanes = 64
    for planes, blocks in ((64, 3), (128, 4), (256, 6), (512, 3)):
        for b in range(blocks):
            shapes += [(planes, inplanes, 1, 1), (planes,), (planes,),
                       (planes, planes, 3, 3), (planes,), (planes,),
                       (planes * 4, planes, 1, 1), (planes * 4,), (planes * 4,)]
            if b == 0:
                shapes += [(planes * 4, inplanes, 1, 1), (planes * 4,), (planes * 4,)]
            inplanes = planes * 4
    shapes += [(1000, 2048), (1000,)]
    return shapes


def timeit(fn, iters, warmup, barrier):
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(iters):
        barrier()
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


class Heartbeat:
    """Rank 0's "still measuring" line on stderr when the table has been quiet for a while.

    Launchers forward the ranks' output line by line, so a table row appears
    only when all its cells are measured, and the 64 MiB row takes seconds
    (many on a busy machine). A daemon thread then says what is being measured.
    It only reads attributes that the main thread replaces whole, so no lock.
    """

    def __init__(self, enabled, quiet_seconds=3.0):
        self.what, self.since = "the first size", time.monotonic()
        self.last_output = self.since
        if enabled:
            threading.Thread(target=self._run, args=(quiet_seconds,), daemon=True).start()

    def measuring(self, what):
        self.what, self.since = what, time.monotonic()

    def printed(self):
        self.last_output = time.monotonic()

    def _run(self, quiet_seconds):
        while True:
            time.sleep(0.5)
            now = time.monotonic()
            if now - self.last_output >= quiet_seconds:
                print(f"  ... measuring {self.what} ({now - self.since:.0f} s so far)",
                      file=sys.stderr, flush=True)
                self.last_output = now


def start_gloo():
    """Initialises torch.distributed/gloo for this job (address and port from rank 0)."""
    import torch.distributed as dist

    if MPI is None:
        return None
    comm = MPI.COMM_WORLD
    addr, port = None, None
    if comm.rank == 0:
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        addr, port = "127.0.0.1", s.getsockname()[1]
        s.close()
    addr, port = comm.bcast((addr, port), root=0)
    dist.init_process_group("gloo", init_method=f"tcp://{addr}:{port}", rank=comm.rank,
                            world_size=comm.size)
    return dist


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="4KiB,64KiB,1MiB,4MiB,16MiB,64MiB")
    parser.add_argument("--iters", type=int, default=50)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--resnet-iters", type=int, default=10)
    parser.add_argument("--no-gloo", action="store_true")
    args = parser.parse_args()

    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    comm = MPI.COMM_WORLD if MPI is not None else None
    dist = None if args.no_gloo else start_gloo()
    barrier = hvd.barrier
    heartbeat = Heartbeat(enabled=rank == 0)

    def log(*parts):
        # Rank 0 only, flushed: a launcher may buffer the ranks' pipes.
        if rank == 0:
            print(*parts, flush=True)
            heartbeat.printed()


    log(f"# {size} ranks; float32 sum; median of {args.iters} (after {args.warmup} warm-up)")
    log(f"# hvdcompat {hvd.__version__}, {hvd.build_info()['mpi_library'].split(',')[0]}, "
        f"torch {torch.__version__}")
    header = f"{'size':>9} | {'hvdcompat ms':>12} {'GB/s':>6} | {'MPI ms':>8} {'GB/s':>6} |"
    header += f" {'gloo ms':>8} {'GB/s':>6} | {'hvd/MPI':>7}"
    log(header)
    log("-" * len(header))
    for nbytes in (parse_size(s) for s in args.sizes.split(",")):
        n = nbytes // 4
        t = torch.ones(n)
        name = f"bench.{nbytes}"
        heartbeat.measuring(f"{human(nbytes)} with hvdcompat")
        th = timeit(lambda: hvd.allreduce_(t, op=hvd.Sum, name=name), args.iters, args.warmup,
                    barrier)
        tm = tg = float("nan")
        if comm is not None:
            heartbeat.measuring(f"{human(nbytes)} with raw MPI")
            a = t.numpy()
            tm = timeit(lambda: comm.Allreduce(MPI.IN_PLACE, a, op=MPI.SUM), args.iters,
                        args.warmup, barrier)
        if dist is not None:
            heartbeat.measuring(f"{human(nbytes)} with gloo")
            tg = timeit(lambda: dist.all_reduce(t), args.iters, args.warmup, barrier)
        gb = lambda s: nbytes / s / 1e9  # noqa: E731
        log(f"{human(nbytes):>9} | {th * 1e3:12.3f} {gb(th):6.2f} | {tm * 1e3:8.3f} {gb(tm):6.2f} |"
            f" {tg * 1e3:8.3f} {gb(tg):6.2f} | {th / tm:7.2f}")

    shapes = resnet50_shapes()
    grads = [torch.randn(s) for s in shapes]
    total = sum(g.numel() for g in grads)
    log(f"\n# ResNet-50 gradient set: {len(grads)} tensors, {total:,} floats "
        f"({human(total * 4)}), median of {args.resnet_iters}")

    def hvd_set():
        handles = [hvd.allreduce_async_(g, op=hvd.Sum, name=f"resnet.{i}")
                   for i, g in enumerate(grads)]
        for h in handles:
            hvd.synchronize(h)

    rows = [("hvdcompat (async, fused)", hvd_set)]
    if comm is not None:
        arrays = [g.numpy() for g in grads]

        def mpi_set():
            for a in arrays:
                comm.Allreduce(MPI.IN_PLACE, a, op=MPI.SUM)

        rows.append(("raw MPI, one Allreduce per tensor", mpi_set))
    if dist is not None:
        def gloo_set():
            works = [dist.all_reduce(g, async_op=True) for g in grads]
            for w in works:
                w.wait()

        rows.append(("gloo, async per tensor", gloo_set))
    for label, fn in rows:
        heartbeat.measuring(f"the ResNet-50 set: {label}")
        sec = timeit(fn, args.resnet_iters, 2, barrier)
        log(f"{label:>36}: {sec * 1e3:8.2f} ms  ({total * 4 / sec / 1e9:.2f} GB/s)")
    stats = hvd.engine_stats()
    log(f"\n# engine: {stats['collectives']} collectives for {stats['tensors']} tensors, "
        f"{stats['fused_tensors']} tensors fused, cache hits {stats['cache_hits']}, "
        f"misses {stats['cache_misses']}")
    if dist is not None:
        dist.destroy_process_group()
    hvd.shutdown()


if __name__ == "__main__":
    sys.exit(main())
