"""Allreduce benchmark: hvdcompat vs raw MPI (mpi4py) vs torch.distributed (gloo), one job.

    hvdcompatrun -np 2 python examples/allreduce_benchmark.py
    mpirun -np 2 python examples/allreduce_benchmark.py --sizes 4KiB,64MiB --iters 20
    mpirun -np 2 python examples/allreduce_benchmark.py --mpi4py-first

Prints, for float32 buffers of each size, the median time of a synchronous
allreduce (sum) and its algorithm bandwidth (bytes / time), then the
ResNet-50 gradient set (161 tensors, 25,557,032 floats) submitted
asynchronously and synchronized, against per-tensor raw MPI and gloo.
Every peer runs in the same job on the same buffers; medians over --iters.
Then hvdcompat in place (hvd.allreduce_) against out of place (hvd.allreduce,
a new output per call), per size and for the ResNet-50 set. --mpi4py-first
starts MPI from mpi4py before hvdcompat is imported (as scripts that import
mpi4py first do), so nothing hvdcompat could set at import reaches MPI.
"""

import argparse
import os
import socket
import statistics
import sys
import time

import torch

if "--mpi4py-first" in sys.argv:
    from mpi4py import MPI  # noqa: F401  (initialises MPI before hvdcompat is imported)

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


def out_of_place_sizes(sizes, args, barrier, log):
    """hvdcompat in place (hvd.allreduce_) vs out of place (hvd.allreduce, new output)."""
    log(f"\n# hvdcompat in place vs out of place (a new output per call), float32 sum")
    header = f"{'size':>9} | {'in place ms':>11} | {'out of place ms':>15} | {'out/in':>6}"
    log(header)
    log("-" * len(header))
    for nbytes in sizes:
        t = torch.ones(nbytes // 4)
        name = f"bench.{nbytes}"
        ti = timeit(lambda: hvd.allreduce_(t, op=hvd.Sum, name=name), args.iters, args.warmup,
                    barrier)
        to = timeit(lambda: hvd.allreduce(t, op=hvd.Sum, name=name + ".out"), args.iters,
                    args.warmup, barrier)
        log(f"{human(nbytes):>9} | {ti * 1e3:11.3f} | {to * 1e3:15.3f} | {to / ti:6.2f}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="4KiB,64KiB,1MiB,4MiB,16MiB,64MiB")
    parser.add_argument("--iters", type=int, default=50)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--resnet-iters", type=int, default=10)
    parser.add_argument("--no-gloo", action="store_true")
    parser.add_argument("--mpi4py-first", action="store_true",
                        help="start MPI from mpi4py before importing hvdcompat")
    parser.add_argument("--no-out-of-place", action="store_true",
                        help="skip the in-place vs out-of-place rows")
    args = parser.parse_args()

    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    comm = MPI.COMM_WORLD if MPI is not None else None
    dist = None if args.no_gloo else start_gloo()
    barrier = hvd.barrier
    log = print if rank == 0 else (lambda *a, **k: None)

    log(f"# {size} ranks; float32 sum; median of {args.iters} (after {args.warmup} warm-up)")
    log(f"# hvdcompat {hvd.__version__}, {hvd.build_info()['mpi_library'].split(',')[0]}, "
        f"torch {torch.__version__}")
    log(f"# MPI started by {'mpi4py, before hvdcompat was imported' if args.mpi4py_first else 'hvdcompat'}")
    header = f"{'size':>9} | {'hvdcompat ms':>12} {'GB/s':>6} | {'MPI ms':>8} {'GB/s':>6} |"
    header += f" {'gloo ms':>8} {'GB/s':>6} | {'hvd/MPI':>7}"
    log(header)
    log("-" * len(header))
    for nbytes in (parse_size(s) for s in args.sizes.split(",")):
        n = nbytes // 4
        t = torch.ones(n)
        name = f"bench.{nbytes}"
        th = timeit(lambda: hvd.allreduce_(t, op=hvd.Sum, name=name), args.iters, args.warmup,
                    barrier)
        tm = tg = float("nan")
        if comm is not None:
            a = t.numpy()
            tm = timeit(lambda: comm.Allreduce(MPI.IN_PLACE, a, op=MPI.SUM), args.iters,
                        args.warmup, barrier)
        if dist is not None:
            tg = timeit(lambda: dist.all_reduce(t), args.iters, args.warmup, barrier)
        gb = lambda s: nbytes / s / 1e9  # noqa: E731
        log(f"{human(nbytes):>9} | {th * 1e3:12.3f} {gb(th):6.2f} | {tm * 1e3:8.3f} {gb(tm):6.2f} |"
            f" {tg * 1e3:8.3f} {gb(tg):6.2f} | {th / tm:7.2f}")

    sizes = [parse_size(s) for s in args.sizes.split(",")]
    if not args.no_out_of_place:
        out_of_place_sizes(sizes, args, barrier, log)

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

    rows = [("hvdcompat (async, fused)", timeit(hvd_set, args.resnet_iters, 2, barrier))]
    if comm is not None:
        arrays = [g.numpy() for g in grads]

        def mpi_set():
            for a in arrays:
                comm.Allreduce(MPI.IN_PLACE, a, op=MPI.SUM)

        rows.append(("raw MPI, one Allreduce per tensor", timeit(mpi_set, args.resnet_iters, 2,
                                                                 barrier)))
    if dist is not None:
        def gloo_set():
            works = [dist.all_reduce(g, async_op=True) for g in grads]
            for w in works:
                w.wait()

        rows.append(("gloo, async per tensor", timeit(gloo_set, args.resnet_iters, 2, barrier)))
    if not args.no_out_of_place:
        def hvd_set_out():
            handles = [hvd.allreduce_async(g, op=hvd.Sum, name=f"resnet_out.{i}")
                       for i, g in enumerate(grads)]
            for h in handles:
                hvd.synchronize(h)

        rows.append(("hvdcompat out of place (async, fused)",
                     timeit(hvd_set_out, args.resnet_iters, 2, barrier)))
    for label, sec in rows:
        log(f"{label:>36}: {sec * 1e3:8.2f} ms  ({total * 4 / sec / 1e9:.2f} GB/s)")
    if not args.no_out_of_place:
        log(f"{'out of place / in place':>36}: {rows[-1][1] / rows[0][1]:8.2f}")
    stats = hvd.engine_stats()
    log(f"\n# engine: {stats['collectives']} collectives for {stats['tensors']} tensors, "
        f"{stats['fused_tensors']} tensors fused, cache hits {stats['cache_hits']}, "
        f"misses {stats['cache_misses']}")
    if dist is not None:
        dist.destroy_process_group()
    hvd.shutdown()


if __name__ == "__main__":
    sys.exit(main())
