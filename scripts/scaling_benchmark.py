"""Cost as the world grows, measured: 2 to 32 ranks on 4 test hosts, against raw MPI.

    python scripts/scaling_benchmark.py                    # root: 2, 4, 8, 16, 32 ranks
    python scripts/scaling_benchmark.py --sizes 2,4 --iters 200 --json out.json

Builds 4 test hosts on this machine (network namespaces joined by a bridge,
tests/cluster/testhosts.py; names start with "scale") and, for each size,
launches one job under ``mpirun`` (1 rank per host at 2 and 4 ranks, then
size / 4 per host). In that job every rank measures, on the same buffers:

- raw MPI (mpi4py) Allreduce latency of 4 KiB of float32 and of the 40 bytes
  a negotiation cycle combines (its 5 words when at most 64 names are cached);
- hvdcompat's 4 KiB allreduce (one cached name, synchronous) and, from the
  engine's counters over the same loop, one negotiation cycle's time
  (``negotiation_ns / cycles``: the cycle's combine, waiting for peers included);
- bytes through set rank 0 per cycle while 161 new names are negotiated (the
  first iteration of ResNet-50's gradients: one-element tensors with the same
  number of dimensions, so the request lists are those of the real model) and
  in steady state (the same names again, from the cache): request lists in,
  responses out, cycle words combined (``coordinator_in_bytes``,
  ``coordinator_out_bytes``, ``flag_bytes``), and the coordinator's time.

Medians over --iters (rank 0's; every rank runs the same loop). The ratios
hvdcompat / raw MPI should stay flat as ranks grow. 2 cores run every rank
here: the absolute times grow with oversubscription, not with the network.
"""

import argparse
import json
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
ROW = "SCALING-ROW "


