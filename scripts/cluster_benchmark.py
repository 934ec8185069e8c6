"""Allreduce and training throughput across 2 test hosts x 2 ranks with limited links.

    python scripts/cluster_benchmark.py                       # 1gbit and 10gbit links
    python scripts/cluster_benchmark.py --rates 1gbit --sizes 1MiB,16MiB --iters 10

Needs root (it makes its own test hosts: network namespaces on a bridge in
198.18.0.0/15, see tests/cluster/testhosts.py, and removes them at the end).
For each link rate (a tbf qdisc on every host link) it runs, under
``hvdcompatrun -H h1:2,h2:2``:

* one allreduce job measuring, on the same buffers and in the same job,
  hvdcompat (flat), hvdcompat with fp16 compression, hvdcompat hierarchical
  (HOROVOD_HIERARCHICAL_ALLREDUCE=1; the engine's counter shows it ran so),
  raw MPI (mpi4py ``Allreduce``) and torch.distributed gloo;
* examples/allreduce_benchmark.py itself (its own table);
* examples/pytorch_synthetic_benchmark.py (MLP), with and without
  ``--fp16-allreduce``.

The hosts share this machine's cores, so the numbers show what the links
cost, not what separate machines would reach.
"""

import argparse
import os
import re
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

__all__ = ["main"]