def layout_for(size, hosts=4):
    if size <= hosts:
        return [1] * size
    if size % hosts:
        raise ValueError(f"{size} ranks do not spread evenly over {hosts} hosts")
    return [size // hosts] * hosts


def median_time(fn, iters, barrier, warmup=5):
    sys.path.insert(0, os.path.join(REPO, "scripts"))
    from benchmark_helpers.bench_common import timeit
    return timeit(fn, iters, warmup, barrier)


def resnet50_ndims():
    sys.path.insert(0, os.path.join(REPO, "scripts"))
    from negotiation_scaling import resnet50_shapes
    return [len(s) for s in resnet50_shapes()]


def worker(args):
    import torch

    import hvdcompat as hvd

    hvd.init()
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    r, n = hvd.rank(), hvd.size()
    row = {"ranks": n, "hosts": hvd.cross_size()}

    def stat(key):
        return hvd.engine_stats()[key]

    # Raw MPI first, on numpy views of torch buffers.
    x = torch.full((1024,), float(r + 1))
    a = x.numpy()
    row["mpi_4k_us"] = median_time(lambda: comm.Allreduce(MPI.IN_PLACE, a, op=MPI.SUM),
                                   args.iters, comm.Barrier) * 1e6
    w = torch.zeros(5, dtype=torch.int64).numpy()
    row["mpi_40b_us"] = median_time(lambda: comm.Allreduce(MPI.IN_PLACE, w, op=MPI.BOR),
                                    args.iters, comm.Barrier) * 1e6
    # hvdcompat: one cached name; the counters over the same loop give the cycle time.
    x = torch.full((1024,), float(r + 1))  # the MPI loop reduced a (x) in place
    got = hvd.allreduce(x, op=hvd.Sum, name="scaling.4k")
    assert torch.equal(got, torch.full((1024,), float(n * (n + 1) // 2))), got[:4]
    hvd.barrier()
    c0, ns0 = stat("cycles"), stat("negotiation_ns")
    row["hvd_4k_us"] = median_time(lambda: hvd.allreduce(x, op=hvd.Sum, name="scaling.4k"),
                                   args.iters, hvd.barrier) * 1e6
    c1, ns1 = stat("cycles"), stat("negotiation_ns")
    row["cycle_us"] = (ns1 - ns0) / max(1, c1 - c0) / 1e3
    row["cycles_per_op"] = (c1 - c0) / (args.iters + 5)  # the op and its barrier

    # Bytes through set rank 0: 161 new names, then the same names from the cache.
    grads = [torch.ones([1] * d) for d in resnet50_ndims()]

    def iteration():
        handles = [hvd.allreduce_async_(g, op=hvd.Average, name=f"scaling.grad.{i}")
                   for i, g in enumerate(grads)]
        for h in handles:
            hvd.synchronize(h)

    keys = ("cycles", "coordinator_in_bytes", "coordinator_out_bytes", "flag_bytes",
            "coordinator_ns")
    per_iteration = []
    for _ in range(1 + args.steady):
        hvd.barrier()
        before = {k: stat(k) for k in keys}
        iteration()
        after = {k: stat(k) for k in keys}
        per_iteration.append({k: after[k] - before[k] for k in keys})
    first, steady = per_iteration[0], per_iteration[1:]
    row["first"] = first
    row["steady"] = {k: statistics.median(it[k] for it in steady) for k in keys}
    if r == 0:
        print(ROW + json.dumps(row), flush=True)
    hvd.shutdown()


def per_cycle(block, key):
    return block[key] / max(1, block["cycles"])


def print_table(rows):
    print(f"\n# {os.cpu_count()} cores on this machine; load average "
          + ", ".join(f"{x:.1f}" for x in os.getloadavg()))
    print("# 4 KiB allreduce and one negotiation cycle against raw MPI (us, rank 0's median)")
    print(f"{'ranks':>5} {'hosts':>5} {'MPI 4 KiB':>9} {'hvd 4 KiB':>9} {'ratio':>6} "
          f"{'MPI 40 B':>8} {'cycle':>7} {'ratio':>6} {'cycles/op+barrier':>17}")
    for r in rows:
        print(f"{r['ranks']:>5} {r['hosts']:>5} {r['mpi_4k_us']:>9.1f} {r['hvd_4k_us']:>9.1f} "
              f"{r['hvd_4k_us'] / r['mpi_4k_us']:>6.2f} {r['mpi_40b_us']:>8.1f} "
              f"{r['cycle_us']:>7.1f} {r['cycle_us'] / r['mpi_40b_us']:>6.2f} "
              f"{r['cycles_per_op']:>17.2f}")
    print("\n# Bytes through set rank 0 per cycle, 161 gradients (first iteration | steady state)")
    print(f"{'ranks':>5} {'cycles':>6} {'in B/cyc':>9} {'out B/cyc':>9} {'words B/cyc':>11} "
          f"{'coord ms':>8} | {'cycles':>6} {'in B/cyc':>8} {'out B/cyc':>9} {'words B/cyc':>11}")
    for r in rows:
        f, s = r["first"], r["steady"]
        print(f"{r['ranks']:>5} {f['cycles']:>6} {per_cycle(f, 'coordinator_in_bytes'):>9.0f} "
              f"{per_cycle(f, 'coordinator_out_bytes'):>9.0f} {per_cycle(f, 'flag_bytes'):>11.0f} "
              f"{f['coordinator_ns'] / 1e6:>8.2f} | {s['cycles']:>6.0f} "
              f"{per_cycle(s, 'coordinator_in_bytes'):>8.0f} "
              f"{per_cycle(s, 'coordinator_out_bytes'):>9.0f} {per_cycle(s, 'flag_bytes'):>11.0f}")


def driver(args):
    sys.path.insert(0, os.path.join(REPO, "tests"))
    sys.path.insert(0, os.path.join(REPO, "tests", "cluster"))
    from cluster_harness import run_mpirun
    from testhosts import ClusterUnavailable, HostCluster

    sizes = [int(s) for s in args.sizes.split(",")]
    try:
        cluster = HostCluster(4, prefix="scale")
    except ClusterUnavailable as e:
        print(f"scaling_benchmark: {e}", file=sys.stderr)
        return 2
    rows = []
    with cluster:
        print(f"# test hosts {', '.join(cluster.names)} on {cluster.subnet}", flush=True)
        for size in sizes:
            t0 = time.monotonic()
            result = run_mpirun(cluster, layout_for(size),
                                [sys.executable, os.path.abspath(__file__), "--worker",
                                 "--iters", str(args.iters), "--steady", str(args.steady)],
                                timeout=args.timeout, what=f"scaling benchmark at {size} ranks")
            line = next(l for l in result.output.splitlines() if ROW in l)
            rows.append(json.loads(line.split(ROW, 1)[1]))
            print(f"# {size} ranks on {layout_for(size)}: {time.monotonic() - t0:.0f} s",
                  flush=True)
    print_table(rows)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(rows, f, indent=1)
    return 0


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="2,4,8,16,32")
    parser.add_argument("--iters", type=int, default=100)
    parser.add_argument("--steady", type=int, default=5, help="steady-state iterations")
    parser.add_argument("--timeout", type=int, default=900, help="seconds per job")
    parser.add_argument("--json", help="also write the rows here")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        return worker(args)
    return driver(args)


if __name__ == "__main__":
    sys.exit(main())