def worker(args):
    """One rank of the allreduce job: prints the table on rank 0."""
    sys.path.insert(0, os.path.join(REPO, "examples"))
    import torch

    import allreduce_benchmark as bench
    import hvdcompat as hvd
    from mpi4py import MPI

    hvd.init()
    comm = MPI.COMM_WORLD
    dist = bench.start_gloo()
    sizes = [bench.parse_size(s) for s in args.sizes.split(",")]

    def barrier():
        comm.Barrier()

    rows = {}
    for nbytes in sizes:
        n = nbytes // 4
        t = torch.ones(n)
        row = rows.setdefault(nbytes, {})
        row["hvdcompat"] = bench.timeit(
            lambda: hvd.allreduce_(t, op=hvd.Sum, name=f"flat.{n}"), args.iters, args.warmup,
            barrier)
        row["hvdcompat fp16"] = bench.timeit(
            lambda: hvd.allreduce(t, op=hvd.Sum, name=f"fp16.{n}",
                                  compression=hvd.Compression.fp16),
            args.iters, args.warmup, barrier)
        buf = t.numpy()
        row["raw MPI"] = bench.timeit(lambda: comm.Allreduce(MPI.IN_PLACE, buf), args.iters,
                                      args.warmup, barrier)
        if dist is not None:
            row["gloo"] = bench.timeit(lambda: dist.all_reduce(t), args.iters, args.warmup,
                                       barrier)
    hvd.shutdown()
    os.environ["HOROVOD_HIERARCHICAL_ALLREDUCE"] = "1"
    hvd.init()
    for nbytes in sizes:
        t = torch.ones(nbytes // 4)
        rows[nbytes]["hvdcompat hierarchical"] = bench.timeit(
            lambda: hvd.allreduce_(t, op=hvd.Sum, name=f"hier.{nbytes}"), args.iters,
            args.warmup, barrier)
    hierarchical_calls = hvd.engine_stats()["hierarchical_allreduces"]
    if hvd.rank() == 0:
        peers = list(next(iter(rows.values())).keys())
        print(f"# {hvd.size()} ranks on {hvd.cross_size()} hosts ({hvd.local_size()} per host); "
              f"float32 sum; median of {args.iters} (after {args.warmup} warm-up); "
              "milliseconds (GB/s)")
        print(f"{'size':>9} | " + " | ".join(f"{p:>22}" for p in peers))
        for nbytes, row in rows.items():
            cells = [f"{row[p] * 1e3:12.2f} ({nbytes / row[p] / 1e9:6.3f})" for p in peers]
            print(f"{bench.human(nbytes):>9} | " + " | ".join(f"{c:>22}" for c in cells))
        print(f"# hvdcompat hierarchical: {hierarchical_calls} MPI calls ran node-aware "
              "(0: the layout did not qualify; HOROVOD_LOG_LEVEL=info says why)")
        sys.stdout.flush()
    comm.Barrier()
    hvd.shutdown()
    return 0


def _launch(cluster, command, timeout):
    sys.path.insert(0, os.path.join(REPO, "tests"))
    sys.path.insert(0, os.path.join(REPO, "tests", "cluster"))
    from cluster_harness import host_list, run_hvdcompatrun

    result = run_hvdcompatrun(cluster, ["-H", host_list(cluster, [2, 2]), "--mpi-args",
                                        " ".join(cluster.mpi_args()), *command], timeout,
                              check=False)
    if result.returncode != 0:
        print(result.output, file=sys.stderr)
        raise SystemExit(f"cluster_benchmark: {' '.join(command)} failed "
                         f"({result.returncode})")
    return result.output


def _synthetic(cluster, args, fp16):
    cmd = [sys.executable, "examples/pytorch_synthetic_benchmark.py", "--model", "mlp",
           "--num-warmup-batches", "1", "--num-batches-per-iter", str(args.train_batches),
           "--num-iters", str(args.train_iters)]
    if fp16:
        cmd.append("--fp16-allreduce")
    out = _launch(cluster, cmd, args.timeout)
    m = re.search(r"Total img/sec on \d+ rank\(s\): ([\d.]+ \+-[\d.]+)", out)
    return m.group(1) if m else "?"


def main(argv=None):
    """Driver: builds the test hosts, runs every measurement per link rate, prints tables."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rates", default="1gbit,10gbit",
                        help="tbf rates of the host links, comma-separated ('none': no limit)")
    parser.add_argument("--sizes", default="64KiB,1MiB,16MiB,64MiB")
    parser.add_argument("--iters", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--train-iters", type=int, default=3)
    parser.add_argument("--train-batches", type=int, default=3)
    parser.add_argument("--skip-examples", action="store_true",
                        help="only the combined allreduce table")
    parser.add_argument("--timeout", type=int, default=900)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        return worker(args)

    sys.path.insert(0, os.path.join(REPO, "tests", "cluster"))
    from testhosts import ClusterUnavailable, HostCluster

    try:
        cluster = HostCluster(2)
    except ClusterUnavailable as e:
        print(f"cluster_benchmark: {e}", file=sys.stderr)
        return 2
    with cluster:
        print(f"# test hosts {', '.join(cluster.names)} on {cluster.subnet}; 2 ranks per host",
              flush=True)
        for rate in args.rates.split(","):
            cluster.limit(None if rate == "none" else rate)
            print(f"\n## host links limited to {rate}", flush=True)
            started = time.monotonic()
            out = _launch(cluster, [sys.executable, "scripts/cluster_benchmark.py", "--worker",
                                    "--sizes", args.sizes, "--iters", str(args.iters),
                                    "--warmup", str(args.warmup)], args.timeout)
            print("\n".join(l for l in out.splitlines()
                            if l.startswith(("#", " ", "size")) or "|" in l), flush=True)
            if not args.skip_examples:
                out = _launch(cluster, [sys.executable, "examples/allreduce_benchmark.py",
                                        "--sizes", args.sizes, "--iters", str(args.iters),
                                        "--warmup", str(args.warmup), "--resnet-iters", "3"],
                              args.timeout)
                print("\n# examples/allreduce_benchmark.py")
                print("\n".join(l for l in out.splitlines()
                                if not l.startswith("[")  # rank warnings (c10d)
                                and (l.startswith(("#", " ", "-")) or "|" in l)))
                plain = _synthetic(cluster, args, fp16=False)
                half = _synthetic(cluster, args, fp16=True)
                print("\n# examples/pytorch_synthetic_benchmark.py --model mlp, 4 ranks: total "
                      "img/sec")
                print(f"   hvdcompat: {plain}    hvdcompat --fp16-allreduce: {half}")
            print(f"# ({time.monotonic() - started:.0f} s)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
